"""A durable Raft journal for pysyncobj, kept in a :class:`~raftmq.storage.store.Store`.

pysyncobj's own ``FileJournal`` never fsyncs, has no checksums and truncates matching entries
(hazards 1, 4 and 5 of docs/architecture.md, "The hazards and what neutralises each"). This journal
replaces it through the seam in ``cluster/raft.py`` and keeps pysyncobj's journal interface
(list-like access to ``(command, index, term)`` tuples, positions counted from the first retained
entry).

Keys (big-endian, so a scan is in index order):
- ``b"E" + index(u64)`` → ``term(u64) + crc32c(u32) + command``; the CRC covers term and command.
- ``b"V"`` → ``term(u64) + voted_for(utf-8)``; written synced before any vote is sent.
- ``b"C"`` → raft commit index (u64), a hint persisted once a second.

Invariants:
- An entry is on stable storage before this node acknowledges it to a leader or counts itself in a
  commit quorum: ``add`` writes without sync and marks the journal dirty; ``flush`` syncs, and the
  Raft adapter calls it before every message it sends and at the end of every tick
  (``durability="os"`` skips the sync, not the write).
- Truncating entries that match what follows is a no-op: a suffix written in the current term is
  kept (it is this leader's own log, so it matches), and an older suffix is hidden from pysyncobj but
  stays on disk until an entry that really conflicts replaces it. The disk therefore never holds
  less than what this node acknowledged.
- Loading stops at the first record whose CRC or index does not fit (a torn tail) and deletes it and
  everything after it; the node then re-fetches those entries from the leader.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

import crc32c
import structlog

from raftmq.storage.store import Batch, Store, StoreError

from .timing import LatencyHistogram

__all__ = ["DurableJournal", "Entry"]

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


class DurableJournal:
    """pysyncobj's journal interface over a Store. Used only from the Raft tick thread."""

    def __init__(self, store: Store, *, fsync: bool = True) -> None:
        self._store = store
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
        expected: int | None = None
        for key, value in self._store.scan(_ENTRY, _ENTRY_END):
            index = _U64.unpack_from(key, 1)[0]
            decoded = _decode_entry(value)
            if decoded is None or (expected is not None and index != expected):
                self._repair_tail(index, reason="crc" if decoded is None else "gap")
                break
            command, term = decoded
            self._entries.append((command, index, term))
            self._bytes += len(command)
            expected = index + 1
        # The commit index hint may point past a cut tail. pysyncobj trusts it on start and its
        # leader never lowers it, so entries it later appends at those indexes would count as
        # committed (and be applied) without a quorum. Never hand it one past the log.
        last = self._entries[-1][1] if self._entries else 1
        if self._commit_index > last:
            log.warning("journal_commit_index_clamped", commit_index=self._commit_index, last_index=last)
            self._commit_index = last
            self._commit_saved = False

    def _repair_tail(self, index: int, reason: str) -> None:
        batch = Batch()
        batch.delete_range(_entry_key(index), _ENTRY_END)
        self._write(batch, sync=True)
        log.warning("journal_tail_repaired", from_index=index, reason=reason)

    # -- durability --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Make every entry added so far durable. Called before any message leaves this node."""
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
