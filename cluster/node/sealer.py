"""The leader's sealing task and every node's segment garbage collection (the I/O half of segment
sealing; the command is ``cluster/commands/segments.py``, its apply ``cluster/machines/segments.py``).

The leader of a queue group seals, for each queue, the committed messages after the last sealed
segment into Arrow IPC and Parquet files (``storage/segments.py``) once there are
``segments.max_messages`` of them, or ``segments.max_bytes``, or the oldest is older than
``segments.max_age_ms``. It reads and writes off the Raft tick thread (an executor thread), writes
each file to a hidden temporary name and renames it, and only then proposes a ``seal_segment``
command. The node that wrote files deletes them once no entry needs them (:meth:`Sealer.collect_garbage`).

A round costs what changed, not what exists: the leader looks at the queues that grew since its
last look (the applies report them: :meth:`Sealer.grown`), those holding an unsealed range that
only age can make due (``max_age_ms``), and every queue of a group once when it becomes leader of
it (what grew under the previous leader). Pruning looks again only once the group applied something.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.groups import META
from raftmq.cluster.commands.segments import seal_segment
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.machines.segments import (
    decode_entry,
    next_base,
    queue_prefix,
    segment_key,
    segment_topics,
    topic_prefix,
)
from raftmq.storage import keys, queues
from raftmq.storage.keys import MAX_U32
from raftmq.storage.records import decode_header
from raftmq.storage.store import Store

if TYPE_CHECKING:
    from raftmq.cluster.config.cluster_file import NodeConfig
    from raftmq.cluster.node.view import NodeView
    from raftmq.storage.segments import SegmentStore, WrittenSegment

__all__ = ["Sealer", "locate", "segment_root"]

log = structlog.get_logger(__name__)


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

    def __init__(self, node: NodeView) -> None:
        from raftmq.storage.segments import SegmentStore

        self.node = node
        self.settings = node.config.segments
        self.store: SegmentStore = SegmentStore(segment_root(self.settings.store, node.me))
        self._progress: dict[tuple[str, int, int], _Progress] = {}
        self._last_gc = 0.0
        # Per queue group: the queues that grew since the sealer last looked at them (on the loop).
        self._grown: dict[str, set[tuple[int, int]]] = {}
        # The groups this node led at its last round and has looked at in full since it leads them.
        self._walked: set[str] = set()
        # Per queue group: the applied index at its last prune (nothing applied: nothing to prune).
        self._pruned_at: dict[str, int] = {}
        # Per queue group: queues looked at for a range to seal (raftmq_segment_queue_checks).
        self.queue_checks: dict[str, int] = {}

    def grown(self, name: str, queues: list[tuple[int, int]]) -> None:
        """Queues of group ``name`` received messages (on the event loop): the next round looks."""
        self._grown.setdefault(name, set()).update(queues)

    async def run_forever(self) -> None:
        interval_s = self.settings.check_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.once()
            except Exception:
                log.exception("segment_seal_failed")

    async def _topics(self) -> list[Topic] | None:
        """Every topic (this node's metadata replica, or a metadata voter's); None when no voter
        answered (the round is skipped: nothing it would have looked at is forgotten)."""
        if self.node.metadata is not None:
            return list(self.node.metadata.topics())
        for voter in self.node.config.metadata_voters:
            try:
                body = await self.node.peer_get_json(voter, "/v1/topics", timeout_s=2.0)
                return [Topic.from_json(t) for t in body["topics"]]
            except Exception:
                continue
        return None

    async def once(self, force: bool = False) -> list[dict[str, Any]]:
        """One round: seal what is due in every group this node leads (``force``: seal every
        unsealed committed range now), then collect garbage if it is time. Returns the results."""
        if not self.settings.enabled:
            return []
        results: list[dict[str, Any]] = []
        leading = [n for n, g in self.node.groups.items() if n != META and g.raft.is_leader()]
        for name in set(self._grown) - set(leading):
            del self._grown[name]  # a follower's growth: the full look on becoming leader sees it
        self._walked &= set(leading)
        topics: dict[int, Topic] | None = None
        for name in leading:
            full = force or name not in self._walked
            queues = None if full else self._grown.pop(name, set()) | self._aging(name)
            index = self.node.groups[name].machine.applied_index
            prune = full or self._pruned_at.get(name) != index
            if queues is not None and not queues and not prune:
                continue  # nothing grew, nothing ages, nothing applied: an idle group costs nothing
            if topics is None:
                known = await self._topics()
                if known is None:  # no metadata voter answered: the next round looks again
                    log.warning("segment_round_skipped", reason="no metadata voter answered")
                    if queues:
                        self._grown.setdefault(name, set()).update(queues)
                    break
                topics = {t.id: t for t in known}
            if full:
                self._walked.add(name)
                self._grown.pop(name, None)
            self._pruned_at[name] = index
            try:
                results += await self._seal_group(name, topics, queues, prune, force)
            except Exception:
                # Nothing this round took on is forgotten: the next round looks at it again.
                self._pruned_at.pop(name, None)
                if full:
                    self._walked.discard(name)
                elif queues:
                    self._grown.setdefault(name, set()).update(queues)
                raise
        if time.monotonic() - self._last_gc >= self.settings.gc_interval_ms / 1000:
            self._last_gc = time.monotonic()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.collect_garbage)
        return results

    def _aging(self, name: str) -> set[tuple[int, int]]:
        """The queues of group ``name`` holding an unsealed range that ``max_age_ms`` makes due in
        time (the others become due only by growing)."""
        if not self.settings.max_age_ms:
            return set()
        # A copy first: a forced round (the seal API) may run _due in an executor thread meanwhile.
        return {(topic_id, queue) for g, topic_id, queue in list(self._progress) if g == name}

    async def _seal_group(
        self,
        name: str,
        topics: dict[int, Topic],
        queues: set[tuple[int, int]] | None,
        prune_due: bool,
        force: bool,
    ) -> list[dict[str, Any]]:
        """Seal what is due among ``queues`` of group ``name`` (None: all of them)."""
        local = self.node.groups[name]
        store = local.machine.store
        loop = asyncio.get_running_loop()
        results = []
        prune = await loop.run_in_executor(None, self._prune_targets, store) if prune_due else []
        if queues is None:
            queues = {
                (t.id, q) for t in topics.values() for q, g in enumerate(t.queue_groups) if str(g) == name
            }
        candidates = sorted((topic_id, q) for topic_id, q in queues if topic_id in topics)
        for topic_id, q in queues:
            if topic_id not in topics:
                if store.get(keys.dropped_key(topic_id)) is not None:
                    self._progress.pop((name, topic_id, q), None)  # its topic was deleted
                else:  # a topic the metadata read does not list yet (it lags): look again later
                    self._grown.setdefault(name, set()).add((topic_id, q))
        spans = await loop.run_in_executor(None, self._due_many, name, store, candidates, now_ms(), force)
        for (topic_id, q), span in zip(candidates, spans, strict=True):
            topic = topics[topic_id]
            if span is None:
                continue
            if not local.raft.is_leader():
                break
            base, end = span
            try:
                written = await loop.run_in_executor(None, self._write, store, topic, q, base, end)
            except Exception:
                log.exception("segment_write_failed", topic=topic.name, queue=q, base=base, end=end)
                self._grown.setdefault(name, set()).add((topic_id, q))  # the next round tries again
                continue
            entry = self._entry(topic.id, q, base, end, written)
            outcome = await self.node.propose(name, seal_segment(now_ms(), [entry], prune))
            prune = []
            result = outcome.result if isinstance(outcome.result, dict) else {}
            if outcome.error or "error" in result or not result.get("sealed"):
                log.warning("segment_not_sealed", group=name, error=outcome.error or result)
                if not outcome.error or outcome.definite:  # surely not recorded: drop the files
                    await loop.run_in_executor(None, self._delete_files, written)
                self._grown.setdefault(name, set()).add((topic_id, q))
                continue
            self._progress.pop((name, topic.id, q), None)
            # More may be due at once (a backlog of several segments): the next round looks.
            self._grown.setdefault(name, set()).add((topic_id, q))
            log.info("segment_sealed", topic=topic.name, queue=q, base=base, end=end, rows=written.rows)
            results.append(result)
        if prune:
            outcome = await self.node.propose(name, seal_segment(now_ms(), [], prune))
            if not outcome.error and isinstance(outcome.result, dict):
                results.append(outcome.result)
        return results

    def _due_many(
        self, name: str, store: Store, queues: list[tuple[int, int]], now: int, force: bool
    ) -> list[tuple[int, int] | None]:
        """:meth:`_due` of each queue, in one executor job (executor thread)."""
        self.queue_checks[name] = self.queue_checks.get(name, 0) + len(queues)
        return [self._due(name, store, topic_id, q, now, force) for topic_id, q in queues]

    def _prune_targets(self, store: Store) -> list[tuple[int, int]]:
        """Queues whose first segment lies below ``low_offset``, and topics dropped with segments
        left (executor thread)."""
        targets: list[tuple[int, int]] = []
        for topic_id in segment_topics(store):
            if store.get(keys.dropped_key(topic_id)) is not None:
                targets.append((topic_id, 0))
                continue
            queue = -1
            while True:
                start = queue_prefix(topic_id, queue + 1) if queue + 1 <= MAX_U32 else None
                if start is None:
                    break
                found = next(
                    iter(queues.scan_prefix(store, topic_prefix(topic_id), start=start, limit=1)), None
                )
                if found is None:
                    break
                entry = decode_entry(*found)
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
        key = (name, topic_id, queue)
        meta = queues.queue_meta(store, topic_id, queue)
        if meta is None:
            self._progress.pop(key, None)
            return None
        s = self.settings
        base = next_base(store, topic_id, queue, meta)
        high = meta.high_offset
        if high <= base:
            self._progress.pop(key, None)  # nothing unsealed: only growth makes it due again
            return None
        if high - base >= s.max_messages:
            return base, base + s.max_messages
        if force:
            return base, high
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
        from raftmq.storage.columns import BATCH_ROWS, read_columns
        from raftmq.storage.segments import segment_name

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
        stores = [g.machine.store for n, g in self.node.groups.items() if n != META]
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
