"""The producer's accumulator: per-queue batches waiting to be sent, with bounded memory.

Thread-safe (a sync producer appends from the application's threads; the sender takes batches on
the event loop's thread) and free of I/O; time comes in as arguments.

Each message is appended to its queue's open batch: a :class:`~._batch_writer.ColumnBatch`,
written as one record batch of format v2 (docs/format.md) when it is sent (the default), or, with
``wire="json"``, the JSON API's message objects. What ``send`` returns is a
:class:`~raftmq.client._outcome.FutureRecord`, two slots over the batch's one shared outcome:
nothing per message is kept for its outcome but a callback when one is given.

When a batch goes (``linger_s`` 0, the producer's default): at once when its queue has no batch
in flight and, for batches that share requests (``node_of``), its queue's leader has fewer than
``max_requests_per_leader`` requests in flight from this producer (first attempts); otherwise it
gathers the messages that arrive meanwhile and goes when one of those answers comes (natural
batching, as NATS's client flushes while its connection is busy and Kafka's producer batches
behind its requests in flight), or at the latest ``LEADER_WAIT_S`` after its first message. An
idle queue's first message therefore waits for nothing, and the busier a queue or its leader, the
larger the batches. With ``max_requests_per_leader`` 1 (the default) a batch waits for the answer
to its leader's other queues and goes with them (fewer, larger requests); above 1 it waits only
for its own queue's batch while the leader is below the limit. A full batch goes without waiting
for its leader (the peak rate needs no request to wait). With ``linger_s`` > 0 (an explicit
opt-in) a batch that is not full waits that long from its first message instead, leader or not.

Invariants:
- At most one batch per queue is in flight: a queue's next batch is sent only after the previous
  one succeeded or failed for good. This keeps per-queue order across retries: the broker
  refuses a duplicate sequence and one older than its window of 5, but not a gap, so a second
  batch in flight that got through while the first was retried would be stored before it.
- A request to a leader counts against ``max_requests_per_leader`` from when its batches are
  taken (one :meth:`Accumulator.ready` call's batches for one leader: one request, a claim) until
  the first attempt of each is answered (:meth:`Accumulator.release`) or it completes: a batch
  that waits for a retry's backoff holds its queue, never its leader's other queues.
- A batch's ``sequence`` (idempotent producers) is the next one of its queue when the batch is
  opened, in the order batches are opened, which is the order they are sent in. A batch that
  fails without ever being sent leaves a gap (the broker accepts gaps).
- ``buffered_bytes`` is the memory held by every batch not yet completed (queued or in flight):
  each message counts its bytes in the batch plus ``message_bytes`` (the objects that hold it
  until the batch is written), plus ``CALLBACK_BYTES`` when it has a callback, and each batch
  ``BATCH_BYTES`` (its objects); a unit test measures these with tracemalloc. It never exceeds
  ``max_buffer_bytes`` (a single larger message is refused up front).

Unkeyed messages are spread with uniform sticky batches (as Kafka's KIP-794): they stick to one
queue until ``sticky_bytes`` have gone there, then move to the queue that has had the fewest
unkeyed bytes of this producer so far (ties broken at random). Switching does not depend on when
batches are sent or sealed, so a slow queue (whose batch waits for the one in flight and grows)
gets no more than the others: over any run each queue's share is within one ``sticky_bytes`` of
an even split.
"""

from __future__ import annotations

import asyncio
import base64
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from raftmq.batch import HEADER_SIZE, join_frames, read, split_frames

from ._batch_writer import ColumnBatch
from ._outcome import BatchOutcome, DeliveryCallback, FutureRecord
from .errors import BufferFull, MessageTooLarge

__all__ = ["Accumulator", "Batch", "Wire"]

