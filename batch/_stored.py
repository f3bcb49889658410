"""The record side of ``read_stored`` (``_validate.py``): a stored batch's columns viewed, with
only the totals checked that keep every record within its section (its CRCs and header were
checked before this runs)."""

from __future__ import annotations

import struct

import numpy as np

from ._format import RECORD_DELAY, RECORD_TTL
from ._small import SMALL_RECORDS, view_small
from ._view import BatchView, _bad

_WORDS = struct.Struct("<4I")  # the first four u32 words of a record table entry
_HEADER = struct.Struct("<2I")  # a header table entry: name_len, value_len

__all__: list[str] = []  # read_stored (_validate.py) is the public side


def _view_records(
    buf: memoryview,
    view: BatchView,
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
    extras_bytes: int,
) -> None:
    """Fill the rest of ``view`` as ``_validate._check_records`` does (``read_stored``), checking
    only that the records' lengths and counts add up to their sections: the CRCs say the bytes are
    the ones written, and these totals that no record reaches past its section into the next one
    (a wrong length is a writer's bug the CRC would carry). Up to ``SMALL_RECORDS`` records the
    totals are summed in Python (numpy's cost per call is more, as for ``_small.py``)."""
    if count <= SMALL_RECORDS:
        n_delays = _small_totals(buf, view.sections, count, rec_stride, hdr_stride, header_total)
    else:
        n_delays = _totals(buf, view.sections, count, rec_stride, hdr_stride, header_total)
    view_small(buf, view, count, rec_stride, hdr_stride, header_total, n_delays)


def _small_totals(
    buf: memoryview,
    bounds: dict[str, tuple[int, int]],
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
) -> int:
    """:func:`_check_totals` of the totals summed in Python; the number of delays."""
    unpack = _WORDS.unpack_from
    at = bounds["table"][0]
    keys = values = headers = delays = ttls = 0
    for _ in range(count):
        word0, _delta, key_len, value_len = unpack(buf, at)
        at += rec_stride
        keys += key_len
        values += value_len
        headers += (word0 >> 8) & 0xFF
        delays += 1 if word0 & RECORD_DELAY else 0
        ttls += 1 if word0 & RECORD_TTL else 0
    names = header_values = 0
    at = bounds["header_table"][0]
    for _ in range(header_total):
        name_len, value_len = _HEADER.unpack_from(buf, at)
        at += hdr_stride
        names += name_len
        header_values += value_len
    _check_totals(bounds, header_total, keys, values, headers, names, header_values, delays, ttls)
    return delays


def _totals(
    buf: memoryview,
    bounds: dict[str, tuple[int, int]],
    count: int,
    rec_stride: int,
    hdr_stride: int,
    header_total: int,
) -> int:
    """:func:`_check_totals` of the totals summed by numpy; the number of delays."""
    words = np.frombuffer(buf, dtype="<u4", count=count * (rec_stride // 4), offset=bounds["table"][0])
    words = words.reshape(count, rec_stride // 4)
    keys, values = words[:, 2:4].sum(axis=0, dtype=np.int64).tolist()
    word0 = words[:, 0]
    headers = int(((word0 >> 8) & 0xFF).sum(dtype=np.int64))
    delays = int(np.count_nonzero(word0 & RECORD_DELAY))
    ttls = int(np.count_nonzero(word0 & RECORD_TTL))
    names = header_values = 0
    if header_total:
        hwords = np.frombuffer(
            buf, dtype="<u4", count=header_total * (hdr_stride // 4), offset=bounds["header_table"][0]
        ).reshape(header_total, hdr_stride // 4)
        names, header_values = hwords[:, 0:2].sum(axis=0, dtype=np.int64).tolist()
    _check_totals(bounds, header_total, keys, values, headers, names, header_values, delays, ttls)
    return delays


def _check_totals(
    bounds: dict[str, tuple[int, int]],
    header_total: int,
    keys: int,
    values: int,
    headers: int,
    names: int,
    header_values: int,
    delays: int,
    ttls: int,
) -> None:
    """Raise ``bad_length`` unless the records' and headers' totals are their sections' sizes."""

    def size(name: str) -> int:
        return bounds[name][1] - bounds[name][0]

    if keys != size("keys") or values != size("values"):
        raise _bad("bad_length", "the record lengths do not add up to their sections")
    if headers != header_total:
        raise _bad("bad_length", "the records' header counts do not add up to the header table")
    if names != size("header_names") or header_values != size("header_values"):
        raise _bad("bad_length", "the header lengths do not add up to their sections")
    if 8 * (delays + ttls) != size("extras"):
        raise _bad("bad_length", "the delay and TTL section does not match the records' bits")
