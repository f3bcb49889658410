"""RocksDB's background threads, shared by every store of a node (storage/rocks.py, ``_options``):
a store's long rewrite (the blob-garbage rewrite, a retention's compact_range) holds one compaction
slot, and another store's level 0 is still compacted meanwhile."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from raft_doubles import wait_for

from raftmq.storage import rocks
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, StoreClosed

RUNNING = "rocksdb.num-running-compactions"


def _fill(store: RocksStore, mib: int, seed: int) -> None:
    """``mib`` MiB of 16 KiB values under random keys: every flush's file overlaps the others."""
    rnd = random.Random(seed)
    for _ in range((mib << 20) // (16 << 10)):
        batch = Batch()
        batch.put(rnd.randbytes(8), rnd.randbytes(16 << 10))
        store.write(batch)


def _compacted(store: RocksStore) -> bool:
    """Whether a compaction ran: files below level 0 (flushes write level 0 only)."""
    return any(store.int_property(f"rocksdb.num-files-at-level{n}") for n in range(1, 7))


def _open_slow(path: str, bytes_per_s: int | None) -> RocksStore:
    """A store with our options, its values in its SST files (a compaction rewrites them) and its
    flushes and compactions written at ``bytes_per_s`` at most (None: unlimited)."""

    def options() -> rocks.Options:
        opts = rocks._options()
        opts.set_enable_blob_files(False)
        if bytes_per_s is not None:
            opts.set_ratelimiter(bytes_per_s, 100_000, 10)
        return opts

    return RocksStore(path, rocks.Rdict(path, options(), column_families={"default": options()}))


def test_a_stores_rewrite_leaves_another_stores_level0_compacted(tmp_path: Path) -> None:
    """Store a rewrites 24 MiB at 1 MiB/s (half a minute, cancelled at the end); meanwhile store b
    gets five memtables' worth (over RocksDB's level-0 trigger of four files), and its level 0 is
    compacted while a's rewrite still holds its slot. With one compaction slot (max_background_jobs
    2: one flush, one compaction) b's level 0 stays at five files until a's rewrite ends."""
    path = str(tmp_path / "a")
    a = _open_slow(path, None)
    _fill(a, 24, seed=1)  # two overlapping level-0 files, left for the rewrite
    a.close()
    a = _open_slow(path, 1 << 20)
    cancelled: list[StoreClosed] = []

    def rewrite() -> None:
        try:
            a.compact_range(b"", b"\xff")
        except StoreClosed as e:  # the close below, at the end of the test
            cancelled.append(e)

    rewriting = threading.Thread(target=rewrite)
    rewriting.start()
    b = RocksStore.open(str(tmp_path / "b"))
    try:
        wait_for(lambda: a.int_property(RUNNING) == 1, "a's rewrite")
        _fill(b, 5 * 16, seed=2)
        wait_for(lambda: _compacted(b), "b's level 0 compacted", timeout=20)
        assert rewriting.is_alive() and a.int_property(RUNNING) == 1  # all along: a's rewrite
    finally:
        a.close()
        rewriting.join()
        b.close()
    assert cancelled
