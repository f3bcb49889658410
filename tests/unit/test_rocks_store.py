"""RocksStore behaviour beyond the Store contract: durability, crash recovery, restore, threads."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raftmq.storage.rocks import (
    RESTORE_FAILED_SUFFIX,
    RESTORE_OLD_SUFFIX,
    RocksStore,
    destroy_store,
)
from raftmq.storage.rocks_cursor import CHUNK_PAIRS
from raftmq.storage.store import Batch, StoreClosed, StoreError
from raftmq.storage.work import background_work


def _key(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _put(store: RocksStore, key: bytes, value: bytes, *, sync: bool = False) -> None:
    batch = Batch()
    batch.put(key, value)
    store.write(batch, sync=sync)


def _contents(path: str) -> dict[bytes, bytes]:
    store = RocksStore.open(path)
    try:
        return dict(store.scan(b""))
    finally:
        store.close()


def _make_db(path: str, pairs: dict[bytes, bytes]) -> None:
    store = RocksStore.open(path)
    for key, value in pairs.items():
        _put(store, key, value)
    store.close()


def _run_and_kill(path: str, body: str) -> None:
    """Run ``body`` in a child with ``store`` open at ``path``, then os._exit(9) without closing."""
    script = (
        "import os, sys\n"
        "from raftmq.storage.rocks import RocksStore\n"
        "from raftmq.storage.store import Batch\n"
        "store = RocksStore.open(sys.argv[1])\n"
        f"{body}\n"
        "os._exit(9)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, path], capture_output=True, timeout=60)
    assert result.returncode == 9, result.stderr.decode()


# -- durability --------------------------------------------------------------------------------


@pytest.mark.parametrize("sync", [False, True])
def test_writes_survive_close_and_reopen(tmp_path: Path, sync: bool) -> None:
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    for n in range(100):
        _put(store, _key(n), b"v%d" % n, sync=sync)
    store.close()
    assert _contents(path) == {_key(n): b"v%d" % n for n in range(100)}


def test_open_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "data" / "n1" / "groups" / "g1"
    store = RocksStore.open(str(path))
    assert store.path == str(path)
    assert (path / "CURRENT").is_file()
    store.close()


def test_writes_survive_a_killed_process(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _run_and_kill(
        path,
        "for n in range(200):\n"
        "    b = Batch(); b.put(n.to_bytes(8, 'big'), b'v%d' % n)\n"
        "    store.write(b, sync=(n % 2 == 0))\n",
    )
    assert _contents(path) == {_key(n): b"v%d" % n for n in range(200)}


def test_open_recovers_to_the_last_whole_record_after_a_torn_wal_tail(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _run_and_kill(
        path,
        "for n in range(100):\n"
        "    b = Batch(); b.put(n.to_bytes(8, 'big'), b'x' * 300)\n"
        "    store.write(b, sync=True)\n",
    )
    newest_wal = max(glob.glob(os.path.join(path, "*.log")), key=os.path.getmtime)
    os.truncate(newest_wal, os.path.getsize(newest_wal) - 100)  # tears the last 300-byte record

    recovered = _contents(path)

    # Point-in-time recovery: every record before the tear, nothing after it.
    assert recovered == {_key(n): b"x" * 300 for n in range(99)}


def test_rocksdb_runs_with_point_in_time_wal_recovery(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    store.close()
    options_file = max(glob.glob(str(tmp_path / "db" / "OPTIONS-*")))
    text = Path(options_file).read_text()
    assert "wal_recovery_mode=kPointInTimeRecovery" in text


def test_a_second_open_of_an_open_store_fails(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    with pytest.raises(StoreError):
        RocksStore.open(str(tmp_path / "db"))
    store.close()


def test_approximate_size_grows_with_the_data(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    before = store.approximate_size()
    _put(store, b"big", os.urandom(1 << 20), sync=True)
    assert store.approximate_size() >= before + (1 << 20)
    store.close()
    with pytest.raises(StoreClosed):
        store.approximate_size()


def test_compact_range_frees_the_disk_a_delete_range_left_and_keeps_the_rest(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    value = os.urandom(1024)
    for start in range(0, 24_000, 1000):  # 24 MiB and more: past a memtable, into SST files
        batch = Batch()
        for n in range(start, start + 1000):
            batch.put(_key(n), value + n.to_bytes(4, "big") + os.urandom(60))
        store.write(batch)
    _put(store, b"z-kept", b"still here", sync=True)
    # The flush of the full memtable ends first: it deletes a write-ahead log of about 16 MiB,
    # which would otherwise shrink the store between the two measurements below.
    deadline = time.monotonic() + 30
    while not background_work(store).idle and time.monotonic() < deadline:
        time.sleep(0.05)
    filled = store.approximate_size()
    batch = Batch()
    batch.delete_range(_key(0), _key(24_000))
    store.write(batch, sync=True)
    # A range deletion alone frees nothing: RocksDB keeps the files until a compaction.
    assert store.approximate_size() >= filled // 2
    store.compact_range(_key(0), _key(24_000))
    assert store.approximate_size() < filled // 8, (filled, store.approximate_size())
    assert store.get(b"z-kept") == b"still here" and store.get(_key(5)) is None
    store.close()
    with pytest.raises(StoreClosed):
        store.compact_range(_key(0), _key(1))


def _fill_with_holes(store: RocksStore, count: int) -> None:
    """``count`` keys of 1 KiB in SST files, then every other key removed by its own range deletion:
    a compaction of them all rewrites every file (a second or so here), none of them dropped whole."""
    for start in range(0, count, 1000):
        batch = Batch()
        for n in range(start, start + 1000):
            batch.put(_key(n), os.urandom(1024))
        store.write(batch)
    batch = Batch()
    for n in range(0, count, 2):
        batch.delete_range(_key(n), _key(n + 1))
    _put(store, b"z-kept", b"still here")
    store.write(batch, sync=True)


def _compacting(store: RocksStore, start: bytes, end: bytes) -> tuple[threading.Thread, list[BaseException]]:
    """compact_range(start, end) in a thread, returned once it is inside the store's gate."""
    failures: list[BaseException] = []

    def compact() -> None:
        try:
            store.compact_range(start, end)
        except BaseException as e:  # handed to the test
            failures.append(e)

    thread = threading.Thread(target=compact)
    thread.start()
    while store._users == 0 and thread.is_alive():  # the compaction holds the gate while it runs
        time.sleep(0.001)
    return thread, failures


