"""The boundaries of a leader's deferred journal compaction (``pso.followers_behind_compaction``,
``pso.defer_compaction``) on pysyncobj's real ``SyncObj``, socket-free (``FakeTransport``: no
connection, every message recorded) and ticked by hand.

A follower counts as behind exactly when a compaction now would send it a snapshot instead of the
entries it lacks: each boundary test compacts for real and looks at what the leader sends it next.
A deferral is counted and logged once when it starts and once when it ends, with why
(``compaction_deferral.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.syncobj import _COMMAND_TYPE
from structlog.testing import capture_logs
from test_raft_seams import PEERS, SELF, FakeTransport

from raftmq.cluster.replication.compaction_deferral import CAUGHT_UP, NOT_LEADING, OVER_CAP
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.pso import (
    compaction_due,
    defer_compaction,
    followers_behind_compaction,
    install_journal_seam,
)
from raftmq.storage.memory import MemoryStore

ENTRIES = 10  # no-op entries after the leader's own, each of ENTRY_BYTES
ENTRY_BYTES = 100


@dataclass
class Leader:
    sync: SyncObj
    transport: FakeTransport
    journal: DurableJournal
    followers: list[Any]  # pysyncobj's nodes, sorted by address

    @property
    def cut(self) -> int:
        """Where a compaction now cuts the journal: the entry before the last applied one."""
        return int(self.sync._SyncObj__raftLastApplied) - 1

    def first_index(self) -> int:
        return int(self.sync._SyncObj__raftLog[0][1])

    def last_index(self) -> int:
        return int(self.sync._SyncObj__raftLog[-1][1])

    def ack(self, follower: Any, next_index: int, *, reset: bool = False) -> None:
        """``follower`` answers: it holds every entry before ``next_index`` (``reset``: the leader
        is to send from ``next_index`` on, as after a rejected append)."""
        message = {"type": "next_node_idx", "next_node_idx": next_index, "reset": reset, "success": not reset}
        self.transport._onMessageReceived(follower, message)

    def sent_from(self, next_index: int, follower: Any) -> None:
        """The leader has sent ``follower`` every entry before ``next_index`` and nothing after."""
        self.ack(follower, next_index, reset=True)

    def compact(self) -> None:
        """Ask for a compaction (as the journal's size does) and tick twice: the first serializes
        the snapshot, the second deletes the entries before the cut."""
        self.sync.forceLogCompaction()
        self.sync.doTick(0)
        self.sync.doTick(0)

    def step_down(self) -> None:
        """A peer leads a later term: this leader follows it, its followers' next indexes still set."""
        heartbeat = {
            "type": "append_entries",
            "term": self.sync.raftCurrentTerm + 1,
            "commit_index": self.sync.raftCommitIndex,
            "entries": [],
            "prevLogIdx": self.last_index(),
            "prevLogTerm": self.sync._SyncObj__raftLog[-1][2],
        }
        self.transport._onMessageReceived(self.followers[1], heartbeat)
        assert not self.sync._isLeader()

    def snapshot_sent_to(self, follower: Any) -> bool:
        """Sends every follower what it lacks now; whether ``follower`` got a snapshot (else entries)."""
        self.transport.sent.clear()
        self.sync._SyncObj__sendAppendEntries()
        sent = [m for node, m in self.transport.sent if node is follower and m["type"] == "append_entries"]
        assert sent, f"nothing sent to {follower}"
        return "serialized" in sent[0]


@pytest.fixture
def make_leader(tmp_path: Path) -> Iterator[Callable[[], Leader]]:
    made: list[SyncObj] = []

    def make() -> Leader:
        install_journal_seam()
        journal = DurableJournal(MemoryStore(), fsync=False, group="g")
        path = tmp_path / f"snapshot-{len(made)}"

        def serialize(file: str, data: Any) -> None:  # a manifest, written at once: no fork
            Path(file).write_bytes(b"manifest")

        conf = SyncObjConf(
            autoTick=False,
            journalFile=journal,
            fullDumpFile=str(path),
            serializer=serialize,
            deserializer=lambda file: None,
            # Nothing is sent, and no election or compaction starts, unless the test asks for it.
            appendEntriesPeriod=1000,
            raftMinTimeout=4000,
            raftMaxTimeout=5000,
            leaderFallbackTimeout=6000,
            connectionTimeout=6000,
            logCompactionMinEntries=10**9,
            logCompactionMinTime=10**9,
        )
        sync = SyncObj(SELF, PEERS, conf=conf, transportClass=FakeTransport)
        made.append(sync)
        transport = sync._SyncObj__transport
        followers = sorted(sync._SyncObj__otherNodes, key=lambda n: n.id)
        for node in followers:
            transport._onNodeConnected(node)
        sync._SyncObj__raftElectionDeadline = 0  # campaign at the next tick
        sync.doTick(0)
        transport._onMessageReceived(followers[0], {"type": "response_vote", "term": sync.raftCurrentTerm})
        assert sync._isLeader()
        for _ in range(ENTRIES):
            sync._applyCommand(b"x" * ENTRY_BYTES, None, _COMMAND_TYPE.NO_OP)
        sync.doTick(0)
        leader = Leader(sync, transport, journal, followers)
        for node in followers:
            leader.ack(node, leader.last_index() + 1)
        sync.doTick(0)  # commits and applies every entry
        assert sync._SyncObj__raftLastApplied == leader.last_index() == ENTRIES + 2
        return leader

    yield make
    for sync in made:
        sync.destroy()


@pytest.mark.parametrize(("from_cut", "behind"), [(-1, True), (0, True), (1, False), (2, False)])
def test_a_follower_is_behind_exactly_when_a_compaction_now_sends_it_a_snapshot(
    make_leader: Callable[[], Leader], from_cut: int, behind: bool
) -> None:
    # from_cut 1: the follower was sent the cut entry itself and lacks only the entries after it;
    # 2: it was sent everything.
    leader = make_leader()
    follower, other = leader.followers
    leader.sent_from(leader.cut + from_cut, follower)
    assert followers_behind_compaction(leader.sync) == int(behind)

    cut = leader.cut
    leader.compact()
    assert leader.first_index() == cut  # the compaction ran: the journal starts at the cut
    assert leader.snapshot_sent_to(follower) is behind
    assert leader.snapshot_sent_to(other) is False


def test_every_connected_follower_behind_is_counted_and_a_disconnected_one_is_not(
    make_leader: Callable[[], Leader],
) -> None:
    leader = make_leader()
    for node in leader.followers:
        leader.sent_from(1, node)
    assert followers_behind_compaction(leader.sync) == 2
    leader.transport._onNodeDisconnected(leader.followers[0])
    assert followers_behind_compaction(leader.sync) == 1
    leader.transport._onNodeDisconnected(leader.followers[1])
    assert followers_behind_compaction(leader.sync) == 0


def test_a_replica_that_stepped_down_counts_no_follower_behind(make_leader: Callable[[], Leader]) -> None:
    leader = make_leader()
    leader.sent_from(1, leader.followers[0])
    assert followers_behind_compaction(leader.sync) == 1
    leader.step_down()
    assert followers_behind_compaction(leader.sync) == 0


@pytest.mark.parametrize(("over_cap_bytes", "compacted"), [(0, False), (1, True)])
def test_a_due_compaction_waits_for_a_follower_behind_until_the_journal_is_past_the_cap(
    make_leader: Callable[[], Leader], over_cap_bytes: int, compacted: bool
) -> None:
    leader = make_leader()
    defer_compaction(leader.sync, leader.journal.size_bytes - over_cap_bytes)
    leader.sent_from(leader.cut, leader.followers[0])
    first, cut = leader.first_index(), leader.cut
    leader.compact()
    assert leader.first_index() == (cut if compacted else first)


def test_a_deferred_compaction_runs_once_the_follower_was_sent_the_entries_up_to_the_cut(
    make_leader: Callable[[], Leader],
) -> None:
    leader = make_leader()
    defer_compaction(leader.sync, 10 * leader.journal.size_bytes)
    follower = leader.followers[0]
    leader.sent_from(leader.cut, follower)
    first, cut = leader.first_index(), leader.cut
    leader.compact()
    assert leader.first_index() == first  # deferred
    leader.sent_from(cut + 1, follower)
    leader.sync.doTick(0)  # the compaction asked for before is still due: no new request
    leader.sync.doTick(0)
    assert leader.first_index() == cut
    assert leader.snapshot_sent_to(follower) is False


def test_a_compaction_with_no_follower_behind_is_not_deferred(make_leader: Callable[[], Leader]) -> None:
    leader = make_leader()
    defer_compaction(leader.sync, 10 * leader.journal.size_bytes)
    cut = leader.cut
    leader.compact()
    assert leader.first_index() == cut


def _events(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == event]


def test_a_compaction_is_due_exactly_when_pysyncobj_would_start_one(
    make_leader: Callable[[], Leader],
) -> None:
    leader = make_leader()
    assert not compaction_due(leader.sync)  # the fixture's triggers are out of reach
    leader.sync.forceLogCompaction()
    assert compaction_due(leader.sync)
    leader.sync.doTick(0)  # serializes: pysyncobj clears its flag
    assert not compaction_due(leader.sync)
    leader.sync._SyncObj__conf.logCompactionMinEntries = len(leader.journal) - 1
    assert compaction_due(leader.sync)


def test_a_deferral_is_counted_and_logged_once_however_many_ticks_it_holds(
    make_leader: Callable[[], Leader],
) -> None:
    leader = make_leader()
    cap = 10 * leader.journal.size_bytes
    deferrals = defer_compaction(leader.sync, cap, "g")
    follower = leader.followers[0]
    leader.sent_from(leader.cut, follower)
    cut = leader.cut
    with capture_logs() as logs:
        leader.compact()
        for _ in range(5):
            leader.sync.doTick(0)
        assert deferrals.deferrals == 1
        [started] = _events(logs, "journal_compaction_deferred")
        assert started == {
            "event": "journal_compaction_deferred",
            "log_level": "info",
            "group": "g",
            "journal_bytes": leader.journal.size_bytes,
            "cap_bytes": cap,
            "followers_behind": 1,
        }
        assert _events(logs, "journal_compaction_resumed") == []
        leader.sent_from(cut + 1, follower)
        for _ in range(3):
            leader.sync.doTick(0)
    [ended] = _events(logs, "journal_compaction_resumed")
    assert ended["reason"] == CAUGHT_UP and ended["group"] == "g" and ended["duration_s"] >= 0
    assert leader.first_index() == cut  # the compaction ran
    assert deferrals.deferrals == 1 and not deferrals.deferring


def test_a_deferral_ends_when_the_journal_passes_the_cap(make_leader: Callable[[], Leader]) -> None:
    leader = make_leader()
    deferrals = defer_compaction(leader.sync, leader.journal.size_bytes, "g")
    leader.sent_from(leader.cut, leader.followers[0])
    with capture_logs() as logs:
        leader.compact()
        assert deferrals.deferring
        # The journal grows past the cap (an entry written as pysyncobj's append does), then a tick.
        leader.journal.add(b"x" * ENTRY_BYTES, leader.last_index() + 1, leader.sync.raftCurrentTerm)
        leader.sync._SyncObj__tryLogCompaction()
    [ended] = _events(logs, "journal_compaction_resumed")
    assert ended["reason"] == OVER_CAP and not deferrals.deferring


def test_a_deferral_ends_when_the_leader_steps_down(make_leader: Callable[[], Leader]) -> None:
    leader = make_leader()
    deferrals = defer_compaction(leader.sync, 10 * leader.journal.size_bytes, "g")
    leader.sent_from(leader.cut, leader.followers[0])
    with capture_logs() as logs:
        leader.compact()
        assert deferrals.deferring
        leader.step_down()
        leader.sync.doTick(0)
    [ended] = _events(logs, "journal_compaction_resumed")
    assert ended["reason"] == NOT_LEADING and deferrals.deferrals == 1