Wire = Literal["binary", "json"]
QueueKey = tuple[str, int]
RECORD_BYTES = 16  # a record table entry of format v2 (docs/format.md)
HEADER_ENTRY_BYTES = 8  # a header table entry
MESSAGE_BYTES = 64  # memory of a buffered message besides its bytes: its value's str and list slots
JSON_MESSAGE_BYTES = 40  # ... with wire="json": a bytes object (its header) and its list slot
CALLBACK_BYTES = 128  # ... plus this when send() was given a callback: (index, callback) in a list
BATCH_BYTES = 2_048  # the objects of one batch (builder, buffers, outcome)
STICKY_BYTES = 16 * 1024  # unkeyed messages go this many bytes to one queue, then move on
# With linger 0, a batch waits for its leader's answer at most this long: a request held up by one
# queue group (an election, a stalled commit) does not hold the other groups' queues on that node
# for the whole request timeout. Far above a round trip under load (tens of ms), so it never
# splits the natural batches.
LEADER_WAIT_S = 0.1
# With linger 0, a queue's batch goes at once while its leader has fewer requests than this in
# flight from the producer (first attempts); with 1 a batch waits for the answer to its leader's
# other queues, and goes with them. 1 is the default: more in flight was slower on two shared
# cores (docs/benchmarks.md, "Several requests per leader").
MAX_REQUESTS_PER_LEADER = 1
_JSON_OVERHEAD_BYTES = 128  # the JSON request's envelope: {"messages":[...],"producer_id":..,"sequence":..}
_FRAME_BYTES = 9  # a frame's prefix (docs/format.md, "Frames"): queue, topic_len 0, prefix_crc


class Batch:
    """Messages for one queue, sent as one produce request (one ``sequence``)."""

    __slots__ = (
        "_body",
        "builder",
        "claim",
        "count",
        "created_s",
        "done",
        "maybe_stored",
        "memory_bytes",
        "node",
        "outcome",
        "parts",
        "queue",
        "sealed",
        "sequence",
        "size_bytes",
        "topic",
        "waiters",
        "wire",
    )

    def __init__(
        self,
        topic: str,
        queue: int,
        created_s: float,
        *,
        wire: Wire = "binary",
        producer_id: str | None = None,
        sequence: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.topic = topic
        self.queue = queue
        self.created_s = created_s
        self.wire = wire
        self.sequence = sequence  # with a producer id: fixed when opened, kept across retries
        self.builder: ColumnBatch | None = None
        self.parts: list[bytes] | None = None
        if wire == "binary":
            self.builder = ColumnBatch(producer_id, sequence or 0)
            self.size_bytes = _FRAME_BYTES + HEADER_SIZE + len((producer_id or "").encode())
        else:
            self.parts = []
            self.size_bytes = _JSON_OVERHEAD_BYTES
        self.count = 0
        self.memory_bytes = 0  # what it holds in the buffer (against max_buffer_bytes)
        self.sealed = False  # no more messages join it
        self.done = False
        self.maybe_stored = False  # an attempt is in flight, or one's outcome was unknown
        self.node: object = None  # the leader it was taken for (with node_of)
        self.claim: _Claim | None = None  # its request's hold on ``node``, until its first answer
        self.waiters: list[Callable[[], None]] = []  # called once done
        self.outcome = BatchOutcome(topic, queue, loop)
        self._body: bytes | None = None

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.queue)

    def body(self, producer_id: str | None) -> bytes:
        """The produce request's body: one frame (binary), or the JSON API's object. Built once
        (the builder's buffers are let go), so every retry sends the same bytes."""
        if self._body is None:
            if self.builder is not None:
                self._body = join_frames([(self.queue, None, self.builder.finish())])
                self.builder = None
            else:
                self._body = json_body(self.parts or [], producer_id, self.sequence)
                self.parts = None
        return self._body

    def as_json(self, producer_id: str | None) -> bytes:
        """The JSON API's body carrying the same messages and sequence (a node that does not
        take the binary format). Decodes the binary body: per-message work, on this path only."""
        if self.wire == "json":
            return self.body(producer_id)
        parts = []
        for frame in split_frames(self.body(producer_id)):
            for r in read(frame.batch).records():
                value: str | bytes = bytes(r.value) if r.binary else str(r.value, "utf-8")
                encoded, _ = encode_message(value, r.key, r.headers)
                parts.append(with_queue(encoded, self.queue))
        return json_body(parts, producer_id, self.sequence)


def json_body(parts: list[bytes], producer_id: str | None, sequence: int | None) -> bytes:
    """The JSON produce request of ``parts`` (messages with their queue)."""
    out = b'{"messages":[' + b",".join(parts) + b"]"
    if producer_id is not None and sequence is not None:
        out += b',"producer_id":' + orjson.dumps(producer_id) + b',"sequence":%d' % sequence
    return out + b"}"


def message_size(value: str | bytes, key: str | None, headers: Mapping[str, str] | None) -> int:
    """The message's size as the broker counts it against ``max_message_bytes``: the bytes of
    the value, the key and each header name and value (UTF-8)."""
    size = len(value) if type(value) is not str or value.isascii() else len(value.encode())
    if key is not None:
        size += len(key) if key.isascii() else len(key.encode())
    if headers:
        size += sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())
    return size


