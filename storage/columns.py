"""Stored record batches as Arrow columns: the segment schema, the decoder and Arrow IPC streams.

The columns are Kafka's (the schema Spark's Kafka source produces, so ``spark.read.parquet`` over
the Parquet segment files gives the same rows as the ``raftmq`` data source)::

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[us, UTC], timestampType int32,
    headers list<struct<key string, value binary>>

``partition`` is the queue number, ``timestamp`` the leader's append time (so ``timestampType`` is
1, Kafka's LogAppendTime), ``headers`` null when a message has none.

- :func:`read_columns`: decode a queue's stored record batches straight into Arrow columns (the
  sealing task of ``segments.py`` and the Arrow fetch use it). It understands the record format of
  ``storage/records.py`` for the flags it knows and falls back to ``records.decode_messages`` for
  anything else, so a format extension is read correctly (if slower) before this is taught about it.
- :func:`batch_to_ipc_stream`, :func:`ipc_stream_to_batches`: the Arrow fetch answer's stream.

No RocksDB here: reads go through the ``Store`` protocol.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import crc32c
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from raftmq import batch as rb

from .keys import RECORD, queue_range, record_key, record_prefix
from .queues import OffsetOutOfRange, queue_bounds
from .records import HEADER_SIZE, CorruptRecord, decode_header, decode_messages
from .store import Store

__all__ = [
    "ARROW_STREAM",
    "BATCH_ROWS",
    "HEADERS_TYPE",
    "SCHEMA",
    "TIMESTAMP_TYPE",
    "batch_to_ipc_stream",
    "decode_record_batch",
    "empty_batch",
    "ipc_stream_to_batches",
    "read_columns",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
"""The media type of an Arrow IPC stream (the fetch route's Arrow answer)."""
BATCH_ROWS = 65_536
"""Rows per Arrow record batch, in segment files and fetch answers."""
TIMESTAMP_TYPE = 1
"""Kafka's LogAppendTime: the timestamp is the leader's append time."""

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

_FLAG_BINARY = 0x01
_FLAG_EXPIRES = 0x02
_FAST_FLAGS = _FLAG_BINARY | _FLAG_EXPIRES  # flags the fast decoder understands
_PLAIN = struct.Struct(">IBiII")  # crc, flags, key_len (-1), headers_len, value_len (when no key)
_U32 = struct.Struct(">I")
_SCAN_CHUNK = 16


# -- decoding stored batches into Arrow ---------------------------------------------------------


class _Builder:
    """Accumulates the columns of consecutive messages of one queue."""

    def __init__(self, topic: str, queue: int) -> None:
        self.topic = topic
        self.queue = queue
        self.values: list[Any] = []  # memoryview slices (joined once)
        self.value_lens: list[int] = []
        self.keys: list[bytes | None] = []
        self.any_key = False
        self.headers: list[list[dict[str, Any]] | None] = []
        self.any_headers = False
        self.ts_runs: list[tuple[int, int]] = []  # (timestamp_ms, count), one per record batch
        self.first_offset: int | None = None
        self.rows = 0
        self.value_bytes = 0

    def add_message(self, offset: int, key: bytes | None, headers: Any, value: Any, ts_ms: int) -> None:
        self.values.append(value)
        self.value_lens.append(len(value))
        self.value_bytes += len(value)
        self.keys.append(key)
        if key is not None:
            self.any_key = True
        self.headers.append(headers)
        if headers is not None:
            self.any_headers = True
        self.note_run(offset, 1, ts_ms)

    def note_run(self, first: int, count: int, ts_ms: int) -> None:
        """``count`` messages from offset ``first`` on, appended with timestamp ``ts_ms``."""
        if self.first_offset is None:
            self.first_offset = first
        elif first != self.first_offset + self.rows:
            raise CorruptRecord(f"offset {first} does not follow {self.first_offset + self.rows - 1}")
        if self.ts_runs and self.ts_runs[-1][0] == ts_ms:
            self.ts_runs[-1] = (ts_ms, self.ts_runs[-1][1] + count)
        else:
            self.ts_runs.append((ts_ms, count))
        self.rows += count

    def build(self) -> pa.RecordBatch:
        n = self.rows
        if n == 0:
            return empty_batch()
        lens = np.fromiter(self.value_lens, dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        data = b"".join(self.values)
        value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        key = pa.array(self.keys, pa.binary()) if self.any_key else pa.nulls(n, pa.binary())
        headers = pa.array(self.headers, HEADERS_TYPE) if self.any_headers else pa.nulls(n, HEADERS_TYPE)
        topic_bytes = self.topic.encode()
        topic_offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(topic_bytes))
        topic = pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(topic_offsets), pa.py_buffer(topic_bytes * n)]
        )
        first = self.first_offset or 0
        ts = np.repeat(
            np.array([t * 1000 for t, _ in self.ts_runs], dtype=np.int64),
            np.array([c for _, c in self.ts_runs], dtype=np.int64),
        )
        return pa.RecordBatch.from_arrays(
            [
                key,
                value,
                topic,
                pa.array(np.full(n, self.queue, dtype=np.int32)),
                pa.array(np.arange(first, first + n, dtype=np.int64)),
                pa.array(ts, pa.timestamp("us", tz="UTC")),
                pa.array(np.full(n, TIMESTAMP_TYPE, dtype=np.int32)),
                headers,
            ],
            schema=SCHEMA,
        )


