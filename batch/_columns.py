"""Stored batches as columns (for sealing segments and Spark): numpy arrays built with a constant
number of Python steps per batch and none per record; :meth:`Columns.to_arrow` wraps them into
an Arrow record batch without copying the value bytes again (pyarrow is imported there only)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._format import MAGIC_V1, RECORD_BINARY, RECORD_KEY
from ._v1 import v1_to_v2
from ._validate import read
from ._view import BatchView

if TYPE_CHECKING:
    import pyarrow

__all__ = ["Columns", "columns"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Columns:
    """The records of several batches, one entry per record (``n``), in the order given.

    Variable-length fields are Arrow-style: ``x_offsets`` (n + 1 int64 positions) into
    ``x_data`` (all bytes, concatenated). Headers are two levels: record ``i`` has headers
    ``header_offsets[i]:header_offsets[i + 1]`` of the header name/value columns.

    Attributes:
        offset: Each record's offset.
        timestamp_ms: The producer's time of each record.
        append_time_ms: The leader's append time of each record's batch.
        raft_index: The Raft index of each record's batch.
        key_valid: False where the record has no key.
        binary: True where the value was produced as bytes.
        delay_ms, ttl_ms: 0 where none.
    """

    offset: I64
    timestamp_ms: I64
    append_time_ms: I64
    raft_index: I64
    key_valid: npt.NDArray[np.bool_]
    key_offsets: I64
    key_data: bytes
    value_offsets: I64
    value_data: bytes
    binary: npt.NDArray[np.bool_]
    header_offsets: I64
    header_name_offsets: I64
    header_name_data: bytes
    header_value_offsets: I64
    header_value_data: bytes
    delay_ms: I64
    ttl_ms: I64

    def __len__(self) -> int:
        return len(self.offset)

    def to_arrow(self) -> pyarrow.RecordBatch:
        """An Arrow record batch: ``offset``, ``timestamp_ms``, ``append_time_ms``,
        ``raft_index`` (int64), ``key`` (string, null where none), ``value`` (large_binary),
        ``binary`` (bool), ``headers`` (map<string, string>), ``delay_ms``, ``ttl_ms`` (int64)."""
        import pyarrow as pa

        n = len(self)
        key_validity = pa.array(self.key_valid).buffers()[1] if not self.key_valid.all() else None
        key = pa.Array.from_buffers(
            pa.large_string(), n, [key_validity, pa.py_buffer(self.key_offsets), pa.py_buffer(self.key_data)]
        )
        value = pa.Array.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(self.value_offsets), pa.py_buffer(self.value_data)]
        )
        m = len(self.header_name_offsets) - 1
        names = pa.Array.from_buffers(
            pa.large_string(),
            m,
            [None, pa.py_buffer(self.header_name_offsets), pa.py_buffer(self.header_name_data)],
        )
        values = pa.Array.from_buffers(
            pa.large_string(),
            m,
            [None, pa.py_buffer(self.header_value_offsets), pa.py_buffer(self.header_value_data)],
        )
        headers = pa.MapArray.from_arrays(pa.array(self.header_offsets.astype(np.int32)), names, values)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.offset),
                pa.array(self.timestamp_ms),
                pa.array(self.append_time_ms),
                pa.array(self.raft_index),
                key,
                value,
                pa.array(self.binary),
                headers,
                pa.array(self.delay_ms),
                pa.array(self.ttl_ms),
            ],
            names=[
                "offset",
                "timestamp_ms",
                "append_time_ms",
                "raft_index",
                "key",
                "value",
                "binary",
                "headers",
                "delay_ms",
                "ttl_ms",
            ],
        )


def _offsets(parts: list[I64]) -> I64:
    """One n + 1 offsets array from per-batch n_b + 1 arrays, each starting at 0."""
    if not parts:
        return np.zeros(1, dtype=np.int64)
    lengths = np.concatenate([np.diff(p) for p in parts])
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def columns(batches: Iterable[bytes | bytearray | memoryview | BatchView]) -> Columns:
    """The records of ``batches`` (v2 batches, views of them, or v1 values, which are converted
    first: per-message work for old data only) as :class:`Columns`.

    Raises:
        BadBatch: a batch fails :func:`read`.
    """
    views: list[BatchView] = []
    for b in batches:
        if isinstance(b, BatchView):
            views.append(b)
        elif len(b) and memoryview(b).cast("B")[0] == MAGIC_V1:
            views.append(read(v1_to_v2(b)))
        else:
            views.append(read(b))
    per: dict[str, list[Any]] = {
        k: []
        for k in (
            "offset",
            "ts",
            "append",
            "raft",
            "attrs",
            "key_off",
            "keys",
            "val_off",
            "vals",
            "hdr_off",
            "name_off",
            "names",
            "hval_off",
            "hvals",
            "delay",
            "ttl",
        )
    }
    for v in views:
        n = v.count
        per["offset"].append(np.arange(v.base_offset, v.base_offset + n, dtype=np.int64))
        per["ts"].append(v.base_timestamp_ms + v.timestamp_delta.astype(np.int64))
        per["append"].append(np.full(n, v.append_time_ms, dtype=np.int64))
        per["raft"].append(np.full(n, v.raft_index, dtype=np.int64))
        per["attrs"].append(v.attributes)
        per["key_off"].append(v.key_starts)
        per["keys"].append(v.section("keys"))
        per["val_off"].append(v.value_starts)
        per["vals"].append(v.section("values"))
        per["hdr_off"].append(v.header_starts)
        ht = v.header_table
        per["name_off"].append(np.concatenate(([0], np.cumsum(ht["name_len"], dtype=np.int64))))
        per["names"].append(v.section("header_names"))
        per["hval_off"].append(np.concatenate(([0], np.cumsum(ht["value_len"], dtype=np.int64))))
        per["hvals"].append(v.section("header_values"))
        per["delay"].append(v.delay_ms())
        per["ttl"].append(v.ttl_ms())

    def cat(name: str, dtype: type) -> Any:
        return np.concatenate(per[name]).astype(dtype, copy=False) if per[name] else np.zeros(0, dtype=dtype)

    attrs = cat("attrs", np.uint8)
    return Columns(
        offset=cat("offset", np.int64),
        timestamp_ms=cat("ts", np.int64),
        append_time_ms=cat("append", np.int64),
        raft_index=cat("raft", np.int64),
        key_valid=(attrs & RECORD_KEY) != 0,
        key_offsets=_offsets(per["key_off"]),
        key_data=b"".join(per["keys"]),
        value_offsets=_offsets(per["val_off"]),
        value_data=b"".join(per["vals"]),
        binary=(attrs & RECORD_BINARY) != 0,
        header_offsets=_offsets(per["hdr_off"]),
        header_name_offsets=_offsets(per["name_off"]),
        header_name_data=b"".join(per["names"]),
        header_value_offsets=_offsets(per["hval_off"]),
        header_value_data=b"".join(per["hvals"]),
        delay_ms=cat("delay", np.int64),
        ttl_ms=cat("ttl", np.int64),
    )
