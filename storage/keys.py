"""The key layout of one queue group's store.

Every integer is unsigned big-endian, so that the store's bytewise key order is numeric order:
``topic_id`` u32, ``queue`` u32, offsets and times u64. Names are UTF-8. A name that ends a key is
written bare (a fixed-width prefix never collides with it); a consumer group name followed by more
key fields is written length-prefixed (``glen`` u8, then its bytes, written ``[group]`` below),
which keeps keys prefix-free, so the keys of one (topic, queue, group) form one contiguous range.

======================================================  ======================================
key                                                     value
======================================================  ======================================
``A``                                                   applied_index u64 (see :data:`APPLIED`)
``D`` topic_id                                          empty: the topic was dropped (tombstone)
``O`` topic_id queue group                              committed offset u64 of consumer group
``P`` topic_id queue producer_id                        :class:`ProducerState` (last sequences)
``W`` last_used_ms topic_id queue producer_id           empty: producer idle index, by last use
``G``                                                   producer sweep cursor (see below)
``K``                                                   u64: the cap on ``W`` keys (see below)
``T``                                                   :class:`GroupTime` (leader time applied)
``Q`` topic_id queue                                    :class:`QueueMeta`
``R`` topic_id queue base_offset                        one record batch (``storage/records.py``)
``S`` topic_id queue [group]                            delivery cursor u64 (receive/ack)
``I`` topic_id queue [group] offset                     :class:`PendingRecord` (in flight/retry)
``Y`` topic_id queue [group] due_ms offset              empty: retry index, by due time
``X`` topic_id queue [group]                            :class:`LockState` (ordered consumption)
``U`` topic_id [group]                                  subscription settings (orjson)
``V`` topic_id queue                                    redrive offset u64 of a dead-letter queue
``E`` deadline_ms topic_id queue [group] offset         receipt token u64: deadline index
``L`` due_ms topic_id queue raft_index position         one delayed message (a 1-record batch)
``F`` topic_id queue dedup_key                          :class:`DedupEntry` (deduplication window)
``f`` expires_ms topic_id queue dedup_key               empty: dedup window index, by expiry
``N`` topic_id queue                                    u64: entries in the dedup window of a queue
======================================================  ======================================

The receive/ack keys are described in ``docs/delivery.md``. ``E``, ``L`` and ``W`` start with a
time so that a tick finds what is due with one ordered scan; they are not removed by ``drop_topic``
(they are checked against the per-topic keys when due, and a dangling one is deleted then).

``W`` holds one key per ``P`` key whose state has a ``last_used_ms`` (``cluster/machines/producers.py``
expires idle producer states through it). ``G`` is written by the group's first
``expire_producers``, which starts a one-time sweep giving every ``P`` state a time: its value is
the next ``P`` key to look at, or empty when the sweep is done. Until ``G`` exists, producer states
are written in the old encoding (no time) and there are no ``W`` keys, exactly as releases before
producer expiry wrote them. ``K`` is written by the first ``expire_producers`` carrying a
``max_states`` (``cluster/machines/producers.py``); while it exists an append that would make more
``W`` keys than it holds forgets the least recently used states first.

The topic id comes first after the prefix byte in every per-topic key (all but ``E``, ``L`` and
``W``), so dropping a topic is one ``delete_range`` per prefix (:func:`topic_range`).

Invariants:
- A queue's record batches tile ``[low_offset, high_offset)`` exactly: the first batch starts at
  ``low_offset``, each next batch starts where the previous one ends, the last ends at
  ``high_offset``. So ``last_before(record_key(t, q, offset), record_prefix(t, q))`` finds the batch
  holding ``offset`` for any ``low_offset <= offset < high_offset``.
- ``retained_bytes`` is the sum of the encoded sizes (store value lengths) of the queue's batches.
- A ``P`` state with ``last_used_ms = t`` has exactly one ``W`` key, the one with time ``t``; a ``W``
  key whose ``P`` state is gone or has another time is dangling (only ever left by ``drop_topic``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .records import CorruptRecord

__all__ = [
    "APPLIED",
    "DEADLINE",
    "DEDUP",
    "DEDUP_COUNT",
    "DEDUP_EXPIRY",
    "DELAYED",
    "DROPPED",
    "GROUP_MAX_STEP_MS",
    "GROUP_TIME",
    "LOCK",
    "MAX_U32",
    "MAX_U64",
    "META",
    "OFFSET",
    "PENDING",
    "PRODUCER",
    "PRODUCER_CAP",
    "PRODUCER_IDLE",
    "PRODUCER_SEQUENCES_KEPT",
    "PRODUCER_SWEEP",
    "RECORD",
    "REDRIVE",
    "RETRY",
    "STATE_INFLIGHT",
    "STATE_RETRY",
    "SUBSCRIPTION",
    "SUB_CURSOR",
    "TOPIC_PREFIXES",
    "GroupTime",
    "LockState",
    "PendingRecord",
    "ProducerState",
    "QueueMeta",
    "deadline_key",
    "decode_deadline_key",
    "decode_delayed_key",
    "decode_producer_idle_key",
    "decode_producer_key",
    "decode_u64",
    "delayed_key",
    "dropped_key",
    "encode_u64",
    "lock_key",
    "meta_key",
    "offset_key",
    "pending_key",
    "prefix_end",
    "producer_idle_key",
    "producer_key",
    "queue_range",
    "record_key",
    "record_prefix",
    "redrive_key",
    "retry_key",
    "sub_key",
    "subscription_key",
    "topic_range",
]

MAX_U32 = 0xFFFF_FFFF
MAX_U64 = 0xFFFF_FFFF_FFFF_FFFF

APPLIED = b"A"
"""Key of the raft index of the last applied command; written in the same batch as every apply."""
DROPPED = b"D"
OFFSET = b"O"
PRODUCER = b"P"
META = b"Q"
RECORD = b"R"
SUB_CURSOR = b"S"
PENDING = b"I"
RETRY = b"Y"
LOCK = b"X"
SUBSCRIPTION = b"U"
REDRIVE = b"V"
DEADLINE = b"E"
DELAYED = b"L"
SEGMENT = b"s"
"""Sealed segments of a queue (cluster/machines/segments.py)."""
PRODUCER_IDLE = b"W"
"""Producer states by last use (``cluster/machines/producers.py``)."""
PRODUCER_CAP = b"K"
"""The cap on live producer states of the group (``cluster/machines/producers.py``)."""
PRODUCER_SWEEP = b"G"
"""The one-time sweep that gives producer states of the old encoding a time
(``cluster/machines/producers.py``)."""
GROUP_TIME = b"T"
"""The group's applied leader time (:class:`GroupTime`, ``cluster/machines/queue_group.py``)."""
DEDUP = b"F"
"""A deduplication id remembered for a queue (``storage/dedup_keys.py``, ``cluster/machines/dedup.py``)."""
DEDUP_EXPIRY = b"f"
"""The deduplication window's entries by expiry time (``cluster/machines/dedup.py``)."""
DEDUP_COUNT = b"N"
"""How many entries a queue's deduplication window holds (``cluster/machines/dedup.py``)."""
# Every prefix above is in use; a prefix is never reused for another meaning (stored data would
# be misread after an upgrade). New kinds of keys take a new byte.

