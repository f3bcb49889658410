"""The check of a small batch without numpy: ``_validate._check``'s path for at most
:data:`SMALL_RECORDS` records, whose numpy calls (about 20 µs a batch whatever its size) cost more
than a Python loop over its records. What a producer sends one message at a time, and an SQS
send (10 messages, two headers and a TTL each), which every replica checks again at apply.

Invariant: :func:`small_accepts` only accepts, and only what the vectorised checks
(``_validate._check_records``) accept, with the same view; a batch it does not accept (anything
in doubt: over a limit, text that is not ASCII, a total that does not add up) goes through the
vectorised checks, which find and name the error. So both paths refuse exactly the same batches,
for the same reason and record (``tests/unit/test_batch_small.py`` compares them).
"""

from __future__ import annotations

import struct

import numpy as np

from ._format import RECORD_BINARY, RECORD_DELAY, RECORD_KEY, RECORD_TTL, RESERVED_HEADER_PREFIX
from ._limits import Limits
from ._view import BatchView, _header_dtype, _no_headers, _record_dtype

__all__: list[str] = []  # _validate.read and validate are the public side

SMALL_RECORDS = 32
"""Up to this many records, a batch is checked without numpy when it can be (:func:`small_accepts`)."""
_WORDS = struct.Struct("<4I")  # the first four u32 words of a record table entry
_HEADER = struct.Struct("<2I")  # a header table entry: name_len, value_len
_RESERVED = RESERVED_HEADER_PREFIX.encode()
_NO_LIMIT = 1 << 64  # more than any u32 length or sum of a batch


def small_accepts(
    buf: memoryview,
    bounds: dict[str, tuple[int, int]],
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
    limits: Limits | None,
) -> int | None:
    """Whether the records of a small batch pass every check of ``_check_records``: the number
    of its delays when they do (the view then needs it), None when it cannot tell (then the
    vectorised checks decide and name the error; None is not a refusal).

    Per record: no attribute bits but binary and key (and the header count with a header table,
    delay and TTL with their section), no reserved bits; a key length only with the key bit; at
    most the limits' headers, key and message bytes (key, value, its headers' names and values).
    Then: the lengths and counts add up to their sections; delays and TTLs are not 0 and within
    the limits; keys, header names and values, and the values unless every one is binary, are
    ASCII (valid UTF-8 cut anywhere; other UTF-8 goes the vectorised way); and, where the limits
    refuse them, no header name starts with the reserved prefix."""
    max_key = max_message = _NO_LIMIT
    max_headers = 0xFF
    if limits is not None:
        max_key, max_message, max_headers = limits.max_key_bytes, limits.max_message_bytes, limits.max_headers
    if header_total > count * min(max_headers, 0xFF):
        return None  # more headers than the records may have: refused the vectorised way, not walked
    headers = _header_sizes(buf, bounds, header_total, hdr_stride)
    if headers is None:
        return None
    name_lens, sizes = headers
    extras_at, extras_end = bounds["extras"]
    allowed = RECORD_BINARY | RECORD_KEY
    if header_total:
        allowed |= 0xFF00
    if extras_end > extras_at:
        allowed |= RECORD_DELAY | RECORD_TTL
    unpack = _WORDS.unpack_from
    at = bounds["table"][0]
    key_sum = value_sum = n_delays = n_ttls = h = 0
    all_binary = True
    for _ in range(count):
        word0, _delta, key_len, value_len = unpack(buf, at)
        at += rec_stride
        if word0 & ~allowed or (key_len and not word0 & RECORD_KEY):
            return None
        size = key_len + value_len
        n_headers = word0 >> 8
        if n_headers:
            if n_headers > max_headers or h + n_headers > header_total:
                return None
            size += sum(sizes[h : h + n_headers])
            h += n_headers
        if key_len > max_key or size > max_message:
            return None
        n_delays += 1 if word0 & RECORD_DELAY else 0
        n_ttls += 1 if word0 & RECORD_TTL else 0
        all_binary = all_binary and bool(word0 & RECORD_BINARY)
        key_sum += key_len
        value_sum += value_len
    k0, k1 = bounds["keys"]
    v0, v1 = bounds["values"]
    if h != header_total or key_sum != k1 - k0 or value_sum != v1 - v0:
        return None
    if 8 * (n_delays + n_ttls) != extras_end - extras_at or not _timing_ok(
        buf, extras_at, n_delays, n_ttls, limits
    ):
        return None
    if k1 > k0 and not bytes(buf[k0:k1]).isascii():
        return None
    if header_total and not _headers_ok(buf, bounds, name_lens, limits):
        return None
    if not (all_binary or v1 == v0 or bytes(buf[v0:v1]).isascii()):
        return None
    return n_delays


