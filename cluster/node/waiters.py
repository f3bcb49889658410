"""Tasks on a node's loop that wait for a queue of a local replica to grow (fetch long polls,
receive waits), and whether any is watching at all: the tick threads read that to skip waking
the loop for an apply nobody on this node waits for.

A watcher reads the replica, then waits only if it found nothing; an apply between the two must
still wake it. Invariants: a watcher counts itself in (:meth:`QueueWaiters.watch`) before its
first read, and a tick thread reads :attr:`QueueWaiters.watching` after the apply's write. So
either the tick thread sees the watcher and wakes the loop (as it always did), or the watcher's
read comes after the write and finds what it brought. And a watcher registers the future it will
wait on (:meth:`QueueWaiters.listen`) before each read: the loop's wake for an apply after that
read (:meth:`QueueWaiters.wake`, which may run while the watcher still reads in an executor or
before its wait task first runs) sets that future, so the wait that follows returns at once
instead of sleeping its whole timeout.

Threads: everything here runs on the loop but :attr:`QueueWaiters.watching`, read by the tick
threads (an int, written on the loop only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["QueueWaiters", "set_if_pending", "until_woken"]


def set_if_pending(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class QueueWaiters:
    """The futures waiting per ``(topic_id, queue)`` of this node's replicas."""

    def __init__(self) -> None:
        self._futures: dict[tuple[int, int], list[asyncio.Future[None]]] = defaultdict(list)
        self.watching = 0  # watchers between watch()'s start and end (loop only; tick threads read)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Around a loop that reads a replica's queues and waits (:meth:`wait`) for them to grow:
        while one runs, every apply that grows a queue here wakes the loop."""
        self.watching += 1
        try:
            yield
        finally:
            self.watching -= 1

    @contextlib.contextmanager
    def listen(self, queues: Iterable[tuple[int, int]]) -> Iterator[asyncio.Future[None]]:
        """A future set when one of ``queues`` (``(topic_id, queue)``) grows here, registered
        now: read the replica inside, then wait on it (:func:`until_woken`)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(queues)
        for key in keys:
            self._futures[key].append(future)
        try:
            yield future
        finally:
            for key in keys:
                waiters = self._futures.get(key)
                if waiters is not None and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._futures[key]

    def wake(self, queues: Iterable[tuple[int, int]]) -> None:
        for key in queues:
            for future in self._futures.pop(key, ()):
                set_if_pending(future, None)


async def until_woken(future: asyncio.Future[None], timeout_s: float) -> None:
    """Until ``future`` (:meth:`QueueWaiters.listen`'s) is set, at most ``timeout_s``."""
    await asyncio.wait([future], timeout=max(0.0, timeout_s))
