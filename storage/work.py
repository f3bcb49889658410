"""What RocksDB still has to do for a store after the writes returned: its flushes and compactions.

A write is done for raftmq once it is in the write-ahead log and the memtable; RocksDB then flushes
memtables into level-0 files and compacts levels down in its own background threads. After a burst
of writes (a large backlog produced in a minute) that work goes on for a while and shares the CPU
and the disk with the node: :func:`background_work` reads how much is left (RocksDB's own figures),
the node's metrics report it (``raftmq_rocksdb_*``), and ``tests/bench/bench_backlog.py`` waits
for it to end and measures what it cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rocks import RocksStore
from .store import StoreError

__all__ = ["BackgroundWork", "background_work"]


@dataclass(frozen=True)
class BackgroundWork:
    """RocksDB's background work of one store at one moment."""

    pending_compaction_bytes: int = 0  # RocksDB's estimate of the bytes compactions must still rewrite
    running_compactions: int = 0
    running_flushes: int = 0
    level0_files: int = 0
    delayed_write_rate: int = 0  # bytes/s RocksDB slows writes to (0: not slowed)
    writes_stopped: int = 0  # 1 while RocksDB stops writes until compactions catch up
    # The messages' blob files (storage/rocks.py): their bytes, and the bytes of deleted values in
    # them, which the store's next compact_range rewrites away once they are half of them.
    blob_file_bytes: int = 0
    blob_garbage_bytes: int = 0

    @property
    def idle(self) -> bool:
        """Nothing is flushing or compacting and no compaction is due."""
        return not (self.pending_compaction_bytes or self.running_compactions or self.running_flushes)


_PROPERTIES = {
    "pending_compaction_bytes": "rocksdb.estimate-pending-compaction-bytes",
    "running_compactions": "rocksdb.num-running-compactions",
    "running_flushes": "rocksdb.num-running-flushes",
    "level0_files": "rocksdb.num-files-at-level0",
    "delayed_write_rate": "rocksdb.actual-delayed-write-rate",
    "writes_stopped": "rocksdb.is-write-stopped",
    "blob_file_bytes": "rocksdb.live-blob-file-size",
    "blob_garbage_bytes": "rocksdb.live-blob-file-garbage-size",
}


def background_work(store: RocksStore) -> BackgroundWork:
    """The background work of ``store`` now (nothing for a closed store: it has none left)."""
    try:
        return BackgroundWork(**{name: store.int_property(prop) for name, prop in _PROPERTIES.items()})
    except StoreError:
        return BackgroundWork()