def view_small(
    buf: memoryview,
    view: BatchView,
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
    n_delays: int,
) -> None:
    """Fill the rest of ``view`` for a batch :func:`small_accepts` accepted with ``n_delays``, as
    ``_check_records`` fills it."""
    bounds = view.sections
    view.table = np.frombuffer(buf, dtype=_record_dtype(rec_stride), count=count, offset=bounds["table"][0])
    view._headers = (
        np.frombuffer(
            buf, dtype=_header_dtype(hdr_stride), count=header_total, offset=bounds["header_table"][0]
        )
        if header_total
        else _no_headers(hdr_stride)
    )
    extras_at, extras_end = bounds["extras"]
    n_ttls = (extras_end - extras_at) // 8 - n_delays
    if n_delays:
        view._delays = np.frombuffer(buf, dtype="<u8", count=n_delays, offset=extras_at)
    if n_ttls:
        view._ttls = np.frombuffer(buf, dtype="<u8", count=n_ttls, offset=extras_at + 8 * n_delays)
    bounds["delays"] = (extras_at, extras_at + 8 * n_delays)
    bounds["ttls"] = (extras_at + 8 * n_delays, extras_end)


def _header_sizes(
    buf: memoryview, bounds: dict[str, tuple[int, int]], header_total: int, hdr_stride: int
) -> tuple[list[int], list[int]] | None:
    """Each header's name length and its name + value bytes, when the lengths add up to the
    header sections (None otherwise, or header bytes without headers)."""
    n0, n1 = bounds["header_names"]
    h0, h1 = bounds["header_values"]
    names: list[int] = []
    sizes: list[int] = []
    at = bounds["header_table"][0]
    for _ in range(header_total):
        name_len, value_len = _HEADER.unpack_from(buf, at)
        at += hdr_stride
        names.append(name_len)
        sizes.append(name_len + value_len)
    if sum(names) != n1 - n0 or sum(sizes) - sum(names) != h1 - h0:
        return None
    return names, sizes


def _timing_ok(buf: memoryview, at: int, n_delays: int, n_ttls: int, limits: Limits | None) -> bool:
    """The delays and then the TTLs at ``at`` are all at least 1 (0 is "absent") and within the limits."""
    if not (n_delays or n_ttls):
        return True
    delays = struct.unpack_from(f"<{n_delays}Q", buf, at)
    ttls = struct.unpack_from(f"<{n_ttls}Q", buf, at + 8 * n_delays)
    if (delays and min(delays) == 0) or (ttls and min(ttls) == 0):
        return False
    if limits is None:
        return True
    return (not delays or max(delays) <= limits.max_delay_ms) and (not ttls or max(ttls) <= limits.max_ttl_ms)


def _headers_ok(
    buf: memoryview, bounds: dict[str, tuple[int, int]], name_lens: list[int], limits: Limits | None
) -> bool:
    """Header names and values ASCII; where the limits refuse reserved headers, no name starting
    with the prefix (ASCII letters without case, as ``is_reserved_header``)."""
    n0, n1 = bounds["header_names"]
    h0, h1 = bounds["header_values"]
    names = bytes(buf[n0:n1])
    if not names.isascii() or not bytes(buf[h0:h1]).isascii():
        return False
    if limits is None or not limits.refuse_reserved_headers:
        return True
    at = 0
    for length in name_lens:
        if names[at : at + length].lower().startswith(_RESERVED):
            return False
        at += length
    return True
