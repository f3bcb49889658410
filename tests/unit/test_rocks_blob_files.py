"""RocksStore keeps the messages in blob files (key-value separation): what compactions then
write, what retention frees, what a checkpoint holds, and stores written before (an upgrade)."""

from __future__ import annotations

import contextlib
import glob
import os
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.storage import blob_gc, rocks
from raftmq.storage.rocks import RocksStore, destroy_store
from raftmq.storage.store import Batch

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


def _written_bytes() -> int:
    """Bytes this process (RocksDB's threads included) caused to be written to the disk."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def _blob_files(path: str) -> list[str]:
    return glob.glob(os.path.join(path, "*.blob"))


@contextlib.contextmanager
def _options_before_blob_files() -> Iterator[None]:
    """Stores opened meanwhile get the options of releases before blob files (the rest unchanged)."""
    current = rocks._options

    def without_blob_files() -> rocks.Options:
        opts = current()
        opts.set_enable_blob_files(False)
        return opts

    rocks._options = without_blob_files
    try:
        yield
    finally:
        rocks._options = current


def test_compactions_rewrite_the_keys_not_the_messages(tmp_path: Path) -> None:
    """32 MiB of batches over 64 queues on top of 32 MiB compacted before: the write-ahead log and
    the flush write each byte once, and merging the new level-0 files with the old data (which
    overlaps them all) writes the keys again, not the messages. With the messages in the SST files
    the merge rewrote the 32 MiB already there as well (4x instead of 2x)."""
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        count = (32 << 20) // BATCH_BYTES
        first = _write(store, _batches(1, count))
        store.compact_range(b"", b"\xff")  # flushed and compacted to the last level
        before = _written_bytes()
        second = _write(store, _batches(2, count, first=count))
        store.compact_range(b"", b"\xff")
        written = _written_bytes() - before
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
    with _options_before_blob_files():
        old = RocksStore.open(path)
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


def test_a_store_with_blob_files_still_opens_and_reads_with_the_options_before_them(tmp_path: Path) -> None:
    """A node rolled back to a release before blob files reads what this one wrote."""
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    written = _write(store, _batches(7, 1024))
    store.compact_range(b"", b"\xff")
    assert _blob_files(path)
    store.close()
    with _options_before_blob_files():
        old = RocksStore.open(path)
        try:
            assert dict(old.scan(b"R", b"S")) == written
        finally:
            old.close()


def test_the_blob_garbage_is_rewritten_a_bounded_piece_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three queues of four removed leave every blob file three quarters garbage: compact_range
    moves the live quarter into new files a key range of about ``blob_gc.PIECE_BYTES`` at a time, asking to be
    called again until the last range is done, so no call rewrites the store at once. Then the
    old files are gone and every kept message reads back."""
    monkeypatch.setattr(rocks, "_SST_FILE_BYTES", 1 << 10)  # a few SST files of keys to cut at
    monkeypatch.setattr(blob_gc, "PIECE_BYTES", 2 << 20)
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        rnd = random.Random(4)  # batches of 4 KiB (the least that goes to a blob file): more keys
        count = (32 << 20) // 4096
        written = _write(
            store, ((_record_key(n % QUEUES, n // QUEUES), rnd.randbytes(4096)) for n in range(count))
        )
        store.compact_range(b"", b"\xff")
        full = store.approximate_size()
        removal = Batch()
        for q in (q for q in range(QUEUES) if q % 4):
            removal.delete_range(_record_key(q, 0), _record_key(q, 1 << 62))
        store.write(removal, sync=True)
        calls, more = [], True
        while more and len(calls) < 100:
            before = _written_bytes()
            more = store.compact_range(b"", b"\xff") if not calls else store.compact_range(b"", b"")
            calls.append(_written_bytes() - before)
        live = 8 << 20  # a quarter of the 32 MiB
        assert len(calls) >= 3 and not more, [c >> 10 for c in calls]
        assert max(calls) < live // 4, f"a call wrote {max(calls) >> 20} MiB of {live >> 20} MiB live"
        assert store.approximate_size() < full * 0.7, (store.approximate_size(), full)
        kept = {k: v for k, v in written.items() if struct.unpack(">I", k[5:9])[0] % 4 == 0}
        assert dict(store.scan(b"R", b"S")) == kept
    finally:
        store.close()