def empty_batch() -> pa.RecordBatch:
    """A record batch of :data:`SCHEMA` with no rows."""
    return pa.RecordBatch.from_pylist([], schema=SCHEMA)


def _headers_list(raw: dict[str, str] | None) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    return [{"key": k, "value": v.encode()} for k, v in raw.items()]


def decode_record_batch(
    builder: _Builder, data: bytes, from_offset: int, max_rows: int, max_bytes: int | None
) -> int:
    """Append the messages of the stored batch ``data`` at offsets ``>= from_offset`` to
    ``builder``, at most ``max_rows`` of them and stopping before ``max_bytes`` of values would be
    exceeded (the first message always goes). Returns the offset after the last message added.

    Raises:
        CorruptRecord: a CRC mismatch or a truncated or invalid record.
    """
    if data[:1] == b"\x02":  # format v2 (docs/format.md)
        return _decode_v2(builder, data, from_offset, max_rows, max_bytes)
    header = decode_header(data)
    offset = header.base_offset
    end_offset = header.end_offset
    view = memoryview(data)
    size = len(data)
    pos = HEADER_SIZE
    crc_of = crc32c.crc32c
    unpack_plain = _PLAIN.unpack_from
    values, lens, keys, hdrs = builder.values, builder.value_lens, builder.keys, builder.headers
    value_bytes = builder.value_bytes
    first_added: int | None = None
    added = 0
    unknown_flags = False
    try:
        while offset < end_offset:
            if offset >= from_offset and added >= max_rows:
                break
            crc, flags, key_len, headers_len, value_len = unpack_plain(data, pos)
            if flags & ~_FAST_FLAGS:
                unknown_flags = True  # the generic decoder below takes over from here
                break
            key: bytes | None = None
            headers: Any = None
            if key_len == -1 and headers_len == 0:
                vstart = pos + 17
            else:
                if key_len < -1:
                    raise CorruptRecord(f"negative key length {key_len} at offset {offset}")
                p = pos + 9
                if key_len >= 0:
                    key = data[p : p + key_len]
                    p += key_len
                (headers_len,) = _U32.unpack_from(data, p)
                p += 4
                if headers_len:
                    headers = data[p : p + headers_len]
                    p += headers_len
                (value_len,) = _U32.unpack_from(data, p)
                vstart = p + 4
            vend = vstart + value_len
            rend = vend + 8 if flags & _FLAG_EXPIRES else vend
            if rend > size:
                raise CorruptRecord(f"record at offset {offset} ends past its batch")
            if offset >= from_offset:
                if max_bytes is not None and (builder.rows + added) and value_bytes + value_len > max_bytes:
                    break
                if crc_of(view[pos + 4 : rend]) != crc:
                    raise CorruptRecord(f"CRC mismatch in the record at offset {offset}")
                if key is not None:
                    builder.any_key = True
                    try:
                        key.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise CorruptRecord(f"undecodable key at offset {offset}") from e
                if headers is not None:
                    builder.any_headers = True
                    headers = _decode_headers(headers, offset)
                values.append(view[vstart:vend])
                lens.append(value_len)
                keys.append(key)
                hdrs.append(headers)
                value_bytes += value_len
                if first_added is None:
                    first_added = offset
                added += 1
            pos = rend
            offset += 1
    except struct.error as e:
        raise CorruptRecord(f"record at offset {offset} is truncated") from e
    if added:
        builder.note_run(first_added or 0, added, header.append_time_ms)
        builder.value_bytes = value_bytes
    if unknown_flags:
        return _decode_slow(builder, data, max(offset, from_offset), max_rows - added, max_bytes)
    return offset


