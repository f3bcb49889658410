"""The ``seal_segment`` command: its shape, its bytes and its strict decoder.

    {"op": "seal_segment", "now_ms": time, "segments": [
        {"topic_id": u32, "queue": u32, "base": u64, "end": u64, "rows": u64, "bytes": u64,
         "crc32c": u32, "parquet_crc32c": u32 | null, "arrow": path, "parquet": path | null,
         "node": str, "first_ts_ms": u64, "last_ts_ms": u64}, ...],
     "prune": [{"topic_id": u32, "queue": u32}, ...]}

Paths are relative to the writer's segment store and use only ``[A-Za-z0-9._/-]``. What the command
does to a queue group's store is ``cluster/machines/segments.py``; who proposes it,
``cluster/node/sealer.py``.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypedDict

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.base.limits import MAX_TIME_MS
from raftmq.storage.keys import MAX_U32, MAX_U64

__all__ = ["PruneEntry", "SealSegmentCommand", "SegmentEntry", "decode_seal_segment", "seal_segment"]

_PATH = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")
_NODE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_PATH = 1024
MAX_SEGMENTS_PER_COMMAND = 64


class SegmentEntry(TypedDict):
    topic_id: int
    queue: int
    base: int
    end: int
    rows: int
    bytes: int
    crc32c: int
    parquet_crc32c: int | None
    arrow: str
    parquet: str | None
    node: str
    first_ts_ms: int
    last_ts_ms: int


class PruneEntry(TypedDict):
    topic_id: int
    queue: int


class SealSegmentCommand(TypedDict):
    v: int
    op: Literal["seal_segment"]
    now_ms: int
    segments: list[SegmentEntry]
    prune: list[PruneEntry]


# -- the command ---------------------------------------------------------------------------------


def seal_segment(now_ms: int, segments: list[dict[str, Any]], prune: list[tuple[int, int]]) -> bytes:
    """The ``seal_segment`` command bytes."""
    return orjson.dumps(
        {
            "v": 1,
            "op": "seal_segment",
            "now_ms": now_ms,
            "segments": segments,
            "prune": [{"topic_id": t, "queue": q} for t, q in prune],
        }
    )


def _bad(message: str) -> Exception:
    return BadCommand(errors.BAD_REQUEST, message)


def _uint(obj: dict[str, Any], name: str, max_value: int, where: str) -> int:
    value = obj.get(name)
    if type(value) is not int or not 0 <= value <= max_value:
        raise _bad(f"{where}{name}: expected an integer in [0, {max_value}], got {value!r}")
    return value


def _path(obj: dict[str, Any], name: str, where: str, optional: bool = False) -> str | None:
    value = obj.get(name)
    if value is None and optional:
        return None
    if (
        type(value) is not str
        or len(value) > MAX_PATH
        or not _PATH.match(value)
        or any(part in (".", "..") for part in value.split("/"))
    ):
        raise _bad(f"{where}{name}: expected a relative path of [A-Za-z0-9._-] parts, got {value!r}")
    return value


def _fields(obj: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if type(obj) is not dict:
        raise _bad(f"{where}: expected an object")
    unknown = obj.keys() - allowed
    if unknown:
        raise _bad(f"{where}: unknown fields {sorted(unknown)}")
    return obj


def _list(obj: dict[str, Any], name: str, max_len: int) -> list[Any]:
    value = obj.get(name)
    if type(value) is not list or len(value) > max_len:
        raise _bad(f"{name}: expected a list of at most {max_len} items")
    return value


_SEGMENT_FIELDS = set(SegmentEntry.__annotations__)


def decode_seal_segment(obj: dict[str, Any]) -> SealSegmentCommand:
    """Strictly validate a ``seal_segment`` command (``obj`` is the parsed JSON object).

    Raises:
        BadCommand: an unknown or invalid field.
    """
    _fields(obj, "command", {"v", "op", "now_ms", "segments", "prune"})
    now_ms = _uint(obj, "now_ms", MAX_TIME_MS, "")
    segments: list[SegmentEntry] = []
    for i, raw in enumerate(_list(obj, "segments", MAX_SEGMENTS_PER_COMMAND)):
        where = f"segments[{i}]."
        s = _fields(raw, where[:-1], _SEGMENT_FIELDS)
        node = s.get("node")
        if type(node) is not str or not _NODE.match(node):
            raise _bad(f"{where}node: expected a node id")
        parquet_crc = None if s.get("parquet_crc32c") is None else _uint(s, "parquet_crc32c", MAX_U32, where)
        entry: SegmentEntry = {
            "topic_id": _uint(s, "topic_id", MAX_U32, where),
            "queue": _uint(s, "queue", MAX_U32, where),
            "base": _uint(s, "base", MAX_U64, where),
            "end": _uint(s, "end", MAX_U64, where),
            "rows": _uint(s, "rows", MAX_U64, where),
            "bytes": _uint(s, "bytes", MAX_U64, where),
            "crc32c": _uint(s, "crc32c", MAX_U32, where),
            "parquet_crc32c": parquet_crc,
            "arrow": _path(s, "arrow", where) or "",
            "parquet": _path(s, "parquet", where, optional=True),
            "node": node,
            "first_ts_ms": _uint(s, "first_ts_ms", MAX_TIME_MS, where),
            "last_ts_ms": _uint(s, "last_ts_ms", MAX_TIME_MS, where),
        }
        segments.append(entry)
    prune: list[PruneEntry] = []
    for i, raw in enumerate(_list(obj, "prune", 4096)):
        p = _fields(raw, f"prune[{i}]", {"topic_id", "queue"})
        prune.append(
            {
                "topic_id": _uint(p, "topic_id", MAX_U32, f"prune[{i}]."),
                "queue": _uint(p, "queue", MAX_U32, f"prune[{i}]."),
            }
        )
    return {"v": 1, "op": "seal_segment", "now_ms": now_ms, "segments": segments, "prune": prune}
