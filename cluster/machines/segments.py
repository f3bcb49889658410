"""Segment sealing: committed offset ranges of each queue become immutable files, recorded in Raft.

The leader of a queue group seals, for each queue, the committed messages after the last sealed
segment into Arrow IPC and Parquet files (``storage/segments.py``) once there are
``segments.max_messages`` of them, or ``segments.max_bytes``, or the oldest is older than
``segments.max_age_ms``. It reads and writes off the Raft tick thread (an executor thread), writes
each file to a hidden temporary name and renames it, and only then proposes a ``seal_segment``
command recording the segment in the queue group's replicated state::

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
files deletes them (:meth:`Sealer.collect_garbage`: a file whose range is below ``low_offset``, whose
topic was dropped, or that no entry lists after a grace period). Entries of a dropped topic are
removed by ``prune`` too.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import orjson
import structlog

from raftmq.cluster.base import errors
from raftmq.storage import keys, queues
from raftmq.storage.keys import MAX_U32, MAX_U64, QueueMeta
from raftmq.storage.records import decode_header
from raftmq.storage.store import Batch, Store

if TYPE_CHECKING:
    from raftmq.cluster.config.cluster_file import NodeConfig
    from raftmq.cluster.machines.metadata import Topic
    from raftmq.cluster.node.node import Node
    from raftmq.storage.segments import SegmentStore, WrittenSegment

__all__ = [
    "SEGMENT",
    "SealSegmentCommand",
    "Sealer",
    "apply_seal_segment",
    "decode_seal_segment",
    "list_segments",
    "manifest",
    "seal_segment",
    "segment_key",
    "segment_root",
]

log = structlog.get_logger(__name__)

SEGMENT = keys.SEGMENT
"""Key prefix of sealed segments: ``s topic_id queue base``."""

_QUEUE = struct.Struct(">cII")
_SEGMENT = struct.Struct(">cIIQ")
_PATH = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")
_NODE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_PATH = 1024
MAX_SEGMENTS_PER_COMMAND = 64
MAX_TIME_MS = 2**62


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


class _Work(Protocol):
    """What the queue group machine's apply offers (``queue_group._Apply``)."""

    store: Store
    batch: Batch
    index: int

    def meta(self, topic_id: int, queue: int) -> QueueMeta: ...

    def is_dropped(self, topic_id: int) -> bool: ...


# -- keys and reads -----------------------------------------------------------------------------


def segment_key(topic_id: int, queue: int, base: int) -> bytes:
    return _SEGMENT.pack(SEGMENT, topic_id, queue, base)


def _queue_prefix(topic_id: int, queue: int) -> bytes:
    return _QUEUE.pack(SEGMENT, topic_id, queue)


def _topic_prefix(topic_id: int) -> bytes:
    return SEGMENT + topic_id.to_bytes(4, "big")


def _decode(key: bytes, value: bytes) -> dict[str, Any]:
    _, topic_id, queue, base = _SEGMENT.unpack(key)
    entry: dict[str, Any] = orjson.loads(value)
    return {"topic_id": topic_id, "queue": queue, "base": base, **entry}


def list_segments(store: Store, topic_id: int, queue: int) -> list[dict[str, Any]]:
    """Every recorded segment of a queue in offset order (including ones below ``low_offset``
    that the next ``prune`` removes)."""
    return [_decode(k, v) for k, v in queues.scan_prefix(store, _queue_prefix(topic_id, queue))]


def last_sealed_end(store: Store, topic_id: int, queue: int) -> int | None:
    """The ``end`` of a queue's last recorded segment, or None."""
    prefix = _queue_prefix(topic_id, queue)
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


def _segment_topics(store: Store) -> Iterator[int]:
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
        start = _topic_prefix(topic_id + 1)


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
    from raftmq.cluster.commands import BadCommand  # commands imports this module

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
        prefix = _topic_prefix(topic_id) if dropped else _queue_prefix(topic_id, queue)
        for key, value in queues.scan_prefix(work.store, prefix):
            entry = _decode(key, value)
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
    prefix = _queue_prefix(topic_id, queue)
    found = store.last_before(prefix + b"\xff" * 8, prefix)
    if found is None:
        return None
    _, t, q, base = _SEGMENT.unpack(found[0])
    if (t, q, base) in deleted:
        return None
    return int(orjson.loads(found[1])["end"])


# -- where files live ----------------------------------------------------------------------------


def segment_root(store_setting: str, node: NodeConfig) -> str:
    """The segment store root of ``node``: ``segments.store`` (``{node_id}`` is replaced), or
    ``<data_dir>/<node_id>/segments`` when it is empty."""
    if store_setting:
        return store_setting.replace("{node_id}", node.id)
    return os.path.abspath(os.path.join(node.data_dir, node.id, "segments"))


