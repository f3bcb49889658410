"""The record side of ``read_stored`` (``_validate.py``): a stored batch's columns viewed, with
only the totals checked that keep every record within its section (its CRCs and header were
checked before this runs)."""

from __future__ import annotations

import numpy as np

from ._format import RECORD_DELAY, RECORD_TTL
from ._view import BatchView, _bad, _exclusive_cumsum, _header_dtype, _no_headers, _record_dtype

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
    (a wrong length is a writer's bug the CRC would carry). The starts computed here are the
    view's own (kept: the records' reads use them)."""
    bounds = view.sections
    table = np.frombuffer(buf, dtype=_record_dtype(rec_stride), count=count, offset=bounds["table"][0])
    view.table = table
    view._key_starts = _exclusive_cumsum(table["key_len"])
    view._value_starts = _exclusive_cumsum(table["value_len"])
    view._header_starts = _exclusive_cumsum(table["header_count"])
    if (
        view._key_starts[-1] != bounds["keys"][1] - bounds["keys"][0]
        or view._value_starts[-1] != bounds["values"][1] - bounds["values"][0]
    ):
        raise _bad("bad_length", "the record lengths do not add up to their sections")
    if view._header_starts[-1] != header_total:
        raise _bad("bad_length", "the records' header counts do not add up to the header table")
    if header_total:
        headers = np.frombuffer(
            buf, dtype=_header_dtype(hdr_stride), count=header_total, offset=bounds["header_table"][0]
        )
        names, hvalues = headers["name_len"].sum(dtype=np.int64), headers["value_len"].sum(dtype=np.int64)
        if (
            names != bounds["header_names"][1] - bounds["header_names"][0]
            or hvalues != bounds["header_values"][1] - bounds["header_values"][0]
        ):
            raise _bad("bad_length", "the header lengths do not add up to their sections")
        view._headers = headers
    else:
        if bounds["header_names"][1] > bounds["header_names"][0] or (
            bounds["header_values"][1] > bounds["header_values"][0]
        ):
            raise _bad("bad_length", "header bytes without headers")
        view._headers = _no_headers(hdr_stride)
    extras_at = bounds["extras"][0]
    n_delays = n_ttls = 0
    if extras_bytes:
        attributes = table["attributes"]
        n_delays = int(np.count_nonzero(attributes & RECORD_DELAY))
        n_ttls = int(np.count_nonzero(attributes & RECORD_TTL))
    elif (table["attributes"] & (RECORD_DELAY | RECORD_TTL)).any():
        raise _bad("bad_length", "a delay or TTL bit, but no delay or TTL section")
    if 8 * (n_delays + n_ttls) != extras_bytes:
        raise _bad("bad_length", "the delay and TTL section does not match the records' bits")
    if n_delays:
        view._delays = np.frombuffer(buf, dtype="<u8", count=n_delays, offset=extras_at)
    if n_ttls:
        view._ttls = np.frombuffer(buf, dtype="<u8", count=n_ttls, offset=extras_at + 8 * n_delays)
    bounds["delays"] = (extras_at, extras_at + 8 * n_delays)
    bounds["ttls"] = (extras_at + 8 * n_delays, bounds["extras"][1])