TOPIC_PREFIXES: tuple[bytes, ...] = (
    OFFSET,
    PRODUCER,
    META,
    RECORD,
    SUB_CURSOR,
    PENDING,
    RETRY,
    LOCK,
    SUBSCRIPTION,
    REDRIVE,
    DEDUP,
    DEDUP_COUNT,
)
"""The prefixes whose keys belong to one topic (everything ``drop_topic`` removes)."""

PRODUCER_SEQUENCES_KEPT = 5
"""How many recent (sequence, base_offset, count) entries a producer's state remembers per queue."""

_U64 = struct.Struct(">Q")
_TOPIC = struct.Struct(">cI")
_QUEUE = struct.Struct(">cII")
_RECORD = struct.Struct(">cIIQ")
_META = struct.Struct(">QQQ")
_PRODUCER_HEAD = struct.Struct(">B")
_PRODUCER_TIMED_HEAD = struct.Struct(">BQB")  # PRODUCER_TIMED, last_used_ms, entry count
_PRODUCER_TIMED = 0x80  # never an entry count of the old encoding (at most PRODUCER_SEQUENCES_KEPT)
_PRODUCER_IDLE = struct.Struct(">cQII")
_PRODUCER_ENTRY = struct.Struct(">QQI")
_U8 = struct.Struct(">B")
_TWO_U64 = struct.Struct(">QQ")
_DEADLINE_HEAD = struct.Struct(">cQII")
_DELAYED = struct.Struct(">cQIIQI")
_PENDING = struct.Struct(">BIQQQQ")
_LOCK = struct.Struct(">QQ")


