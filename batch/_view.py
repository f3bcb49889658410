"""Reading a v2 batch: :func:`validate` (the node's check of a produced batch), :func:`read`
(the same checks without the limits, for stored or fetched batches), :class:`BatchView` (the
checked batch: header fields, numpy columns, lazy records) and :func:`stamp`.

Validation is vectorised: the record table is one ``np.frombuffer`` view, every per-record check
is one numpy expression over all records, and UTF-8 is checked per section, not per string
(:func:`_first_bad_utf8`). Python work per message is spent only on records carrying a delay or
a TTL, and only when the caller asks for them (:meth:`BatchView.timing`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import pairwise, repeat
from typing import NamedTuple

import crc32c
import numpy as np
import numpy.typing as npt

from ._format import (
    COVERED,
    CRC_AT,
    CRC_START,
    HEADER_CRC_AT,
    HEADER_ENTRY_SIZE,
    HEADER_SIZE,
    MAGIC,
    RECORD_BINARY,
    RECORD_DELAY,
    RECORD_ENTRY_SIZE,
    RECORD_KEY,
    RECORD_KNOWN,
    RECORD_TTL,
    RESERVED_HEADER_PREFIX,
    STAMP_FIELDS,
    STAMP_FIELDS_AT,
    STAMP_SIZE,
    STAMPED,
    U32,
    BadBatch,
    header_dtype,
    record_dtype,
)

__all__ = [
    "BatchView",
    "Limits",
    "Record",
    "read",
    "reserved_header_record",
    "stamp",
    "stamp_into",
    "validate",
]

Buffer = bytes | bytearray | memoryview
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Limits:
    """What a produced batch may hold (the node fills it from its ``[limits]``).

    ``max_message_bytes`` counts, per message, the key, every header name and value, and the
    value, as the JSON API does. ``refuse_reserved_headers``: a header whose name starts with
    ``raftmq-`` (any ASCII case) is the broker's own and refused (reason ``reserved_header``).
    """

    max_message_bytes: int = 1024 * 1024
    max_batch_bytes: int = 4 * 1024 * 1024
    max_records: int = 10_000
    max_key_bytes: int = 64 * 1024
    max_headers: int = 64
    max_delay_ms: int = 7 * 24 * 3600 * 1000
    max_ttl_ms: int = 10 * 365 * 24 * 3600 * 1000
    refuse_reserved_headers: bool = True


class Record(NamedTuple):
    """One message of a batch, as the lazy decoder hands it out.

    Attributes:
        offset: ``base_offset + index`` (the index itself in an unstamped batch).
        timestamp_ms: The producer's time of the record (for a v1 value: the append time).
        key: The key, or None.
        value: The value bytes (UTF-8 text unless ``binary``).
        binary: The value was produced as bytes.
        headers: The headers, or None.
        delay_ms: Delivered no earlier than this long after the append time (0: at once).
        ttl_ms: Expires this long after it became deliverable (0: never).
    """

    offset: int
    timestamp_ms: int
    key: str | None
    value: bytes
    binary: bool
    headers: dict[str, str] | None
    delay_ms: int
    ttl_ms: int


@lru_cache(maxsize=8)
def _record_dtype(stride: int) -> np.dtype[np.void]:
    return record_dtype(stride)


@lru_cache(maxsize=8)
def _header_dtype(stride: int) -> np.dtype[np.void]:
    return header_dtype(stride)


@lru_cache(maxsize=8)
def _no_headers(stride: int) -> np.ndarray:
    return np.zeros(0, dtype=_header_dtype(stride))


_NO_U64: npt.NDArray[np.uint64] = np.zeros(0, dtype="<u8")


def _exclusive_cumsum(lengths: npt.NDArray[np.uint32] | I64) -> I64:
    """``[0, l0, l0+l1, ...]``: n + 1 start positions (in int64: no u32 overflow)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class BatchView:
    """A checked v2 batch over its buffer (nothing is copied; keep the buffer unchanged).

    The header fields are attributes; the record table is exposed as numpy columns
    (``attributes``, ``key_len``, ``value_len``, ...); :meth:`records` decodes messages only when
    iterated. Build one with :func:`validate` or :func:`read`.
    """

    __slots__ = (
        "_delays",
        "_header_starts",
        "_headers",
        "_key_starts",
        "_ttls",
        "_value_starts",
        "append_time_ms",
        "base_offset",
        "base_sequence",
        "base_timestamp_ms",
        "buffer",
        "count",
        "producer_epoch",
        "producer_id",
        "raft_index",
        "sections",
        "table",
    )

    _headers: np.ndarray
    _delays: npt.NDArray[np.uint64]
    _ttls: npt.NDArray[np.uint64]
    buffer: memoryview
    base_offset: int
    append_time_ms: int
    raft_index: int
    count: int
    producer_id: str | None
    producer_epoch: int
    base_sequence: int
    base_timestamp_ms: int
    table: np.ndarray
    _header_starts: I64 | None
    _key_starts: I64 | None
    _value_starts: I64 | None
    sections: dict[str, tuple[int, int]]
    """``name -> (start, end)`` in :attr:`buffer` of each section (``keys``, ``values``,
    ``header_names``, ``header_values``, ``delays``, ``ttls``, ``header_table``)."""

    @property
    def key_starts(self) -> I64:
        """Position of each record's key in the keys section (n + 1 entries; computed once)."""
        if self._key_starts is None:
            self._key_starts = _exclusive_cumsum(self.table["key_len"])
        return self._key_starts

    @property
    def value_starts(self) -> I64:
        """Position of each record's value in the values section (n + 1 entries)."""
        if self._value_starts is None:
            self._value_starts = _exclusive_cumsum(self.table["value_len"])
        return self._value_starts

    @property
    def header_starts(self) -> I64:
        """Index of each record's first header in the header table (n + 1 entries)."""
        if self._header_starts is None:
            self._header_starts = _exclusive_cumsum(self.table["header_count"])
        return self._header_starts

    @property
    def size(self) -> int:
        """The batch's length in bytes."""
        return len(self.buffer)

    @property
    def end_offset(self) -> int:
        """The offset after the last record."""
        return self.base_offset + self.count

    @property
    def attributes(self) -> npt.NDArray[np.uint8]:
        """Each record's attribute bits (``RECORD_*``)."""
        return self.table["attributes"]

    @property
    def key_len(self) -> npt.NDArray[np.uint32]:
        return self.table["key_len"]

    @property
    def value_len(self) -> npt.NDArray[np.uint32]:
        return self.table["value_len"]

    @property
    def timestamp_delta(self) -> npt.NDArray[np.uint32]:
        return self.table["timestamp_delta"]

    @property
    def header_count(self) -> npt.NDArray[np.uint8]:
        return self.table["header_count"]

    @property
    def header_table(self) -> np.ndarray:
        """The header table (``name_len``, ``value_len`` per header, in record order)."""
        return self._headers

    def section(self, name: str) -> memoryview:
        """The bytes of one section (see :attr:`sections`)."""
        start, end = self.sections[name]
        return self.buffer[start:end]

    @property
    def delays(self) -> npt.NDArray[np.uint64]:
        """The delays, one per record with ``RECORD_DELAY``, in record order."""
        return self._delays

    @property
    def ttls(self) -> npt.NDArray[np.uint64]:
        """The TTLs, one per record with ``RECORD_TTL``, in record order."""
        return self._ttls

    def delay_ms(self) -> npt.NDArray[np.int64]:
        """Each record's delay (0: none), one per record."""
        out = np.zeros(self.count, dtype=np.int64)
        out[(self.attributes & RECORD_DELAY) != 0] = self._delays
        return out

    def ttl_ms(self) -> npt.NDArray[np.int64]:
        """Each record's TTL (0: none), one per record."""
        out = np.zeros(self.count, dtype=np.int64)
        out[(self.attributes & RECORD_TTL) != 0] = self._ttls
        return out

    def timing(self) -> list[tuple[int, int, int]]:
        """``(index, delay_ms, ttl_ms)`` of the records carrying a delay or a TTL (0: none), in
        order; empty (and free) when no record does. The only per-record Python work the node
        needs on produce."""
        if not (len(self._delays) or len(self._ttls)):
            return []
        timed = np.flatnonzero(self.attributes & (RECORD_DELAY | RECORD_TTL))
        return list(
            zip(timed.tolist(), self.delay_ms()[timed].tolist(), self.ttl_ms()[timed].tolist(), strict=True)
        )

    def records(self, from_offset: int | None = None, max_records: int | None = None) -> Iterator[Record]:
        """The records, each built as the iterator is advanced (a tuple: see :class:`Record`).

        Positions come from the table (records before ``from_offset`` are never read), and the
        common columns are sliced by C-level ``map``s: Python code runs per record only for keys
        that are not ASCII and for headers.

        Args:
            from_offset: Skip records below this offset.
            max_records: Stop after this many.
        """
        first, last = self._range(from_offset, max_records)
        if first >= last:
            return iter(())
        buf = self.buffer
        rows = self.table[first:last]
        attrs = rows["attributes"]
        timestamps = (rows["timestamp_delta"].astype(np.int64) + self.base_timestamp_ms).tolist()
        binary = ((attrs & RECORD_BINARY) != 0).tolist()
        v0 = self.sections["values"][0]
        values = _slices(buf, v0, self.value_starts[first : last + 1])
        keys: Iterator[str | None] | list[str | None] = repeat(None)
        has_key = (attrs & RECORD_KEY) != 0
        if has_key.any():
            keys = _keys(buf, self.sections["keys"][0], self.key_starts[first : last + 1], has_key)
        headers: Iterator[dict[str, str] | None] | list[dict[str, str] | None] = repeat(None)
        h_starts = self.header_starts[first : last + 1]
        if h_starts[-1] > h_starts[0]:
            headers = self._header_dicts(h_starts.tolist())
        delays: Iterator[int] | list[int] = repeat(0)
        ttls: Iterator[int] | list[int] = repeat(0)
        if len(self._delays):
            delays = self.delay_ms()[first:last].tolist()
        if len(self._ttls):
            ttls = self.ttl_ms()[first:last].tolist()
        offsets = range(self.base_offset + first, self.base_offset + last)
        return map(
            _make_record, zip(offsets, timestamps, keys, values, binary, headers, delays, ttls, strict=False)
        )
        # (strict=False: the columns that are absent are endless repeats)

    def values(self, from_offset: int | None = None, max_records: int | None = None) -> Iterator[bytes]:
        """Only the values, as :meth:`records` would give them (C-level slicing, no tuple per
        record): the cheapest way to consume a batch."""
        first, last = self._range(from_offset, max_records)
        if first >= last:
            return iter(())
        return _slices(self.buffer, self.sections["values"][0], self.value_starts[first : last + 1])

    def _range(self, from_offset: int | None, max_records: int | None) -> tuple[int, int]:
        first = 0 if from_offset is None else min(max(from_offset - self.base_offset, 0), self.count)
        last = self.count if max_records is None else min(self.count, first + max(max_records, 0))
        return first, last

    def _header_dicts(self, starts: list[int]) -> list[dict[str, str] | None]:
        buf = self.buffer
        n0, h0 = self.sections["header_names"][0], self.sections["header_values"][0]
        name_at = _exclusive_cumsum(self._headers["name_len"]).tolist()
        value_at = _exclusive_cumsum(self._headers["value_len"]).tolist()
        out: list[dict[str, str] | None] = []
        for a, b in pairwise(starts):  # per record with headers: headers are per message
            out.append(
                {
                    str(buf[n0 + name_at[j] : n0 + name_at[j + 1]], "utf-8"): str(
                        buf[h0 + value_at[j] : h0 + value_at[j + 1]], "utf-8"
                    )
                    for j in range(a, b)
                }
                if b > a
                else None
            )
        return out

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return (
            f"BatchView(base_offset={self.base_offset}, count={self.count}, size={self.size}, "
            f"producer_id={self.producer_id!r}, base_sequence={self.base_sequence})"
        )