def encode_message(
    value: str | bytes, key: str | None, headers: Mapping[str, str] | None
) -> tuple[bytes, int]:
    """The message as the JSON API's object without its queue (``{...}``), and its size (see
    :func:`message_size`)."""
    body: dict[str, object] = (
        {"value": value} if isinstance(value, str) else {"value_b64": base64.b64encode(value).decode()}
    )
    if key is not None:
        body["key"] = key
    if headers:
        body["headers"] = dict(headers)
    return orjson.dumps(body), message_size(value, key, headers)


def with_queue(encoded: bytes, queue: int) -> bytes:
    """``encoded`` (a JSON object) with ``"queue": queue`` as its first field."""
    return b'{"queue":%d,' % queue + encoded[1:]


class _Claim:
    """One request's hold on its leader: the batches of it whose first attempt is unanswered."""

    __slots__ = ("left", "node")

    def __init__(self, node: object, batches: int) -> None:
        self.node = node
        self.left = batches


@dataclass
class _Sticky:
    """A topic's unkeyed stream: the current queue, the bytes it may still take, and the unkeyed
    bytes each queue had so far."""

    queue: int
    left: int
    sent: list[int]


class Accumulator:
    """Batches per queue; see the module docstring for the invariants.

    Args:
        wire: ``"binary"`` (format v2 batches) or ``"json"`` (the JSON API's messages).
        producer_id: The idempotent producer's id (batches are numbered per queue), or None.
        loop: The event loop that completes batches (the producer's): a handle refuses to block
            the thread running it.
        max_requests_per_leader: With ``linger_s`` 0 and ``node_of``, the requests in flight to
            one leader (first attempts) below which a queue's batch goes at once.
    """

    def __init__(
        self,
        *,
        linger_s: float,
        max_batch_bytes: int,
        max_batch_messages: int,
        max_buffer_bytes: int,
        rand: random.Random | None = None,
        sticky_bytes: int = STICKY_BYTES,
        message_bytes: int | None = None,
        wire: Wire = "binary",
        producer_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        max_requests_per_leader: int = MAX_REQUESTS_PER_LEADER,
    ) -> None:
        self.linger_s = linger_s
        self.max_requests_per_leader = max_requests_per_leader
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_messages = max_batch_messages
        self.max_buffer_bytes = max_buffer_bytes
        self.wire: Wire = wire
        self.producer_id = producer_id
        self.loop = loop
        self._lock = threading.Lock()
        self.space = threading.Condition(self._lock)  # notified when buffered bytes drop
        self._queues: dict[QueueKey, deque[Batch]] = {}
        self._open: dict[QueueKey, Batch] = {}  # the batch of each queue that messages join
        self._in_flight: dict[QueueKey, Batch] = {}
        self._busy: dict[object, int] = {}  # leader -> its requests (claims) in flight
        self._node_of: Callable[[QueueKey], object] | None = None  # as the last ready() was given
        self._sequences: dict[QueueKey, int] = {}
        self.sticky_bytes = max(1, min(sticky_bytes, max_batch_bytes))
        if message_bytes is None:
            message_bytes = MESSAGE_BYTES if wire == "binary" else JSON_MESSAGE_BYTES
        self.message_bytes = message_bytes
        self._sticky: dict[str, _Sticky] = {}
        self._rand = rand or random.Random()
        self._pressure = False  # an append found the buffer full: send what is there now
        self._next_s: float | None = None  # when the sender wakes next by itself (ready()'s answer)
        self.buffered_bytes = 0
        self.on_space: Callable[[], None] | None = None
        self.on_wake: Callable[[], None] | None = None  # a batch filled, or opened that can go sooner

    # -- appending (any thread) ------------------------------------------------------------------

    def try_append(
        self,
        topic: str,
        queue: int | None,
        queues: int,
        value: str | bytes,
        key: str | None,
        headers: Mapping[str, str] | None,
        size: int,
        callback: DeliveryCallback | None,
        now_s: float | None = None,
    ) -> FutureRecord | None:
        """Add one message to its queue's open batch.

        Args:
            queue: The queue, or None for an unkeyed message (uniform sticky: ``sticky_bytes`` to
                one queue, then the least-loaded queue; see the module docstring).
            queues: The topic's queue count.
            size: The message's size (:func:`message_size`).
            callback: Called with the outcome, if given.
            now_s: The time (monotonic s), if a new batch is opened (default: read the clock).

        Returns:
            The message's handle (``on_wake`` was called if a batch filled, or opened due before
            the sender's next wake-up);
            None when the buffer has no room (nothing was added).

        Raises:
            MessageTooLarge: The message alone exceeds ``max_buffer_bytes``.
        """
        parts: bytes | None = None
        if self.wire == "binary":
            wire_size = size + RECORD_BYTES
            if headers:
                wire_size += HEADER_ENTRY_BYTES * len(headers)
        else:
            parts, _ = encode_message(value, key, headers)
            wire_size = len(parts) + 16
        memory = wire_size + self.message_bytes
        if callback is not None:
            memory += CALLBACK_BYTES
        if memory > self.max_buffer_bytes:
            raise MessageTooLarge(f"a message of {wire_size} bytes exceeds max_buffer_bytes")
        wake = False
        with self._lock:
            buffered = self.buffered_bytes
            if buffered + memory > self.max_buffer_bytes and buffered > 0:
                self._pressure = True
                return None
            if queue is None:
                sticky = self._sticky.get(topic)
                if sticky is not None and sticky.left > 0 and len(sticky.sent) == queues:
                    queue = sticky.queue
                    sticky.left -= wire_size
                    sticky.sent[queue] += wire_size
                else:
                    queue = self._sticky_queue(topic, queues, wire_size)
            qkey = (topic, queue)
            batch = self._open.get(qkey)  # an open batch holds 1 to max_batch_messages - 1 messages
            if batch is None or batch.size_bytes + wire_size > self.max_batch_bytes:
                if batch is not None:
                    batch.sealed = True
                batch = self._new_batch(qkey, time.monotonic() if now_s is None else now_s)
                memory += BATCH_BYTES
                wake = self._goes_now(qkey, batch.created_s)
            if batch.builder is not None:
                index = batch.builder.append(value, key, headers)
            else:  # wire="json", or the producer turned to JSON since this message was sized
                if parts is None:
                    parts, _ = encode_message(value, key, headers)
                index = batch.count
                batch.parts.append(with_queue(parts, queue))  # type: ignore[union-attr]
            if callback is not None:
                batch.outcome.callbacks.append((index, callback))
            batch.count = index + 1
            batch.size_bytes += wire_size
            batch.memory_bytes += memory
            self.buffered_bytes = buffered + memory
            if index + 1 >= self.max_batch_messages or batch.size_bytes >= self.max_batch_bytes:
                batch.sealed = True
                del self._open[qkey]
                wake = True
        if wake and self.on_wake is not None:
            self.on_wake()
        return FutureRecord(batch.outcome, index)

    def _goes_now(self, qkey: QueueKey, created_s: float) -> bool:
        """Whether a batch just opened needs the sender woken (under the lock): lingering, if it
        is due before the sender wakes anyway; else if nothing holds it back, since what holds
        it (its queue's batch in flight, its leader's requests) wakes the sender when it ends."""
        if self.linger_s > 0:
            return self._next_s is None or self._next_s > created_s + self.linger_s
        if qkey in self._in_flight:
            return False
        return self._node_of is None or self._leader_free(self._node_of(qkey))

    def _leader_free(self, node: object) -> bool:
        """Whether ``node`` may take another request now (under the lock)."""
        return self._busy.get(node, 0) < self.max_requests_per_leader

    def _new_batch(self, qkey: QueueKey, now_s: float) -> Batch:
        sequence = None
        if self.producer_id is not None:
            sequence = self._sequences.get(qkey, 0)
            self._sequences[qkey] = sequence + 1
        batch = Batch(
            qkey[0],
            qkey[1],
            now_s,
            wire=self.wire,
            producer_id=self.producer_id,
            sequence=sequence,
            loop=self.loop,
        )
        self._open[qkey] = batch
        dq = self._queues.get(qkey)
        if dq is None:
            dq = self._queues[qkey] = deque()
        dq.append(batch)
        return batch

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

    def ready(
        self,
        now_s: float,
        *,
        all_now: bool = False,
        node_of: Callable[[QueueKey], object] | None = None,
    ) -> tuple[list[Batch], float | None]:
        """Take the batches to send now: the head of each queue not in flight, if it is sealed,
        or ``all_now`` (flush, close) or the buffer is under pressure, or (see the module
        docstring) it has lingered ``linger_s`` or, with ``linger_s`` 0, its leader (``node_of``)
        has fewer than ``max_requests_per_leader`` requests in flight.

        With ``node_of`` (a queue's leader), the head of every other queue not in flight whose
        leader is the leader of a batch taken is taken too, lingered or not (as Kafka drains every
        partition of a ready broker): it rides in the same request instead of waiting for a
        request of its own. The batches taken for one leader are one request in flight there
        (a claim) until :meth:`release` of each.

        Returns:
            The batches (now in flight) and the earliest time a waiting batch becomes ready
            (with a busy leader, ``LEADER_WAIT_S`` from now at the latest): the caller wakes then
            (or when ``on_wake`` is called: a batch opened that can go earlier, a batch filled, a
            batch completed or released its leader).
        """
        taken: list[Batch] = []
        waiting: list[tuple[QueueKey, float]] = []  # (queue, when it is due at the latest)
        linger_s = self.linger_s
        with self._lock:
            self._node_of = node_of
            urgent = all_now or self._pressure
            for key, dq in self._queues.items():
                if not dq or key in self._in_flight:
                    continue
                head = dq[0]
                if urgent or head.sealed or len(dq) > 1:
                    go, due = True, now_s
                elif linger_s > 0:
                    due = head.created_s + linger_s
                    go = now_s >= due
                else:  # the busy leaders are those of earlier calls: this call's go together
                    due = head.created_s + LEADER_WAIT_S
                    go = node_of is None or now_s >= due or self._leader_free(node_of(key))
                if go:
                    self._take(key, dq)
                    taken.append(head)
                else:
                    waiting.append((key, due))
            if node_of is not None and taken:
                by_node: dict[object, list[Batch]] = {}
                for b in taken:
                    b.node = node_of(b.key)
                    by_node.setdefault(b.node, []).append(b)
                for key, _ in waiting:
                    node = node_of(key)
                    if node in by_node:
                        b = self._take(key, self._queues[key])
                        b.node = node
                        by_node[node].append(b)
                        taken.append(b)
                waiting = [(k, d) for k, d in waiting if k not in self._in_flight]
                for node, batches in by_node.items():
                    claim = _Claim(node, len(batches))
                    for b in batches:
                        b.claim = claim
                    self._busy[node] = self._busy.get(node, 0) + 1
            for key in [k for k, dq in self._queues.items() if not dq and k not in self._in_flight]:
                del self._queues[key]
            dues = [due for _, due in waiting]
            if self._busy and linger_s == 0:  # a batch opened later waits no more than LEADER_WAIT_S
                dues.append(now_s + LEADER_WAIT_S)
            self._next_s = next_s = min(dues, default=None)
        return taken, next_s

    def _take(self, key: QueueKey, dq: deque[Batch]) -> Batch:
        """Seal the head of ``key``'s queue and put it in flight (under the lock)."""
        head = dq.popleft()
        if not head.sealed:
            head.sealed = True
            del self._open[key]
        self._in_flight[key] = head
        return head

    def release(self, batches: list[Batch]) -> bool:
        """The first attempt of ``batches`` is answered (or failed): their leader may take the
        next request (a retry does not hold it). Returns whether a leader went below its limit
        of requests in flight: the sender should look at what waited for it."""
        with self._lock:
            return self._release(batches)

    def _release(self, batches: list[Batch]) -> bool:
        freed = False
        for b in batches:
            claim = b.claim
            if claim is None:
                continue
            b.claim = None
            claim.left -= 1
            if claim.left:
                continue
            requests = self._busy[claim.node]
            if requests > 1:
                self._busy[claim.node] = requests - 1
            else:
                del self._busy[claim.node]
            freed = freed or requests == self.max_requests_per_leader
        return freed

    def complete(self, batch: Batch) -> None:
        """The batch succeeded or failed for good: free its bytes, its queue and its leader."""
        with self._lock:
            self._release([batch])
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
            self._open.clear()
            return out

    def empty(self) -> bool:
        with self._lock:
            return not self._in_flight and not any(self._queues.values())

    def drain(self) -> list[Batch]:
        """Remove and return every queued (not in-flight) batch (closing without sending)."""
        with self._lock:
            out = [b for dq in self._queues.values() for b in dq]
            self._queues.clear()
            self._open.clear()
            return out

    def wait_space_blocking(self, timeout_s: float) -> bool:
        """Wait (in an application thread) until some bytes are freed; False on timeout."""
        with self._lock:
            return self.space.wait(timeout_s)


def buffer_full(max_block_ms: int) -> BufferFull:
    return BufferFull(f"the producer's buffer stayed full for {max_block_ms} ms")