def encode_u64(value: int) -> bytes:
    """``value`` as 8 big-endian bytes."""
    return _U64.pack(value)


def decode_u64(data: bytes) -> int:
    """The integer :func:`encode_u64` wrote.

    Raises:
        CorruptRecord: ``data`` is not 8 bytes long.
    """
    if len(data) != _U64.size:
        raise CorruptRecord(f"expected an 8-byte integer, got {len(data)} bytes")
    (value,) = _U64.unpack(data)
    return int(value)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``.

    Raises:
        ValueError: if ``prefix`` is empty or all ``0xff`` (no such key exists).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError("prefix has no upper bound")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def topic_range(prefix: bytes, topic_id: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every key of ``topic_id`` under the one-byte ``prefix``."""
    start = _TOPIC.pack(prefix, topic_id)
    return start, prefix_end(start)


def queue_range(prefix: bytes, topic_id: int, queue: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every key of one queue under the one-byte ``prefix``."""
    start = _QUEUE.pack(prefix, topic_id, queue)
    return start, prefix_end(start)


def dropped_key(topic_id: int) -> bytes:
    return _TOPIC.pack(DROPPED, topic_id)


def meta_key(topic_id: int, queue: int) -> bytes:
    return _QUEUE.pack(META, topic_id, queue)


def record_prefix(topic_id: int, queue: int) -> bytes:
    """The prefix of every record-batch key of one queue (the ``floor`` for ``last_before``)."""
    return _QUEUE.pack(RECORD, topic_id, queue)


def record_key(topic_id: int, queue: int, base_offset: int) -> bytes:
    return _RECORD.pack(RECORD, topic_id, queue, base_offset)


def producer_key(topic_id: int, queue: int, producer_id: str) -> bytes:
    return _QUEUE.pack(PRODUCER, topic_id, queue) + producer_id.encode("utf-8")


def decode_producer_key(key: bytes) -> tuple[int, int, str]:
    """``(topic_id, queue, producer_id)`` of a :func:`producer_key`.

    Raises:
        CorruptRecord: ``key`` is not a producer key.
    """
    try:
        prefix, topic_id, queue = _QUEUE.unpack_from(key, 0)
        producer_id = key[_QUEUE.size :].decode("utf-8")
    except (struct.error, UnicodeDecodeError) as e:
        raise CorruptRecord(f"bad producer key {key.hex()}") from e
    if prefix != PRODUCER:
        raise CorruptRecord(f"bad producer key {key.hex()}")
    return topic_id, queue, producer_id


def producer_idle_key(last_used_ms: int, topic_id: int, queue: int, producer_id: str) -> bytes:
    """The idle-index key of a producer state last used at ``last_used_ms``: time first, so one
    ordered scan finds the states idle the longest."""
    return _PRODUCER_IDLE.pack(PRODUCER_IDLE, last_used_ms, topic_id, queue) + producer_id.encode("utf-8")


def decode_producer_idle_key(key: bytes) -> tuple[int, int, int, str]:
    """``(last_used_ms, topic_id, queue, producer_id)`` of a :func:`producer_idle_key`.

    Raises:
        CorruptRecord: ``key`` is not a producer idle key.
    """
    try:
        prefix, last_used_ms, topic_id, queue = _PRODUCER_IDLE.unpack_from(key, 0)
        producer_id = key[_PRODUCER_IDLE.size :].decode("utf-8")
    except (struct.error, UnicodeDecodeError) as e:
        raise CorruptRecord(f"bad producer idle key {key.hex()}") from e
    if prefix != PRODUCER_IDLE:
        raise CorruptRecord(f"bad producer idle key {key.hex()}")
    return last_used_ms, topic_id, queue, producer_id


def offset_key(topic_id: int, queue: int, group: str) -> bytes:
    return _QUEUE.pack(OFFSET, topic_id, queue) + group.encode("utf-8")


def _group_field(group: str) -> bytes:
    data = group.encode("utf-8")
    return _U8.pack(len(data)) + data  # names are at most 255 bytes (commands.MAX_NAME_BYTES)


def sub_key(prefix: bytes, topic_id: int, queue: int, group: str) -> bytes:
    """``prefix topic_id queue [group]``: the cursor (``S``) or lock (``X``) key of one
    (topic, queue, consumer group), and the prefix of its ``I`` and ``Y`` keys."""
    return _QUEUE.pack(prefix, topic_id, queue) + _group_field(group)


def pending_key(topic_id: int, queue: int, group: str, offset: int) -> bytes:
    return sub_key(PENDING, topic_id, queue, group) + _U64.pack(offset)


def retry_key(topic_id: int, queue: int, group: str, due_ms: int, offset: int) -> bytes:
    return sub_key(RETRY, topic_id, queue, group) + _TWO_U64.pack(due_ms, offset)


def lock_key(topic_id: int, queue: int, group: str) -> bytes:
    return sub_key(LOCK, topic_id, queue, group)


def subscription_key(topic_id: int, group: str) -> bytes:
    return _TOPIC.pack(SUBSCRIPTION, topic_id) + _group_field(group)


def redrive_key(topic_id: int, queue: int) -> bytes:
    return _QUEUE.pack(REDRIVE, topic_id, queue)


def deadline_key(deadline_ms: int, topic_id: int, queue: int, group: str, offset: int) -> bytes:
    head = _DEADLINE_HEAD.pack(DEADLINE, deadline_ms, topic_id, queue)
    return head + _group_field(group) + _U64.pack(offset)


def decode_deadline_key(key: bytes) -> tuple[int, int, int, str, int]:
    """``(deadline_ms, topic_id, queue, group, offset)`` of a :func:`deadline_key`.

    Raises:
        CorruptRecord: ``key`` is not a deadline key.
    """
    head = _DEADLINE_HEAD.size
    try:
        _, deadline_ms, topic_id, queue = _DEADLINE_HEAD.unpack_from(key, 0)
        glen = key[head]
        group = key[head + 1 : head + 1 + glen].decode("utf-8")
        (offset,) = _U64.unpack_from(key, head + 1 + glen)
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise CorruptRecord(f"bad deadline key {key.hex()}") from e
    if len(key) != head + 1 + glen + _U64.size:
        raise CorruptRecord(f"bad deadline key {key.hex()}")
    return deadline_ms, topic_id, queue, group, offset


def delayed_key(due_ms: int, topic_id: int, queue: int, raft_index: int, position: int) -> bytes:
    """A delayed message: due time first (release order), then where it came from, which makes
    the key unique and the order among equal due times the order of production."""
    return _DELAYED.pack(DELAYED, due_ms, topic_id, queue, raft_index, position)


def decode_delayed_key(key: bytes) -> tuple[int, int, int]:
    """``(due_ms, topic_id, queue)`` of a :func:`delayed_key`.

    Raises:
        CorruptRecord: ``key`` is not a delayed key.
    """
    if len(key) != _DELAYED.size:
        raise CorruptRecord(f"bad delayed-message key {key.hex()}")
    _, due_ms, topic_id, queue, _, _ = _DELAYED.unpack(key)
    return due_ms, topic_id, queue


STATE_INFLIGHT = 1
"""A pending record handed out by ``receive``: ``time_ms`` is its visibility deadline."""
STATE_RETRY = 2
"""A pending record waiting to be handed out again: ``time_ms`` is when it is due."""


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """A delivered, not yet finished message of one (topic, queue, consumer group).

    Attributes:
        state: :data:`STATE_INFLIGHT` or :data:`STATE_RETRY`.
        attempts: How many times it was handed out (the last delivery's ``attempt``).
        time_ms: The visibility deadline (in flight) or the due time (retry).
        token: The raft index of the ``receive`` that handed it out last: with the offset, the
            receipt. Unique, so a receipt of an earlier delivery never matches a later one.
        first_ms: When it was first handed out.
        last_ms: When it was last handed out.
    """

    state: int
    attempts: int
    time_ms: int
    token: int
    first_ms: int
    last_ms: int

    def encode(self) -> bytes:
        return _PENDING.pack(self.state, self.attempts, self.time_ms, self.token, self.first_ms, self.last_ms)

    @classmethod
    def decode(cls, data: bytes) -> PendingRecord:
        """Raises: CorruptRecord: ``data`` is not an encoded pending record."""
        if len(data) != _PENDING.size or data[0] not in (STATE_INFLIGHT, STATE_RETRY):
            raise CorruptRecord("pending record has the wrong length or state")
        return cls(*_PENDING.unpack(data))


@dataclass(frozen=True, slots=True)
class LockState:
    """The exclusive lock of one queue for one consumer group (ordered consumption).

    Attributes:
        epoch: Grows by one for every new holder; commits and acks naming an older epoch are
            refused (fencing). Never reset: a released lock keeps its epoch.
        lease_until_ms: The holder has the queue until then (leader time); 0 when released.
        holder: The consumer id of the (last) holder.
    """

    epoch: int
    lease_until_ms: int
    holder: str

    def live(self, now_ms: int) -> bool:
        return now_ms < self.lease_until_ms

    def encode(self) -> bytes:
        return _LOCK.pack(self.epoch, self.lease_until_ms) + self.holder.encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> LockState:
        """Raises: CorruptRecord: ``data`` is not an encoded lock."""
        if len(data) < _LOCK.size:
            raise CorruptRecord("lock state is too short")
        epoch, until = _LOCK.unpack_from(data, 0)
        try:
            holder = data[_LOCK.size :].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptRecord("lock holder is not UTF-8") from e
        return cls(epoch, until, holder)


@dataclass(frozen=True, slots=True)
class QueueMeta:
    """The bounds and size of one queue. A queue nobody produced to is ``QueueMeta(0, 0, 0)``.

    Attributes:
        low_offset: First retained offset.
        high_offset: Next offset to be written. Invariant: ``low_offset <= high_offset``.
        retained_bytes: Sum of the encoded sizes of the retained record batches.
    """

    low_offset: int = 0
    high_offset: int = 0
    retained_bytes: int = 0

    def encode(self) -> bytes:
        return _META.pack(self.low_offset, self.high_offset, self.retained_bytes)

    @classmethod
    def decode(cls, data: bytes) -> QueueMeta:
        """Raises: CorruptRecord: ``data`` is not an encoded meta."""
        if len(data) != _META.size:
            raise CorruptRecord(f"queue meta has {len(data)} bytes, expected {_META.size}")
        low, high, retained = _META.unpack(data)
        return cls(low, high, retained)


# now_ms, stamp_ms, now_ms again: the layout of the release before the group clock (last_ms,
# retain_stamp_ms, retain_clock_ms), so a replica or checkpoint of either release reads the other's.
_GROUP_TIME = struct.Struct(">QQQ")

GROUP_MAX_STEP_MS = 300_000
"""How far the group's time may move past the stamps' own progress in one command (a ``retain``
carries its own bound, ``raft.retention_max_jump_ms``, for itself)."""


@dataclass(frozen=True, slots=True)
class GroupTime:
    """The time a queue group applied so far (0: none yet): the leaders' stamps, bounded.

    Attributes:
        now_ms: The group's time: the ``now_ms`` every op of the last stamped command applied at
            (receive, deadlines, retries, TTLs, locks, retention). It never goes backwards, and
            moves with the stamps' progress, at most :data:`GROUP_MAX_STEP_MS` per command
            (``cluster/machines/apply.py``, ``advance``), so a leader clock that jumped ahead
            moves it by one step, not by the jump.
        stamp_ms: The ``now_ms`` of the last stamped command, as stamped.
    """

    now_ms: int = 0
    stamp_ms: int = 0

    def encode(self) -> bytes:
        return _GROUP_TIME.pack(self.now_ms, self.stamp_ms, self.now_ms)

    @classmethod
    def decode(cls, data: bytes) -> GroupTime:
        """Raises: CorruptRecord: ``data`` is not an encoded group time."""
        if len(data) != _GROUP_TIME.size:
            raise CorruptRecord(f"group time has {len(data)} bytes, expected {_GROUP_TIME.size}")
        now_ms, stamp_ms, _ = _GROUP_TIME.unpack(data)
        # Written by the release before: stamp_ms was the last retain's (0: none), an earlier stamp.
        return cls(now_ms, stamp_ms or now_ms)


@dataclass(frozen=True, slots=True)
class ProducerState:
    """The last :data:`PRODUCER_SEQUENCES_KEPT` batches one producer appended to one queue.

    Attributes:
        entries: ``(sequence, base_offset, count)``, oldest first.
        last_used_ms: The leader time of the command that appended the newest batch; None for a
            state of the old encoding (written before states had a time) until the sweep of
            ``cluster/machines/producers.py`` gives it one.

    Encodings: the old one is ``n u8`` then ``n`` entries (``sequence u64, base_offset u64, count
    u32``); the current one is ``0x80 u8, last_used_ms u64, n u8`` then the entries. Both decode.
    """

    entries: tuple[tuple[int, int, int], ...] = ()
    last_used_ms: int | None = None

    def find(self, sequence: int) -> tuple[int, int] | None:
        """``(base_offset, count)`` of the remembered batch with ``sequence``, or None."""
        for seq, base_offset, count in self.entries:
            if seq == sequence:
                return base_offset, count
        return None

    def is_stale(self, sequence: int) -> bool:
        """``sequence`` is below the newest remembered one (and, when :meth:`find` has no batch for
        it, can only be a late retry of a batch given up on, or a reused producer id)."""
        return any(sequence < seq for seq, _, _ in self.entries)

    def add(self, sequence: int, base_offset: int, count: int, now_ms: int | None) -> ProducerState:
        """A state that also remembers this batch, appended at ``now_ms`` (None: a state of the old
        encoding), forgetting the oldest beyond the limit."""
        entries = (*self.entries, (sequence, base_offset, count))
        return ProducerState(entries[-PRODUCER_SEQUENCES_KEPT:], now_ms)

    def encode(self) -> bytes:
        if self.last_used_ms is None:
            parts = [_PRODUCER_HEAD.pack(len(self.entries))]
        else:
            parts = [_PRODUCER_TIMED_HEAD.pack(_PRODUCER_TIMED, self.last_used_ms, len(self.entries))]
        parts.extend(_PRODUCER_ENTRY.pack(*entry) for entry in self.entries)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> ProducerState:
        """Raises: CorruptRecord: ``data`` is not an encoded producer state (of either encoding)."""
        last_used_ms: int | None = None
        head = _PRODUCER_HEAD.size
        n = data[0] if data else -1
        if n == _PRODUCER_TIMED:
            if len(data) < _PRODUCER_TIMED_HEAD.size:
                raise CorruptRecord("producer state has the wrong length")
            _, last_used_ms, n = _PRODUCER_TIMED_HEAD.unpack_from(data, 0)
            head = _PRODUCER_TIMED_HEAD.size
        if n < 0 or len(data) != head + n * _PRODUCER_ENTRY.size:
            raise CorruptRecord("producer state has the wrong length")
        entries = tuple(_PRODUCER_ENTRY.unpack_from(data, head + i * _PRODUCER_ENTRY.size) for i in range(n))
        return cls(entries, last_used_ms)
