"""Format v1 (``storage/records.py``, the values written before v2) read without importing it:
the stored bytes stay readable, and :func:`v1_to_v2` turns an old value into a stamped v2 batch
(per-message work, for old data only).

v1, big-endian: ``version u8 (1) | raft_index u64 | append_time_ms u64 | count u32 |
base_offset u64``, then per record ``crc32c u32 | flags u8 | key_len i32 | key |
headers_len u32 | headers (orjson of str -> str) | value_len u32 | value [| expires_at_ms u64]``
(flags: bit 0 binary, bit 1 expires).
"""

from __future__ import annotations

import json
import struct

import crc32c

from ._builder import BatchBuilder
from ._format import MAGIC_V1, BadBatch
from ._view import Record, stamp

__all__ = ["V1Batch", "read_v1", "v1_to_v2"]

_HEADER = struct.Struct(">BQQIQ")
_REC = struct.Struct(">IBi")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_BINARY, _EXPIRES = 0x01, 0x02


class V1Batch:
    """A decoded v1 value: its header fields and records (``Record`` with ``timestamp_ms`` the
    append time, ``delay_ms`` 0 and ``ttl_ms`` the time from the append to ``expires_at_ms``)."""

    __slots__ = ("append_time_ms", "base_offset", "expires_at_ms", "raft_index", "records")

    def __init__(
        self,
        raft_index: int,
        append_time_ms: int,
        base_offset: int,
        records: list[Record],
        expires: list[int | None],
    ) -> None:
        self.raft_index = raft_index
        self.append_time_ms = append_time_ms
        self.base_offset = base_offset
        self.records = records
        self.expires_at_ms = expires
        """Each record's stored expiry (None: none), as v1 keeps it."""

    @property
    def count(self) -> int:
        return len(self.records)


def read_v1(value: bytes | bytearray | memoryview) -> V1Batch:
    """Decode and check a v1 value.

    Raises:
        BadBatch: not v1, a CRC mismatch, truncated or trailing bytes, an invalid field.
    """
    data = bytes(value)
    if len(data) < _HEADER.size or data[0] != MAGIC_V1:
        raise BadBatch("unknown_version", "not a v1 record batch")
    _, raft_index, append_time_ms, count, base_offset = _HEADER.unpack_from(data, 0)
    pos = _HEADER.size
    records: list[Record] = []
    expires: list[int | None] = []
    try:
        for i in range(count):
            crc, flags, key_len = _REC.unpack_from(data, pos)
            body_at = pos + 4
            p = pos + _REC.size
            if flags & ~(_BINARY | _EXPIRES) or key_len < -1:
                raise BadBatch("bad_record", f"record {i}: invalid flags or key length", i)
            key = None
            if key_len >= 0:
                key = data[p : p + key_len].decode("utf-8")
                p += key_len
            (headers_len,) = _U32.unpack_from(data, p)
            p += 4
            headers = _headers(data[p : p + headers_len], i) if headers_len else None
            p += headers_len
            (value_len,) = _U32.unpack_from(data, p)
            p += 4
            val = data[p : p + value_len]
            p += value_len
            expires_at = None
            if flags & _EXPIRES:
                (expires_at,) = _U64.unpack_from(data, p)
                p += 8
            if p > len(data) or len(val) != value_len:
                raise BadBatch("truncated", f"record {i} is truncated", i)
            if crc32c.crc32c(data[body_at:p]) != crc:
                raise BadBatch("crc_mismatch", f"record {i}: CRC mismatch", i)
            ttl = 0 if expires_at is None else max(1, expires_at - append_time_ms)
            records.append(
                Record(base_offset + i, append_time_ms, key, val, bool(flags & _BINARY), headers, 0, ttl)
            )
            expires.append(expires_at)
            pos = p
    except struct.error:
        raise BadBatch("truncated", f"record {len(records)} is truncated", len(records)) from None
    except UnicodeDecodeError:
        raise BadBatch("bad_utf8", f"record {len(records)}: the key is not UTF-8", len(records)) from None
    if pos != len(data):
        raise BadBatch("bad_length", f"{len(data) - pos} trailing bytes after the last record")
    return V1Batch(raft_index, append_time_ms, base_offset, records, expires)


def _headers(raw: bytes, i: int) -> dict[str, str]:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the stack
        raise BadBatch("bad_record", f"record {i}: headers are not JSON", i) from None
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise BadBatch("bad_record", f"record {i}: headers are not a str -> str object", i)
    return obj


def v1_to_v2(value: bytes | bytearray | memoryview) -> bytes:
    """The v1 value as a stamped v2 batch: same offsets, append time, Raft index, keys, values,
    headers and expiry (``ttl_ms`` counts from the append time; v1 records carry no delay, the
    delivery state holds their due times). Records get the append time as their timestamp.

    Raises:
        BadBatch: as :func:`read_v1`.
    """
    old = read_v1(value)
    if not old.records:
        raise BadBatch("bad_header", "a v1 value without records has no v2 form")
    b = BatchBuilder(base_timestamp_ms=old.append_time_ms, timestamps=False)
    for r in old.records:
        try:
            b.append(r.value if r.binary else r.value.decode("utf-8"), r.key, r.headers, 0, r.ttl_ms)
        except UnicodeError:
            raise BadBatch("bad_utf8", f"record {b.count}: text that is not UTF-8", b.count) from None
        except ValueError as e:  # what v2 cannot hold (more than 255 headers, say)
            raise BadBatch("bad_record", f"record {b.count}: {e}", b.count) from None
    return stamp(b.finish(), old.base_offset, old.append_time_ms, old.raft_index)
