"""The plumbing of the sync clients: an event loop in an I/O thread of the client's own
(:class:`LoopThread`), and :class:`SyncClient`, the base of every sync twin of an asyncio client
(``Admin``, ``Producer``, ``Consumer``, ``Subscriber``): start, close, ``with``; and
:func:`runs_loop`, how code that knows a loop (not its thread) tells the loop's thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from .errors import ClientClosed

__all__ = ["LoopThread", "SyncClient", "runs_loop"]

T = TypeVar("T")


def runs_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """The calling thread is running ``loop`` now (it would wait for itself if it blocked on the
    loop). Asked of the thread, not matched on an identifier kept: the OS gives an ended
    thread's identifier to threads started after it, and a loop may run in another thread later.
    Asked without an exception in a thread that runs no loop (``asyncio._get_running_loop``, public
    in ``asyncio.__all__``): the sync producer's application thread asks at every batch it opens,
    and a raised ``RuntimeError`` cost it twice the self-pipe write that wakes the loop."""
    return asyncio._get_running_loop() is loop


class LoopThread:
    """An event loop running in a daemon thread; ``run`` executes a coroutine there."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closing = False
        self._stopping = False
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with self._lock:  # no call is accepted from here on
                self._closing = True
            # Run the callbacks still queued (a call made just before: its task is made there),
            # then cancel every task until none is left.
            self.loop.run_until_complete(asyncio.sleep(0))
            while pending := asyncio.all_tasks(self.loop):
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            with self._lock:
                calls, self._calls = self._calls, set()
            for call in calls:  # (a backstop) a waiter gets CancelledError, never waits forever
                call.cancel()
            self.loop.close()

    @property
    def in_loop(self) -> bool:
        # The thread object, not its identifier: a thread started after this one ended may get
        # the same identifier from the OS.
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` in the loop and wait for its result (from any other thread)."""
        if self.in_loop:
            coro.close()
            raise RuntimeError(
                "a blocking raftmq call from the client's own I/O thread (e.g. in a delivery callback)"
            )
        with self._lock:
            if self._closing or not self._thread.is_alive():
                coro.close()
                raise ClientClosed("the client is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._calls.add(future)
        future.add_done_callback(self._finished)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s} s") from None

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._calls.discard(future)

    def stop(self) -> None:
        if self._thread.is_alive():
            with self._lock:  # one stop only: a second, run by the clean-up's loop, would break it
                stop, self._stopping = not self._stopping, True
            if stop:
                self.loop.call_soon_threadsafe(self.loop.stop)
            if not self.in_loop:
                self._thread.join()


class SyncClient:
    """The base of a sync twin: its asyncio twin runs in the I/O thread ``self._io``.

    A subclass starts the thread (``super().__init__(name)``) once its settings are checked,
    starts its core with :meth:`_start`, and closes with :meth:`_shut_down`; ``with`` closes.
    """

    def __init__(self, thread_name: str) -> None:
        self._io = LoopThread(thread_name)

    def _start(self, start: Coroutine[Any, Any, T]) -> T:
        """Run ``start`` in the I/O thread; if it fails, stop the thread and raise."""
        try:
            return self._io.run(start)
        except BaseException:
            self._io.stop()
            raise

    def _run_or_closed(self, coro: Coroutine[Any, Any, T], closed: T) -> T:
        """``coro``'s result, or ``closed`` when the client is closed meanwhile (by another thread)."""
        try:
            return self._io.run(coro)
        except (ClientClosed, concurrent.futures.CancelledError):
            return closed

    def _shut_down(self, close: Coroutine[Any, Any, None]) -> None:
        """Run ``close`` (the twin's) in the I/O thread, then stop the thread (a client closed
        before has no thread left to run it: it is only stopped again)."""
        with contextlib.suppress(ClientClosed, concurrent.futures.CancelledError):  # closed meanwhile
            self._io.run(close)
        self._io.stop()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
