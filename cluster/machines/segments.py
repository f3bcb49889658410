"""Segment sealing: committed offset ranges of each queue become immutable files, recorded in Raft.

This module is the apply half (the command is ``cluster/commands/segments.py``, the leader's sealing
task ``cluster/node/sealer.py``). The leader of a queue group seals, for each queue, the committed
messages after the last sealed segment into Arrow IPC and Parquet files (``storage/segments.py``)
once there are ``segments.max_messages`` of them, or ``segments.max_bytes``, or the oldest is older
than ``segments.max_age_ms``. It reads and writes off the Raft tick thread (an executor thread),
writes each file to a hidden temporary name and renames it, and only then proposes a
``seal_segment`` command recording the segment in the queue group's replicated state::

    {"op": "seal_segment", "now_ms": time, "segments": [
        {"topic_id": u32, "queue": u32, "base": u64, "end": u64, "rows": u64, "bytes": u64,
         "crc32c": u32, "parquet_crc32c": u32 | null, "arrow": path, "parquet": path | null,
         "node": str, "first_ts_ms": u64, "last_ts_ms": u64}, ...],
     "prune": [{"topic_id": u32, "queue": u32}, ...]}

Paths are relative to the writer's segment store and use only ``[A-Za-z0-9._/-]``.

State (one key per segment, next to the keys of ``storage/keys.py``)::

    s topic_id queue base  ->  orjson {"end", "rows", "bytes", "crc32c", "parquet_crc32c", "arrow",
                                       "parquet", "node", "first_ts_ms", "last_ts_ms", "index"}

:func:`apply_seal_segment` is the pure part (the queue group machine dispatches to it): no clock,
no I/O but the store, one batch. A segment is accepted only if it starts exactly where the queue's
sealed range ends (or at ``low_offset`` when retention went past it), lies within
``[low_offset, high_offset]`` and has ``rows == end - base``; otherwise that segment is answered
``{"rejected": reason}`` and not recorded (a leader that lost a race deletes its files). Segments
therefore tile a queue's sealed range without gaps or overlaps on every replica.

Retention and drops: retention moves ``low_offset`` (the ``retain`` op); from then on a segment with
``end <= low_offset`` is no longer listed by :func:`manifest` (the same apply hides it), the next
``seal_segment`` names the queue in ``prune`` and removes the entries, and the node that wrote the
files deletes them (``Sealer.collect_garbage``: a file whose range is below ``low_offset``, whose
topic was dropped, or that no entry lists after a grace period). Entries of a dropped topic are
removed by ``prune`` too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from raftmq.cluster.commands.segments import SealSegmentCommand
from raftmq.storage import keys, queues
from raftmq.storage.keys import MAX_U32, QueueMeta
from raftmq.storage.store import Batch, Store

__all__ = [
    "SEGMENT",
    "apply_seal_segment",
    "decode_entry",
    "list_segments",
    "manifest",
    "next_base",
    "queue_prefix",
    "segment_key",
    "segment_topics",
    "topic_prefix",
]

SEGMENT = keys.SEGMENT
"""Key prefix of sealed segments: ``s topic_id queue base``."""

_QUEUE = struct.Struct(">cII")
_SEGMENT = struct.Struct(">cIIQ")


class _Work(Protocol):
    """What the queue group machine's apply offers (``apply.Apply``)."""

    store: Store
    batch: Batch
    index: int

    def meta(self, topic_id: int, queue: int) -> QueueMeta: ...

    def is_dropped(self, topic_id: int) -> bool: ...


# -- keys and reads -----------------------------------------------------------------------------


def segment_key(topic_id: int, queue: int, base: int) -> bytes:
    return _SEGMENT.pack(SEGMENT, topic_id, queue, base)


def queue_prefix(topic_id: int, queue: int) -> bytes:
    return _QUEUE.pack(SEGMENT, topic_id, queue)


def topic_prefix(topic_id: int) -> bytes:
    return SEGMENT + topic_id.to_bytes(4, "big")


def decode_entry(key: bytes, value: bytes) -> dict[str, Any]:
    _, topic_id, queue, base = _SEGMENT.unpack(key)
    entry: dict[str, Any] = orjson.loads(value)
    return {"topic_id": topic_id, "queue": queue, "base": base, **entry}


def list_segments(store: Store, topic_id: int, queue: int) -> list[dict[str, Any]]:
    """Every recorded segment of a queue in offset order (including ones below ``low_offset``
    that the next ``prune`` removes)."""
    return [decode_entry(k, v) for k, v in queues.scan_prefix(store, queue_prefix(topic_id, queue))]


def last_sealed_end(store: Store, topic_id: int, queue: int) -> int | None:
    """The ``end`` of a queue's last recorded segment, or None."""
    prefix = queue_prefix(topic_id, queue)
    found = store.last_before(prefix + b"\xff" * 8, prefix)
    return None if found is None else int(orjson.loads(found[1])["end"])


