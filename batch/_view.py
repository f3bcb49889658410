"""Viewing a checked v2 batch: :class:`BatchView` (header fields, numpy columns, lazy records),
:class:`Record` (one message of it) and :func:`stamp` (the leader's fields written into a batch).

A view is made only by ``_validate.py`` (:func:`read`, :func:`validate` check the bytes;
:func:`read_stored` checks only CRCs, header and section lengths, for values checked before they
were stored), which fill its columns; nothing here checks bytes again. Records are decoded
lazily: Python work per message is spent only when the caller iterates them, and on delays and
TTLs only when asked for (:meth:`BatchView.timing`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache, partial
from itertools import pairwise, repeat
from typing import NamedTuple

import crc32c
import numpy as np
import numpy.typing as npt

from ._format import (
    CRC_AT,
    CRC_START,
    HEADER_CRC_AT,
    MAGIC,
    RECORD_BINARY,
    RECORD_DELAY,
    RECORD_KEY,
    RECORD_TTL,
    STAMP_FIELDS,
    STAMP_FIELDS_AT,
    STAMP_SIZE,
    U32,
    BadBatch,
    header_dtype,
    record_dtype,
)

__all__ = ["BatchView", "Record", "stamp", "stamp_into"]

Buffer = bytes | bytearray | memoryview
I64 = npt.NDArray[np.int64]


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


SMALL_READ = 32
"""Up to this many records, :meth:`BatchView.records` reads a batch without numpy."""


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
        if len(self._delays) == self.count:  # every record has one: no mask to build
            return self._delays.astype(np.int64)
        out = np.zeros(self.count, dtype=np.int64)
        out[(self.attributes & RECORD_DELAY) != 0] = self._delays
        return out

    def ttl_ms(self) -> npt.NDArray[np.int64]:
        """Each record's TTL (0: none), one per record."""
        if len(self._ttls) == self.count:  # every record has one (an SQS send's retention)
            return self._ttls.astype(np.int64)
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
        if self.count <= SMALL_READ:
            return iter(self._small_records(first, last))
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

    def _small_records(self, first: int, last: int) -> list[Record]:
        """:meth:`records` of a batch of at most :data:`SMALL_READ` records, in Python: the numpy
        path's dozen calls (about 20 µs whatever the size) were most of a small batch's read (a
        ReceiveMessage's answer reads one or two SQS batches of 10, issue 24)."""
        buf, sections, base_ts = self.buffer, self.sections, self.base_timestamp_ms
        k_at, v_at = sections["keys"][0], sections["values"][0]
        n_at, hv_at = sections["header_names"][0], sections["header_values"][0]
        heads = self._headers.tolist()
        delays, ttls = iter(self._delays.tolist()), iter(self._ttls.tolist())
        out: list[Record] = []
        k = v = h = n = hv = 0  # positions in the keys, values, header table, names, header values
        for i, (attrs, n_headers, _, delta, key_len, value_len) in enumerate(self.table.tolist()):
            if i >= last:
                break
            key = str(buf[k_at + k : k_at + k + key_len], "utf-8") if attrs & RECORD_KEY else None
            value = bytes(buf[v_at + v : v_at + v + value_len])
            k, v = k + key_len, v + value_len
            headers: dict[str, str] | None = {} if n_headers else None
            for name_len, header_len in heads[h : h + n_headers]:
                name = str(buf[n_at + n : n_at + n + name_len], "utf-8")
                headers[name] = str(buf[hv_at + hv : hv_at + hv + header_len], "utf-8")  # type: ignore[index]
                n, hv = n + name_len, hv + header_len
            h += n_headers
            delay = next(delays) if attrs & RECORD_DELAY else 0
            ttl = next(ttls) if attrs & RECORD_TTL else 0
            if i >= first:
                binary = bool(attrs & RECORD_BINARY)
                fields = (self.base_offset + i, base_ts + delta, key, value, binary, headers, delay, ttl)
                out.append(_make_record(fields))
        return out

    def header_values(
        self, name: str, from_offset: int | None = None, max_records: int | None = None
    ) -> list[str | None]:
        """The value of header ``name`` of each record :meth:`records` would give (None: the
        record has no such header; of a name given twice, the last value, as its ``headers``
        dict has it), without building the records: per-record Python only when the name's
        bytes occur in the header names at all."""
        first, last = self._range(from_offset, max_records)
        out: list[str | None] = [None] * max(0, last - first)
        if not out:
            return out
        wanted = name.encode("utf-8")
        n0, n1 = self.sections["header_names"]
        if wanted not in self.buffer[n0:n1].tobytes():  # before the starts: a receive's usual case
            return out
        starts = self.header_starts
        if starts[first] == starts[last]:
            return out
        buf, h0 = self.buffer, self.sections["header_values"][0]
        name_at = _exclusive_cumsum(self._headers["name_len"]).tolist()
        value_at = _exclusive_cumsum(self._headers["value_len"]).tolist()
        record_starts = starts[first : last + 1].tolist()
        for i, (h_first, h_end) in enumerate(pairwise(record_starts)):
            for j in range(h_first, h_end):
                if buf[n0 + name_at[j] : n0 + name_at[j + 1]] == wanted:
                    out[i] = str(buf[h0 + value_at[j] : h0 + value_at[j + 1]], "utf-8")
        return out

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


def _bad(reason: str, message: str, record: int | None = None) -> BadBatch:
    return BadBatch(reason, message if record is None else f"record {record}: {message}", record)


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