def locate(root: str, rel: str) -> str:
    """The absolute path or URI of ``rel`` under ``root``. Raises ``UnsafePath`` (a ValueError)
    when ``rel`` could leave ``root`` (``..``, absolute); seal commands never store such a path."""
    from raftmq.storage.segments import checked_rel

    if "://" in root:
        return root.rstrip("/") + "/" + checked_rel(rel)
    return os.path.join(os.path.abspath(root), checked_rel(rel))


# -- the leader's sealing task (and every node's garbage collection) -----------------------------


@dataclass
class _Progress:
    """What the last check of a queue's unsealed range found (so it is not re-read each time)."""

    base: int
    scanned_to: int
    bytes: int
    first_ts_ms: int | None


class Sealer:
    """Seals the queues of the groups this node leads, and deletes this node's dead files."""

    def __init__(self, node: Node) -> None:
        from raftmq.storage.segments import SegmentStore

        self.node = node
        self.settings = node.config.segments
        self.store: SegmentStore = SegmentStore(segment_root(self.settings.store, node.me))
        self._progress: dict[tuple[str, int, int], _Progress] = {}
        self._last_gc = 0.0

    async def run_forever(self) -> None:
        interval_s = self.settings.check_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.once()
            except Exception:
                log.exception("segment_seal_failed")

    async def _topics(self) -> list[Topic]:
        from raftmq.cluster.machines.metadata import Topic

        if self.node.metadata is not None:
            return list(self.node.metadata.topics())
        for voter in self.node.config.metadata_voters:
            try:
                body = await self.node.peer_get_json(voter, "/v1/topics", timeout_s=2.0)
                return [Topic.from_json(t) for t in body["topics"]]
            except Exception:
                continue
        return []

    async def once(self, force: bool = False) -> list[dict[str, Any]]:
        """One round: seal what is due in every group this node leads (``force``: seal every
        unsealed committed range now), then collect garbage if it is time. Returns the results."""
        if not self.settings.enabled:
            return []
        results: list[dict[str, Any]] = []
        leading = [n for n, g in self.node.groups.items() if n != "meta" and g.raft.is_leader()]
        if leading:
            topics = await self._topics()
            for name in leading:
                results += await self._seal_group(name, topics, force)
        if time.monotonic() - self._last_gc >= self.settings.gc_interval_ms / 1000:
            self._last_gc = time.monotonic()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.collect_garbage)
        return results

    async def _seal_group(self, name: str, topics: list[Topic], force: bool) -> list[dict[str, Any]]:
        from raftmq.cluster.node.node import now_ms

        local = self.node.groups[name]
        store = local.machine.store
        loop = asyncio.get_running_loop()
        results = []
        prune = await loop.run_in_executor(None, self._prune_targets, store)
        for topic in topics:
            for q, g in enumerate(topic.queue_groups):
                if str(g) != name or not local.raft.is_leader():
                    continue
                span = await loop.run_in_executor(None, self._due, name, store, topic.id, q, now_ms(), force)
                if span is None:
                    continue
                base, end = span
                try:
                    written = await loop.run_in_executor(None, self._write, store, topic, q, base, end)
                except Exception:
                    log.exception("segment_write_failed", topic=topic.name, queue=q, base=base, end=end)
                    continue
                entry = self._entry(topic.id, q, base, end, written)
                outcome = await self.node.propose(name, seal_segment(now_ms(), [entry], prune))
                prune = []
                result = outcome.result if isinstance(outcome.result, dict) else {}
                if outcome.error or "error" in result or not result.get("sealed"):
                    log.warning("segment_not_sealed", group=name, error=outcome.error or result)
                    if not outcome.error or outcome.definite:  # surely not recorded: drop the files
                        await loop.run_in_executor(None, self._delete_files, written)
                    continue
                self._progress.pop((name, topic.id, q), None)
                log.info("segment_sealed", topic=topic.name, queue=q, base=base, end=end, rows=written.rows)
                results.append(result)
        if prune:
            outcome = await self.node.propose(name, seal_segment(now_ms(), [], prune))
            if not outcome.error and isinstance(outcome.result, dict):
                results.append(outcome.result)
        return results

    def _prune_targets(self, store: Store) -> list[tuple[int, int]]:
        """Queues whose first segment lies below ``low_offset``, and topics dropped with segments
        left (executor thread)."""
        targets: list[tuple[int, int]] = []
        for topic_id in _segment_topics(store):
            if store.get(keys.dropped_key(topic_id)) is not None:
                targets.append((topic_id, 0))
                continue
            queue = -1
            while True:
                start = _queue_prefix(topic_id, queue + 1) if queue + 1 <= MAX_U32 else None
                if start is None:
                    break
                found = next(
                    iter(queues.scan_prefix(store, _topic_prefix(topic_id), start=start, limit=1)), None
                )
                if found is None:
                    break
                entry = _decode(*found)
                queue = entry["queue"]
                low, _ = queues.queue_bounds(store, topic_id, queue)
                if entry["end"] <= low:
                    targets.append((topic_id, queue))
                if len(targets) >= 1024:
                    return targets
        return targets

    def _due(
        self, name: str, store: Store, topic_id: int, queue: int, now: int, force: bool
    ) -> tuple[int, int] | None:
        """The range to seal now, or None (executor thread)."""
        meta = queues.queue_meta(store, topic_id, queue)
        if meta is None:
            return None
        s = self.settings
        base = next_base(store, topic_id, queue, meta)
        high = meta.high_offset
        if high <= base:
            return None
        if high - base >= s.max_messages:
            return base, base + s.max_messages
        if force:
            return base, high
        key = (name, topic_id, queue)
        progress = self._progress.get(key)
        if progress is None or progress.base != base:
            progress = self._progress[key] = _Progress(base, base, 0, None)
        # Add up the stored size of the batches not looked at yet.
        found = store.last_before(
            keys.record_key(topic_id, queue, progress.scanned_to), keys.record_prefix(topic_id, queue)
        )
        start_key = found[0] if found is not None else keys.record_key(topic_id, queue, progress.scanned_to)
        _, range_end = keys.queue_range(keys.RECORD, topic_id, queue)
        for _k, v in store.scan(start_key, range_end):
            header = decode_header(v)
            if header.end_offset <= progress.scanned_to:
                continue
            if progress.first_ts_ms is None:
                progress.first_ts_ms = header.append_time_ms
            progress.bytes += len(v)
            progress.scanned_to = header.end_offset
            if progress.bytes >= s.max_bytes:
                return base, min(header.end_offset, base + s.max_messages)
        if s.max_age_ms and progress.first_ts_ms is not None and progress.first_ts_ms <= now - s.max_age_ms:
            return base, min(high, progress.scanned_to)
        return None

    def _write(self, store: Store, topic: Topic, queue: int, base: int, end: int) -> WrittenSegment:
        """Read ``[base, end)`` and write the segment files (executor thread)."""
        from raftmq.storage.segments import BATCH_ROWS, read_columns, segment_name

        batches = []
        offset = base
        while offset < end:
            batch, offset = read_columns(
                store, topic.id, topic.name, queue, offset, end, BATCH_ROWS, 256 * 1024 * 1024
            )
            if batch.num_rows == 0:
                raise RuntimeError(f"queue {queue} of {topic.name} stopped at {offset} before {end}")
            batches.append(batch)
        me = self.node.me.id
        arrow = segment_name(topic.name, topic.id, queue, base, end, me, "arrow")
        parquet = (
            segment_name(topic.name, topic.id, queue, base, end, me, "parquet")
            if self.settings.parquet
            else None
        )
        return self.store.write(batches, arrow, parquet)

    def _entry(self, topic_id: int, queue: int, base: int, end: int, w: WrittenSegment) -> dict[str, Any]:
        return {
            "topic_id": topic_id,
            "queue": queue,
            "base": base,
            "end": end,
            "rows": w.rows,
            "bytes": w.bytes,
            "crc32c": w.crc32c,
            "parquet_crc32c": w.parquet_crc32c,
            "arrow": w.arrow,
            "parquet": w.parquet,
            "node": self.node.me.id,
            "first_ts_ms": w.first_ts_ms,
            "last_ts_ms": w.last_ts_ms,
        }

    def _delete_files(self, written: WrittenSegment) -> None:
        for rel in (written.arrow, written.parquet):
            if rel is not None:
                self.store.delete(rel)

    def collect_garbage(self) -> int:
        """Delete this node's segment files that no replica state here lists and that cannot be
        needed: their range is below the queue's ``low_offset``, their topic was dropped, or they
        are older than ``gc_grace_ms`` (a write whose seal was refused or never proposed), plus
        leftover temporary files older than the grace. Returns how many files went."""
        from raftmq.storage.segments import SegmentFile

        me = self.node.me.id
        stores = [g.machine.store for n, g in self.node.groups.items() if n != "meta"]
        grace_s = self.settings.gc_grace_ms / 1000
        now = time.time()
        deleted = 0
        for rel, mtime, temporary in list(self.store.list_files()):
            if temporary:
                if now - mtime > grace_s and self.store.delete(rel):
                    deleted += 1
                continue
            f = SegmentFile.parse(rel)
            if f is None or f.node != me:
                continue
            dead = now - mtime > grace_s
            for store in stores:
                value = store.get(segment_key(f.topic_id, f.queue, f.base))
                if value is not None:
                    entry = orjson.loads(value)
                    if rel in (entry.get("arrow"), entry.get("parquet")):
                        dead = False
                        break
                if store.get(keys.dropped_key(f.topic_id)) is not None:
                    dead = True
                    break
                meta = queues.queue_meta(store, f.topic_id, f.queue)
                if meta is not None and f.end <= meta.low_offset:
                    dead = True
                    break
            if dead and self.store.delete(rel):
                deleted += 1
                log.info("segment_file_deleted", path=rel)
        return deleted
