"""``RocksStore``: the :class:`~raftmq.storage.store.Store` over RocksDB (rocksdict 0.3.29, raw mode).

This is the only module in raftmq that imports rocksdict. Everything rocksdict-specific stays here,
including the workarounds for what that version does differently from RocksDB's documentation:

- ``ReadOptions.set_iterate_lower_bound`` sets the *upper* bound, so lower limits are checked here in
  Python and only ``set_iterate_upper_bound`` is used.
- A ``WriteBatch`` holding ``delete_range(start, end)`` with ``end < start`` is applied up to that op,
  then fails, and every later write *and* ``close()`` fail too. Empty and reversed ranges (which delete
  nothing by the contract) therefore never reach RocksDB.
- An iterator keeps the database open (and its ``LOCK`` held) after ``Rdict.close()``. A closed
  ``Rdict`` raises ``DbClosedError``, but an iterator over it keeps working. So the store tracks its
  live scan cursors and drops their iterators before it closes or swaps the database.
- RocksDB errors arrive as bare ``Exception``; they are re-raised as :class:`StoreError`.
- ``compact_range`` drops RocksDB's status: a cancelled compaction returns as a finished one.
- Opening an existing database without naming its column families takes their options from its
  OPTIONS file, not from the ``Options`` given: the default column family is named (``_open_rdict``).

Values of ``_MIN_BLOB_BYTES`` or more (record batches, Raft journal entries: the messages) live in
blob files beside the SST files (RocksDB's integrated BlobDB, key-value separation): compactions
rewrite keys and small values only, never the messages. With the messages in the SST files each
byte was rewritten by every level it went through (a memtable flush holds keys of every queue, so
each level-0 compaction overlapped the whole of level 1): 8.3x the data written to the disk by one
store pair at 1 GB, and growing with the data held; 3.9x (the write-ahead log and the flush of
each store) with blob files (docs/operations.md, "Disk"). A blob file goes once every value in it
is deleted; RocksDB's own blob garbage collection, which would rewrite the oldest files' live
values in every compaction touching them (and, the messages' keys of every queue sharing each
file, that is every level-1 compaction), stays off. ``compact_ranges`` (what retention and dropped
topics call) collects the garbage instead, in bounded pieces (``blob_gc.py``: when, and where).

Threads: one writer and many readers may call in at once, through the gate ``RocksStore`` is built
on (``store_gate.py``): a close or a restore takes the handle away only once no user is inside.

Restore protocol (``restore_from``). Every step is one atomic rename on one filesystem, made durable
by an fsync of the directories involved; ``<path>.restore-old`` existing marks an unfinished restore:

1. close the database; fsync every file of the checkpoint;
2. rename ``<path>`` -> ``<path>.restore-old``;
3. rename the checkpoint directory -> ``<path>``;
4. open ``<path>``, then delete ``<path>.restore-old``.

``RocksStore.open`` finishes or undoes an interrupted restore before it opens anything:

- ``<path>.restore-old`` absent: an ordinary open (created if missing).
- present, and ``<path>`` is a database (has ``CURRENT``): roll forward: open ``<path>``, then delete
  ``<path>.restore-old``.
- present, and ``<path>`` is missing, not a database, or does not open: roll back: rename ``<path>``
  (if any) to ``<path>.restore-failed``, rename ``<path>.restore-old`` back to ``<path>``, delete
  ``<path>.restore-failed`` (any later open deletes a leftover one too).

So after a crash at any point, once ``open`` has run, ``<path>`` is the old or the new complete
database. ``restore_from`` ends with the same recovery step, and raises ``StoreError`` if it rolled back.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import NoReturn, cast

from rocksdict import (
    BottommostLevelCompaction,
    Checkpoint,
    CompactOptions,
    DbClosedError,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from . import blob_gc
from .durable_dirs import make_dirs_durable
from .restore_files import (
    RESTORE_FAILED_SUFFIX,
    RESTORE_OLD_SUFFIX,
    check_restorable,
    destroy_store,
    is_database,
    remove_tree,
    roll_back,
    swap_in,
)
from .rocks_cursor import ScanCursor, as_bytes
from .store import OP_DELETE, OP_DELETE_RANGE, OP_PUT, Batch, StoreClosed, StoreError
from .store_gate import HandleGate

__all__ = ["RESTORE_FAILED_SUFFIX", "RESTORE_OLD_SUFFIX", "RocksStore", "destroy_store"]

# Values from this size on go to blob files (a record batch of a few messages and up, a Raft entry
# carrying them); smaller ones (queue metas, offsets, producer states, in-flight records) stay in
# the SST files, where RocksDB reads them with the keys.
_MIN_BLOB_BYTES = 4096
# Blob files written by a flush are at most a memtable (16 MiB); this bounds the ones a garbage
# collection writes, so the next one frees the disk file by file.
_BLOB_FILE_BYTES = 64 << 20
# The SST files' target size: RocksDB's default, named. Their boundaries are where the garbage
# collection can cut its pieces (``blob_gc.piece``); smaller files would cut finer but multiply the
# files of a store of small messages (they stay in the SST files: 10 GB of them in 1 MiB files is
# 10,000 files, each held open), so a piece is at least one file's keys: at this size, with the
# messages in blob files, millions of keys, usually the whole store.
_SST_FILE_BYTES = 64 << 20


def _options() -> Options:
    """RocksDB options for a commit log on a small (2-core) machine."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # One flush and two compactions at a time, in a pool every store of the process shares: the
    # rewrite of a store's live messages that collects blob garbage (_collect_blob_garbage) holds
    # one compaction slot for as long as it takes (minutes at tens of gigabytes), and with a single
    # slot every other store's level 0 would pile up until RocksDB stopped its writes.
    opts.set_max_background_jobs(3)
    # A node hosts several databases (one per queue group replica, one for metadata); 16 MiB
    # memtables (RocksDB default: 64 MiB) keep their sum modest. Two of them: one filling, one flushing.
    opts.set_write_buffer_size(16 << 20)
    opts.set_max_write_buffer_number(2)
    # After a crash, recover every WAL record before a torn tail and drop the tail, instead of refusing
    # to open (absolute_consistency). RocksDB's default, but our durability argument rests on it.
    # recycle_log_file_num stays 0: measured, it moved no figure (docs/benchmarks.md, "Recycled").
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    # Every open rolls the info LOG to LOG.old.<time>; keep a few, not all of them.
    opts.set_keep_log_file_num(4)
    # Key-value separation (the module docstring). Blob files are compressed as the SST files are
    # (Snappy), so compressible messages take the disk they took before; RocksDB's own blob
    # garbage collection stays off (compact_range collects). A store written before opens as it
    # was: its values stay in the SST files until a compaction rewrites them into blob files.
    opts.set_enable_blob_files(True)
    opts.set_min_blob_size(_MIN_BLOB_BYTES)
    opts.set_blob_file_size(_BLOB_FILE_BYTES)
    opts.set_blob_compression_type(DBCompressionType.snappy())
    opts.set_enable_blob_gc(False)
    opts.set_target_file_size_base(_SST_FILE_BYTES)
    return opts