def next_base(store: Store, topic_id: int, queue: int, meta: QueueMeta) -> int:
    """Where the next segment of a queue must start."""
    end = last_sealed_end(store, topic_id, queue)
    return meta.low_offset if end is None else max(end, meta.low_offset)


def manifest(store: Store, topic_id: int, queue_numbers: list[int]) -> dict[int, dict[str, Any]]:
    """Per queue: ``low_offset``, ``high_offset`` and the segments that still hold retained data.

    Segments are read before the bounds, so every listed segment ends at or below the reported
    ``high_offset`` (both only grow)."""
    out: dict[int, dict[str, Any]] = {}
    for q in queue_numbers:
        segs = list_segments(store, topic_id, q)
        low, high = queues.queue_bounds(store, topic_id, q)
        out[q] = {"low_offset": low, "high_offset": high, "segments": [s for s in segs if s["end"] > low]}
    return out


def segment_topics(store: Store) -> Iterator[int]:
    """The topic ids that have segment entries (one seek per topic)."""
    start = SEGMENT
    while True:
        found = next(iter(queues.scan_prefix(store, SEGMENT, start=start, limit=1)), None)
        if found is None:
            return
        topic_id = int.from_bytes(found[0][1:5], "big")
        yield topic_id
        if topic_id == MAX_U32:
            return
        start = topic_prefix(topic_id + 1)


# -- the pure apply ------------------------------------------------------------------------------


def apply_seal_segment(work: _Work, cmd: SealSegmentCommand) -> dict[str, Any]:
    """Prune, then record each acceptable segment (see the module docstring).

    Result: ``{"sealed": [{"topic_id", "queue", "base", "end"}], "rejected": [{"topic_id", "queue",
    "base", "end", "reason"}], "pruned": [{"topic_id", "queue", "base", "end", "arrow", "parquet",
    "node"}]}``.
    """
    pruned: list[dict[str, Any]] = []
    deleted: set[tuple[int, int, int]] = set()
    seen: set[tuple[int, int]] = set()
    targets = [(p["topic_id"], p["queue"]) for p in cmd["prune"]]
    targets += [(s["topic_id"], s["queue"]) for s in cmd["segments"]]
    for topic_id, queue in targets:
        if (topic_id, queue) in seen:
            continue
        seen.add((topic_id, queue))
        dropped = work.is_dropped(topic_id)
        low = work.meta(topic_id, queue).low_offset
        prefix = topic_prefix(topic_id) if dropped else queue_prefix(topic_id, queue)
        for key, value in queues.scan_prefix(work.store, prefix):
            entry = decode_entry(key, value)
            if not dropped and entry["end"] > low:
                break  # segments are in offset order: the rest hold retained data
            where = (entry["topic_id"], entry["queue"], entry["base"])
            if where in deleted:
                continue
            deleted.add(where)
            work.batch.delete(key)
            pruned.append(
                {k: entry[k] for k in ("topic_id", "queue", "base", "end", "arrow", "parquet", "node")}
            )
    sealed: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    ends: dict[tuple[int, int], int] = {}  # queues sealed earlier in this command
    for s in cmd["segments"]:
        t, q, base, end = s["topic_id"], s["queue"], s["base"], s["end"]
        ident = {"topic_id": t, "queue": q, "base": base, "end": end}
        meta = work.meta(t, q)
        if (t, q) in ends:
            expected = max(ends[(t, q)], meta.low_offset)
        else:
            last = _last_end_excluding(work.store, t, q, deleted)
            expected = meta.low_offset if last is None else max(last, meta.low_offset)
        reason = None
        if work.is_dropped(t):
            reason = f"topic {t} was dropped"
        elif base != expected:
            reason = f"segment must start at {expected}, not {base}"
        elif not base < end <= meta.high_offset:
            reason = f"segment [{base}, {end}) is not within the committed range up to {meta.high_offset}"
        elif s["rows"] != end - base:
            reason = f"segment [{base}, {end}) cannot hold {s['rows']} rows"
        if reason is not None:
            rejected.append({**ident, "reason": reason})
            continue
        fields = {k: v for k, v in s.items() if k not in ("topic_id", "queue", "base")}
        work.batch.put(segment_key(t, q, base), orjson.dumps({**fields, "index": work.index}))
        ends[(t, q)] = end
        sealed.append(ident)
    return {"sealed": sealed, "rejected": rejected, "pruned": pruned}


def _last_end_excluding(
    store: Store, topic_id: int, queue: int, deleted: set[tuple[int, int, int]]
) -> int | None:
    """The last recorded end of a queue, ignoring entries this apply pruned (they all end at or
    below ``low_offset``, so the answer only matters through ``max(..., low_offset)``)."""
    prefix = queue_prefix(topic_id, queue)
    found = store.last_before(prefix + b"\xff" * 8, prefix)
    if found is None:
        return None
    _, t, q, base = _SEGMENT.unpack(found[0])
    if (t, q, base) in deleted:
        return None
    return int(orjson.loads(found[1])["end"])
