"""RocksDB's background work as ``storage/work.py`` reads it from a real store."""

from __future__ import annotations

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
