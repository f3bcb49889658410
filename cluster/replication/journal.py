"""A durable Raft journal for pysyncobj, kept in a :class:`~raftmq.storage.store.Store`.

pysyncobj's own ``FileJournal`` never fsyncs, has no checksums and truncates matching entries
(hazards 1, 4 and 5 of docs/architecture.md, "The hazards and what neutralises each"). This journal
replaces it through the seam in ``cluster/replication/pso.py`` and keeps pysyncobj's journal interface
(list-like access to ``(command, index, term)`` tuples, positions counted from the first retained
entry).

Keys (big-endian, so a scan is in index order):
- ``b"E" + index(u64)`` → ``term(u64) + crc32c(u32) + command``; the CRC covers term and command.
- ``b"V"`` → ``term(u64) + voted_for(utf-8)``; written synced before any vote is sent.
- ``b"C"`` → raft commit index (u64), a hint persisted once a second.

Invariants:
- An entry is on stable storage before this node acknowledges it to a leader or counts itself in a
  commit quorum: ``add`` writes without sync and marks the journal dirty; ``flush`` syncs, and the
  Raft adapter calls it before every message it sends but a leader's entries, before it reads a
  follower's acknowledgement, and at the end of every tick (``durability="os"`` skips the sync,
  not the write).
- Truncating entries that match what follows is a no-op: a suffix written in the current term is
  kept (it is this leader's own log, so it matches), and an older suffix is hidden from pysyncobj but
  stays on disk until an entry that really conflicts replaces it. The disk therefore never holds
  less than what this node acknowledged.
- Loading checks every record (:func:`scan_journal`). A damaged run at the very end (a torn tail:
  records that fail their CRC, with no good record after them) is deleted and re-fetched from the
  leader. A damaged or missing record with good records after it is corruption in the middle: the
  journal raises :class:`JournalCorruptError` naming the group and the index and changes nothing, since
  cutting there would drop entries this node acknowledged; ``raftmq repair-journal``
  (``cluster/cli/repair.py``) is the operator's way out. Why a crash cannot produce the second
  case: docs/architecture.md, "Journal integrity".
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import crc32c
import structlog

from raftmq.cluster.base.timing import LatencyHistogram
from raftmq.errors import RaftmqError
from raftmq.storage.store import Batch, Store, StoreError

__all__ = [
    "DurableJournal",
    "Entry",
    "JournalCorruptError",
    "JournalScan",
    "scan_journal",
    "truncate_journal",
]

log = structlog.get_logger(__name__)

Entry = tuple[bytes, int, int]  # (command, index, term), pysyncobj's entry shape

_ENTRY = b"E"
_ENTRY_END = b"F"
_VOTE = b"V"
_COMMIT = b"C"
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">QI")  # term, crc32c


def _entry_key(index: int) -> bytes:
    return _ENTRY + _U64.pack(index)


def _encode_entry(command: bytes, term: int) -> bytes:
    term_bytes = _U64.pack(term)
    crc = crc32c.crc32c(command, crc32c.crc32c(term_bytes))
    return _HEAD.pack(term, crc) + command


def _decode_entry(value: bytes) -> tuple[bytes, int] | None:
    """(command, term), or None when the record is torn or corrupt."""
    if len(value) < _HEAD.size:
        return None
    term, crc = _HEAD.unpack_from(value)
    command = value[_HEAD.size :]
    if crc32c.crc32c(command, crc32c.crc32c(_U64.pack(term))) != crc:
        return None
    return command, term


def _key_index(key: bytes) -> int:
    """The index an entry key names (a malformed key: its first 8 bytes after the prefix, zero-padded)."""
    return int(_U64.unpack(key[1:9].ljust(8, b"\0"))[0])


_REASONS = {
    "crc": "a record that fails its checksum",
    "gap": "a missing entry",
    "key": "a malformed key",
}


@dataclass(frozen=True)
class JournalScan:
    """What a journal holds on disk: the good entries up to the first one that does not fit.

    ``bad_index`` is the first index that does not fit: a record failing its CRC (``crc``), a
    malformed key (``key``), or the first missing index before a later record (``gap``). None when
    every record is good and contiguous. ``good_after`` counts the records with a valid CRC after it:
    0 means a torn tail (only damaged records follow the last good one), more means corruption in
    the middle. ``last_index`` is the last index on disk, good or not.
    """

    entries: list[Entry] = field(default_factory=list)
    bad_index: int | None = None
    reason: str = ""
    cut_key: bytes = b""  # deleting [cut_key, end) removes bad_index and everything after it
    good_after: int = 0
    first_good_after: int | None = None
    last_index: int | None = None

    @property
    def torn_tail(self) -> bool:
        return self.bad_index is not None and self.good_after == 0

    @property
    def corrupt_middle(self) -> bool:
        return self.good_after > 0

    def describe(self) -> str:
        """One line for operators (the CLI and the error)."""
        if self.bad_index is None:
            span = f"entries {self.entries[0][1]}..{self.entries[-1][1]}" if self.entries else "no entries"
            return f"sound ({span})"
        good = (
            f"good entries {self.entries[0][1]}..{self.entries[-1][1]}" if self.entries else "no good entry"
        )
        what = f"{_REASONS[self.reason]} at index {self.bad_index}"
        if self.corrupt_middle:
            return (
                f"{good}, then {what}, then {self.good_after} good entries "
                f"(from index {self.first_good_after}, last index on disk {self.last_index})"
            )
        return f"{good}, then {what} and only damaged records after it (a torn tail)"


def scan_journal(store: Store) -> JournalScan:
    """Read and check every entry record of a journal store (nothing is written)."""
    entries: list[Entry] = []
    bad: int | None = None
    reason, cut = "", b""
    good_after, first_after, last = 0, None, None
    expected: int | None = None
    for key, value in store.scan(_ENTRY, _ENTRY_END):
        well_formed = len(key) == len(_ENTRY) + _U64.size
        decoded = _decode_entry(value) if well_formed else None
        index = _key_index(key)
        last = index
        if bad is None:
            if decoded is not None and (expected is None or index == expected):
                entries.append((decoded[0], index, decoded[1]))
                expected = index + 1
                continue
            if decoded is None:
                reason, bad = ("crc" if well_formed else "key"), index
                # A malformed key names the index of its first 8 bytes, and sorts after that
                # index's own key: that entry goes too, so a cut at bad_index removes the key.
                entries = [e for e in entries if e[1] < bad]
                cut = min(key, _entry_key(bad))
            else:  # a good record after a missing index
                assert expected is not None
                reason, bad, cut = "gap", expected, _entry_key(expected)
        if decoded is not None:
            good_after += 1
            first_after = index if first_after is None else first_after
    return JournalScan(entries, bad, reason, cut, good_after, first_after, last)


def truncate_journal(store: Store, from_index: int, *, dry_run: bool = False) -> int:
    """Delete every entry at or after ``from_index`` (synced); returns how many records go.

    For ``raftmq repair-journal`` on a stopped node: the node then re-fetches those entries (or a
    snapshot) from its group's leader. The vote and the commit index hint are kept (a hint past the
    new end is clamped on load). ``dry_run``: count only."""
    start = _entry_key(from_index)
    # A malformed key that sorts before entry_key(from_index) but names an index past it goes too.
    first = next((k for k, _ in store.scan(_ENTRY, _ENTRY_END) if _key_index(k) >= from_index), start)
    start = min(start, first)
    removed = sum(1 for _ in store.scan(start, _ENTRY_END))
    if dry_run or removed == 0:
        return removed
    batch = Batch()
    batch.delete_range(start, _ENTRY_END)
    store.write(batch, sync=True)
    return removed


class JournalCorruptError(RaftmqError):
    """A journal holds a damaged or missing entry with good entries after it (not a torn tail).

    Raised on load, before anything is changed. Cutting there would drop entries this node may have
    acknowledged to a leader; the operator repairs it with ``raftmq repair-journal``."""

    def __init__(self, group: str, scan: JournalScan) -> None:
        assert scan.bad_index is not None
        self.group = group
        self.index = scan.bad_index
        self.scan = scan
        super().__init__(
            f"group {group}: the Raft journal is corrupt at index {scan.bad_index} ({scan.describe()}); "
            "refusing to start, because cutting the journal there would drop entries this node may "
            "have acknowledged. Repair it with `raftmq repair-journal --group "
            f"{group} --truncate-from {scan.bad_index}` (see docs/operations.md, Repairing a journal)"
        )


class DurableJournal:
    """pysyncobj's journal interface over a Store. Used only from the Raft tick thread."""

    def __init__(self, store: Store, *, fsync: bool = True, group: str = "?") -> None:
        self._store = store
        self._group = group  # names the group in a JournalCorruptError
        self._fsync = fsync
        self._dirty = False
        self._entries: list[Entry] = []
        self._hidden: list[Entry] = []  # truncated in memory, still on disk (see module docstring)
        self._bytes = 0
        self._commit_index = 1
        self._commit_saved = True
        self._term = 0
        self._voted_for: str | None = None
        self.before_compaction: Callable[[], None] | None = None
        # Called when the store fails a write or sync; the Raft adapter stops the process (a node
        # that cannot persist its log must not go on acknowledging). Default: re-raise.
        self.on_storage_failure: Callable[[StoreError], None] | None = None
        # Read by the metrics collector; written only on the tick thread.
        self.syncs = 0
        self.sync_seconds = 0.0
        self.sync_latency = LatencyHistogram()
        self._load()

    # -- loading ---------------------------------------------------------------------------------

    def _load(self) -> None:
        vote = self._store.get(_VOTE)
        if vote is not None:
            self._term = _U64.unpack_from(vote)[0]
            self._voted_for = vote[8:].decode() or None
        commit = self._store.get(_COMMIT)
        if commit is not None:
            self._commit_index = _U64.unpack(commit)[0]
        scan = scan_journal(self._store)
        if scan.corrupt_middle:
            log.error(
                "journal_corrupt",
                group=self._group,
                index=scan.bad_index,
                reason=scan.reason,
                good_after=scan.good_after,
                last_index=scan.last_index,
            )
            raise JournalCorruptError(self._group, scan)
        if scan.torn_tail:
            assert scan.bad_index is not None
            self._repair_tail(scan.cut_key, scan.bad_index, scan.reason)
        self._entries = scan.entries
        self._bytes = sum(len(command) for command, _, _ in self._entries)
        # The commit index hint may point past a cut tail. pysyncobj trusts it on start and its
        # leader never lowers it, so entries it later appends at those indexes would count as
        # committed (and be applied) without a quorum. Never hand it one past the log.
        last = self._entries[-1][1] if self._entries else 1
        if self._commit_index > last:
            log.warning("journal_commit_index_clamped", commit_index=self._commit_index, last_index=last)
            self._commit_index = last
            self._commit_saved = False

    def _repair_tail(self, cut_key: bytes, index: int, reason: str) -> None:
        batch = Batch()
        batch.delete_range(cut_key, _ENTRY_END)
        self._write(batch, sync=True)
        log.warning("journal_tail_repaired", group=self._group, from_index=index, reason=reason)

    # -- durability --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Make every entry added so far durable. Called before a message that vouches for this log
        leaves the node, before a follower's acknowledgement is read, after every tick and at the
        start of every tick (a no-op unless the tick before failed ahead of its end)."""
        if self._dirty:
            if self._fsync:
                started = time.perf_counter()
                self._sync_store()
                took_s = time.perf_counter() - started
                self.sync_seconds += took_s
                self.syncs += 1
                self.sync_latency.observe(took_s)
            self._dirty = False

    @property
    def size_bytes(self) -> int:
        """Total size of the retained commands (for size-triggered compaction)."""
        return self._bytes

    # -- pysyncobj's Journal interface ---------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._entries and idx <= self._entries[-1][1]:
            # Re-sent entry for a position we still hold (a suffix kept by deleteEntriesFrom).
            pos = idx - self._entries[0][1]
            if self._entries[pos][2] == term:
                return
            self._truncate_disk(idx)
            self._drop_memory(pos)
            self._hidden.clear()  # the disk truncation removed them too
        elif self._hidden:
            head = self._hidden[0]
            if head[1] == idx and head[2] == term:
                self._entries.append(self._hidden.pop(0))
                self._bytes += len(head[0])
                return
            self._truncate_disk(idx)
            self._hidden.clear()
        batch = Batch()
        batch.put(_entry_key(idx), _encode_entry(command, term))
        self._write(batch)
        self._dirty = True
        self._entries.append((command, idx, term))
        self._bytes += len(command)

    def clear(self) -> None:
        batch = Batch()
        batch.delete_range(_ENTRY, _ENTRY_END)
        self._write(batch)
        self._dirty = True
        self._entries.clear()
        self._hidden.clear()
        self._bytes = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        tail = self._entries[entryFrom:]
        if not tail:
            return
        if tail[0][2] == self._term:
            # Written in the current term, so by the current leader: these entries are what the
            # leader holds at those indexes. Keep them; a conflicting add replaces them.
            return
        self._drop_memory(entryFrom)
        self._hidden = tail + self._hidden

    def deleteEntriesTo(self, entryTo: int) -> None:
        if entryTo <= 0:
            return
        if self.before_compaction is not None:
            self.before_compaction()
        first = self._entries[0][1]
        upto = self._entries[entryTo][1] if entryTo < len(self._entries) else first + entryTo
        batch = Batch()
        batch.delete_range(_entry_key(first), _entry_key(upto))
        self._write(batch)
        self._dirty = True
        for command, _, _ in self._entries[:entryTo]:
            self._bytes -= len(command)
        del self._entries[:entryTo]

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self.flush()
        self._save_commit_index()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._commit_saved = False

    def getRaftCommitIndex(self) -> int:
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        # Raft: term and vote are on stable storage before any message that reflects them.
        batch = Batch()
        batch.put(_VOTE, _U64.pack(term) + (votedForNodeId or "").encode())
        self._write(batch, sync=True)
        self._term = term
        self._voted_for = votedForNodeId

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        self._save_commit_index()

    # -- helpers -------------------------------------------------------------------------------------

    def _write(self, batch: Batch, *, sync: bool = False) -> None:
        try:
            self._store.write(batch, sync=sync)
        except StoreError as e:
            self._storage_failed(e)

    def _sync_store(self) -> None:
        try:
            self._store.sync()
        except StoreError as e:
            self._storage_failed(e)

    def _storage_failed(self, error: StoreError) -> None:
        if self.on_storage_failure is None:
            raise error
        self.on_storage_failure(error)
        raise error  # on_storage_failure normally does not return

    def align_to_snapshot(self, prev: Entry, last: Entry) -> None:
        """Drop entries before the snapshot's ``prev`` entry if this journal holds prev and last.

        pysyncobj clears the whole journal on start unless its first two entries equal the
        snapshot's; a crash between writing the snapshot and compacting the journal would then drop
        every entry after the snapshot (hazard 2). Compacting here first keeps them.
        """
        if len(self._entries) < 2:
            return
        pos = prev[1] - self._entries[0][1]
        if pos <= 0 or pos + 1 >= len(self._entries):
            return
        held_prev, held_last = self._entries[pos], self._entries[pos + 1]
        if (held_prev[1], held_prev[2]) == (prev[1], prev[2]) and (held_last[1], held_last[2]) == (
            last[1],
            last[2],
        ):
            hook, self.before_compaction = self.before_compaction, None
            try:
                self.deleteEntriesTo(pos)
            finally:
                self.before_compaction = hook
            self.flush()

    def _truncate_disk(self, idx: int) -> None:
        batch = Batch()
        batch.delete_range(_entry_key(idx), _ENTRY_END)
        self._write(batch)
        self._dirty = True

    def _drop_memory(self, pos: int) -> None:
        for command, _, _ in self._entries[pos:]:
            self._bytes -= len(command)
        del self._entries[pos:]

    def _save_commit_index(self) -> None:
        if not self._commit_saved:
            batch = Batch()
            batch.put(_COMMIT, _U64.pack(self._commit_index))
            self._write(batch)
            self._commit_saved = True