def _decode_headers(raw: bytes, offset: int) -> list[dict[str, Any]]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CorruptRecord(f"undecodable headers at offset {offset}") from e
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise CorruptRecord(f"headers at offset {offset} are not a str -> str object")
    return [{"key": k, "value": v.encode()} for k, v in obj.items()]


def _decode_v2(builder: _Builder, data: bytes, from_offset: int, max_rows: int, max_bytes: int | None) -> int:
    """:func:`decode_record_batch` of a v2 batch: the values of the rows wanted are one slice of
    the batch's values section and their lengths one column of its record table, so no Python
    runs per row unless rows carry keys or headers (those two columns are then built per row).
    A stored value was checked whole at apply: ``read_stored`` checks its CRCs and lengths, not
    its records again (their UTF-8 is then decoded only where a row has a key or headers)."""
    try:
        return _decode_v2_view(builder, rb.read_stored(data), from_offset, max_rows, max_bytes)
    except rb.BadBatch as e:
        raise CorruptRecord(f"v2 record batch: {e.reason}: {e.message}") from None
    except (ValueError, IndexError) as e:  # UnicodeDecodeError included: read_stored trusts the records
        raise CorruptRecord(f"v2 record batch: records unreadable: {e}") from None


def _decode_v2_view(
    builder: _Builder, view: rb.BatchView, from_offset: int, max_rows: int, max_bytes: int | None
) -> int:
    first = min(max(from_offset - view.base_offset, 0), view.count)
    last = min(view.count, first + max(max_rows, 0))
    if first >= last:
        return view.base_offset + first
    lens = view.value_len[first:last].astype(np.int64)
    if max_bytes is not None:
        fits = int(np.searchsorted(np.cumsum(lens), max_bytes - builder.value_bytes, side="right"))
        last = first + (fits if fits or builder.rows else 1)  # the first message always goes
        lens = lens[: last - first]
        if last == first:
            return view.base_offset + first
    n = last - first
    starts = view.value_starts
    v0 = view.sections["values"][0]
    builder.values.append(view.buffer[v0 + int(starts[first]) : v0 + int(starts[last])])
    builder.value_lens.extend(lens.tolist())
    builder.value_bytes += int(lens.sum())
    has_key = bool(view.key_len[first:last].any()) or bool(
        (view.attributes[first:last] & rb.RECORD_KEY).any()
    )
    has_headers = bool(view.header_count[first:last].any())
    if has_key or has_headers:
        for r in view.records(view.base_offset + first, n):
            builder.keys.append(None if r.key is None else r.key.encode())
            builder.headers.append(_headers_list(r.headers))
        builder.any_key = builder.any_key or has_key
        builder.any_headers = builder.any_headers or has_headers
    else:
        builder.keys.extend([None] * n)
        builder.headers.extend([None] * n)
    builder.note_run(view.base_offset + first, n, view.append_time_ms)
    return view.base_offset + last


