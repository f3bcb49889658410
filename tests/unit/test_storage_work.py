"""RocksDB's background work as ``storage/work.py`` reads it from a real store."""

from __future__ import annotations

import os
import time
from pathlib import Path

from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch
from raftmq.storage.work import BackgroundWork, background_work

MIB = 1 << 20


def _fill(store: RocksStore, mib: int) -> None:
    value = bytes(range(256)) * (MIB // 256)
    for i in range(mib):
        batch = Batch()
        batch.put(i.to_bytes(8, "big"), value)
        store.write(batch)


def _until_idle(store: RocksStore, timeout_s: float = 60.0) -> tuple[BackgroundWork, list[BackgroundWork]]:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        work = background_work(store)
        seen.append(work)
        if work.idle:
            return work, seen
        time.sleep(0.05)
    raise AssertionError(f"the store still works in the background after {timeout_s} s: {seen[-1]}")


def test_flushed_memtables_show_as_level0_files_once_the_flushes_end(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        assert background_work(store) == BackgroundWork()  # a new store has nothing to do
        _fill(store, 40)  # 16 MiB memtables: two of them are flushed, below the compaction trigger
        work, _ = _until_idle(store)
        assert work.level0_files >= 2, work
        assert work.writes_stopped == 0 and work.delayed_write_rate == 0
    finally:
        store.close()


def test_a_closed_store_has_no_work_left(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    _fill(store, 1)
    store.close()
    assert background_work(store) == BackgroundWork()


def test_blob_files_and_their_garbage_show_until_compact_range_rewrites_it_away(tmp_path: Path) -> None:
    """Values of 1 MiB go to blob files. Removing a quarter of them leaves it as garbage in the
    files (compact_range drops the keys); removing three quarters makes compact_range rewrite the
    live rest into new files, and the garbage is gone."""
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        for i in range(40):
            batch = Batch()
            batch.put(i.to_bytes(8, "big"), os.urandom(MIB))
            store.write(batch)
        store.compact_range(b"", b"\xff")
        work = background_work(store)
        assert work.blob_file_bytes >= 40 * MIB and work.blob_garbage_bytes == 0, work

        def remove_to(n: int) -> BackgroundWork:
            batch = Batch()
            batch.delete_range((0).to_bytes(8, "big"), n.to_bytes(8, "big"))
            store.write(batch)
            store.compact_range((0).to_bytes(8, "big"), n.to_bytes(8, "big"))
            return background_work(store)

        work = remove_to(10)
        assert 10 * MIB <= work.blob_garbage_bytes < work.blob_file_bytes // 2, work
        work = remove_to(30)
        assert work.blob_garbage_bytes == 0 and 10 * MIB <= work.blob_file_bytes < 12 * MIB, work
    finally:
        store.close()
