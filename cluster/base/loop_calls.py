"""Calls from other threads into one asyncio loop, with one wake-up for all that wait.

A node's tick threads hand the loop a few calls per Raft entry (a proposal's outcome, the
waiters of the queues that grew); ``loop.call_soon_threadsafe`` writes to the loop's self-pipe
for each, and each write is a system call after which the loop thread must win the GIL back.
:class:`LoopCalls` queues the calls and wakes the loop once: the first call made while none
is waiting schedules one :meth:`LoopCalls._run`, which runs every call queued until then, in
the order they were made.

Invariant: every call made is run exactly once, in order. ``_scheduled`` is set before the
run is scheduled and cleared by the run before it takes the first call, so a call appended
after the run emptied the queue sees it cleared (and schedules the next run), and one
appended while it was set is taken by the run that set it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["LoopCalls"]


class LoopCalls:
    """``call(fn, *args)`` from any thread runs ``fn(*args)`` on ``loop``, soon."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self.wakeups = 0  # runs scheduled (each one write to the loop's self-pipe)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._calls.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
            self.wakeups += 1
        self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            self._scheduled = False
            calls, self._calls = self._calls, deque()
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as e:  # as the loop treats a failing callback: reported, the rest run
                self._loop.call_exception_handler(
                    {"message": f"exception in {fn!r}", "exception": e, "loop_calls": self}
                )