def _write_options(*, sync: bool) -> WriteOptions:
    # The WAL is always on (never disable_wal): it is what makes an unsynced write survive a process
    # crash and a synced one survive a power loss.
    wo = WriteOptions()
    wo.sync = sync
    return wo


def _translate(exc: BaseException) -> StoreError | None:
    """The StoreError for a rocksdict or OS failure, or None for anything else (a caller bug)."""
    if isinstance(exc, DbClosedError):
        return StoreClosed(str(exc))
    # rocksdict raises RocksDB's Status errors as bare Exception, never a subclass.
    if type(exc) is Exception or isinstance(exc, OSError):
        return StoreError(str(exc))
    return None


def _raise_translated(exc: Exception) -> NoReturn:
    """Raise what :class:`_StoreErrors` would for ``exc`` (the hot paths' form: no object per call)."""
    if isinstance(exc, StoreError):
        raise exc
    translated = _translate(exc)
    if translated is None:
        raise exc
    raise translated from exc


class _StoreErrors:
    """``with _StoreErrors():`` a rocksdict or OS failure raised as a StoreError (a class: _Gate's)."""

    __slots__ = ()

    def __enter__(self) -> object:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        translated = None if exc is None else _translate(exc)  # None for a StoreError
        if translated is not None:
            raise translated from exc


