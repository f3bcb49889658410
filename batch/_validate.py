"""Checking a v2 batch: :func:`validate` (the node's check of a produced batch, against its
:class:`Limits`), :func:`read` (the same checks without the limits, for stored or fetched batches)
and :func:`reserved_header_record`. Both checks end in a :class:`BatchView` whose columns they
filled (``_view.py``).

Validation is vectorised: the record table is one ``np.frombuffer`` view, every per-record check
is one numpy expression over all records, and UTF-8 is checked per section, not per string
(:func:`_first_bad_utf8`). A failed check raises :class:`BadBatch` naming the first bad record.

A small batch (at most ``SMALL_RECORDS`` records: what a producer sends one message at a time,
an SQS send) skips numpy, whose per-call cost is most of the check of a few records: ``_small.py``
checks its records in Python. Invariant: that path only accepts, and only what the vectorised
checks accept with the same view; a batch it does not accept goes through the vectorised checks,
which find the error. So both paths refuse exactly the same batches, for the same reason and
record (``tests/unit/test_batch_small.py`` compares them).
"""

from __future__ import annotations

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
    STAMP_SIZE,
    STAMPED,
    U32,
)
from ._limits import Limits
from ._small import SMALL_RECORDS, small_accepts, view_small
from ._stored import _view_records
from ._view import (
    _NO_U64,
    I64,
    BatchView,
    Buffer,
    _bad,
    _exclusive_cumsum,
    _header_dtype,
    _no_headers,
    _record_dtype,
)

__all__ = ["Limits", "read", "read_stored", "reserved_header_record", "validate"]


def read(buf: Buffer) -> BatchView:
    """Check one whole v2 batch (its CRCs, lengths, fields and UTF-8) and view it; no limit is
    applied. For batches already accepted once (stored, replicated, fetched).

    Raises:
        BadBatch: the first problem found; ``record`` names the first bad record when one is.
    """
    return _check(memoryview(buf).cast("B"), None)


def read_stored(buf: Buffer) -> BatchView:
    """View a batch this node stored: its CRCs and header checked as :func:`read` does, and the
    records' lengths and counts against their sections (so no record reaches past its section),
    not the records themselves. Only for bytes that passed :func:`read` or :func:`validate` before they were
    stored (a queue group applies a batch only after :func:`read`): a matching CRC says they are
    still those bytes, so the record checks would find nothing new, and they were most of a
    receive's check (numpy's cost per call, for the few records a receive reads).

    Raises:
        BadBatch: a CRC, the header or the sections' lengths do not match (a damaged value), or
            the records' lengths and counts do not add up to their sections (``bad_length``).
    """
    return _check(memoryview(buf).cast("B"), None, stored=True)


def validate(buf: Buffer, limits: Limits) -> BatchView:
    """Check one whole v2 batch as :func:`read` does, and against ``limits``: what the node does
    with a produced batch before anything is proposed.

    Raises:
        BadBatch: the first problem found (``message_too_large``, ``too_many_records``, ...).
    """
    return _check(memoryview(buf).cast("B"), limits)


INT64_MAX = (1 << 63) - 1


def _check(
    buf: memoryview, limits: Limits | None, small_records: int = SMALL_RECORDS, stored: bool = False
) -> BatchView:
    size = len(buf)
    if size < HEADER_SIZE:
        raise _bad("truncated", f"{size} bytes is shorter than a batch header ({HEADER_SIZE})")
    if buf[0] != MAGIC:
        raise _bad("unknown_version", f"unknown batch format version {buf[0]} (this reader knows {MAGIC})")
    stamped = buf[:STAMP_SIZE]
    if crc32c.crc32c(stamped) != U32.unpack_from(buf, HEADER_CRC_AT)[0]:
        raise _bad("header_crc_mismatch", "the batch header's CRC does not match")
    _, batch_length, base_offset, append_time_ms, raft_index = STAMPED.unpack_from(buf, 0)
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

    view = BatchView.__new__(BatchView)
    view._key_starts = view._value_starts = view._header_starts = None
    view.buffer = buf
    view.sections = bounds
    view.base_offset = base_offset
    view.append_time_ms = append_time_ms
    view.raft_index = raft_index
    view.count = count
    view.producer_id = producer_id
    view.producer_epoch = epoch
    view.base_sequence = base_sequence
    view.base_timestamp_ms = base_timestamp_ms
    view._delays = view._ttls = _NO_U64
    if stored:
        _view_records(buf, view, count, rec_stride, hdr_stride, header_total, extras_bytes)
        return view
    if count <= small_records:
        n_delays = small_accepts(buf, bounds, count, rec_stride, hdr_stride, header_total, limits)
        if n_delays is not None:
            view_small(buf, view, count, rec_stride, hdr_stride, header_total, n_delays)
            return view
    sizes = (header_total, keys_bytes, names_bytes, hvalues_bytes, values_bytes, extras_bytes)
    _check_records(buf, limits, view, count, rec_stride, hdr_stride, *sizes)
    return view


def _check_records(
    buf: memoryview,
    limits: Limits | None,
    view: BatchView,
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
    keys_bytes: int,
    names_bytes: int,
    hvalues_bytes: int,
    values_bytes: int,
    extras_bytes: int,
) -> None:
    """The vectorised checks of the record table, headers, delays and TTLs, limits and UTF-8;
    fills the rest of ``view`` (its header fields and sections are set)."""
    bounds = view.sections
    # The record table as rows of u32 words: word 0 = attributes | header_count << 8 | reserved
    # << 16, then timestamp_delta, key_len, value_len (entry sizes grow by whole words).
    words = np.frombuffer(
        buf, dtype="<u4", count=count * (rec_stride // 4), offset=bounds["table"][0]
    ).reshape(count, rec_stride // 4)
    word0 = words[:, 0]
    key_len = words[:, 2]
    value_len = words[:, 3]
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
    if limits is not None and limits.refuse_reserved_headers and header_total:
        reserved = reserved_header_record(view)
        if reserved is not None:
            raise _bad("reserved_header", f"a header name starts with {RESERVED_HEADER_PREFIX!r}", reserved)
    view._delays = delays
    view._ttls = ttls
    bounds["delays"] = (extras_at, extras_at + 8 * n_delays)
    bounds["ttls"] = (extras_at + 8 * n_delays, bounds["extras"][1])


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