@pytest.mark.parametrize("how", ["close", "restore"])
def test_a_close_or_restore_cancels_a_compaction_in_flight_instead_of_waiting_for_it(
    tmp_path: Path, how: str
) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    _fill_with_holes(store, 60_000)
    filled = store.approximate_size()
    if how == "restore":
        _make_db(str(tmp_path / "other"), {b"other": b"db"})
    thread, failures = _compacting(store, _key(0), _key(60_000))
    assert thread.is_alive()
    if how == "close":
        store.close()
    else:
        store.restore_from(str(tmp_path / "other"))
    thread.join()
    # Cancelled: it raises instead of finishing (before, the close waited for all of it).
    assert [type(e) for e in failures] == [StoreClosed]
    if how == "restore":
        assert dict(store.scan(b"")) == {b"other": b"db"}
        store.close()
        return
    reopened = RocksStore.open(store.path)  # released, whole, and what was not freed is still there
    assert reopened.get(b"z-kept") == b"still here" and reopened.get(_key(1)) is not None
    assert reopened.get(_key(0)) is None
    assert reopened.approximate_size() > filled // 4
    reopened.compact_range(_key(0), _key(60_000))  # a later run frees it
    assert reopened.approximate_size() < filled * 3 // 4
    reopened.close()


def test_destroy_store_removes_the_directory_and_restore_leftovers(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _make_db(path, {b"k": b"v"})
    os.makedirs(path + RESTORE_FAILED_SUFFIX)
    destroy_store(path)
    destroy_store(path)  # nothing left: harmless
    assert os.listdir(tmp_path) == []


# -- restore -----------------------------------------------------------------------------------


def _checkpoint_of(tmp_path: Path, pairs: dict[bytes, bytes]) -> str:
    source_path = str(tmp_path / "source")
    source = RocksStore.open(source_path)
    for key, value in pairs.items():
        _put(source, key, value)
    checkpoint = str(tmp_path / "incoming" / "ckpt")
    source.checkpoint(checkpoint)
    source.close()
    destroy_store(source_path)
    return checkpoint


def test_restore_from_replaces_the_contents_and_removes_the_old_database(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    _put(store, b"old", b"1")
    checkpoint = _checkpoint_of(tmp_path, {b"new": b"2", b"newer": b"3"})

    store.restore_from(checkpoint)

    assert dict(store.scan(b"")) == {b"new": b"2", b"newer": b"3"}
    _put(store, b"after", b"4", sync=True)
    assert not os.path.exists(checkpoint)
    assert sorted(os.listdir(tmp_path)) == ["db", "incoming"]
    store.close()
    assert _contents(path) == {b"new": b"2", b"newer": b"3", b"after": b"4"}


def test_restore_from_a_directory_that_is_not_a_checkpoint_changes_nothing(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    _put(store, b"old", b"1")
    (tmp_path / "junk").mkdir()
    with pytest.raises(StoreError):
        store.restore_from(str(tmp_path / "junk"))
    assert store.get(b"old") == b"1"
    store.close()


def test_restore_from_a_checkpoint_inside_the_store_is_refused(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    _put(store, b"old", b"1")
    inside = str(tmp_path / "db" / "ckpt")
    store.checkpoint(inside)
    with pytest.raises(StoreError):
        store.restore_from(inside)
    assert store.get(b"old") == b"1"
    store.close()


def test_restore_from_a_checkpoint_that_does_not_open_keeps_the_old_contents(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    _put(store, b"old", b"1")
    checkpoint = _checkpoint_of(tmp_path, {b"new": b"2"})
    for manifest in glob.glob(os.path.join(checkpoint, "MANIFEST-*")):
        os.remove(manifest)  # CURRENT now names a missing manifest

    with pytest.raises(StoreError):
        store.restore_from(checkpoint)

    assert dict(store.scan(b"")) == {b"old": b"1"}
    assert sorted(os.listdir(tmp_path)) == ["db", "incoming"]
    store.close()


def test_open_rolls_forward_a_restore_interrupted_after_the_new_database_was_moved_in(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "db")
    _make_db(path, {b"old": b"1"})
    checkpoint = _checkpoint_of(tmp_path, {b"new": b"2"})
    os.rename(path, path + RESTORE_OLD_SUFFIX)  # step 2 done
    os.rename(checkpoint, path)  # step 3 done; crash before the old one was deleted

    assert _contents(path) == {b"new": b"2"}
    assert not os.path.exists(path + RESTORE_OLD_SUFFIX)


def test_open_rolls_back_a_restore_interrupted_after_the_old_database_was_moved_aside(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "db")
    _make_db(path, {b"old": b"1"})
    os.rename(path, path + RESTORE_OLD_SUFFIX)  # step 2 done; crash before step 3

    assert _contents(path) == {b"old": b"1"}
    assert not os.path.exists(path + RESTORE_OLD_SUFFIX)


def test_open_rolls_back_when_the_database_in_place_is_incomplete(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _make_db(path, {b"old": b"1"})
    os.rename(path, path + RESTORE_OLD_SUFFIX)
    os.makedirs(path)
    Path(path, "000007.sst").write_bytes(b"half a database, no CURRENT")

    assert _contents(path) == {b"old": b"1"}
    assert sorted(os.listdir(tmp_path)) == ["db"]


def test_open_removes_a_leftover_failed_restore(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    _make_db(path, {b"old": b"1"})
    os.makedirs(path + RESTORE_FAILED_SUFFIX)

    assert _contents(path) == {b"old": b"1"}
    assert sorted(os.listdir(tmp_path)) == ["db"]


# -- threads -----------------------------------------------------------------------------------


def test_an_abandoned_scan_does_not_keep_the_database_open_after_close(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    for n in range(300):
        _put(store, _key(n), b"v")
    pairs = store.scan(b"")
    next(pairs)

    store.close()

    reopened = RocksStore.open(path)  # rocksdict would still hold LOCK through the live iterator
    reopened.close()
    with pytest.raises(StoreClosed):
        list(pairs)


def test_a_scan_read_whole_when_it_was_made_keeps_its_snapshot_after_close(tmp_path: Path) -> None:
    """A scan of at most a chunk is read in the call that makes it (one visit to the store), so
    closing the store afterwards takes nothing from it: it still yields the snapshot it took."""
    store = RocksStore.open(str(tmp_path / "db"))
    for n in range(10):
        _put(store, _key(n), b"v")
    pairs = store.scan(b"")
    store.close()
    assert [k for k, _ in pairs] == [_key(n) for n in range(10)]


def test_a_scan_in_progress_during_restore_raises_store_closed(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    for n in range(300):
        _put(store, _key(n), b"old")
    pairs = store.scan(b"")
    next(pairs)

    store.restore_from(_checkpoint_of(tmp_path, {b"new": b"2"}))

    with pytest.raises(StoreClosed):
        list(pairs)
    assert dict(store.scan(b"")) == {b"new": b"2"}
    store.close()


def test_close_waits_for_in_flight_calls_and_refuses_new_ones(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    _put(store, b"k", b"v")
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def in_flight() -> None:
        # Stands in for a long call (a synced write, a big get) holding the handle.
        with store._using() as db:
            inside.set()
            release.wait(timeout=30)
            seen.append(db.get(b"k"))  # the handle must not have been closed under us

    user = threading.Thread(target=in_flight)
    user.start()
    assert inside.wait(timeout=30)
    closer = threading.Thread(target=store.close)
    closer.start()
    while True:  # until close() has stopped admitting new calls
        try:
            store.get(b"k")
        except StoreClosed:
            break
    assert closer.is_alive()  # it cannot finish while the in-flight call holds the handle
    release.set()
    user.join(timeout=30)
    closer.join(timeout=30)
    assert seen == [b"v"]
    assert not closer.is_alive()


def _run_concurrently(store: RocksStore, action: threading.Thread) -> list[BaseException]:
    """Two readers scan and one writer writes until ``action`` has run; returns unexpected errors."""
    errors: list[BaseException] = []
    scanned = threading.Event()
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                keys = [k for k, _ in store.scan(b"")]
                assert keys == sorted(keys)
                scanned.set()
        except StoreClosed:
            pass
        except BaseException as exc:
            errors.append(exc)

    def writer() -> None:
        n = 1000
        try:
            while not stop.is_set():
                batch = Batch()
                batch.put(_key(n), b"w")
                batch.delete_range(_key(n - 1000), _key(n - 990))
                store.write(batch, sync=n % 10 == 0)
                n += 1
        except StoreClosed:
            pass
        except BaseException as exc:
            errors.append(exc)

    workers = [
        threading.Thread(target=reader),
        threading.Thread(target=reader),
        threading.Thread(target=writer),
    ]
    for worker in workers:
        worker.start()
    assert scanned.wait(timeout=30)
    action.start()
    action.join(timeout=30)
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    assert not any(t.is_alive() for t in [action, *workers])
    return errors


def test_close_while_readers_scan_and_a_writer_writes_is_clean(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    for n in range(1000):
        _put(store, _key(n), b"v" * 100)

    errors = _run_concurrently(store, threading.Thread(target=store.close))

    assert errors == []
    with pytest.raises(StoreClosed):
        store.get(_key(0))
    RocksStore.open(str(tmp_path / "db")).close()  # the LOCK was released


def test_restore_while_readers_scan_and_a_writer_writes_is_clean(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    for n in range(1000):
        _put(store, _key(n), b"v" * 100)
    checkpoint = _checkpoint_of(tmp_path, {b"restored": b"yes"})

    errors = _run_concurrently(store, threading.Thread(target=store.restore_from, args=(checkpoint,)))

    assert errors == []
    assert store.get(b"restored") == b"yes"
    assert store.get(_key(5)) is None
    store.close()


def test_a_scan_with_a_temporary_end_bound_returns_exactly_the_range(tmp_path: Path) -> None:
    """rocksdict points at the upper bound's bytes without holding them: the cursor must keep the
    bound alive, or a scan given a temporary ``end`` silently returns the wrong keys."""
    import gc
    import struct

    store = RocksStore.open(str(tmp_path / "db"))
    try:
        batch = Batch()
        for i in range(300):
            batch.put(b"K" + struct.pack(">Q", i), b"v")
            batch.put(b"Z" + struct.pack(">Q", i), b"z")
        store.write(batch)
        # More keys than the first chunk the scan reads while its caller still holds the bound
        # (CHUNK_PAIRS): the rest is read after the temporary is gone.
        assert CHUNK_PAIRS < 200
        for _ in range(30):
            cursor = store.scan(b"K", b"K" + struct.pack(">Q", 200))  # the bound is a temporary
            gc.collect()
            _churn = [bytes(range(256)) * 4 for _ in range(1000)]  # reuse the freed memory
            keys = [k for k, _ in cursor]
            assert keys == [b"K" + struct.pack(">Q", i) for i in range(200)]
    finally:
        store.close()
