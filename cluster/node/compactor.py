"""Frees the disk of removed messages: compacts, on this node's replica of a queue group, the key
ranges that applied entries removed (retention, a dropped topic: ``Applied.freed``).

RocksDB keeps what a range deletion covers in its files until a compaction rewrites them, and it
compacts a level only when the level outgrows its target: a backlog that retention removed from a
store that no longer grows would stay on disk for good (measured: ``tests/bench/bench_backlog.py``).
Every replica applies the removal and compacts its own store; nothing here is replicated.

Invariant: at most one compaction job runs on a node at a time (an executor job that goes through
every pending range), and ranges freed meanwhile wait for the next job, ``COMPACT_DELAY_S`` after
the first of them, so that a run of ``retain`` entries (each removing at most
``raft.retention_max_batches`` batches) becomes one compaction per queue. Per queue only the
greatest end is kept: retention always removes from the queue's start. A close or a checkpoint
restore of the replica's store cancels a compaction in flight rather than waiting for it
(``RocksStore.compact_range``: minutes for a large removed backlog); it is logged as failed, and
what it did not free waits for that removal's next report (a restart's replay reports it again).
A job compacts a store's ranges in one call (``Store.compact_ranges``), which does at most one
bounded piece of the store's other work (the rewrite of its blob garbage, however many ranges were
freed); a store that answers that it has more to do is called again by the next job, with an empty
range, and so is one whose rewrite a restart cut short, as its replica starts (``node.py``).
"""

from __future__ import annotations

import asyncio
import time

import structlog

from raftmq.storage.store import Store, StoreError

__all__ = ["COMPACT_DELAY_S", "Compactor"]

log = structlog.get_logger(__name__)

COMPACT_DELAY_S = 2.0


class Compactor:
    """The ranges this node's queue group replicas freed, compacted in the background."""

    def __init__(self) -> None:
        # Per replica's state store: its group, and range start -> the greatest end freed from it
        # since the last job (on the loop). Keyed by the store, not by the group's name: a replica
        # reports what its start's replay freed before the node lists it in its groups, and a
        # replica removed or restarted meanwhile has its store closed (StoreClosed: passed over).
        self._pending: dict[Store, tuple[str, dict[bytes, bytes]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.compacted_ranges = 0  # ranges compacted since the start (the log and tests read it)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The task waiting to compact, if any (the node cancels it when it stops; a compaction
        already running is cancelled by the store's close)."""
        return [self._task] if self._task is not None and not self._task.done() else []

    def freed(self, name: str, store: Store, ranges: tuple[tuple[bytes, bytes], ...]) -> None:
        """Group ``name``'s replica removed the keys of ``ranges`` from its state ``store`` (on the
        event loop): compact them soon."""
        if not ranges:
            return
        _, pending = self._pending.setdefault(store, (name, {}))
        for start, end in ranges:
            pending[start] = max(end, pending.get(start, end))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(COMPACT_DELAY_S)
            pending, self._pending = self._pending, {}
            again = await loop.run_in_executor(None, self._compact, pending)
            for name, store in again:  # one more call, with an empty range
                self._pending.setdefault(store, (name, {}))[1].setdefault(b"", b"")

    def _compact(
        self, pending: dict[Store, tuple[str, dict[bytes, bytes]]]
    ) -> list[tuple[str, Store]]:  # an executor thread
        """Compacts ``pending``; returns the stores with more work under way."""
        again = []
        for store, (name, ranges) in pending.items():
            started = time.monotonic()
            more = False
            try:
                more = store.compact_ranges(sorted(ranges.items()))
                self.compacted_ranges += sum(1 for start, end in ranges.items() if start < end)
            except StoreError as e:  # closed (removed, restarted, stopping): nothing to free there
                log.warning("freed_range_compaction_failed", group=name, error=str(e))
                continue
            except Exception:  # anything else: the other stores' ranges are still compacted
                log.exception("freed_range_compaction_failed", group=name)
                continue
            if more:
                again.append((name, store))
            log.info(
                "freed_ranges_compacted",
                group=name,
                ranges=len(ranges),
                seconds=round(time.monotonic() - started, 2),
                more=more,
            )
        return again
