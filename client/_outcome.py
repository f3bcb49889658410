"""What ``send`` returns: a light handle per message over one shared outcome per batch.

A producer batches messages, and the broker answers per batch (one base offset, or one error),
so the outcome lives once per batch (:class:`BatchOutcome`) and each message gets a
:class:`FutureRecord`: two slots, the outcome and the message's index in its batch. Nothing per
message is created for waiting: a ``threading.Event`` or an asyncio future is made per batch,
and only when somebody waits for a batch that is not finished yet. Per-message callbacks exist
only when given.

``FutureRecord`` offers what ``concurrent.futures.Future`` and ``asyncio.Future`` offered the
producer's callers: ``result(timeout)``, ``exception(timeout)``, ``done()``,
``add_done_callback(fn)`` (``fn(handle)``), and ``await handle`` (it also works with
``asyncio.gather`` and ``asyncio.wait``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Generator
from typing import Any

from ._io_thread import runs_loop
from ._types import RecordMetadata
from .errors import RaftmqError

__all__ = ["BatchOutcome", "DeliveryCallback", "FutureRecord"]

log = logging.getLogger("raftmq.client.producer")

DeliveryCallback = Callable[[RecordMetadata | None, RaftmqError | None], None]
"""``callback(metadata, error)``: exactly one of the two is None. Runs on the producer's I/O
thread (the event loop); keep it short and do not block in it."""

# Guards every outcome's waiters. Taken once when a batch finishes, and by a waiter or a
# done-callback that comes before the batch finished: a few times per batch, never per message.
_lock = threading.Lock()

# A waiter: a threading.Event (result() in a thread), an asyncio future (await), or a
# done-callback with its handle.
_Waiter = threading.Event | asyncio.Future[None] | tuple[Callable[["FutureRecord"], object], "FutureRecord"]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class BatchOutcome:
    """The outcome of one batch, shared by the handles of its messages.

    Written once, by the producer's I/O thread (:meth:`resolve` or :meth:`fail`); read from any
    thread. ``loop`` is the producer's event loop: a handle refuses to block the thread running
    it (it would wait for itself).
    """

    __slots__ = (
        "_offsets",
        "_waiters",
        "base_offset",
        "callbacks",
        "done",
        "error",
        "loop",
        "queue",
        "topic",
    )

    def __init__(self, topic: str, queue: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.topic = topic
        self.queue = queue
        self.loop = loop
        self.done = False
        self.base_offset = 0
        self._offsets: list[int] | None = None
        self.error: RaftmqError | None = None
        self.callbacks: list[tuple[int, DeliveryCallback]] = []  # (index, callback), when given
        self._waiters: list[_Waiter] = []

    def offset(self, index: int) -> int:
        if self._offsets is not None:
            return self._offsets[index]
        base = self.base_offset
        return base if base is None else base + index  # None: see _producer._offset

    def metadata(self, index: int) -> RecordMetadata:
        return RecordMetadata(self.topic, self.queue, self.offset(index))

    def resolve(self, queue: int, base_offset: int, offsets: list[int] | None = None) -> None:
        """Stored: message ``i`` is at ``base_offset + i`` (or ``offsets[i]``) of ``queue``."""
        if self.done:
            return
        self.queue, self.base_offset, self._offsets = queue, base_offset, offsets
        self._finish()

    def fail(self, error: RaftmqError) -> None:
        if self.done:
            return
        self.error = error
        self._finish()

    def _finish(self) -> None:
        with _lock:
            self.done = True
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            if isinstance(w, threading.Event):
                w.set()
            elif isinstance(w, asyncio.Future):
                _set_soon(w)
            else:
                _call(w[0], w[1])
        error = self.error
        for index, callback in self.callbacks:
            try:
                if error is None:
                    callback(self.metadata(index), None)
                else:
                    callback(None, error)
            except Exception:
                log.exception("delivery callback raised")

    # -- waiting (any thread) ----------------------------------------------------------------

    def wait(self, timeout_s: float | None) -> bool:
        """Block until finished; False on timeout."""
        if self.done:
            return True
        if self.loop is not None and runs_loop(self.loop):
            raise asyncio.InvalidStateError(
                "the message is not stored yet; its producer's I/O thread cannot wait for it"
            )
        if self.loop is not None and self.loop.is_closed():  # nothing will ever finish it
            raise asyncio.InvalidStateError("the message is not stored, and its producer's loop is closed")
        with _lock:
            if self.done:
                return True
            event = threading.Event()
            self._waiters.append(event)
        return event.wait(timeout_s)

    def add_waiter(self, waiter: _Waiter) -> bool:
        """Register ``waiter``; False (nothing registered) when the batch already finished."""
        with _lock:
            if self.done:
                return False
            self._waiters.append(waiter)
            return True

    def remove_waiter(self, waiter: _Waiter) -> int:
        with _lock:
            before = len(self._waiters)
            self._waiters = [w for w in self._waiters if w != waiter]
            return before - len(self._waiters)


def _set_soon(future: asyncio.Future[None]) -> None:
    loop = future.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _wake(future)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_wake, future)


def _call(fn: Callable[[FutureRecord], object], handle: FutureRecord) -> None:
    try:
        fn(handle)
    except Exception:
        log.exception("done callback raised")


class FutureRecord:
    """One sent message's outcome: where it was stored, or why not.

    The producer's ``send`` returns it at once. ``result()`` blocks until the message's batch is
    stored (or failed); ``await handle`` waits in asyncio. It behaves like the
    ``concurrent.futures.Future`` (sync ``Producer``) or ``asyncio.Future`` (``AsyncProducer``)
    earlier versions returned, without their cost per message: the outcome is shared by the
    batch.
    """

    __slots__ = ("_batch", "_index")
    _batch: BatchOutcome
    _index: int

    def __init__(self, batch: Any, index: int) -> None:
        """Made by the producer: ``batch`` is its batch's outcome, ``index`` its place there."""
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        """The message is stored or failed for good."""
        return self._batch.done

    def cancelled(self) -> bool:
        """Always False: a sent message cannot be called back."""
        return False

    def cancel(self) -> bool:
        """Always False (nothing is cancelled): a message in a batch goes with its batch."""
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The message's :class:`RecordMetadata` once stored (blocks up to ``timeout`` s).

        Raises:
            RaftmqError: The message was not stored (or may not have been: ``definite``).
            TimeoutError: ``timeout`` passed first.
            asyncio.InvalidStateError: Not finished, and called on the producer's own I/O
                thread (in a callback, or in the ``AsyncProducer``'s event loop: await it).
        """
        b = self._batch
        if not b.done and not b.wait(timeout):
            raise TimeoutError(f"the message was not stored within {timeout} s")
        if b.error is not None:
            raise b.error
        return b.metadata(self._index)

    def exception(self, timeout: float | None = None) -> RaftmqError | None:
        """The error, or None once stored (blocks as :meth:`result` does)."""
        b = self._batch
        if not b.done and not b.wait(timeout):
            raise TimeoutError(f"the message was not stored within {timeout} s")
        return b.error

    def add_done_callback(self, fn: Callable[[FutureRecord], object]) -> None:
        """Call ``fn(handle)`` once finished: on the producer's I/O thread, or now (in this
        thread) if it already is."""
        if not self._batch.add_waiter((fn, self)):
            _call(fn, self)

    def remove_done_callback(self, fn: Callable[[FutureRecord], object]) -> int:
        """Forget ``fn`` (registered with :meth:`add_done_callback`); returns how many went."""
        return self._batch.remove_waiter((fn, self))

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        b = self._batch
        if not b.done:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if b.add_waiter(future):
                yield from future.__await__()
        if b.error is not None:
            raise b.error
        return b.metadata(self._index)

    def __repr__(self) -> str:
        b = self._batch
        if not b.done:
            state = "pending"
        elif b.error is not None:
            state = f"failed: {b.error.code}"
        else:
            state = f"offset {b.offset(self._index)}"
        return f"<FutureRecord {b.topic}/{b.queue} #{self._index} {state}>"