# tuple.__new__ bound to Record: C-level (NamedTuple._make checks the length in Python)
_make_record = partial(tuple.__new__, Record)


def _slices(buf: memoryview, at: int, starts: I64) -> Iterator[bytes]:
    """``bytes`` of each piece ``starts[i]:starts[i + 1]`` of ``buf[at:]``: one copy of the range,
    then C-level slicing."""
    first, end = int(starts[0]), int(starts[-1])
    raw = bytes(buf[at + first : at + end])
    cuts = (starts - first).tolist()
    return map(raw.__getitem__, map(slice, cuts, cuts[1:]))


def _keys(buf: memoryview, at: int, starts: I64, has_key: npt.NDArray[np.bool_]) -> Iterator[str | None]:
    first, end = int(starts[0]), int(starts[-1])
    raw = bytes(buf[at + first : at + end])
    cuts = (starts - first).tolist()
    if raw.isascii():  # one decode; str offsets are byte offsets
        text = raw.decode("ascii")
        keys: Iterator[str | None] = map(text.__getitem__, map(slice, cuts, cuts[1:]))
    else:
        keys = (raw[a:b].decode("utf-8") for a, b in pairwise(cuts))
    if bool(has_key.all()):
        return keys
    return (k if present else None for k, present in zip(keys, has_key.tolist(), strict=True))