def _decode_slow(builder: _Builder, data: bytes, start: int, max_rows: int, max_bytes: int | None) -> int:
    """The generic path (``records.decode_messages``) for records the fast path does not know."""
    offset = start
    for m in decode_messages(data, start, max_rows):
        if max_bytes is not None and builder.rows and builder.value_bytes + len(m.value) > max_bytes:
            return m.offset
        key = None if m.key is None else m.key.encode()
        builder.add_message(m.offset, key, _headers_list(m.headers), m.value, m.timestamp_ms)
        offset = m.offset + 1
    return offset


def read_columns(
    store: Store,
    topic_id: int,
    topic: str,
    queue: int,
    offset: int,
    end: int | None = None,
    max_rows: int = BATCH_ROWS,
    max_bytes: int | None = None,
) -> tuple[pa.RecordBatch, int]:
    """Messages ``[offset, end)`` of a queue (at most ``max_rows``; values up to ``max_bytes``,
    the first message always) as one record batch of :data:`SCHEMA`, and the next offset.

    ``end`` None means the queue's ``high_offset`` at the time of the call.

    Raises:
        OffsetOutOfRange: ``offset`` is outside ``[low_offset, high_offset]``, or retention
            removed the range while it was being read.
        CorruptRecord: a stored batch failed its checks.
    """
    low, high = queue_bounds(store, topic_id, queue)
    if not low <= offset <= high:
        raise OffsetOutOfRange(offset, low, high)
    stop = high if end is None else min(end, high)
    builder = _Builder(topic, queue)
    if offset >= stop or max_rows <= 0:
        return builder.build(), offset
    prefix = record_prefix(topic_id, queue)
    found = store.last_before(record_key(topic_id, queue, offset), prefix)
    if found is None or decode_header(found[1]).end_offset <= offset:
        low, high = queue_bounds(store, topic_id, queue)
        raise OffsetOutOfRange(offset, low, high)
    _, range_end = queue_range(RECORD, topic_id, queue)  # held here: the scan's upper bound
    next_offset = offset
    start_key = found[0]
    want = min(max_rows, stop - offset)
    while True:
        chunk = list(store.scan(start_key, range_end, limit=_SCAN_CHUNK))
        for key, value in chunk:
            header = decode_header(value)
            if key != record_key(topic_id, queue, header.base_offset):
                raise CorruptRecord(f"record batch at key {key.hex()} has base offset {header.base_offset}")
            if header.base_offset > next_offset:
                # Retention removed batches under our feet; never return a gap.
                low, high = queue_bounds(store, topic_id, queue)
                raise OffsetOutOfRange(next_offset, low, high)
            next_offset = decode_record_batch(builder, value, next_offset, want - builder.rows, max_bytes)
            if builder.rows >= want or next_offset < header.end_offset:
                return builder.build(), next_offset
        if len(chunk) < _SCAN_CHUNK:
            return builder.build(), next_offset
        start_key = chunk[-1][0] + b"\x00"


# -- Arrow IPC streams (the fetch answer) --------------------------------------------------------


def batch_to_ipc_stream(batches: Sequence[pa.RecordBatch], schema: pa.Schema = SCHEMA) -> pa.Buffer:
    """An Arrow IPC stream holding ``batches`` (may be none: the schema alone)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as writer:
        for b in batches:
            if b.num_rows:
                writer.write_batch(b)
    return sink.getvalue()


def ipc_stream_to_batches(data: Any) -> list[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream."""
    reader = ipc.open_stream(pa.py_buffer(data) if isinstance(data, (bytes, bytearray)) else data)
    return list(reader)
