"""The producer's accumulator: per-queue batches waiting to be sent, with bounded memory.

Thread-safe (a sync producer appends from the application's threads; the sender takes batches on
the event loop's thread) and free of I/O; time comes in as arguments.

Invariants:
- At most one batch per queue is in flight: a queue's next batch is sent only after the previous
  one succeeded or failed for good. This keeps per-queue order across retries, and keeps a retried
  batch within the broker's memory of each producer's last sequences per queue.
- ``buffered_bytes`` is the memory held by every batch not yet completed (queued or in flight):
  each message counts its encoded size plus ``message_bytes``, the Python objects that come with
  it (its delivery and future: about 1.8 KB with a ``concurrent.futures.Future``, which dwarfs a
  small message; counting only the encoded bytes let 32 MiB hold a million messages and 1.9 GB).
  It never exceeds ``max_buffer_bytes`` (a single larger message is refused up front).

Unkeyed messages are spread with uniform sticky batches (as Kafka's KIP-794): they stick to one
queue until ``sticky_bytes`` have gone there, then move to the queue that has had the fewest
unkeyed bytes of this producer so far (ties broken at random). Switching does not depend on when
batches are sent or sealed, so a slow queue (whose batch waits for the one in flight and grows)
gets no more than the others: over any run each queue's share is within one ``sticky_bytes`` of
an even split.
"""

from __future__ import annotations

import base64
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from ._types import RecordMetadata
from .errors import BufferFull, MessageTooLarge, RaftmqError

__all__ = ["Accumulator", "Batch", "Delivery"]

QueueKey = tuple[str, int]
MESSAGE_BYTES = 256  # memory of a buffered message besides its encoded bytes (asyncio future)
SYNC_MESSAGE_BYTES = 1_792  # ... with a concurrent.futures.Future (the sync Producer)
STICKY_BYTES = 16 * 1024  # unkeyed messages go this many bytes to one queue, then move on
_OVERHEAD_BYTES = 128  # the request's envelope: {"messages":[...],"producer_id":..,"sequence":..}


class Delivery(Protocol):
    """Where one message's outcome goes (a future, and maybe a callback)."""

    def resolve(self, metadata: RecordMetadata) -> None: ...

    def fail(self, error: RaftmqError) -> None: ...


@dataclass(eq=False)
class Batch:
    """Messages for one queue, sent as one produce request (one ``sequence``)."""

    topic: str
    queue: int
    created_s: float
    parts: list[bytes] = field(default_factory=list)  # each message, JSON-encoded
    deliveries: list[Delivery] = field(default_factory=list)
    size_bytes: int = _OVERHEAD_BYTES  # the request's size (against max_batch_bytes)
    memory_bytes: int = 0  # what it holds in the buffer (against max_buffer_bytes)
    sealed: bool = False  # no more messages join it
    sequence: int | None = None  # assigned when first sent, kept across retries
    done: bool = False
    maybe_stored: bool = False  # an attempt is in flight, or one's outcome was unknown
    waiters: list[Callable[[], None]] = field(default_factory=list)  # called once done

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.queue)

    def body(self, producer_id: str | None) -> bytes:
        """The produce request's JSON body."""
        out = b'{"messages":[' + b",".join(self.parts) + b"]"
        if producer_id is not None and self.sequence is not None:
            out += b',"producer_id":' + orjson.dumps(producer_id) + b',"sequence":%d' % self.sequence
        return out + b"}"


def encode_message(value: str | bytes, key: str | None, headers: dict[str, str] | None) -> tuple[bytes, int]:
    """The message as JSON without its queue (``{...}``), and its size as the broker counts it
    against ``max_message_bytes`` (value, key and headers in bytes)."""
    body: dict[str, object]
    if isinstance(value, str):
        body = {"value": value}
        size = len(value.encode())
    else:
        body = {"value_b64": base64.b64encode(value).decode()}
        size = len(value)
    if key is not None:
        body["key"] = key
        size += len(key.encode())
    if headers:
        body["headers"] = headers
        size += sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())
    return orjson.dumps(body), size


def with_queue(encoded: bytes, queue: int) -> bytes:
    """``encoded`` (a JSON object) with ``"queue": queue`` as its first field."""
    return b'{"queue":%d,' % queue + encoded[1:]


@dataclass
class _Sticky:
    """A topic's unkeyed stream: the current queue, the bytes it may still take, and the unkeyed
    bytes each queue had so far."""

    queue: int
    left: int
    sent: list[int]