def read(buf: Buffer) -> BatchView:
    """Check one whole v2 batch (its CRCs, lengths, fields and UTF-8) and view it; no limit is
    applied. For batches already accepted once (stored, replicated, fetched).

    Raises:
        BadBatch: the first problem found; ``record`` names the first bad record when one is.
    """
    return _check(memoryview(buf).cast("B"), None)


def validate(buf: Buffer, limits: Limits) -> BatchView:
    """Check one whole v2 batch as :func:`read` does, and against ``limits``: what the node does
    with a produced batch before anything is proposed.

    Raises:
        BadBatch: the first problem found (``message_too_large``, ``too_many_records``, ...).
    """
    return _check(memoryview(buf).cast("B"), limits)


def _bad(reason: str, message: str, record: int | None = None) -> BadBatch:
    return BadBatch(reason, message if record is None else f"record {record}: {message}", record)


INT64_MAX = (1 << 63) - 1


def _check(buf: memoryview, limits: Limits | None) -> BatchView:
    size = len(buf)
    if size < HEADER_SIZE:
        raise _bad("truncated", f"{size} bytes is shorter than a batch header ({HEADER_SIZE})")
    if buf[0] != MAGIC:
        raise _bad("unknown_version", f"unknown batch format version {buf[0]} (this reader knows {MAGIC})")
    stamped = buf[:STAMP_SIZE]
    if crc32c.crc32c(stamped) != U32.unpack_from(buf, HEADER_CRC_AT)[0]:
        raise _bad("header_crc_mismatch", "the batch header's CRC does not match")
    magic, batch_length, base_offset, append_time_ms, raft_index = STAMPED.unpack_from(buf, 0)
    if bytes(buf[1:4]) != b"\0\0\0":
        raise _bad("bad_header", "reserved header bytes are not zero")
    if batch_length != size:
        raise _bad(
            "truncated" if batch_length > size else "bad_length",
            f"the header says {batch_length} bytes, the batch has {size}",
        )
    if limits is not None and size > limits.max_batch_bytes:
        raise _bad("batch_too_large", f"the batch is {size} bytes; the limit is {limits.max_batch_bytes}")
    if crc32c.crc32c(buf[CRC_START:]) != U32.unpack_from(buf, CRC_AT)[0]:
        raise _bad("crc_mismatch", "the batch's CRC does not match its contents")
    (
        header_size,
        attributes,
        rec_stride,
        hdr_stride,
        epoch,
        count,
        header_total,
        base_timestamp_ms,
        base_sequence,
        keys_bytes,
        names_bytes,
        hvalues_bytes,
        values_bytes,
        extras_bytes,
        pid_len,
    ) = COVERED.unpack_from(buf, CRC_START)
    if (
        header_size < HEADER_SIZE
        or rec_stride < RECORD_ENTRY_SIZE
        or hdr_stride < HEADER_ENTRY_SIZE
        or rec_stride % 4
        or hdr_stride % 4
    ):
        raise _bad("bad_header", "header or table entry sizes below this version's, or not whole u32 words")
    if attributes:
        raise _bad("bad_header", f"unknown batch attributes {attributes:#x}")
    if bytes(buf[HEADER_SIZE - 3 : HEADER_SIZE]) != b"\0\0\0":
        raise _bad("bad_header", "reserved header bytes are not zero")
    if count < 1:
        raise _bad("bad_header", "a batch holds at least one record")
    if limits is not None and count > limits.max_records:
        raise _bad("too_many_records", f"{count} records in one batch; the limit is {limits.max_records}")
    if pid_len == 0 and (base_sequence or epoch):
        raise _bad("bad_header", "a sequence or epoch without a producer id")
    # Offsets and times are read into int64 (numpy, Arrow): none may reach 2**63.
    if base_timestamp_ms + 0xFFFFFFFF > INT64_MAX:
        raise _bad("bad_header", f"base timestamp {base_timestamp_ms} ms is beyond any int64 time")
    if base_offset + count > INT64_MAX or append_time_ms > INT64_MAX or raft_index > INT64_MAX:
        raise _bad("bad_header", "a stamped offset, time or Raft index is beyond int64")
    # Section bounds, in Python integers (no overflow); their sum must be the batch.
    bounds: dict[str, tuple[int, int]] = {}
    pos = header_size
    for name, length in (
        ("producer_id", pid_len),
        ("table", count * rec_stride),
        ("header_table", header_total * hdr_stride),
        ("keys", keys_bytes),
        ("header_names", names_bytes),
        ("header_values", hvalues_bytes),
        ("values", values_bytes),
        ("extras", extras_bytes),
    ):
        bounds[name] = (pos, pos + length)
        pos += length
    if pos != size:
        raise _bad("bad_length", f"the sections add up to {pos} bytes, the batch has {size}")
    if extras_bytes % 8:
        raise _bad("bad_length", "the delay and TTL section is not a whole number of u64")
    producer_id = None
    if pid_len:
        try:
            producer_id = str(buf[header_size : header_size + pid_len], "utf-8")
        except UnicodeDecodeError:
            raise _bad("bad_utf8", "the producer id is not UTF-8") from None

    # The record table as rows of u32 words: word 0 = attributes | header_count << 8 | reserved
    # << 16, then timestamp_delta, key_len, value_len (entry sizes grow by whole words).
    words = np.frombuffer(
        buf, dtype="<u4", count=count * (rec_stride // 4), offset=bounds["table"][0]
    ).reshape(count, rec_stride // 4)
    word0 = words[:, 0]
    key_len = words[:, 2]
    value_len = words[:, 3]
    view = BatchView.__new__(BatchView)
    view._key_starts = view._value_starts = view._header_starts = None
    view.table = np.frombuffer(buf, dtype=_record_dtype(rec_stride), count=count, offset=bounds["table"][0])

    # Structure: each check is one numpy expression over all records, and what a batch does not
    # use (headers, delays and TTLs, keys, non-ASCII text) costs nothing. Only a batch that fails
    # pays for naming its first bad record.
    allowed = RECORD_KNOWN | (0xFF00 if header_total else 0)
    if not extras_bytes:
        allowed &= ~(RECORD_DELAY | RECORD_TTL)
    if (word0 & (0xFFFF_FFFF ^ allowed)).any():
        _first(
            (word0 & (0xFFFF_FFFF ^ RECORD_KNOWN ^ 0xFF00)),
            "bad_attributes",
            "unknown record bits or reserved bytes",
        )
        _first(word0 & 0xFF00, "bad_length", "headers counted, but the header table is empty")
        _first(
            word0 & (RECORD_DELAY | RECORD_TTL),
            "bad_length",
            "a delay or TTL bit, but no delay or TTL section",
        )
    key_sum, value_sum = words[:, 2:4].sum(axis=0, dtype=np.int64).tolist()
    if key_sum:
        _first(((word0 & RECORD_KEY) == 0) & (key_len != 0), "bad_record", "a key length without the key bit")
    if key_sum != keys_bytes or value_sum != values_bytes:
        raise _bad("bad_length", "the record lengths do not add up to their sections")
    name_starts = hvalue_starts = header_count = None
    if header_total:
        header_count = (word0 >> 8) & 0xFF
        if int(header_count.sum(dtype=np.int64)) != header_total:
            raise _bad("bad_length", "the records' header counts do not add up to the header table")
        hwords = np.frombuffer(
            buf, dtype="<u4", count=header_total * (hdr_stride // 4), offset=bounds["header_table"][0]
        ).reshape(header_total, hdr_stride // 4)
        name_starts = _exclusive_cumsum(hwords[:, 0])
        hvalue_starts = _exclusive_cumsum(hwords[:, 1])
        if name_starts[-1] != names_bytes or hvalue_starts[-1] != hvalues_bytes:
            raise _bad("bad_length", "the header lengths do not add up to their sections")
    elif names_bytes or hvalues_bytes:
        raise _bad("bad_length", "header bytes without headers")
    n_delays = n_ttls = 0
    has_delay = has_ttl = None
    if extras_bytes:
        has_delay = (word0 & RECORD_DELAY) != 0
        has_ttl = (word0 & RECORD_TTL) != 0
        n_delays, n_ttls = int(np.count_nonzero(has_delay)), int(np.count_nonzero(has_ttl))
        if 8 * (n_delays + n_ttls) != extras_bytes:
            raise _bad("bad_length", "the delay and TTL section does not match the records' bits")
    extras_at = bounds["extras"][0]
    delays = np.frombuffer(buf, dtype="<u8", count=n_delays, offset=extras_at) if n_delays else _NO_U64
    ttls = (
        np.frombuffer(buf, dtype="<u8", count=n_ttls, offset=extras_at + 8 * n_delays) if n_ttls else _NO_U64
    )
    # Zero is "absent": a present delay or TTL is at least 1 (one encoding per message).
    if n_delays and not delays.all():
        assert has_delay is not None
        raise _bad("bad_delay", "a delay of 0 with the delay bit", _nth(has_delay, int(np.argmin(delays))))
    if n_ttls and not ttls.all():
        assert has_ttl is not None
        raise _bad("bad_ttl", "a TTL of 0 with the TTL bit", _nth(has_ttl, int(np.argmin(ttls))))
    view._headers = (
        np.frombuffer(
            buf, dtype=_header_dtype(hdr_stride), count=header_total, offset=bounds["header_table"][0]
        )
        if header_total
        else _no_headers(hdr_stride)
    )

    if limits is not None:
        _check_limits(
            limits, view, key_len, value_len, header_count, keys_bytes, delays, ttls, has_delay, has_ttl
        )

    # UTF-8: keys, header names and values, and text values, each section checked in one pass.
    bad_record = None
    if keys_bytes:
        k0 = bounds["keys"][0]
        bad_record = _first_bad_utf8(buf[k0 : k0 + keys_bytes], view, "key_starts")
    if name_starts is not None and hvalue_starts is not None:
        n0, h0 = bounds["header_names"][0], bounds["header_values"][0]
        for start, nbytes, starts in ((n0, names_bytes, name_starts), (h0, hvalues_bytes, hvalue_starts)):
            bad_header = _first_bad_utf8(buf[start : start + nbytes], starts)
            if bad_header is not None:
                rec = int(np.searchsorted(view.header_starts, bad_header, side="right")) - 1
                bad_record = rec if bad_record is None else min(bad_record, rec)
    if values_bytes:
        v0 = bounds["values"][0]
        values = buf[v0 : v0 + values_bytes]
        bad = None
        if np.frombuffer(values, dtype=np.uint8).max() >= 0x80:  # all ASCII: every text value is fine
            binary = word0 & RECORD_BINARY
            n_binary = int(np.count_nonzero(binary))
            if n_binary == 0:
                bad = _first_bad_utf8(values, view, "value_starts")
            elif n_binary < count:  # gather the text values into one buffer (a byte mask: no loop)
                is_text = binary == 0
                mask = np.repeat(is_text, value_len.astype(np.int64))
                text = np.frombuffer(values, dtype=np.uint8)[mask]
                bad_text = _first_bad_utf8(memoryview(text), _exclusive_cumsum(value_len[is_text]))
                bad = None if bad_text is None else int(np.flatnonzero(is_text)[bad_text])
        if bad is not None:
            bad_record = bad if bad_record is None else min(bad_record, bad)
    if bad_record is not None:
        raise _bad("bad_utf8", "a key, header or text value is not UTF-8", bad_record)
    view.buffer = buf
    view.sections = bounds
    if limits is not None and limits.refuse_reserved_headers and header_total:
        reserved = reserved_header_record(view)
        if reserved is not None:
            raise _bad("reserved_header", f"a header name starts with {RESERVED_HEADER_PREFIX!r}", reserved)
    view.base_offset = base_offset
    view.append_time_ms = append_time_ms
    view.raft_index = raft_index
    view.count = count
    view.producer_id = producer_id
    view.producer_epoch = epoch
    view.base_sequence = base_sequence
    view.base_timestamp_ms = base_timestamp_ms
    view._delays = delays
    view._ttls = ttls
    bounds["delays"] = (extras_at, extras_at + 8 * n_delays)
    bounds["ttls"] = (extras_at + 8 * n_delays, bounds["extras"][1])
    del magic
    return view


def _check_limits(
    limits: Limits,
    view: BatchView,
    key_len: npt.NDArray[np.uint32],
    value_len: npt.NDArray[np.uint32],
    header_count: np.ndarray | None,
    keys_bytes: int,
    delays: npt.NDArray[np.uint64],
    ttls: npt.NDArray[np.uint64],
    has_delay: npt.NDArray[np.bool_] | None,
    has_ttl: npt.NDArray[np.bool_] | None,
) -> None:
    candidates: list[tuple[int, str, str]] = []

    def first(mask: npt.NDArray[np.bool_], reason: str, message: str) -> None:
        if mask.any():
            candidates.append((int(np.argmax(mask)), reason, message))

    size: npt.NDArray[np.int64] | npt.NDArray[np.uint32] = value_len
    if keys_bytes:
        size = key_len.astype(np.int64) + value_len
        if keys_bytes > limits.max_key_bytes:  # no key can be longer than all keys together
            first(
                key_len > limits.max_key_bytes,
                "key_too_large",
                f"a key longer than {limits.max_key_bytes} bytes",
            )
    if header_count is not None:
        if int(header_count.max()) > limits.max_headers:
            first(header_count > limits.max_headers, "too_many_headers", f"over {limits.max_headers} headers")
        headers = view.header_table
        header_bytes = _exclusive_cumsum(headers["name_len"].astype(np.int64) + headers["value_len"])
        starts = view.header_starts
        size = size + (header_bytes[starts[1:]] - header_bytes[starts[:-1]])
    if int(size.max()) > limits.max_message_bytes:
        first(size > limits.max_message_bytes, "message_too_large", f"over {limits.max_message_bytes} bytes")
    if len(delays) and int(delays.max()) > limits.max_delay_ms:
        assert has_delay is not None
        bad = np.zeros(len(has_delay), dtype=bool)
        bad[has_delay] = delays > limits.max_delay_ms
        first(bad, "bad_delay", f"a delay beyond {limits.max_delay_ms} ms")
    if len(ttls) and int(ttls.max()) > limits.max_ttl_ms:
        assert has_ttl is not None
        bad = np.zeros(len(has_ttl), dtype=bool)
        bad[has_ttl] = ttls > limits.max_ttl_ms
        first(bad, "bad_ttl", f"a TTL beyond {limits.max_ttl_ms} ms")
    if candidates:
        index, reason, message = min(candidates)
        raise _bad(reason, message, index)


def reserved_header_record(view: BatchView) -> int | None:
    """The index of the first record of ``view`` with a header whose name starts with
    :data:`RESERVED_HEADER_PREFIX` (any ASCII case, as :func:`is_reserved_header`), or None.
    :func:`validate` refuses such a batch; a leader checks batches a peer forwarded with this."""
    table = view.header_table
    if not len(table):
        return None
    reserved = _first_reserved_name(view.section("header_names"), _exclusive_cumsum(table["name_len"]))
    if reserved is None:
        return None
    return int(np.searchsorted(view.header_starts, reserved, side="right")) - 1


_RESERVED = np.frombuffer(RESERVED_HEADER_PREFIX.encode(), dtype=np.uint8)
_RESERVED_CASE = np.frombuffer(bytes(0x20 * c.isalpha() for c in RESERVED_HEADER_PREFIX), dtype=np.uint8)


def _first_reserved_name(names: memoryview, starts: I64) -> int | None:
    """The index of the first header name (``starts`` cuts ``names`` into them) that starts with
    :data:`RESERVED_HEADER_PREFIX`, ASCII letters without case (``is_reserved_header``), or None.
    One gather of the first bytes of every long enough name; OR-ing 0x20 folds exactly the two
    cases of an ASCII letter onto one, and is applied to the letters of the prefix only."""
    lengths = np.diff(starts)
    long_enough = np.flatnonzero(lengths >= len(_RESERVED))
    if not len(long_enough):
        return None
    data = np.frombuffer(names, dtype=np.uint8)
    heads = data[starts[long_enough][:, None] + np.arange(len(_RESERVED))]
    hits = ((heads | _RESERVED_CASE) == _RESERVED).all(axis=1)
    return int(long_enough[np.argmax(hits)]) if hits.any() else None


def _first(values: np.ndarray, reason: str, message: str) -> None:
    """Raise for the first record whose entry in ``values`` is nonzero (or True), if any."""
    if values.any():
        raise _bad(reason, message, int(np.argmax(values != 0)))


def _nth(mask: npt.NDArray[np.bool_], n: int) -> int:
    """The record index of the ``n``-th True of ``mask``."""
    return int(np.flatnonzero(mask)[n])


def _first_bad_utf8(
    section: memoryview | bytes, starts_or_view: I64 | BatchView, name: str = ""
) -> int | None:
    """The index of the first piece of ``section`` that is not UTF-8, or None when all are.

    ``starts`` (n + 1 positions; or the view and the name of its property, computed only when
    the section is not ASCII) cuts ``section`` into pieces. One decode of the whole section
    checks the bytes; every piece is valid too exactly when the section is valid AND no non-empty
    piece starts with a continuation byte (0b10xxxxxx): then every cut falls between characters.
    All-ASCII sections (the common case) skip the decode. Only when something is wrong are pieces
    decoded one by one, to name the first bad one.
    """
    if not len(section):
        return None
    data = np.frombuffer(section, dtype=np.uint8)
    if data.max() < 0x80:
        return None
    starts: I64 = getattr(starts_or_view, name) if name else starts_or_view  # type: ignore[assignment]
    firsts = starts[:-1]
    nonempty = starts[1:] > firsts
    cont = np.zeros(len(firsts), dtype=bool)
    cont[nonempty] = (data[firsts[nonempty]] & 0xC0) == 0x80
    last = len(firsts) - 1
    if cont.any():
        last = int(np.argmax(cont))
    else:
        try:
            str(section, "utf-8")
            return None
        except UnicodeDecodeError as e:
            last = int(np.searchsorted(starts, e.start, side="right")) - 1
    cuts = starts.tolist()
    for i in range(last + 1):  # the failure path only
        try:
            str(section[cuts[i] : cuts[i + 1]], "utf-8")
        except UnicodeDecodeError:
            return i
    return last


def stamp(buf: Buffer, base_offset: int, append_time_ms: int, raft_index: int) -> bytes:
    """A copy of the v2 batch ``buf`` carrying the leader's fields. The records and their CRC are
    untouched; only the 32-byte stamped part and its own CRC change (constant work per batch,
    plus one copy of the bytes). ``buf`` is not checked here (it was by :func:`validate`).

    Raises:
        BadBatch: ``buf`` is not a v2 batch, or a field does not fit u64.
    """
    view = memoryview(buf).cast("B")
    if len(view) < CRC_START or view[0] != MAGIC:
        raise _bad("unknown_version", "not a v2 batch")
    try:
        fields = STAMP_FIELDS.pack(base_offset, append_time_ms, raft_index)
    except Exception as e:  # struct.error: a negative or too large field
        raise _bad("bad_stamp", f"a stamped field does not fit u64: {e}") from None
    head = bytes(view[:STAMP_FIELDS_AT]) + fields
    return b"".join((head, U32.pack(crc32c.crc32c(head)), view[CRC_AT:]))


def stamp_into(
    buf: bytearray | memoryview, base_offset: int, append_time_ms: int, raft_index: int, at: int = 0
) -> None:
    """Stamp the v2 batch starting at ``buf[at]`` in place (see :func:`stamp`).

    Raises:
        BadBatch: ``buf[at]`` is not a v2 batch, or a field does not fit u64.
    """
    if len(buf) < at + CRC_START or buf[at] != MAGIC:
        raise _bad("unknown_version", "not a v2 batch")
    try:
        STAMP_FIELDS.pack_into(buf, at + STAMP_FIELDS_AT, base_offset, append_time_ms, raft_index)
    except Exception as e:  # struct.error: a negative or too large field
        raise _bad("bad_stamp", f"a stamped field does not fit u64: {e}") from None
    U32.pack_into(buf, at + HEADER_CRC_AT, crc32c.crc32c(memoryview(buf)[at : at + STAMP_SIZE]))
