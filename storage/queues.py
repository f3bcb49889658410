"""Reading a queue group's store: queue bounds, messages, committed offsets, applied index, and
the receive/ack state (cursors, pending records, locks, what is due next).

These helpers run on HTTP threads while the apply thread writes, and are also used by the state
machine. They rely on the invariants in ``storage/keys.py`` and on committed messages being
immutable: a batch is only ever added at the high end or removed (by retention or drop_topic) from
the low end. A reader racing with retention sees :class:`OffsetOutOfRange`, never a wrong message.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from raftmq.errors import OffsetOutOfRange

from .keys import (
    APPLIED,
    DEADLINE,
    DELAYED,
    META,
    OFFSET,
    PENDING,
    SUB_CURSOR,
    LockState,
    PendingRecord,
    QueueMeta,
    decode_deadline_key,
    decode_delayed_key,
    decode_u64,
    lock_key,
    meta_key,
    offset_key,
    pending_key,
    prefix_end,
    queue_range,
    record_key,
    record_prefix,
    redrive_key,
    sub_key,
    topic_range,
)
from .keys import RECORD as _RECORD_PREFIX_BYTE
from .records import (
    BatchHeader,
    CorruptRecord,
    Message,
    decode_delivery_fields,
    decode_header,
    decode_messages,
)
from .store import Store

__all__ = [
    "OffsetOutOfRange",
    "applied_index",
    "batch_span",
    "committed_offset",
    "committed_offsets",
    "first_pending",
    "lock_state",
    "message_steps",
    "next_due_ms",
    "pending_record",
    "queue_bounds",
    "queue_meta",
    "raw_batches",
    "read_delivery_fields",
    "read_messages",
    "redrive_offset",
    "scan_prefix",
    "sub_cursor",
    "topic_bounds",
]

_SCAN_CHUNK = 16  # record batches fetched per scan call while reading forward

# A v2 batch's base offset (u64 at byte 8) and record count (u32 at byte 48), little-endian
# (docs/format.md, "The batch"); v1 keeps them in its own header (records.decode_header).
_V2_BASE = struct.Struct("<Q")
_V2_COUNT = struct.Struct("<I")
_V2_MIN = 52


def applied_index(store: Store) -> int:
    """The raft index of the last command applied to ``store`` (0 if none)."""
    data = store.get(APPLIED)
    return 0 if data is None else decode_u64(data)


def queue_meta(store: Store, topic_id: int, queue: int) -> QueueMeta | None:
    """The stored meta of a queue, or None if nothing was ever produced to it (or it was dropped)."""
    data = store.get(meta_key(topic_id, queue))
    return None if data is None else QueueMeta.decode(data)


def queue_bounds(store: Store, topic_id: int, queue: int) -> tuple[int, int]:
    """``(low_offset, high_offset)`` of a queue; ``(0, 0)`` for an unknown queue."""
    meta = queue_meta(store, topic_id, queue)
    return (0, 0) if meta is None else (meta.low_offset, meta.high_offset)


def topic_bounds(store: Store, topic_id: int) -> dict[int, tuple[int, int]]:
    """``queue -> (low_offset, high_offset)`` of every queue of a topic with a stored meta (one
    prefix scan, rather than a lookup per possible queue)."""
    start, end = topic_range(META, topic_id)
    out: dict[int, tuple[int, int]] = {}
    for key, value in store.scan(start, end):
        meta = QueueMeta.decode(value)
        out[_queue_of(key)] = (meta.low_offset, meta.high_offset)
    return out


def committed_offsets(store: Store, group: str, topic_id: int) -> dict[int, int]:
    """``queue -> offset`` consumer group ``group`` committed on the queues of a topic (one prefix
    scan over the topic's committed offsets, every group's, keeping ``group``'s)."""
    start, end = topic_range(OFFSET, topic_id)
    name = group.encode("utf-8")
    out: dict[int, int] = {}
    for key, value in store.scan(start, end):
        if key[_QUEUE_KEY_SIZE:] == name:
            out[_queue_of(key)] = decode_u64(value)
    return out


_QUEUE_KEY_SIZE = 9  # prefix byte | topic_id u32 | queue u32 (keys._QUEUE)


def _queue_of(key: bytes) -> int:
    return int.from_bytes(key[5:_QUEUE_KEY_SIZE], "big")


def committed_offset(store: Store, group: str, topic_id: int, queue: int) -> int | None:
    """The offset consumer group ``group`` committed on a queue, or None if it never did."""
    data = store.get(offset_key(topic_id, queue, group))
    return None if data is None else decode_u64(data)


def scan_prefix(
    store: Store, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The pairs whose key starts with ``prefix`` (from ``start`` on), in key order.

    Use this rather than ``store.scan(prefix, prefix_end(prefix))``: ``RocksStore`` hands the upper
    bound to RocksDB (rocksdict's ``iterate_upper_bound``) without keeping the bytes object alive,
    so a bound that is a temporary can be freed while the iterator still reads it, and the scan
    then silently returns nothing. This generator's frame holds the bound until the scan is done.
    """
    end = prefix_end(prefix)
    yield from store.scan(prefix if start is None else start, end, limit=limit)


def sub_cursor(store: Store, group: str, topic_id: int, queue: int) -> int | None:
    """The next offset ``receive`` hands out to consumer group ``group`` (None: never received)."""
    data = store.get(sub_key(SUB_CURSOR, topic_id, queue, group))
    return None if data is None else decode_u64(data)


def pending_record(store: Store, group: str, topic_id: int, queue: int, offset: int) -> PendingRecord | None:
    """The in-flight or retry record of one delivered, unfinished message, or None."""
    data = store.get(pending_key(topic_id, queue, group, offset))
    return None if data is None else PendingRecord.decode(data)


def first_pending(store: Store, group: str, topic_id: int, queue: int) -> int | None:
    """The lowest offset with a pending record, or None."""
    prefix = sub_key(PENDING, topic_id, queue, group)
    for key, _ in scan_prefix(store, prefix, limit=1):
        return decode_u64(key[len(prefix) :])
    return None


def lock_state(store: Store, group: str, topic_id: int, queue: int) -> LockState | None:
    """The queue's lock for consumer group ``group`` (ordered consumption), or None."""
    data = store.get(lock_key(topic_id, queue, group))
    return None if data is None else LockState.decode(data)


def redrive_offset(store: Store, topic_id: int, queue: int) -> int | None:
    """The next offset of dead-letter queue ``(topic_id, queue)`` to redrive, or None."""
    data = store.get(redrive_key(topic_id, queue))
    return None if data is None else decode_u64(data)


def next_due_ms(store: Store) -> int | None:
    """The earliest time a ``deliver_tick`` has work: a delayed message due or an in-flight
    deadline passing (None: nothing scheduled). Dangling entries count too; the tick removes them."""
    times = []
    for prefix in (DELAYED, DEADLINE):
        for key, _ in scan_prefix(store, prefix, limit=1):
            due = decode_delayed_key(key)[0] if prefix == DELAYED else decode_deadline_key(key)[0]
            times.append(due)
    return min(times) if times else None


def read_messages(
    store: Store,
    topic_id: int,
    queue: int,
    offset: int,
    max_messages: int,
    max_bytes: int | None = None,
    *,
    first_chunk: int = _SCAN_CHUNK,
) -> list[Message]:
    """Messages of a queue from ``offset`` on, in offset order.

    Args:
        store: The queue group's store.
        topic_id: The topic.
        queue: The queue number.
        offset: The first offset to return; may fall inside a record batch.
        max_messages: Return at most this many messages.
        max_bytes: Stop before the total value size would exceed this, except that the first
            message is always returned (so one large message cannot stall a consumer).
        first_chunk: Record batches the first scan fetches (then twice as many, up to 16): 1
            when the messages wanted are likely in one or two batches (each scanned batch is
            copied out of the store whole).

    Returns:
        Up to ``max_messages`` consecutive messages starting at ``offset``; empty when
        ``offset == high_offset``.

    Raises:
        OffsetOutOfRange: ``offset < low_offset`` or ``offset > high_offset``.
        CorruptRecord: a stored batch failed its checks.
    """
    messages: list[Message] = []
    budget = max_bytes
    if max_messages <= 0:
        _check_offset(store, topic_id, queue, offset)
        return messages
    for _, value, from_offset in _batches_from(store, topic_id, queue, offset, first_chunk):
        for message in decode_messages(value, from_offset, max_messages - len(messages)):
            if budget is not None:
                if messages and len(message.value) > budget:
                    return messages
                budget -= len(message.value)
            messages.append(message)
        if len(messages) >= max_messages:
            return messages
    return messages


def message_steps(
    store: Store, topic_id: int, queue: int, offset: int, max_messages: int, max_bytes: int | None = None
) -> Iterator[list[Message]]:
    """:func:`read_messages` in steps, one record batch each: the lists concatenated are what
    :func:`read_messages` returns. One scan is read lazily (one seek for the whole read; a
    ``RocksStore`` cursor copies a batch or 1 MiB at a time), so a caller on an event loop can
    give other work a turn between steps of a 64 MiB read.

    Raises (at the first step):
        OffsetOutOfRange: ``offset < low_offset`` or ``offset > high_offset``.
        CorruptRecord: a stored batch failed its checks.
    """
    if max_messages <= 0:
        _check_offset(store, topic_id, queue, offset)
        return
    count, budget = 0, max_bytes
    for _, value, from_offset in _batches_from(store, topic_id, queue, offset, first_chunk=0):
        step: list[Message] = []
        for message in decode_messages(value, from_offset, max_messages - count):
            if budget is not None:
                if (count or step) and len(message.value) > budget:
                    if step:
                        yield step
                    return
                budget -= len(message.value)
            step.append(message)
        count += len(step)
        yield step
        if count >= max_messages:
            return


def read_delivery_fields(
    store: Store, topic_id: int, queue: int, offset: int, max_messages: int, header: str
) -> list[tuple[int, int, int | None, str | None]]:
    """What a receive needs to decide whether to hand out each of up to ``max_messages``
    consecutive messages from ``offset`` on, without building them: ``(offset, timestamp_ms,
    expires_at_ms, value of header ``header`` or None)``. Same ranges, errors and CRC checks as
    :func:`read_messages`; batches are fetched one, two, four... at a time (a receive usually
    needs part of one).

    Raises:
        OffsetOutOfRange: ``offset < low_offset`` or ``offset > high_offset``.
        CorruptRecord: a stored batch failed its checks.
    """
    out: list[tuple[int, int, int | None, str | None]] = []
    if max_messages <= 0:
        _check_offset(store, topic_id, queue, offset)
        return out
    for batch_header, value, from_offset in _batches_from(store, topic_id, queue, offset, 1):
        timestamp_ms = batch_header.append_time_ms
        fields = decode_delivery_fields(value, from_offset, max_messages - len(out), header)
        out += [(o, timestamp_ms, expires_at_ms, found) for o, expires_at_ms, found in fields]
        if len(out) >= max_messages:
            break
    return out


def batch_span(value: bytes) -> tuple[int, int]:
    """``(base_offset, end_offset)`` of a stored batch value of either version, read from its
    header only (nothing is checked but the version and the size of the header).

    Raises:
        CorruptRecord: the value is shorter than its header or of an unknown version.
    """
    if value[:1] == b"\x02":
        if len(value) < _V2_MIN:
            raise CorruptRecord(f"v2 record batch of {len(value)} bytes is shorter than its header")
        base = _V2_BASE.unpack_from(value, 8)[0]
        return base, base + _V2_COUNT.unpack_from(value, 48)[0]
    header = decode_header(value)
    return header.base_offset, header.end_offset


def raw_batches(
    store: Store, topic_id: int, queue: int, offset: int, max_messages: int, max_bytes: int | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """The stored batch values of a queue from the one holding ``offset`` on, as stored (v1 or
    v2, not decoded), each as ``(base_offset, end_offset, value)``; what a binary fetch sends.

    Whole batches only: the first always comes (it may begin before ``offset``); a later one
    comes only if the records at or above ``offset`` stay within ``max_messages`` and the values'
    bytes within ``max_bytes``. One lazy scan (a seek for the whole read) that stops before a
    gap, as :func:`message_steps`; a caller on an event loop may yield between values.

    Raises (at the first value):
        OffsetOutOfRange: ``offset < low_offset`` or ``offset > high_offset``.
        CorruptRecord: a value of an unknown version, or not at its own base offset.
    """
    low, high = queue_bounds(store, topic_id, queue)
    if not low <= offset <= high:
        raise OffsetOutOfRange(offset, low, high)
    if offset == high or max_messages <= 0:
        return
    prefix = record_prefix(topic_id, queue)
    found = store.last_before(record_key(topic_id, queue, offset), prefix)
    if found is None or batch_span(found[1])[1] <= offset:
        low, high = queue_bounds(store, topic_id, queue)  # retention removed it meanwhile
        raise OffsetOutOfRange(offset, low, high)
    _, end = queue_range(_RECORD_PREFIX_BYTE, topic_id, queue)
    count = size = 0
    next_offset = offset
    for key, value in store.scan(found[0], end):
        base, stop = batch_span(value)
        if key != record_key(topic_id, queue, base):
            raise CorruptRecord(f"record batch at key {key.hex()} has base offset {base}")
        if base > next_offset:
            return  # a gap: retention removed batches under our feet
        count += stop - max(base, offset)
        size += len(value)
        if next_offset > offset and (count > max_messages or (max_bytes is not None and size > max_bytes)):
            return
        yield base, stop, value
        next_offset = stop
        if count >= max_messages:
            return


def _check_offset(store: Store, topic_id: int, queue: int, offset: int) -> None:
    low, high = queue_bounds(store, topic_id, queue)
    if not low <= offset <= high:
        raise OffsetOutOfRange(offset, low, high)


def _batches_from(
    store: Store, topic_id: int, queue: int, offset: int, first_chunk: int
) -> Iterator[tuple[BatchHeader, bytes, int]]:
    """``(header, value, first offset wanted)`` of the record batches from the one holding
    ``offset`` on, in order, ending before a gap (retention removed batches under our feet: never
    return a gap). The first batch is the one the seek for ``offset`` read (not read again); the
    scans after it fetch ``first_chunk`` batches, then twice as many up to ``_SCAN_CHUNK``;
    ``first_chunk=0``: one scan, read lazily (each new scan is a seek, which costs as much as
    reading a large batch).

    Raises:
        OffsetOutOfRange: ``offset`` is outside the queue's bounds.
        CorruptRecord: a batch does not sit at its own base offset.
    """
    low, high = queue_bounds(store, topic_id, queue)
    if not low <= offset <= high:
        raise OffsetOutOfRange(offset, low, high)
    if offset == high:
        return
    prefix = record_prefix(topic_id, queue)
    found = store.last_before(record_key(topic_id, queue, offset), prefix)
    if found is None or (header := decode_header(found[1])).end_offset <= offset:
        # Retention removed the batch after we read the bounds.
        low, high = queue_bounds(store, topic_id, queue)
        raise OffsetOutOfRange(offset, low, high)
    # The seek read the batch holding ``offset``: it is the first, and the scans start after it.
    if found[0] != record_key(topic_id, queue, header.base_offset):
        raise CorruptRecord(f"record batch at key {found[0].hex()} has base offset {header.base_offset}")
    yield header, found[1], offset
    next_offset = header.end_offset
    _, end = queue_range(_RECORD_PREFIX_BYTE, topic_id, queue)
    start_key = found[0] + b"\x00"
    chunk_size = first_chunk
    while True:
        if chunk_size == 0:
            chunk: Iterable[tuple[bytes, bytes]] = store.scan(start_key, end)
        else:
            chunk = list(store.scan(start_key, end, limit=chunk_size))
        for key, value in chunk:
            header = decode_header(value)
            # A batch must sit at its own base offset; anything else means the store is damaged.
            if key != record_key(topic_id, queue, header.base_offset):
                raise CorruptRecord(f"record batch at key {key.hex()} has base offset {header.base_offset}")
            if header.base_offset > next_offset:
                return
            yield header, value, next_offset
            next_offset = header.end_offset
        if not isinstance(chunk, list) or len(chunk) < chunk_size:
            return
        start_key = chunk[-1][0] + b"\x00"
        chunk_size = min(2 * chunk_size, _SCAN_CHUNK)