class Accumulator:
    """Batches per queue; see the module docstring for the invariants."""

    def __init__(
        self,
        *,
        linger_s: float,
        max_batch_bytes: int,
        max_batch_messages: int,
        max_buffer_bytes: int,
        rand: random.Random | None = None,
        sticky_bytes: int = STICKY_BYTES,
        message_bytes: int = MESSAGE_BYTES,
    ) -> None:
        self.linger_s = linger_s
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_messages = max_batch_messages
        self.max_buffer_bytes = max_buffer_bytes
        self._lock = threading.Lock()
        self.space = threading.Condition(self._lock)  # notified when buffered bytes drop
        self._queues: dict[QueueKey, deque[Batch]] = {}
        self._in_flight: dict[QueueKey, Batch] = {}
        self._sequences: dict[QueueKey, int] = {}
        self.sticky_bytes = max(1, min(sticky_bytes, max_batch_bytes))
        self.message_bytes = message_bytes
        self._sticky: dict[str, _Sticky] = {}
        self._rand = rand or random.Random()
        self._pressure = False  # an append found the buffer full: send what is there now
        self.buffered_bytes = 0
        self.on_space: Callable[[], None] | None = None

    # -- appending (any thread) ------------------------------------------------------------------

    def try_append(
        self,
        topic: str,
        queue: int | None,
        queues: int,
        encoded: bytes,
        delivery: Delivery,
        now_s: float,
    ) -> tuple[int, bool] | None:
        """Add one message (``encoded`` by :func:`encode_message`) to its queue's open batch.

        Args:
            queue: The queue, or None for an unkeyed message (uniform sticky: ``sticky_bytes`` to
                one queue, then the least-loaded queue; see the module docstring).
            queues: The topic's queue count.

        Returns:
            ``(queue, wake)``, ``wake`` telling the sender a batch was started or filled; None when
            the buffer has no room (nothing was added).

        Raises:
            MessageTooLarge: The message alone exceeds ``max_buffer_bytes``.
        """
        size = len(encoded) + 16
        memory = size + self.message_bytes
        if size + _OVERHEAD_BYTES > self.max_buffer_bytes:
            raise MessageTooLarge(f"a message of {size} bytes exceeds max_buffer_bytes")
        with self._lock:
            if self.buffered_bytes > 0 and self.buffered_bytes + memory > self.max_buffer_bytes:
                self._pressure = True
                return None
            if queue is None:
                queue = self._sticky_queue(topic, queues, size)
            key = (topic, queue)
            dq = self._queues.setdefault(key, deque())
            batch = dq[-1] if dq else None
            wake = False
            if (
                batch is None
                or batch.sealed
                or len(batch.parts) >= self.max_batch_messages
                or (batch.parts and batch.size_bytes + size > self.max_batch_bytes)
            ):
                if batch is not None:
                    batch.sealed = True
                batch = Batch(topic, queue, now_s)
                dq.append(batch)
                wake = True
            batch.parts.append(with_queue(encoded, queue))
            batch.deliveries.append(delivery)
            batch.size_bytes += size
            batch.memory_bytes += memory
            self.buffered_bytes += memory
            if batch.size_bytes >= self.max_batch_bytes or len(batch.parts) >= self.max_batch_messages:
                batch.sealed = True
                wake = True
            return queue, wake

    def _sticky_queue(self, topic: str, queues: int, size: int) -> int:
        """The queue of an unkeyed message of ``size`` bytes (counted against the stick)."""
        state = self._sticky.get(topic)
        if state is None:
            state = self._sticky[topic] = _Sticky(-1, 0, [0] * queues)
        elif len(state.sent) != queues:  # the topic's queue count changed: new queues start level
            floor = min(state.sent[:queues], default=0)
            state.sent = (state.sent + [floor] * queues)[:queues]
            if state.queue >= queues:
                state.left = 0
        if state.left <= 0:
            least = min(state.sent)
            state.queue = self._rand.choice([q for q, n in enumerate(state.sent) if n == least])
            state.left = self.sticky_bytes
        state.left -= size
        state.sent[state.queue] += size
        return state.queue

    # -- sending (the event loop's thread) -------------------------------------------------------

    def ready(self, now_s: float, *, all_now: bool = False) -> tuple[list[Batch], float | None]:
        """Take the batches to send now: the head of each queue not in flight, if it is sealed,
        has lingered ``linger_s``, or ``all_now`` (flush, close) or the buffer is under pressure.

        Returns:
            The batches (now in flight) and the earliest time another batch becomes ready.
        """
        taken: list[Batch] = []
        next_s: float | None = None
        with self._lock:
            urgent = all_now or self._pressure
            for key, dq in self._queues.items():
                if not dq or key in self._in_flight:
                    continue
                head = dq[0]
                due = head.created_s + self.linger_s
                if urgent or head.sealed or len(dq) > 1 or now_s >= due:
                    dq.popleft()
                    head.sealed = True
                    self._in_flight[key] = head
                    taken.append(head)
                elif next_s is None or due < next_s:
                    next_s = due
            for key in [k for k, dq in self._queues.items() if not dq and k not in self._in_flight]:
                del self._queues[key]
        return taken, next_s

    def next_sequence(self, key: QueueKey) -> int:
        with self._lock:
            seq = self._sequences.get(key, 0)
            self._sequences[key] = seq + 1
            return seq

    def complete(self, batch: Batch) -> None:
        """The batch succeeded or failed for good: free its bytes and its queue."""
        with self._lock:
            if self._in_flight.get(batch.key) is batch:
                del self._in_flight[batch.key]
            self.buffered_bytes -= batch.memory_bytes
            self._pressure = False
            batch.done = True
            self.space.notify_all()
        for waiter in batch.waiters:
            waiter()
        if self.on_space is not None:
            self.on_space()

    def unfinished(self) -> list[Batch]:
        """Every batch not completed (queued or in flight), sealing the open ones (flush)."""
        with self._lock:
            out = list(self._in_flight.values())
            for dq in self._queues.values():
                for b in dq:
                    b.sealed = True
                    out.append(b)
            return out

    def empty(self) -> bool:
        with self._lock:
            return not self._in_flight and not any(self._queues.values())

    def drain(self) -> list[Batch]:
        """Remove and return every queued (not in-flight) batch (closing without sending)."""
        with self._lock:
            out = [b for dq in self._queues.values() for b in dq]
            self._queues.clear()
            return out

    def wait_space_blocking(self, timeout_s: float) -> bool:
        """Wait (in an application thread) until some bytes are freed; False on timeout."""
        with self._lock:
            return self.space.wait(timeout_s)


def buffer_full(max_block_ms: int) -> BufferFull:
    return BufferFull(f"the producer's buffer stayed full for {max_block_ms} ms")
