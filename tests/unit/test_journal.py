"""DurableJournal: pysyncobj's journal interface over a Store, and the durability hazards it closes.

Every test runs over MemoryStore and RocksStore. "Reopen" means building a new DurableJournal on the
same store; for RocksStore the store is closed and opened again first, so what a reopened journal
shows is what was on disk. Hazard numbers refer to docs/architecture.md, "The hazards and what
neutralises each".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from raftmq.cluster.replication.journal import (
    DurableJournal,
    Entry,
    JournalCorruptError,
    scan_journal,
    truncate_journal,
)
from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, Store

_U64 = struct.Struct(">Q")


def entry_key(index: int) -> bytes:
    return b"E" + _U64.pack(index)


def cmd(index: int, tag: str = "") -> bytes:
    return f"cmd-{index}{tag}".encode()


def entries(first: int, last: int, term: int, tag: str = "") -> list[Entry]:
    return [(cmd(i, tag), i, term) for i in range(first, last + 1)]


def fill(journal: DurableJournal, items: list[Entry]) -> None:
    for item in items:
        journal.add(*item)


def visible(journal: DurableJournal) -> list[Entry]:
    return list(journal[:])


def disk_indexes(store: Store) -> list[int]:
    return [_U64.unpack_from(k, 1)[0] for k, _ in store.scan(b"E", b"F")]


def expected_size(journal: DurableJournal) -> int:
    return sum(len(c) for c, _, _ in journal[:])


class CountingStore:
    """A Store wrapper counting syncs and writes (by their ``sync`` flag)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.syncs = 0
        self.synced_writes = 0
        self.plain_writes = 0

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def scan(self, start: bytes, end: bytes | None = None, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(start, end, **kwargs)

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        return self.inner.last_before(key, floor)

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        if sync:
            self.synced_writes += 1
        else:
            self.plain_writes += 1
        self.inner.write(batch, sync=sync)

    def sync(self) -> None:
        self.syncs += 1
        self.inner.sync()

    def checkpoint(self, path: str) -> None:
        self.inner.checkpoint(path)

    def close(self) -> None:
        self.inner.close()

    @property
    def writes(self) -> int:
        return self.synced_writes + self.plain_writes


class Env:
    """One store kind; ``reopen`` proves what is on disk (RocksStore: close and open the path)."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind
        self.path = path
        self.store: Store = MemoryStore() if kind == "memory" else RocksStore.open(path)

    def journal(self, **kwargs: Any) -> DurableJournal:
        return DurableJournal(self.store, **kwargs)

    def reopen(self, **kwargs: Any) -> DurableJournal:
        if self.kind == "rocks":
            self.store.close()
            self.store = RocksStore.open(self.path)
        return DurableJournal(self.store, **kwargs)

    def put_raw(self, key: bytes, value: bytes) -> None:
        batch = Batch()
        batch.put(key, value)
        self.store.write(batch, sync=True)

    def delete_raw(self, key: bytes) -> None:
        batch = Batch()
        batch.delete(key)
        self.store.write(batch, sync=True)

    def close(self) -> None:
        self.store.close()


@pytest.fixture(params=["memory", "rocks"])
def env(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Env]:
    e = Env(request.param, str(tmp_path / "journal"))
    try:
        yield e
    finally:
        e.close()


# -- 1. list semantics and persistence ---------------------------------------------------------------


def test_list_semantics_mirror_pysyncobj(env: Env) -> None:
    journal = env.journal()
    assert len(journal) == 0
    with pytest.raises(IndexError):
        journal[-1]
    items = entries(1, 6, 1) + entries(7, 9, 2)
    fill(journal, items)
    assert len(journal) == len(items)
    for i in range(-len(items), len(items)):
        assert journal[i] == items[i]
    for sl in (
        slice(None),
        slice(2, 5),
        slice(3, None),
        slice(None, -2),
        slice(-3, None),
        slice(7, 100),
        slice(100, None),
        slice(0, 0),
        slice(None, None, 2),
    ):
        assert journal[sl] == items[sl]
        assert isinstance(journal[sl], list)
    with pytest.raises(IndexError):
        journal[len(items)]
    with pytest.raises(IndexError):
        journal[-len(items) - 1]
    # pysyncobj's __getEntries/__getCurrentLogIndex shapes
    assert journal[-1][1] == 9 and journal[-1][2] == 2
    assert journal[0][1] == 1


def test_entries_survive_reopen_exactly(env: Env) -> None:
    journal = env.journal()
    odd = [
        (b"\x01" + bytes(range(256)), 1, 0),
        (b"", 2, 3),
        (b"\x00" * 100_000, 3, 3),
        (b"E\x00\x00\x00\x00\x00\x00\x00\x01", 4, 2**40),
    ]
    fill(journal, odd)
    journal.flush()
    reopened = env.reopen()
    assert visible(reopened) == odd
    for command, _, _ in reopened[:]:
        assert type(command) is bytes
    assert reopened.size_bytes == expected_size(reopened)


# -- 2. durability accounting (hazard 1) ------------------------------------------------------------


def test_flush_syncs_exactly_when_dirty(env: Env) -> None:
    store = CountingStore(env.store)
    journal = DurableJournal(store)
    assert (store.syncs, store.writes) == (0, 0)  # loading writes nothing
    journal.flush()
    assert store.syncs == 0  # clean: nothing to sync
    journal.add(cmd(1), 1, 1)
    assert store.syncs == 0 and store.plain_writes == 1 and store.synced_writes == 0  # add never syncs
    journal.flush()
    assert store.syncs == 1
    journal.flush()
    assert store.syncs == 1  # clean again
    fill(journal, entries(2, 4, 1))
    journal.flush()
    assert store.syncs == 2  # one sync covers every add since the last flush
    journal.deleteEntriesTo(1)
    journal.flush()
    assert store.syncs == 3
    journal.clear()
    journal.flush()
    assert store.syncs == 4
    journal.flush()
    assert store.syncs == 4


def test_fsync_false_never_syncs_entries(env: Env) -> None:
    store = CountingStore(env.store)
    journal = DurableJournal(store, fsync=False)
    fill(journal, entries(1, 5, 1))
    journal.flush()
    journal.deleteEntriesTo(2)
    journal.flush()
    journal.onOneSecondTimer()
    journal._destroy()
    assert store.syncs == 0
    assert store.synced_writes == 0
    # the write still happens (durability="os" skips the sync, not the write)
    assert visible(env.reopen()) == entries(3, 5, 1)


@pytest.mark.parametrize("fsync", [True, False])
def test_term_and_vote_are_written_synced_and_survive(env: Env, fsync: bool) -> None:
    store = CountingStore(env.store)
    journal = DurableJournal(store, fsync=fsync)
    assert journal.getCurrentTerm() == 0
    assert journal.getVotedForNodeId() is None
    journal.setCurrentTerm(3, "10.0.0.1:4321")
    assert store.synced_writes == 1 and store.plain_writes == 0
    assert journal.getCurrentTerm() == 3
    assert journal.getVotedForNodeId() == "10.0.0.1:4321"
    reopened = env.reopen()
    assert reopened.getCurrentTerm() == 3
    assert reopened.getVotedForNodeId() == "10.0.0.1:4321"

    store = CountingStore(env.store)
    journal = DurableJournal(store, fsync=fsync)
    journal.setCurrentTerm(4, None)
    journal.setCurrentTerm(4, "nödé-ü:1")
    assert store.synced_writes == 2 and store.plain_writes == 0
    reopened = env.reopen()
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (4, "nödé-ü:1")
    DurableJournal(env.store).setCurrentTerm(5, None)
    reopened = env.reopen()
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (5, None)


# -- 3. truncation of matching entries (hazard 5) ----------------------------------------------------


def test_current_term_suffix_is_kept_and_readds_are_noops(env: Env) -> None:
    store = CountingStore(env.store)
    journal = DurableJournal(store)
    journal.setCurrentTerm(5, None)
    items = entries(1, 10, 5)
    fill(journal, items)
    journal.flush()
    writes = store.writes
    journal.deleteEntriesFrom(5)  # pysyncobj: __deleteEntriesFrom(prevLogIdx + 1) with prevLogIdx = 5
    for item in items[5:8]:
        journal.add(*item)
    assert len(journal) == 10
    assert visible(journal) == items
    assert store.writes == writes  # nothing rewritten
    assert journal.size_bytes == expected_size(journal)
    assert visible(env.reopen()) == items


def test_older_term_suffix_hidden_kept_on_disk_until_conflict(env: Env) -> None:
    journal = env.journal()
    journal.setCurrentTerm(4, None)
    old = entries(1, 5, 3) + entries(6, 10, 4)
    fill(journal, old)
    journal.setCurrentTerm(5, None)
    journal.flush()

    # (b) an older-term suffix disappears from pysyncobj's view but stays on disk
    journal.deleteEntriesFrom(5)
    assert len(journal) == 5
    assert visible(journal) == old[:5]
    assert journal[-1][1] == 5
    assert journal.size_bytes == expected_size(journal)
    assert disk_indexes(env.store) == list(range(1, 11))
    journal = env.reopen()
    assert visible(journal) == old  # the hidden tail is still there after a restart
    assert journal.getCurrentTerm() == 5

    # (c) an entry that really conflicts replaces the hidden tail, on disk too
    journal.deleteEntriesFrom(5)
    new6 = (cmd(6, "-new"), 6, 5)
    journal.add(*new6)
    assert visible(journal) == [*old[:5], new6]
    assert disk_indexes(env.store) == list(range(1, 7))
    journal.flush()
    reopened = env.reopen()
    assert visible(reopened) == [*old[:5], new6]
    assert reopened.size_bytes == expected_size(reopened)


def test_hidden_tail_readded_identically_is_reattached_without_rewrite(env: Env) -> None:
    journal = env.journal()
    old = entries(1, 10, 4)
    fill(journal, old)
    journal.setCurrentTerm(5, None)
    journal.flush()
    store = CountingStore(env.store)
    journal = DurableJournal(store)
    journal.deleteEntriesFrom(5)
    assert len(journal) == 5
    for item in old[5:]:
        journal.add(*item)
    assert visible(journal) == old
    assert store.writes == 0  # reattached, not rewritten
    assert journal.size_bytes == expected_size(journal)
    assert visible(env.reopen()) == old


def test_partial_reattach_then_conflict(env: Env) -> None:
    journal = env.journal()
    old = entries(1, 10, 4)
    fill(journal, old)
    journal.setCurrentTerm(5, None)
    journal.deleteEntriesFrom(5)
    journal.add(*old[5])  # 6 matches
    journal.add(*old[6])  # 7 matches
    new8 = (cmd(8, "-new"), 8, 5)
    journal.add(*new8)
    expected = [*old[:7], new8]
    assert visible(journal) == expected
    assert journal.size_bytes == expected_size(journal)
    journal.flush()
    assert visible(env.reopen()) == expected


def test_hidden_tail_is_rehidden_from_an_earlier_point(env: Env) -> None:
    journal = env.journal()
    old = entries(1, 10, 4)
    fill(journal, old)
    journal.setCurrentTerm(5, None)
    journal.deleteEntriesFrom(7)  # hides 8..10
    journal.deleteEntriesFrom(3)  # hides 4..10
    assert visible(journal) == old[:3]
    assert journal.size_bytes == expected_size(journal)
    for item in old[3:]:
        journal.add(*item)
    assert visible(journal) == old
    assert journal.size_bytes == expected_size(journal)
    assert visible(env.reopen()) == old


def test_conflicting_add_inside_retained_current_term_suffix_truncates(env: Env) -> None:
    journal = env.journal()
    journal.setCurrentTerm(5, None)
    items = entries(1, 10, 5)
    fill(journal, items)
    journal.deleteEntriesFrom(5)  # kept: written in the current term
    assert len(journal) == 10
    new7 = (cmd(7, "-new"), 7, 6)
    journal.add(*new7)
    expected = [*items[:6], new7]
    assert visible(journal) == expected
    assert disk_indexes(env.store) == list(range(1, 8))
    assert journal.size_bytes == expected_size(journal)
    journal.flush()
    assert visible(env.reopen()) == expected


def test_delete_entries_from_past_the_end_is_a_noop(env: Env) -> None:
    journal = env.journal()
    journal.setCurrentTerm(5, None)
    items = entries(1, 3, 4)
    fill(journal, items)
    journal.deleteEntriesFrom(3)
    journal.deleteEntriesFrom(10)
    assert visible(journal) == items
    journal.add(cmd(4), 4, 5)
    assert len(journal) == 4


# -- 4. torn tail (hazard 4) ---------------------------------------------------------------------------


def _written(env: Env, count: int = 10) -> list[Entry]:
    journal = env.journal()
    items = entries(1, count, 1)
    fill(journal, items)
    journal.setRaftCommitIndex(4)
    journal._destroy()
    return items


def _flip(value: bytes, pos: int) -> bytes:
    return value[:pos] + bytes([value[pos] ^ 0x40]) + value[pos + 1 :]


@pytest.mark.parametrize(
    "pos", [0, 7, 8, 11, 12, -1], ids=["term-hi", "term-lo", "crc", "crc-lo", "cmd", "cmd-end"]
)
def test_corrupt_last_entry_is_cut(env: Env, pos: int) -> None:
    items = _written(env)
    value = env.store.get(entry_key(10))
    assert value is not None
    env.put_raw(entry_key(10), _flip(value, pos))
    with structlog.testing.capture_logs() as logs:
        journal = env.reopen()
    assert visible(journal) == items[:9]
    assert env.store.get(entry_key(10)) is None
    assert disk_indexes(env.store) == list(range(1, 10))
    repaired = [e for e in logs if e["event"] == "journal_tail_repaired"]
    assert repaired and repaired[0]["from_index"] == 10 and repaired[0]["reason"] == "crc"
    assert journal.getRaftCommitIndex() == 4
    # the repaired journal carries on from there
    journal.add(cmd(10, "-again"), 10, 2)
    journal.flush()
    assert visible(env.reopen()) == [*items[:9], (cmd(10, "-again"), 10, 2)]


def _disk(env: Env) -> list[tuple[bytes, bytes]]:
    return list(env.store.scan(b"", None))


def _refused(env: Env, group: str = "7") -> JournalCorruptError:
    """Reopen expecting a refusal; the store must be left exactly as it was."""
    before = _disk(env)
    with structlog.testing.capture_logs() as logs, pytest.raises(JournalCorruptError) as info:
        env.reopen(group=group)
    assert _disk(env) == before
    assert not any(e["event"] == "journal_tail_repaired" for e in logs)
    corrupt = [e for e in logs if e["event"] == "journal_corrupt"]
    assert corrupt and corrupt[0]["group"] == group and corrupt[0]["index"] == info.value.index
    return info.value


# -- 4b. corruption in the middle: refuse, never cut acknowledged entries -----------------------------


@pytest.mark.parametrize(
    "value", [b"", b"\x00" * 11, b"short", None], ids=["empty", "header-minus-1", "short", "flipped"]
)
def test_damaged_record_in_the_middle_refuses_to_load_and_changes_nothing(
    env: Env, value: bytes | None
) -> None:
    items = _written(env)
    if value is None:
        good = env.store.get(entry_key(6))
        assert good is not None
        value = _flip(good, 12)
    env.put_raw(entry_key(6), value)
    error = _refused(env)
    assert (error.group, error.index, error.scan.reason) == ("7", 6, "crc")
    assert error.scan.entries == items[:5]
    assert (error.scan.good_after, error.scan.first_good_after, error.scan.last_index) == (4, 7, 10)
    message = str(error)
    assert "group 7" in message and "index 6" in message and "raftmq repair-journal" in message
    _refused(env)  # and again: a refusal repairs nothing behind the operator's back


def test_missing_entry_in_the_middle_refuses_and_names_the_missing_index(env: Env) -> None:
    _written(env)
    env.delete_raw(entry_key(6))
    error = _refused(env, group="meta")
    assert (error.group, error.index, error.scan.reason) == ("meta", 6, "gap")
    assert "a missing entry at index 6" in str(error)


def test_corrupt_first_entry_with_good_entries_after_it_refuses(env: Env) -> None:
    _written(env)
    value = env.store.get(entry_key(1))
    assert value is not None
    env.put_raw(entry_key(1), _flip(value, 3))
    error = _refused(env)
    assert error.index == 1 and error.scan.entries == [] and error.scan.good_after == 9


def test_malformed_key_in_the_middle_refuses(env: Env) -> None:
    _written(env)
    env.put_raw(entry_key(5) + b"x", b"junk")
    error = _refused(env)
    assert (error.index, error.scan.reason) == (5, "key")


def test_damaged_run_at_the_end_is_a_torn_tail_and_is_cut(env: Env) -> None:
    items = _written(env)
    for index in (8, 9, 10):
        value = env.store.get(entry_key(index))
        assert value is not None
        env.put_raw(entry_key(index), _flip(value, 12))
    with structlog.testing.capture_logs() as logs:
        journal = env.reopen()
    assert visible(journal) == items[:7]
    assert disk_indexes(env.store) == list(range(1, 8))
    assert any(e["event"] == "journal_tail_repaired" and e["from_index"] == 8 for e in logs)
    assert journal.size_bytes == expected_size(journal)
    assert visible(env.reopen()) == items[:7]  # repair is durable and idempotent


def test_only_record_damaged_leaves_an_empty_journal(env: Env) -> None:
    journal = env.journal()
    fill(journal, entries(1, 1, 1))
    journal._destroy()
    value = env.store.get(entry_key(1))
    assert value is not None
    env.put_raw(entry_key(1), _flip(value, 3))
    journal = env.reopen()
    assert len(journal) == 0
    assert disk_indexes(env.store) == []
    assert journal.size_bytes == 0
    assert journal.getRaftCommitIndex() == 1  # pysyncobj's initial value, for its seeded no-op


def test_truncate_journal_from_the_bad_index_lets_it_load_and_carry_on(env: Env) -> None:
    items = _written(env)
    env.delete_raw(entry_key(6))
    scan = scan_journal(env.store)
    assert scan.corrupt_middle and scan.bad_index == 6
    assert truncate_journal(env.store, 6) == 4  # 7..10
    assert scan_journal(env.store).bad_index is None
    with structlog.testing.capture_logs() as logs:
        journal = env.reopen()
    assert visible(journal) == items[:5]
    assert journal.getRaftCommitIndex() == 4
    assert not any(e["event"] in ("journal_tail_repaired", "journal_corrupt") for e in logs)
    journal.add(cmd(6, "-refetched"), 6, 2)
    journal.flush()
    assert visible(env.reopen()) == [*items[:5], (cmd(6, "-refetched"), 6, 2)]


def test_truncate_journal_removes_a_malformed_key_past_the_cut(env: Env) -> None:
    _written(env)
    env.put_raw(entry_key(5) + b"x", b"junk")
    assert truncate_journal(env.store, 5) == 7  # 5, the malformed key, 6..10
    assert disk_indexes(env.store) == [1, 2, 3, 4]


def test_commit_index_hint_is_clamped_to_a_repaired_log(env: Env) -> None:
    # pysyncobj's leader never lowers the commit index it read from the journal: one past the log
    # would let it apply entries appended there without a quorum (see test_raft_seams).
    journal = env.journal()
    fill(journal, entries(1, 10, 1))
    journal.setRaftCommitIndex(10)
    journal._destroy()
    for index in (8, 9, 10):
        value = env.store.get(entry_key(index))
        assert value is not None
        env.put_raw(entry_key(index), _flip(value, 12))
    with structlog.testing.capture_logs() as logs:
        journal = env.reopen()
    assert journal[-1][1] == 7
    assert journal.getRaftCommitIndex() == 7
    assert any(e["event"] == "journal_commit_index_clamped" for e in logs)
    journal.onOneSecondTimer()
    assert env.reopen().getRaftCommitIndex() == 7  # and the clamped value is what gets saved


def test_commit_index_inside_a_compacted_log_is_kept(env: Env) -> None:
    journal = env.journal()
    fill(journal, entries(1, 10, 1))
    journal.deleteEntriesTo(6)
    journal.setRaftCommitIndex(9)
    journal._destroy()
    with structlog.testing.capture_logs() as logs:
        journal = env.reopen()
    assert journal.getRaftCommitIndex() == 9
    assert logs == []


# -- 5. compaction ----------------------------------------------------------------------------------


def test_delete_entries_to_compacts_memory_and_disk_after_the_hook(env: Env) -> None:
    journal = env.journal()
    items = entries(1, 10, 1)
    fill(journal, items)
    events: list[tuple[str, int, list[int]]] = []
    journal.before_compaction = lambda: events.append(("hook", len(journal), disk_indexes(env.store)))
    journal.deleteEntriesTo(0)
    assert events == []  # nothing to compact: no hook
    journal.deleteEntriesTo(4)
    assert events == [("hook", 10, list(range(1, 11)))]  # hook first, nothing deleted yet
    assert visible(journal) == items[4:]
    assert journal[0][1] == 5
    assert disk_indexes(env.store) == list(range(5, 11))
    assert journal.size_bytes == expected_size(journal)
    journal.flush()
    reopened = env.reopen()
    assert visible(reopened) == items[4:]
    assert reopened.size_bytes == expected_size(reopened)
    assert events == [("hook", 10, list(range(1, 11)))]  # loading never calls the hook


def test_delete_entries_to_everything(env: Env) -> None:
    journal = env.journal()
    fill(journal, entries(1, 5, 1))
    journal.deleteEntriesTo(5)
    assert len(journal) == 0
    assert journal.size_bytes == 0
    assert disk_indexes(env.store) == []


def test_size_bytes_tracks_every_operation(env: Env) -> None:
    journal = env.journal()
    assert journal.size_bytes == 0
    journal.add(b"x" * 100, 1, 1)
    journal.add(b"y" * 50, 2, 1)
    assert journal.size_bytes == 150
    fill(journal, [(b"z" * 10, i, 1) for i in range(3, 11)])
    assert journal.size_bytes == 230
    journal.deleteEntriesTo(1)
    assert journal.size_bytes == 130
    journal.setCurrentTerm(2, None)
    journal.deleteEntriesFrom(5)  # hides 7..10 (older term)
    assert journal.size_bytes == 50 + 10 * 4
    journal.add(b"z" * 10, 7, 1)  # reattached
    assert journal.size_bytes == 50 + 10 * 5
    journal.add(b"w" * 7, 8, 2)  # conflict: 8.. replaced
    assert journal.size_bytes == 50 + 10 * 5 + 7
    assert journal.size_bytes == expected_size(journal)
    journal.clear()
    assert journal.size_bytes == 0
    assert disk_indexes(env.store) == []
    journal.add(b"v" * 3, 20, 2)
    assert journal.size_bytes == 3


# -- 6. snapshot/compaction crash window (hazard 2) -------------------------------------------------


def test_align_to_snapshot_makes_the_first_two_entries_the_snapshot_pair(env: Env) -> None:
    journal = env.journal()
    items = entries(1, 8, 1) + entries(9, 20, 2)
    fill(journal, items)
    journal.flush()
    store = CountingStore(env.store)
    journal = DurableJournal(store)
    calls: list[str] = []

    def hook() -> None:
        calls.append("hook")

    journal.before_compaction = hook
    prev, last = items[9], items[10]  # entries 10 and 11
    # a fresh tuple, as the deserializer builds it from the manifest
    journal.align_to_snapshot((bytes(prev[0]), prev[1], prev[2]), (bytes(last[0]), last[1], last[2]))
    # what pysyncobj's __loadDumpFile compares before deciding to clear the journal
    assert journal[0] == prev
    assert journal[1] == last
    assert visible(journal)[2:] == items[11:]
    assert calls == []  # align is not a compaction of new state: the hook is not called
    assert journal.before_compaction is hook  # and it is restored
    assert store.syncs == 1  # made durable before pysyncobj goes on
    assert journal.size_bytes == expected_size(journal)
    reopened = env.reopen()
    assert visible(reopened) == items[9:]


@pytest.mark.parametrize(
    ("prev", "last"),
    [
        ((cmd(30), 30, 2), (cmd(31), 31, 2)),  # beyond the journal
        ((cmd(10), 10, 2), (cmd(11), 11, 2)),  # wrong term for prev (held: 10 at term 1)
        ((cmd(10), 10, 1), (cmd(11), 11, 1)),  # wrong term for last (held: 11 at term 2)
        ((cmd(20), 20, 2), (cmd(21), 21, 2)),  # prev is the last entry: last not held
        ((cmd(1), 1, 1), (cmd(2), 2, 1)),  # already aligned
        ((cmd(0), 0, 1), (cmd(1), 1, 1)),  # before the journal
    ],
    ids=["beyond", "prev-term", "last-term", "last-missing", "aligned", "before"],
)
def test_align_to_snapshot_leaves_other_journals_alone(env: Env, prev: Entry, last: Entry) -> None:
    journal = env.journal()
    items = entries(1, 10, 1) + entries(11, 20, 2)
    fill(journal, items)
    calls: list[str] = []
    journal.before_compaction = lambda: calls.append("hook")
    journal.align_to_snapshot(prev, last)
    assert visible(journal) == items
    assert calls == []
    assert visible(env.reopen()) == items


def test_align_to_snapshot_on_short_journal(env: Env) -> None:
    journal = env.journal()
    journal.align_to_snapshot((cmd(1), 1, 1), (cmd(2), 2, 1))
    assert len(journal) == 0
    journal.add(cmd(1), 1, 1)
    journal.align_to_snapshot((cmd(1), 1, 1), (cmd(2), 2, 1))
    assert visible(journal) == [(cmd(1), 1, 1)]


# -- 7. commit index ----------------------------------------------------------------------------------


def test_commit_index_persisted_once_a_second_and_on_destroy(env: Env) -> None:
    fill(env.journal(), entries(1, 10, 1))
    store = CountingStore(env.store)
    journal = DurableJournal(store)
    assert journal.getRaftCommitIndex() == 1  # pysyncobj's initial value
    journal.setRaftCommitIndex(7)
    assert journal.getRaftCommitIndex() == 7
    assert store.writes == 0  # only a hint: not written on every change
    journal.onOneSecondTimer()
    assert store.writes == 1
    journal.onOneSecondTimer()
    assert store.writes == 1  # unchanged: not rewritten
    assert env.reopen().getRaftCommitIndex() == 7

    store = CountingStore(env.store)
    journal = DurableJournal(store)
    assert journal.getRaftCommitIndex() == 7
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    assert store.writes == 0
    journal.setRaftCommitIndex(9)
    journal._destroy()
    assert env.reopen().getRaftCommitIndex() == 9
