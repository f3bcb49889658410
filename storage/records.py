"""The record-batch codec: how the messages of one produce batch to one queue are stored.

A record batch is the value at ``R topic_id queue base_offset`` (see ``storage/keys.py``). All
integers are big-endian::

    batch  := header record{count}
    header := version u8 | raft_index u64 | append_time_ms u64 | count u32 | base_offset u64
    record := crc32c u32 | body
    body   := flags u8 | key_len i32 | key | headers_len u32 | headers | value_len u32 | value
              [expires_at_ms u64]     (only with flag bit 1)

- ``crc32c`` covers the whole ``body`` (everything of the record after the CRC itself).
- ``flags`` bit 0: the value is binary (it was produced as ``value_b64``); otherwise it is UTF-8
  text. Bit 1: the record expires (per-message TTL) and ``expires_at`` follows the value. Other
  bits are reserved and must be 0. Records written before bit 1 existed never set it, so they
  decode unchanged (the format version stays 1).
- ``key_len`` -1 means "no key"; otherwise the key is ``key_len`` bytes of UTF-8.
- ``headers_len`` 0 means "no headers"; otherwise ``headers`` is the orjson encoding of a
  ``str -> str`` object (so ``{}`` is stored as ``b"{}"`` and round-trips as ``{}``).
- Message ``i`` of a batch has offset ``base_offset + i``; its timestamp is ``append_time_ms`` and
  its ``raft_index`` is the index of the Raft entry that appended it.

Encoding runs on the Raft apply thread for every message, so :func:`encode_batch` is written for
speed: precompiled structs, one ``join``, and a fast path for records without key and headers.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
import orjson

from raftmq import batch as v2

from .store import StoreError

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "BatchHeader",
    "CorruptRecord",
    "Message",
    "NewMessage",
    "RecordBatch",
    "decode_batch",
    "decode_delivery_fields",
    "decode_header",
    "decode_messages",
    "encode_batch",
]

FORMAT_VERSION = 1
FLAG_BINARY = 0x01
FLAG_EXPIRES = 0x02
_KNOWN_FLAGS = FLAG_BINARY | FLAG_EXPIRES

_HEADER = struct.Struct(">BQQIQ")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FLAGS_KEY_LEN = struct.Struct(">Bi")
_TWO_U32 = struct.Struct(">II")
_NO_KEY_NO_HEADERS = struct.Struct(">BiII")  # flags, key_len=-1, headers_len=0, value_len
_RECORD_PREFIX = _U32.size + _FLAGS_KEY_LEN.size  # crc + flags + key_len


class CorruptRecord(StoreError):
    """Stored bytes failed their check: CRC mismatch, truncated data, or an impossible field."""


class NewMessage(NamedTuple):
    """A message to append, already validated (see ``cluster/commands/__init__.py``).

    Attributes:
        value: The payload (UTF-8 text unless ``binary``).
        binary: The payload was produced as ``value_b64``.
        key: The producer's key, or None.
        headers: ``str -> str`` headers, or None.
        expires_at_ms: The time (leader clock, ms since the epoch) from which the message is
            expired and never delivered by receive (per-message TTL), or None.
    """

    value: bytes
    binary: bool = False
    key: str | None = None
    headers: Mapping[str, str] | None = None
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message, as read back.

    Attributes:
        offset: Its offset in the queue.
        key: The producer's key, or None.
        value: The payload bytes (UTF-8 text unless ``binary``).
        binary: The payload was produced as ``value_b64``.
        headers: The headers, or None.
        timestamp_ms: The append time the leader stamped into the produce command.
        raft_index: The index of the Raft entry that appended it.
        expires_at_ms: When the message expires (per-message TTL), or None.
    """

    offset: int
    key: str | None
    value: bytes
    binary: bool
    headers: dict[str, str] | None
    timestamp_ms: int
    raft_index: int
    expires_at_ms: int | None = None

    def expired(self, now_ms: int, max_age_ms: int | None = None) -> bool:
        """Whether the message is expired at ``now_ms``: its own TTL passed, or it is older than
        ``max_age_ms`` (a topic's retention, which also works as a TTL)."""
        if self.expires_at_ms is not None and self.expires_at_ms <= now_ms:
            return True
        return max_age_ms is not None and self.timestamp_ms + max_age_ms <= now_ms


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed-size header of a record batch."""

    version: int
    raft_index: int
    append_time_ms: int
    count: int
    base_offset: int

    @property
    def end_offset(self) -> int:
        """The offset after the batch's last message."""
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded record batch: its header and all of its messages."""

    header: BatchHeader
    messages: list[Message]


def encode_batch(
    raft_index: int, append_time_ms: int, base_offset: int, messages: Sequence[NewMessage]
) -> bytes:
    """Encode one record batch.

    Args:
        raft_index: Index of the Raft entry appending the batch.
        append_time_ms: The leader-stamped time of that entry.
        base_offset: Offset of the first message.
        messages: The messages, in offset order (validated by the caller).

    Returns:
        The batch bytes (the store value at the batch's record key).

    Raises:
        struct.error: an integer does not fit its field.
    """
    pack_u32 = _U32.pack
    pack_plain = _NO_KEY_NO_HEADERS.pack
    crc = crc32c.crc32c
    parts = [_HEADER.pack(FORMAT_VERSION, raft_index, append_time_ms, len(messages), base_offset)]
    append = parts.append
    for value, binary, key, headers, expires_at_ms in messages:
        flags = FLAG_BINARY if binary else 0
        if key is None and headers is None and expires_at_ms is None:
            body = pack_plain(flags, -1, 0, len(value)) + value
        else:
            body = _encode_body(flags, key, headers, value, expires_at_ms)
        append(pack_u32(crc(body)))
        append(body)
    return b"".join(parts)


def _encode_body(
    flags: int, key: str | None, headers: Mapping[str, str] | None, value: bytes, expires_at_ms: int | None
) -> bytes:
    if expires_at_ms is not None:
        flags |= FLAG_EXPIRES
    if key is None:
        head = _FLAGS_KEY_LEN.pack(flags, -1)
    else:
        key_bytes = key.encode("utf-8")
        head = _FLAGS_KEY_LEN.pack(flags, len(key_bytes)) + key_bytes
    headers_bytes = b"" if headers is None else orjson.dumps(headers)
    tail = b"" if expires_at_ms is None else _U64.pack(expires_at_ms)
    return b"".join((head, _U32.pack(len(headers_bytes)), headers_bytes, _U32.pack(len(value)), value, tail))


def decode_header(data: bytes) -> BatchHeader:
    """The header of the batch ``data`` (no record is read or checked), v1 or v2 (docs/format.md).

    Raises:
        CorruptRecord: ``data`` is shorter than a header or has an unknown format version.
    """
    if data[:1] == _V2_MAGIC:
        return _v2_header(data)
    if len(data) < HEADER_SIZE:
        raise CorruptRecord(f"record batch of {len(data)} bytes is shorter than its header")
    version, raft_index, append_time_ms, count, base_offset = _HEADER.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise CorruptRecord(f"unknown record batch format version {version}")
    return BatchHeader(version, raft_index, append_time_ms, count, base_offset)


def decode_batch(data: bytes) -> RecordBatch:
    """Decode and check a whole record batch.

    Raises:
        CorruptRecord: a CRC mismatch, truncated or trailing data, or an invalid field.
    """
    if data[:1] == _V2_MAGIC:
        view = _v2_read(data)
        return RecordBatch(_v2_header(data), _v2_messages(view, None, None))
    header = decode_header(data)
    messages, end = _decode_records(data, header, header.base_offset, header.count)
    if end != len(data):
        raise CorruptRecord(f"{len(data) - end} trailing bytes after the last record")
    return RecordBatch(header, messages)


def decode_messages(data: bytes, from_offset: int, max_messages: int) -> list[Message]:
    """The messages of the batch ``data`` at offsets ``>= from_offset``, at most ``max_messages``.

    Records before ``from_offset`` are skipped by their lengths; only returned records have their
    CRC checked.

    Raises:
        CorruptRecord: as :func:`decode_batch`, for the records read.
    """
    if data[:1] == _V2_MAGIC:
        return _v2_messages(_v2_read(data), from_offset, max(0, max_messages))
    header = decode_header(data)
    messages, _ = _decode_records(data, header, from_offset, max_messages)
    return messages


def decode_delivery_fields(
    data: bytes, from_offset: int, max_messages: int, header: str
) -> list[tuple[int, int | None, str | None]]:
    """What a receive needs to decide whether to hand a message out, without building messages:
    ``(offset, expires_at_ms, value of header ``header`` or None)`` of the records of batch
    ``data`` at offsets ``>= from_offset`` (at most ``max_messages``): what
    :func:`decode_messages` gives as ``offset``, ``expires_at_ms`` and ``headers.get(header)``.
    The CRCs of the returned records are checked, as :func:`decode_messages` does (a v2 batch's
    CRC covers the whole batch).

    Raises:
        CorruptRecord: as :func:`decode_messages`, for the records read.
    """
    if data[:1] == _V2_MAGIC:
        return _v2_delivery_fields(_v2_read(data), from_offset, max(0, max_messages), header)
    wanted = orjson.dumps(header)  # a v1 record's headers are stored as JSON, names never escaped
    batch_header = decode_header(data)
    view = memoryview(data)
    size = len(data)
    end_offset = batch_header.end_offset
    pos, offset = _skip_records(data, HEADER_SIZE, batch_header.base_offset, min(from_offset, end_offset))
    last = min(end_offset, offset + max(0, max_messages))
    out: list[tuple[int, int | None, str | None]] = []
    flags_key_len, u32, crc = _FLAGS_KEY_LEN.unpack_from, _U32.unpack_from, crc32c.crc32c
    try:
        while offset < last:  # _record_bounds inlined, then the fields wanted (this runs per message)
            flags, key_len = flags_key_len(data, pos + _U32.size)
            if key_len < -1:
                raise CorruptRecord(f"negative key length {key_len}")
            if flags & ~_KNOWN_FLAGS:
                raise CorruptRecord(f"unknown record flags {flags:#x} at offset {offset}")
            p = pos + _RECORD_PREFIX + (key_len if key_len > 0 else 0)
            (headers_len,) = u32(data, p)
            headers_at = p + _U32.size
            p = headers_at + headers_len
            p += _U32.size + u32(data, p)[0]
            expires_at_ms = None
            if flags & FLAG_EXPIRES:
                (expires_at_ms,) = _U64.unpack_from(data, p)
                p += _U64.size
            if p > size:
                raise CorruptRecord(f"record ends at byte {p} of a {size}-byte batch")
            if crc(view[pos + _U32.size : p]) != u32(data, pos)[0]:
                raise CorruptRecord(f"CRC mismatch in the record at offset {offset}")
            stored = data[headers_at : headers_at + headers_len]
            found = orjson.loads(stored).get(header) if wanted in stored else None
            out.append((offset, expires_at_ms, found))
            pos = p
            offset += 1
    except struct.error as e:
        raise CorruptRecord(f"record at offset {offset} is truncated") from e
    return out


def _skip_records(data: bytes, pos: int, offset: int, to_offset: int) -> tuple[int, int]:
    """Position and offset of record ``to_offset``, from record ``offset`` at ``pos``: what
    :func:`_record_bounds` does record by record, in one loop (reading from the middle of a batch
    walks every record before)."""
    size = len(data)
    flags_key_len = _FLAGS_KEY_LEN.unpack_from
    u32 = _U32.unpack_from
    try:
        while offset < to_offset:
            flags, key_len = flags_key_len(data, pos + _U32.size)
            if key_len < -1:
                raise CorruptRecord(f"negative key length {key_len}")
            p = pos + _RECORD_PREFIX + (key_len if key_len > 0 else 0)
            p += _U32.size + u32(data, p)[0]
            p += _U32.size + u32(data, p)[0]
            if flags & FLAG_EXPIRES:
                p += _U64.size
            if p > size:
                raise CorruptRecord(f"record ends at byte {p} of a {size}-byte batch")
            pos = p
            offset += 1
    except struct.error as e:
        raise CorruptRecord(f"record at offset {offset} is truncated") from e
    return pos, offset


def _decode_records(
    data: bytes, header: BatchHeader, from_offset: int, max_messages: int
) -> tuple[list[Message], int]:
    """Messages from ``from_offset`` on (at most ``max_messages``) and the position after the
    last record parsed."""
    view = memoryview(data)
    size = len(data)
    pos = HEADER_SIZE
    messages: list[Message] = []
    offset = header.base_offset
    end_offset = header.end_offset
    if max_messages > 0:  # the records before from_offset: only their lengths are read
        pos, offset = _skip_records(data, pos, offset, min(from_offset, end_offset))
    while offset < end_offset and len(messages) < max_messages:
        try:
            start, next_pos = _record_bounds(data, pos, size)
            if offset >= from_offset:
                messages.append(_decode_record(data, view, start, next_pos, offset, header))
        except struct.error as e:
            raise CorruptRecord(f"record at offset {offset} is truncated") from e
        pos = next_pos
        offset += 1
    return messages, pos


def _record_bounds(data: bytes, pos: int, size: int) -> tuple[int, int]:
    """``(pos, end)`` of the record starting at ``pos``, checking only that its lengths fit."""
    flags, key_len = _FLAGS_KEY_LEN.unpack_from(data, pos + _U32.size)
    if key_len < -1:
        raise CorruptRecord(f"negative key length {key_len}")
    p = pos + _RECORD_PREFIX + max(key_len, 0)
    (headers_len,) = _U32.unpack_from(data, p)
    p += _U32.size + headers_len
    (value_len,) = _U32.unpack_from(data, p)
    p += _U32.size + value_len
    if flags & FLAG_EXPIRES:
        p += _U64.size
    if p > size:
        raise CorruptRecord(f"record ends at byte {p} of a {size}-byte batch")
    return pos, p


def _decode_record(
    data: bytes, view: memoryview, pos: int, end: int, offset: int, header: BatchHeader
) -> Message:
    (stored_crc,) = _U32.unpack_from(data, pos)
    if crc32c.crc32c(view[pos + _U32.size : end]) != stored_crc:
        raise CorruptRecord(f"CRC mismatch in the record at offset {offset}")
    flags, key_len = _FLAGS_KEY_LEN.unpack_from(data, pos + _U32.size)
    if flags & ~_KNOWN_FLAGS:
        raise CorruptRecord(f"unknown record flags {flags:#x} at offset {offset}")
    p = pos + _RECORD_PREFIX
    try:
        key: str | None = None
        if key_len >= 0:
            key = data[p : p + key_len].decode("utf-8")
            p += key_len
        (headers_len,) = _U32.unpack_from(data, p)
        p += _U32.size
        headers = _decode_headers(data[p : p + headers_len]) if headers_len else None
        p += headers_len
    except (UnicodeDecodeError, orjson.JSONDecodeError) as e:
        raise CorruptRecord(f"undecodable key or headers at offset {offset}") from e
    expires_at_ms: int | None = None
    if flags & FLAG_EXPIRES:
        (expires_at_ms,) = _U64.unpack_from(data, end - _U64.size)
        end -= _U64.size
    value = data[p + _U32.size : end]
    return Message(
        offset,
        key,
        value,
        bool(flags & FLAG_BINARY),
        headers,
        header.append_time_ms,
        header.raft_index,
        expires_at_ms,
    )


def _decode_headers(data: bytes) -> dict[str, str]:
    headers = orjson.loads(data)
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise CorruptRecord("headers are not a str -> str object")
    return headers


# -- format v2 (raftmq.batch, docs/format.md): stored by the binary produce path ---------------

_V2_MAGIC = bytes([v2.MAGIC])
_V2_STAMPED = struct.Struct("<B3xIQQQI")  # magic, batch_length, base_offset, append time, index, header_crc
_V2_COUNT = struct.Struct("<I")
_V2_COUNT_AT = 48


def _v2_header(data: bytes) -> BatchHeader:
    """The stamped header of a v2 batch, checked by its own CRC (the records are not read)."""
    if len(data) < v2.HEADER_SIZE:
        raise CorruptRecord(f"v2 record batch of {len(data)} bytes is shorter than its header")
    magic, length, base_offset, append_time_ms, raft_index, header_crc = _V2_STAMPED.unpack_from(data, 0)
    if crc32c.crc32c(memoryview(data)[:32]) != header_crc or length != len(data):
        raise CorruptRecord("v2 record batch: header CRC or length mismatch")
    (count,) = _V2_COUNT.unpack_from(data, _V2_COUNT_AT)
    return BatchHeader(magic, raft_index, append_time_ms, count, base_offset)


def _v2_read(data: bytes) -> v2.BatchView:
    try:
        return v2.read_stored(data)
    except v2.BadBatch as e:
        raise CorruptRecord(f"v2 record batch: {e.reason}: {e.message}") from None
    except (ValueError, IndexError) as e:  # read_stored trusts the structure apply's read checked
        raise CorruptRecord(f"v2 record batch: records unreadable: {e}") from None


def _v2_delivery_fields(
    view: v2.BatchView, from_offset: int, max_messages: int, header: str
) -> list[tuple[int, int | None, str | None]]:
    """:func:`decode_delivery_fields` of a v2 batch: what :func:`_v2_messages` gives as offsets,
    expiry times and that header, from the view's columns (no record built)."""
    first = min(max(from_offset - view.base_offset, 0), view.count)
    last = min(view.count, first + max_messages)
    try:
        values = view.header_values(header, from_offset, max_messages)
    except (ValueError, IndexError) as e:  # UnicodeDecodeError included: see _v2_read
        raise CorruptRecord(f"v2 record batch: records unreadable: {e}") from None
    offsets = range(view.base_offset + first, view.base_offset + last)
    if not len(view.ttls):
        return [(o, None, h) for o, h in zip(offsets, values, strict=True)]
    at = view.append_time_ms
    ttls = view.ttl_ms()[first:last].tolist()
    delays = view.delay_ms()[first:last].tolist() if len(view.delays) else [0] * len(ttls)
    return [
        (o, at + d + t if t else None, h) for o, d, t, h in zip(offsets, delays, ttls, values, strict=True)
    ]


def _v2_messages(view: v2.BatchView, from_offset: int | None, max_messages: int | None) -> list[Message]:
    """A v2 batch's records as messages: the timestamp is the append time (as v1's), and a TTL
    counts from when the record became deliverable (append time + delay)."""
    at, index = view.append_time_ms, view.raft_index
    try:
        return [
            Message(
                r.offset,
                r.key,
                r.value,
                r.binary,
                r.headers,
                at,
                index,
                at + r.delay_ms + r.ttl_ms if r.ttl_ms else None,
            )
            for r in view.records(from_offset, max_messages)
        ]
    except (ValueError, IndexError) as e:  # UnicodeDecodeError included: see _v2_read
        raise CorruptRecord(f"v2 record batch: records unreadable: {e}") from None
