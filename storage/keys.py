"""The key layout of one queue group's store.

Every integer is unsigned big-endian, so that the store's bytewise key order is numeric order:
``topic_id`` u32, ``queue`` u32, offsets u64. Names (producer ids, consumer groups) are UTF-8 and
always come last, so a fixed-width prefix never collides with a name.

======================================================  ======================================
key                                                     value
======================================================  ======================================
``A``                                                   applied_index u64 (see :data:`APPLIED`)
``D`` topic_id                                          empty: the topic was dropped (tombstone)
``O`` topic_id queue group                              committed offset u64 of consumer group
``P`` topic_id queue producer_id                        :class:`ProducerState` (last sequences)
``Q`` topic_id queue                                    :class:`QueueMeta`
``R`` topic_id queue base_offset                        one record batch (``storage/records.py``)
======================================================  ======================================

The topic id comes first after the prefix byte in every per-topic key, so dropping a topic is one
``delete_range`` per prefix (:func:`topic_range`).

Invariants:
- A queue's record batches tile ``[low_offset, high_offset)`` exactly: the first batch starts at
  ``low_offset``, each next batch starts where the previous one ends, the last ends at
  ``high_offset``. So ``last_before(record_key(t, q, offset), record_prefix(t, q))`` finds the batch
  holding ``offset`` for any ``low_offset <= offset < high_offset``.
- ``retained_bytes`` is the sum of the encoded sizes (store value lengths) of the queue's batches.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .records import CorruptRecord

__all__ = [
    "APPLIED",
    "DROPPED",
    "MAX_U32",
    "MAX_U64",
    "META",
    "OFFSET",
    "PRODUCER",
    "PRODUCER_SEQUENCES_KEPT",
    "RECORD",
    "TOPIC_PREFIXES",
    "ProducerState",
    "QueueMeta",
    "decode_u64",
    "dropped_key",
    "encode_u64",
    "meta_key",
    "offset_key",
    "prefix_end",
    "producer_key",
    "queue_range",
    "record_key",
    "record_prefix",
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

TOPIC_PREFIXES: tuple[bytes, ...] = (OFFSET, PRODUCER, META, RECORD)
"""The prefixes whose keys belong to one topic (everything ``drop_topic`` removes)."""

PRODUCER_SEQUENCES_KEPT = 5
"""How many recent (sequence, base_offset, count) entries a producer's state remembers per queue."""

_U64 = struct.Struct(">Q")
_TOPIC = struct.Struct(">cI")
_QUEUE = struct.Struct(">cII")
_RECORD = struct.Struct(">cIIQ")
_META = struct.Struct(">QQQ")
_PRODUCER_HEAD = struct.Struct(">B")
_PRODUCER_ENTRY = struct.Struct(">QQI")


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


def offset_key(topic_id: int, queue: int, group: str) -> bytes:
    return _QUEUE.pack(OFFSET, topic_id, queue) + group.encode("utf-8")


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


@dataclass(frozen=True, slots=True)
class ProducerState:
    """The last :data:`PRODUCER_SEQUENCES_KEPT` batches one producer appended to one queue.

    Attributes:
        entries: ``(sequence, base_offset, count)``, oldest first.
    """

    entries: tuple[tuple[int, int, int], ...] = ()

    def find(self, sequence: int) -> tuple[int, int] | None:
        """``(base_offset, count)`` of the remembered batch with ``sequence``, or None."""
        for seq, base_offset, count in self.entries:
            if seq == sequence:
                return base_offset, count
        return None

    def add(self, sequence: int, base_offset: int, count: int) -> ProducerState:
        """A state that also remembers this batch, forgetting the oldest beyond the limit."""
        entries = (*self.entries, (sequence, base_offset, count))
        return ProducerState(entries[-PRODUCER_SEQUENCES_KEPT:])

    def encode(self) -> bytes:
        parts = [_PRODUCER_HEAD.pack(len(self.entries))]
        parts.extend(_PRODUCER_ENTRY.pack(*entry) for entry in self.entries)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> ProducerState:
        """Raises: CorruptRecord: ``data`` is not an encoded producer state."""
        n = data[0] if data else -1
        if n < 0 or len(data) != _PRODUCER_HEAD.size + n * _PRODUCER_ENTRY.size:
            raise CorruptRecord("producer state has the wrong length")
        entries = tuple(
            _PRODUCER_ENTRY.unpack_from(data, _PRODUCER_HEAD.size + i * _PRODUCER_ENTRY.size)
            for i in range(n)
        )
        return cls(entries)