class _Gate(_StoreErrors):
    """``with store._using() as db``: the handle through the store's gate (no generator: 1 µs less)."""

    __slots__ = ("_store",)

    def __init__(self, store: RocksStore) -> None:
        self._store = store

    def __enter__(self) -> Rdict:
        return self._store._enter()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._store._leave()
        _StoreErrors.__exit__(self, kind, exc, tb)


def _to_write_batch(batch: Batch) -> WriteBatch:
    """The rocksdict batch for ``batch``. Raises ValueError (before anything is written) on a bad op."""
    wb = WriteBatch(raw_mode=True)
    for op, a, b in batch.ops:
        if op == OP_PUT:
            wb.put(a, b)
        elif op == OP_DELETE:
            wb.delete(a)
        elif op == OP_DELETE_RANGE:
            # Empty or reversed ranges delete nothing; RocksDB would half-apply the batch (see above).
            if a < b:
                wb.delete_range(a, b)
        else:
            raise ValueError(f"unknown batch op {op}")
    return wb


class RocksStore(HandleGate[Rdict]):
    """A :class:`Store` in one RocksDB directory. Safe for one writer and many reader threads (the gate).

    Create with :meth:`open`. Scan iterators are not themselves thread-safe (use each from one thread).
    """

    def __init__(self, path: str, db: Rdict) -> None:
        super().__init__(path, db)
        # Where the blob garbage collection's next piece starts (b"": the first; None: none under
        # way), kept in the store's directory. Only compact_ranges sets it (one thread at a time).
        self._gc_next: bytes | None = blob_gc.read_cursor(path)
        self._closed = False
        # Serializes close() and restore_from(), which both take the handle away from users.
        self._admin = threading.Lock()
        self._wo_sync = _write_options(sync=True)
        self._wo_nosync = _write_options(sync=False)

    @classmethod
    def open(cls, path: str) -> RocksStore:
        """Open (or create) the store in directory ``path``, finishing an interrupted restore first.

        Raises:
            StoreError: RocksDB refused to open (corruption, lock held by another opener, I/O error).
        """
        path = os.path.abspath(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        db, _ = _open_recovering(path)
        # RocksDB fsyncs the database's directory, not its entry in the parent (durable_dirs).
        make_dirs_durable(os.path.dirname(path))
        return cls(path, db)

    @property
    def path(self) -> str:
        """The absolute path of the database directory."""
        return self._path

    @property
    def blob_gc_under_way(self) -> bool:
        """A rewrite of blob garbage is under way (its cursor kept): compact_ranges goes on with it."""
        return self._gc_next is not None

    def _using(self) -> _Gate:
        return _Gate(self)

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value stored at ``key``, or None."""
        # The gate inline, not a _Gate object: a get is several per applied entry.
        db = self._enter()
        try:
            value = db.get(key)
        except Exception as exc:
            _raise_translated(exc)
        finally:
            self._leave()
        return None if value is None else as_bytes(value)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values at ``keys``, in their order (None: none), read by one RocksDB multi-get."""
        wanted: list[str | int | float | bytes | bool] = list(keys)  # rocksdict's type of a key list
        with self._using() as db:
            values = cast("list[object]", db.get(wanted))  # for a list of keys, a list
        return [None if value is None else as_bytes(value) for value in values]

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` in key order (descending with ``reverse``), at most ``limit``.

        It reads a snapshot taken by this call, which reads its first chunk (a scan of one chunk, whole:
        it outlives a close); a longer one raises StoreClosed if the store is closed or restored first.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if limit == 0 or (end is not None and start >= end):
            with self._using():
                return iter(())
        ro = ReadOptions()
        if end is not None:
            ro.set_iterate_upper_bound(end)
        with self._using() as db:
            # The iterator pins the database's state as of now: this is the scan's snapshot.
            cursor = ScanCursor(
                db.iter(ro),  # only the cursor holds it: revoked at close while registered
                start,
                reverse=reverse,
                limit=limit,
                gate=self._using,
                done=self._unregister,
                path=self._path,
            )
            # rocksdict keeps a pointer to the upper bound's bytes without a reference: the cursor owns
            # `ro` and `end` while the iterator lives (a freed bound silently gives the wrong keys).
            cursor.pin(ro, end)
            if cursor.prime():  # the first chunk read in this visit; a short scan ends here
                self._register(cursor)
        return cursor

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        """The pair with the greatest key ``k`` such that ``floor <= k <= key``, or None."""
        if floor > key:
            with self._using():
                return None
        with self._using() as db:
            it = db.iter()
            it.seek_for_prev(key)
            if not it.valid():
                return None
            found = as_bytes(it.key())
            if found < floor:
                return None
            return found, as_bytes(it.value())

    def int_property(self, name: str) -> int:
        """RocksDB's integer property ``name`` (``rocksdb.num-running-compactions``, ...); 0 when unknown."""
        with self._using() as db:
            return int(db.property_int_value(name) or 0)

    def approximate_size(self) -> int:
        """Bytes the database directory takes on disk (SST, WAL, manifest and log files)."""
        with self._using():
            total = 0
            with os.scandir(self._path) as entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
            return total

    # -- writes ----------------------------------------------------------------------------------

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        """Apply ``batch`` atomically; with ``sync``, return only once it is on stable storage.

        Raises:
            ValueError: the batch holds an unknown op (nothing is written).
            StoreError: RocksDB failed; treat the store as broken.
        """
        if not batch.ops:  # nothing to write, but a closed store raises all the same
            with self._using():
                pass
            if sync:
                self.sync()
            return
        wb = _to_write_batch(batch)
        with self._using() as db:
            db.write(wb, self._wo_sync if sync else self._wo_nosync)

    def sync(self) -> None:
        """Make every write made so far durable (fsync of the write-ahead log)."""
        with self._using() as db:
            db.flush_wal(sync=True)

    def compact_range(self, start: bytes, end: bytes) -> bool:
        """:meth:`compact_ranges` of the one range ``[start, end)``."""
        return self.compact_ranges(((start, end),))

    def compact_ranges(self, ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        """Compact each ``[start, end)`` of ``ranges`` through every level now (memtable first),
        dropping what range deletions cover: RocksDB compacts a level only once it outgrows its
        target, so on a store that stopped growing a deleted backlog stays on disk. Not exclusive
        (RocksDB's own go on). An empty range (``start >= end``) only goes on with the below.

        The dropped keys' values are garbage in their blob files: once it is half their bytes, the
        live values move into new files, one piece of about ``blob_gc.PIECE_BYTES`` per call however
        many ranges it compacted (``blob_gc.py``, the cursor kept across restarts).

        A ``close`` or ``restore_from`` meanwhile cancels it (milliseconds): what it did is kept.

        Returns:
            True while a garbage collection is under way: call again (an empty range will do).

        Raises:
            StoreClosed: the store is closed, or was closed or restored during the compaction.
        """
        opts = CompactOptions()
        opts.set_exclusive_manual_compaction(False)
        with self._using() as db:
            with self._cond:
                self._compactions += 1
            try:
                for start, end in ranges:
                    if start < end and self._db is db:
                        db.compact_range(start, end, opts)
                if self._db is db and (self._gc_next is not None or blob_gc.garbage_due(db)):
                    following = _collect_blob_garbage(db, self._gc_next or b"")
                    if self._db is db:  # a piece a close cancelled is not passed: done again
                        self._gc_next = following
                        blob_gc.write_cursor(self._path, following)
            finally:
                with self._cond:
                    self._compactions -= 1
                    cancelled = self._db is not db
            if cancelled:
                raise StoreClosed(f"store {self._path} was closed during a compaction")
            return self._gc_next is not None

    def checkpoint(self, path: str) -> None:
        """Write an openable copy of the store into the new directory ``path`` (hard links where possible).

        Raises:
            StoreError: ``path`` exists, or RocksDB failed.
        """
        path = os.path.abspath(path)
        if os.path.lexists(path):
            raise StoreError(f"checkpoint directory {path} already exists")
        with self._using() as db:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Checkpoint(db).create_checkpoint(path)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database; waits for in-flight reads and writes. Later calls raise StoreClosed.

        Closing twice is harmless.

        Raises:
            StoreError: RocksDB reported an error while closing (the store is closed anyway).
        """
        with self._admin:
            self._closed = True
            db, cancelled = self._revoke()
            if db is not None:
                _close_rdict(db, cancelled=cancelled)

    def restore_from(self, checkpoint_dir: str) -> None:
        """Replace the whole contents of this store with ``checkpoint_dir``, durably and crash-safely.

        ``checkpoint_dir`` (made by :meth:`checkpoint`, on the store's filesystem) is consumed (moved
        into place). Readers get StoreClosed while the swap runs. The protocol: the module docstring.

        Raises:
            StoreError: the checkpoint is not usable; the store still holds its old contents (or, if
                even those do not reopen, the store is closed).
            StoreClosed: the store was closed.
        """
        src = os.path.abspath(checkpoint_dir)
        with self._admin:
            if self._closed:
                raise StoreClosed(f"store {self._path} is closed")
            check_restorable(src, self._path)
            db, cancelled = self._revoke()
            assert db is not None  # only close() and restore_from() revoke, and _admin serializes them
            try:
                _close_rdict(db, cancelled=cancelled)
                swap_in(src, self._path)
            except (StoreError, OSError) as exc:
                self._reopen()
                raise StoreError(f"restore of {self._path} from {src} failed: {exc}") from exc
            if self._reopen():
                raise StoreError(f"checkpoint {src} did not open; {self._path} kept its old contents")

    def _reopen(self) -> bool:
        """Reopen after a swap (finishing or undoing it). True if the restore was rolled back."""
        try:
            db, rolled_back = _open_recovering(self._path)
        except StoreError:
            self._closed = True
            raise
        with self._cond:
            self._db = db
            self._gc_next = blob_gc.read_cursor(self._path)  # the cursor goes with the database
        return rolled_back


def _collect_blob_garbage(db: Rdict, start: bytes) -> bytes | None:
    """Compact one piece of the store from ``start`` (its last level too) with blob garbage
    collection on for every blob file: the live values of its keys move into new blob files. Returns
    where the next piece starts, or None when this one reached the end (the old files, all garbage
    once every piece is done, are gone then)."""
    last, after = blob_gc.piece(db, start)
    opts = CompactOptions()
    opts.set_exclusive_manual_compaction(False)
    opts.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    # Mutable options, written to the store's OPTIONS file too: the next open names them off
    # again (_open_rdict), and they are set off below as soon as the compaction ends.
    db.set_options({"enable_blob_garbage_collection": "true", "blob_garbage_collection_age_cutoff": "1.0"})
    try:
        db.compact_range(start or None, last, opts)
    finally:
        db.set_options({"enable_blob_garbage_collection": "false"})
    return after


def _open_rdict(path: str) -> Rdict:
    with _StoreErrors():
        # The default column family's options named, not left to rocksdict: for a database that
        # exists it takes them from the database's last OPTIONS file (what the release that wrote
        # it set) and applies ours only to the database-wide ones, so a change here never reached
        # a store written before it.
        return Rdict(path, _options(), column_families={"default": _options()})


def _close_rdict(db: Rdict, *, cancelled: bool = False) -> None:
    """Close ``db``. After ``cancel_all_background`` its close reports "Shutdown in progress"
    (the memtable is not flushed: its writes are in the write-ahead log, replayed at the next
    open) and the handle is released all the same."""
    try:
        with _StoreErrors():
            db.close()
    except StoreError as e:
        if not (cancelled and str(e).startswith("Shutdown in progress")):
            raise


def _open_recovering(path: str) -> tuple[Rdict, bool]:
    """Open ``path`` after finishing or undoing an interrupted restore (see the module docstring).

    Returns the handle and whether a restore was rolled back.
    """
    old = path + RESTORE_OLD_SUFFIX
    remove_tree(path + RESTORE_FAILED_SUFFIX)
    if not os.path.isdir(old):
        return _open_rdict(path), False
    if is_database(path):
        try:
            db = _open_rdict(path)
        except StoreError:
            pass  # the new database is unusable: fall through to the roll back
        else:
            remove_tree(old)  # roll forward: the new database is in place and opens
            return db, False
    roll_back(path)
    return _open_rdict(path), True
