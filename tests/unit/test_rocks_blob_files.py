"""RocksStore keeps the messages in blob files (key-value separation): what compactions then
write, what retention frees, what a checkpoint holds, and stores written before (an upgrade)."""

from __future__ import annotations

import glob
import os
import random
import re
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.storage import blob_gc, rocks
from raftmq.storage.rocks import RocksStore, destroy_store
from raftmq.storage.store import Batch, StoreClosed

QUEUES = 64
BATCH_BYTES = 16 * 1024  # a record batch of 16 messages of 1 KiB (the client's sticky 16 KiB)
BLOB_BYTES = "rocksdb.live-blob-file-size"


def _record_key(queue: int, offset: int) -> bytes:
    return b"R" + struct.pack(">IIQ", 1, queue, offset)  # as storage/keys.py: topic, queue, offset


def _batches(seed: int, count: int, first: int = 0) -> Iterator[tuple[bytes, bytes]]:
    """``count`` record batches over QUEUES queues in turn (the produce pattern: every flush holds
    keys of every queue), from batch number ``first`` on; random bytes (incompressible)."""
    rnd = random.Random(seed)
    for n in range(first, first + count):
        yield _record_key(n % QUEUES, n // QUEUES), rnd.randbytes(BATCH_BYTES)


def _write(store: RocksStore, pairs: Iterator[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    written = {}
    for key, value in pairs:
        batch = Batch()
        batch.put(key, value)
        batch.put(b"Q" + key[1:9], len(written).to_bytes(8, "big"))  # a small value beside it
        store.write(batch)
        written[key] = value
    return written


def _open_counting(path: str) -> tuple[RocksStore, rocks.Options]:
    """The store at ``path`` opened as RocksStore.open opens it, with RocksDB's statistics on
    (read with :func:`_bytes_written`)."""
    opts = rocks._options()
    opts.enable_statistics()
    return RocksStore(path, rocks.Rdict(path, opts, column_families={"default": rocks._options()})), opts


def _bytes_written(opts: rocks.Options) -> int:
    """What RocksDB wrote so far, as its statistics count it (whatever the file system): the
    write-ahead log, the flushes and the compactions (blob files included)."""
    text = opts.get_statistics()
    total = 0
    for ticker in ("rocksdb.wal.bytes", "rocksdb.flush.write.bytes", "rocksdb.compact.write.bytes"):
        match = re.search(re.escape(ticker) + r" COUNT : (\d+)", text)
        assert match, ticker
        total += int(match.group(1))
    return total


def _blob_files(path: str) -> list[str]:
    return glob.glob(os.path.join(path, "*.blob"))


def _open_as_the_release_before(path: str) -> RocksStore:
    """The store at ``path`` opened as a release before blob files opened it: its options then,
    and no column family's options named (RocksDB takes them from the store's OPTIONS file)."""
    opts = rocks.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_max_background_jobs(2)
    opts.set_write_buffer_size(16 << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_wal_recovery_mode(rocks.DBRecoveryMode.point_in_time())
    opts.set_keep_log_file_num(4)
    return RocksStore(path, rocks.Rdict(path, opts))


def test_compactions_rewrite_the_keys_not_the_messages(tmp_path: Path) -> None:
    """32 MiB of batches over 64 queues on top of 32 MiB compacted before: the write-ahead log and
    the flush write each byte once, and merging the new level-0 files with the old data (which
    overlaps them all) writes the keys again, not the messages. With the messages in the SST files
    the merge rewrote the 32 MiB already there as well (4x instead of 2x)."""
    store, opts = _open_counting(str(tmp_path / "db"))
    try:
        count = (32 << 20) // BATCH_BYTES
        first = _write(store, _batches(1, count))
        store.compact_range(b"", b"\xff")  # flushed and compacted to the last level
        before = _bytes_written(opts)
        second = _write(store, _batches(2, count, first=count))
        store.compact_range(b"", b"\xff")
        written = _bytes_written(opts) - before
        ratio = written / sum(len(v) for v in second.values())
        assert ratio < 2.5, f"wrote {written / 2**20:.0f} MiB for 32 MiB of messages ({ratio:.2f}x)"
        assert dict(store.scan(b"R", b"S")) == first | second
    finally:
        store.close()


def test_retention_frees_the_disk_while_another_queue_keeps_its_messages_in_the_same_files(
    tmp_path: Path,
) -> None:
    """Each blob file holds batches of every queue: removing 63 queues' batches leaves every file
    with live values of the 64th. compact_range (the compactor's call after retention) then moves
    the live values into new files, so the disk comes back to what is retained."""
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        written = _write(store, _batches(3, (32 << 20) // BATCH_BYTES))
        store.compact_range(b"", b"\xff")
        full = store.approximate_size()
        assert full > 32 << 20 and _blob_files(store.path)
        removal = Batch()
        ends = {q: _record_key(q, 1 << 62) for q in range(1, QUEUES)}
        for q, end in ends.items():
            removal.delete_range(_record_key(q, 0), end)
        store.write(removal, sync=True)
        for q, end in ends.items():
            store.compact_range(_record_key(q, 0), end)
        kept = {k: v for k, v in written.items() if k[5:9] == struct.pack(">I", 0)}
        assert store.approximate_size() < full // 10, (store.approximate_size(), full)
        assert dict(store.scan(b"R", b"S")) == kept
    finally:
        store.close()


def test_a_checkpoint_holds_the_blob_files_and_restores_every_message(tmp_path: Path) -> None:
    source = RocksStore.open(str(tmp_path / "source"))
    target = RocksStore.open(str(tmp_path / "target"))
    try:
        written = _write(source, _batches(4, 1024))
        source.compact_range(b"", b"\xff")
        source.checkpoint(str(tmp_path / "copy"))
        assert _blob_files(str(tmp_path / "copy")), os.listdir(tmp_path / "copy")
        source.close()  # the copy stands alone (hard links): the source's files may go
        destroy_store(source.path)
        target.restore_from(str(tmp_path / "copy"))
        assert dict(target.scan(b"R", b"S")) == written
    finally:
        source.close()
        target.close()


def test_a_store_written_before_blob_files_opens_reads_and_moves_its_messages_out(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    old = _open_as_the_release_before(path)
    written = _write(old, _batches(5, 1024))
    old.compact_range(b"", b"\xff")
    assert not _blob_files(path) and old.int_property(BLOB_BYTES) == 0
    old.close()

    store = RocksStore.open(path)
    try:
        assert dict(store.scan(b"R", b"S")) == written  # read as it was
        written |= _write(store, _batches(6, 1024, first=1024))
        store.compact_range(b"", b"\xff")  # the old SST files' messages go to blob files too
        assert store.int_property(BLOB_BYTES) >= sum(len(v) for v in written.values())
        assert dict(store.scan(b"R", b"S")) == written
    finally:
        store.close()


def test_a_store_with_blob_files_opens_and_reads_in_the_release_before_and_keeps_them(
    tmp_path: Path,
) -> None:
    """A node rolled back to a release before blob files reads what this one wrote, and what it
    writes goes to blob files still (the column family's options come from the OPTIONS file that
    this release wrote: docs/operations.md, "Disk and write amplification")."""
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    written = _write(store, _batches(7, 1024))
    store.compact_range(b"", b"\xff")
    files = set(_blob_files(path))
    assert files
    store.close()
    old = _open_as_the_release_before(path)
    try:
        assert dict(old.scan(b"R", b"S")) == written
        written |= _write(old, _batches(8, 1024, first=1024))
        old.compact_range(b"", b"\xff")
        assert set(_blob_files(path)) - files  # its new messages in blob files of their own
        assert dict(old.scan(b"R", b"S")) == written
    finally:
        old.close()


def _store_three_quarters_garbage(path: str) -> tuple[RocksStore, rocks.Options, dict[bytes, bytes], int]:
    """A store of 32 MiB of 4 KiB batches over QUEUES queues, compacted, then three queues of four
    removed: every blob file three quarters garbage. Returns the store, its options (statistics
    on), what it keeps and its size before the removal."""
    store, opts = _open_counting(path)
    rnd = random.Random(4)  # batches of 4 KiB (the least that goes to a blob file): more keys
    count = (32 << 20) // 4096
    pairs = ((_record_key(n % QUEUES, n // QUEUES), rnd.randbytes(4096)) for n in range(count))
    written = _write(store, pairs)
    store.compact_range(b"", b"\xff")
    full = store.approximate_size()
    store.write(_removal(), sync=True)
    kept = {k: v for k, v in written.items() if struct.unpack(">I", k[5:9])[0] % 4 == 0}
    return store, opts, kept, full


def _removed_ranges() -> list[tuple[bytes, bytes]]:
    return [(_record_key(q, 0), _record_key(q, 1 << 62)) for q in range(QUEUES) if q % 4]


def _removal() -> Batch:
    removal = Batch()
    for start, end in _removed_ranges():
        removal.delete_range(start, end)
    return removal


def _rewrite_calls(store: RocksStore, first: bool = True, limit: int = 100) -> int:
    """Calls compact_range (the whole store first, then empty ranges, as the node's compactor does)
    until the blob garbage rewrite is done, at most ``limit`` times; returns how many it took."""
    calls, more = 0, True
    while more and calls < limit:
        more = store.compact_range(b"", b"\xff") if first and not calls else store.compact_range(b"", b"")
        calls += 1
    return calls


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "_SST_FILE_BYTES", 1 << 10)  # a few SST files of keys to cut at
    monkeypatch.setattr(blob_gc, "PIECE_BYTES", 2 << 20)


@pytest.mark.usefixtures("small_pieces")
def test_the_blob_garbage_is_rewritten_a_bounded_piece_per_call(tmp_path: Path) -> None:
    """Three queues of four removed leave every blob file three quarters garbage: compact_range
    moves the live quarter into new files a key range of about ``blob_gc.PIECE_BYTES`` at a time, asking to be
    called again until the last range is done, so no call rewrites the store at once. Then the
    old files are gone and every kept message reads back."""
    store, opts, kept, full = _store_three_quarters_garbage(str(tmp_path / "db"))
    try:
        calls, more = [], True
        while more and len(calls) < 100:
            before = _bytes_written(opts)
            more = store.compact_range(b"", b"\xff") if not calls else store.compact_range(b"", b"")
            calls.append(_bytes_written(opts) - before)
        live = 8 << 20  # a quarter of the 32 MiB
        assert len(calls) >= 3 and not more, [c >> 10 for c in calls]
        assert max(calls) < live // 4, f"a call wrote {max(calls) >> 20} MiB of {live >> 20} MiB live"
        assert store.approximate_size() < full * 0.7, (store.approximate_size(), full)
        assert dict(store.scan(b"R", b"S")) == kept
        assert not os.path.exists(os.path.join(tmp_path / "db", blob_gc.CURSOR_FILE))
    finally:
        store.close()


@pytest.mark.usefixtures("small_pieces")
def test_one_call_rewrites_one_piece_of_blob_garbage_however_many_ranges_it_compacts(tmp_path: Path) -> None:
    """The node's compactor hands a store every range a job freed in one call (48 queues' here):
    the call compacts them all and moves one piece of the live values, not one per range."""
    store, opts, kept, _ = _store_three_quarters_garbage(str(tmp_path / "db"))
    try:
        before = _bytes_written(opts)
        assert store.compact_ranges(_removed_ranges()) is True  # more to do
        live = 8 << 20
        assert _bytes_written(opts) - before < live // 4
        assert _rewrite_calls(store, first=False) >= 2
        assert dict(store.scan(b"R", b"S")) == kept
    finally:
        store.close()


@pytest.mark.usefixtures("small_pieces")
def test_a_restart_goes_on_with_the_blob_garbage_rewrite_where_it_stopped(tmp_path: Path) -> None:
    """Where the rewrite's next piece starts is kept in the store's directory: a store closed and
    opened again after 3 pieces takes as many calls in all as one that was never closed (starting
    over would take the whole count again after the 3)."""
    reference, _, _, _ = _store_three_quarters_garbage(str(tmp_path / "reference"))
    try:
        whole = _rewrite_calls(reference)
    finally:
        reference.close()
    assert whole >= 6, whole
    path = str(tmp_path / "db")
    store, _, kept, _ = _store_three_quarters_garbage(path)
    assert _rewrite_calls(store, limit=3) == 3
    store.close()
    assert blob_gc.read_cursor(path)  # a key past the start
    store = RocksStore.open(path)
    try:
        assert store.blob_gc_under_way  # what the node's start looks at (cluster/node/node.py)
        rest = _rewrite_calls(store, first=False)
        assert 3 + rest <= whole + 1, (rest, whole)
        assert blob_gc.read_cursor(path) is None and not store.blob_gc_under_way
        assert dict(store.scan(b"R", b"S")) == kept
    finally:
        store.close()


@pytest.mark.usefixtures("small_pieces")
def test_a_piece_a_close_cancelled_is_not_passed_by_the_kept_cursor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close during a piece cancels it (its old blob files stay): the cursor kept for a restart
    stays where that piece starts, so the piece is done again, not skipped."""
    path = str(tmp_path / "db")
    store, _, _, _ = _store_three_quarters_garbage(path)
    assert _rewrite_calls(store, limit=2) == 2
    before = blob_gc.read_cursor(path)
    assert before
    real = rocks._collect_blob_garbage
    closing: list[threading.Thread] = []

    def closed_meanwhile(db: Any, start: bytes) -> bytes | None:
        following = real(db, start)
        closing.append(threading.Thread(target=store.close))
        closing[0].start()
        while store._db is not None:  # the close has revoked the handle (and would cancel)
            time.sleep(0.001)
        return following

    monkeypatch.setattr(rocks, "_collect_blob_garbage", closed_meanwhile)
    with pytest.raises(StoreClosed):
        store.compact_ranges([(b"", b"")])
    closing[0].join(10)
    assert blob_gc.read_cursor(path) == before


def test_a_blob_garbage_cursor_that_does_not_read_is_none(tmp_path: Path) -> None:
    blob_gc.write_cursor(str(tmp_path), b"\x00R\xff")
    assert blob_gc.read_cursor(str(tmp_path)) == b"\x00R\xff"
    blob_gc.write_cursor(str(tmp_path), b"")  # under way from the start
    assert blob_gc.read_cursor(str(tmp_path)) == b""
    (tmp_path / blob_gc.CURSOR_FILE).write_text("not hex")
    assert blob_gc.read_cursor(str(tmp_path)) is None
    (tmp_path / blob_gc.CURSOR_FILE).write_text("")  # a power loss left the new file empty
    assert blob_gc.read_cursor(str(tmp_path)) is None
    (tmp_path / blob_gc.CURSOR_FILE).write_text("00ab")  # or cut short: no newline at its end
    assert blob_gc.read_cursor(str(tmp_path)) is None
    blob_gc.write_cursor(str(tmp_path), None)
    assert not (tmp_path / blob_gc.CURSOR_FILE).exists()
    blob_gc.write_cursor(str(tmp_path), None)  # none to remove: fine
