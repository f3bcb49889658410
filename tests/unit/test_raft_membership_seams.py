"""Pins of the pysyncobj 0.3.17 membership behaviour ``cluster/replication/raft.py`` relies on (no sockets),
and the adapter's membership seams driven through a real, socket-free ``SyncObj``.

Each pin names what raftmq does because of the pinned behaviour; if pysyncobj changes it, the test
fails and the adapter must be revisited (docs/architecture.md, "Placement and cluster changes").
"""

from __future__ import annotations

import gzip
import inspect
import queue
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso
import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport, Transport

from raftmq.cluster.replication.held_answers import HeldAnswers
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.pso import FlushingTransport, RaftNode, install_journal_seam
from raftmq.cluster.replication.raft import (
    Outcome,
    RaftGroup,
    RaftSettings,
    members_after,
    membership_change,
)
from raftmq.cluster.replication.voter_changes import VoterChanges
from raftmq.storage.memory import MemoryStore

SELF = "127.0.0.1:1"
PEERS = ["127.0.0.1:2", "127.0.0.1:3"]
NEWCOMER = "127.0.0.1:4"


def _src(func: Any) -> str:
    """The source of ``func`` with every run of whitespace made one space."""
    return " ".join(textwrap.dedent(inspect.getsource(func)).split())


def _entry(action: str, addr: str, index: int) -> tuple[bytes, int, int]:
    """A membership entry as pysyncobj writes it (``addNodeToCluster``/``removeNodeFromCluster``)."""
    return bytes([pso._COMMAND_TYPE.MEMBERSHIP]) + pso_pickle.dumps([action, addr, TCPNode(addr)]), index, 1


def test_membership_entries_are_a_type_byte_and_a_pickled_request() -> None:
    assert pso._COMMAND_TYPE.MEMBERSHIP == 2
    assert "pickle.dumps(['add', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP" in _src(
        SyncObj.addNodeToCluster
    )
    assert "pickle.dumps(['rem', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP" in _src(
        SyncObj.removeNodeFromCluster
    )
    assert membership_change(_entry("add", "h:1", 5)[0]) == ("add", "h:1")
    assert membership_change(_entry("rem", "h:2", 6)[0]) == ("rem", "h:2")
    assert membership_change(b"\x00" + pso_pickle.dumps((0, (b"x",)))) is None  # a regular entry
    assert membership_change(b"\x01") is None  # the leader's no-op


def test_voters_are_the_base_plus_the_changes_in_log_order() -> None:
    log = [_entry("add", "d:1", 10), _entry("rem", "a:1", 12), _entry("add", "a:1", 15)]
    base = ["a:1", "b:1", "c:1"]
    assert members_after(base, log, 0) == ["a:1", "b:1", "c:1", "d:1"]
    assert members_after(base, log, 0, upto_index=12) == ["b:1", "c:1", "d:1"]
    assert members_after(base, log, 10) == ["a:1", "b:1", "c:1"]  # the add at 10 is in the base


def test_the_guard_against_a_second_change_in_flight_is_dead_code() -> None:
    # Why RaftGroup.change_membership refuses while a membership entry is uncommitted.
    source = inspect.getsource(pso)
    assigned = re.findall(r"self\.__changeClusterIDx = (.+)", source)
    assert assigned and set(assigned) == {"None"}
    # What pysyncobj does check: the leader's no-op entry is applied (the thesis' bug fix).
    assert "if self.__raftLastApplied < self.__noopIDx:" in _src(SyncObj._SyncObj__changeCluster)


def test_changes_take_effect_when_appended_and_a_leader_cannot_remove_itself() -> None:
    check = _src(SyncObj._checkCommandsToApply)
    assert "self.__changeCluster(changeClusterRequest)" in check  # before the entry is appended
    do = _src(SyncObj._SyncObj__doChangeCluster)
    assert "if oldNode == self.__selfNode: return False" in do


def test_snapshots_carry_the_live_voters_and_loading_filters_self_only_as_a_node() -> None:
    # The serializer gets the live set (perhaps with an uncommitted change): the manifest records
    # the voters as of its last entry instead.
    assert "cluster = self.__otherNodes | {self.__selfNode}" in _src(SyncObj._SyncObj__tryLogCompaction)
    load = _src(SyncObj._SyncObj__loadDumpFile)
    assert "self.__updateClusterConfiguration([node for node in data[3] if node != self.__selfNode])" in load
    # A plain address never equals pysyncobj's own TCPNode, so the deserializer leaves itself out;
    # raftmq's RaftNode equals its address (a str), and that load then drops it too: same result.
    assert TCPNode("h:1") != "h:1"
    assert "h:1" != TCPNode("h:1")  # noqa: SIM300 (the comparison pysyncobj makes, reflected)
    assert [n for n in ["h:1", "h:2"] if n != RaftNode("h:1")] == ["h:2"]


def test_the_transport_hangs_up_on_unknown_addresses_and_hints_are_transport_nodes() -> None:
    incoming = _src(TCPTransport._onIncomingMessageReceived)
    assert "if node is None and message != 'readonly': conn.disconnect()" in incoming
    assert "self._nodes.add(node)" in _src(TCPTransport.addNode)
    assert "self._nodeAddrToNode[node.address] = node" in _src(TCPTransport.addNode)
    assert "self.__transport = transportClass(self, self.__selfNode, self.__otherNodes)" in _src(
        SyncObj.__init__
    )
    assert FlushingTransport.addNode is not TCPTransport.addNode  # idempotent for a hinted peer
    for method in (
        TCPTransport.addNode,
        TCPTransport._onIncomingMessageReceived,
        TCPTransport._onOutgoingMessageReceived,
    ):
        # Every connection hands its messages to the transport's _onMessageReceived, looked up on
        # the instance: FlushingTransport's override sees every message before pysyncobj does.
        assert "functools.partial(self._onMessageReceived, node)" in _src(method)


def test_pysyncobj_adopts_the_term_of_a_vote_request_from_any_connected_node() -> None:
    # Why FlushingTransport drops votes from non-voters: the handler never checks the sender.
    handler = _src(SyncObj._SyncObj__onMessageReceived)
    vote = handler[handler.index("if message['type'] == 'request_vote'") :]
    vote = vote[: vote.index("if message['type'] == 'append_entries'")]
    assert "if message['term'] > self.__raftCurrentTerm: self.__setCurrentTerm(message['term'], None)" in vote
    assert "self.__setState(_RAFT_STATE.FOLLOWER)" in vote
    assert "otherNodes" not in vote


# -- a socket-free leader wrapped in a RaftGroup -----------------------------------------------------


class RecordingTransport(Transport):  # type: ignore[misc]
    """Never connects; records what pysyncobj sends."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append((str(node.id), message))
        return True


class Replica:
    """A real pysyncobj ``SyncObj`` (no ticks of its own, no sockets) inside the parts of a
    ``RaftGroup`` that membership changes use; the test plays the peers by calling pysyncobj's
    message handler, and delivers what peers send through ``FlushingTransport``'s filter."""

    def __init__(self) -> None:
        install_journal_seam()
        self.journal = DurableJournal(MemoryStore())
        group = RaftGroup.__new__(RaftGroup)
        group.name, group.node_id, group.self_addr = "g", "n1", SELF
        group.became_leader_count = 0
        group.votes_ignored = 0
        group._vote_log_at = 0.0
        group._journal = self.journal
        group._tick_calls = queue.SimpleQueue()
        group._voter_changes = VoterChanges("g", SELF, self.journal)
        self.group = group
        self.sync = SyncObj(
            SELF,
            PEERS,
            conf=SyncObjConf(
                autoTick=False,
                journalFile=self.journal,
                dynamicMembershipChange=True,
                onStateChanged=group._on_state_changed,
            ),
            transportClass=RecordingTransport,
        )
        self.sync.raftmq_group = group  # what FlushingTransport reports dropped votes to
        group._sync = self.sync
        group._held = HeldAnswers(self.sync, RaftSettings(password="x" * 16))
        # The filter under test, in front of pysyncobj's handler as TCPTransport would put it.
        self.inbound = FlushingTransport.__new__(FlushingTransport)
        Transport.__init__(self.inbound, self.sync, None, [])
        self.inbound._syncObj = self.sync
        self.inbound.setOnMessageReceivedCallback(self.sync._SyncObj__onMessageReceived)

    def receive(self, sender: str, message: dict[str, Any]) -> None:
        self.inbound._onMessageReceived(TCPNode(sender), message)

    def last_index(self) -> int:
        return int(self.journal[-1][1])

    def elect(self, term: int, commit: bool = True) -> None:
        """Win an election at ``term``; ``commit``: get the leader's no-op committed and applied."""
        self.sync._SyncObj__setCurrentTerm(term, SELF)
        self.sync._SyncObj__onBecomeLeader()
        if commit:
            self.ack_all()
            assert self.sync._isLeader() and self.sync.raftLastApplied == self.last_index()

    def ack_all(self) -> None:
        """Every voter acknowledges the whole log; a tick commits and applies it."""
        for peer in sorted(self.members() - {SELF}):
            self.receive(
                peer,
                {
                    "type": "next_node_idx",
                    "next_node_idx": self.last_index() + 1,
                    "success": True,
                    "reset": False,
                },
            )
        self.tick()

    def tick(self) -> None:
        """A pysyncobj tick, then the RaftGroup calls queued for the tick thread."""
        self.sync.doTick(0)
        while True:
            try:
                call = self.group._tick_calls.get_nowait()
            except queue.Empty:
                break
            call()
        self.sync.doTick(0)  # proposals queued by those calls are appended

    def change(self, action: str, addr: str) -> list[Outcome]:
        outcomes: list[Outcome] = []
        self.group.change_membership(action, addr, outcomes.append)
        self.tick()
        return outcomes

    def members(self) -> set[str]:
        return {str(n.id) for n in self.sync.otherNodes} | {SELF}


@pytest.fixture
def replica() -> Iterator[Replica]:
    r = Replica()
    yield r
    r.sync.destroy()


def _snapshot(last: tuple[bytes, int, int], prev: tuple[bytes, int, int], cluster: list[str]) -> bytes:
    """A snapshot as pysyncobj's in-memory serializer sends it (no file: gzip of a pickle)."""
    return gzip.compress(pso_pickle.dumps((None, last, prev, [TCPNode(a) for a in cluster])))


def test_a_voter_change_cut_off_by_a_lost_leadership_and_a_snapshot_does_not_block_the_next(
    replica: Replica,
) -> None:
    """The leader proposes a change and is deposed before it commits; the new leader sends a
    snapshot past the change's index, so pysyncobj never calls the change back. Elected again, the
    replica must accept the next change (it refused every change for ever before)."""
    r = replica
    r.elect(term=2)
    first = r.change("add", NEWCOMER)
    index = r.last_index()
    assert membership_change(r.journal[-1][0]) == ("add", NEWCOMER) and first == []  # in flight
    # PEERS[0] won term 3 without the entry and tells this replica so.
    r.receive(
        PEERS[0],
        {
            "type": "append_entries",
            "term": 3,
            "commit_index": index - 1,
            "prevLogIdx": index - 1,
            "prevLogTerm": 2,
            "entries": [],
        },
    )
    assert not r.sync._isLeader()
    assert first == [Outcome(error="unknown_outcome", definite=False)]  # answered at once
    noop = bytes([pso._COMMAND_TYPE.NO_OP])
    snapshot = _snapshot((noop, index + 5, 3), (noop, index + 4, 3), [SELF, *PEERS])
    r.receive(
        PEERS[0],
        {
            "type": "append_entries",
            "term": 3,
            "commit_index": index + 5,
            "serialized": (snapshot, True, True),
        },
    )
    assert r.sync.raftLastApplied == index + 5 and r.last_index() == index + 5  # the log gave way
    r.elect(term=4)
    second = r.change("add", NEWCOMER)
    assert second == [] and membership_change(r.journal[-1][0]) == ("add", NEWCOMER)  # proposed
    r.ack_all()
    assert second == [Outcome(result={"changed": True, "members": sorted([SELF, *PEERS, NEWCOMER])})]
    assert first == [Outcome(error="unknown_outcome", definite=False)]  # answered once


def test_a_deposed_leaders_change_is_answered_once_even_when_it_commits_later(replica: Replica) -> None:
    """Deposed and elected again, the replica commits its old entry in the new term: pysyncobj then
    calls the old change back, which must not answer it a second time nor end the next change."""
    r = replica
    r.elect(term=2)
    first = r.change("add", NEWCOMER)
    index = r.last_index()
    r.receive(
        PEERS[0], {"type": "request_vote", "term": 3, "last_log_index": index, "last_log_term": 2}
    )  # a voter's campaign: it deposes the leader (votes from voters still count)
    assert not r.sync._isLeader() and r.sync.raftCurrentTerm == 3
    assert first == [Outcome(error="unknown_outcome", definite=False)]
    r.elect(term=4, commit=False)
    refused = r.change("remove", PEERS[1])  # the old entry is still uncommitted in the log
    assert refused == [Outcome(error="unavailable")]
    r.ack_all()  # commits the old entry: pysyncobj calls the old change back now
    assert first == [Outcome(error="unknown_outcome", definite=False)]
    assert r.members() == {SELF, *PEERS, NEWCOMER}
    second = r.change("remove", PEERS[1])
    r.ack_all()
    assert second == [Outcome(result={"changed": True, "members": sorted([SELF, PEERS[0], NEWCOMER])})]


def test_votes_from_non_voters_are_dropped_and_a_voter_added_later_is_heard(replica: Replica) -> None:
    """A removed voter (or any node the transport connects, hinted peers included) campaigning with
    a higher term cannot depose the leader; once a node is added, its campaign counts."""
    r = replica
    r.elect(term=2)
    # A removed voter's log ends where its removal began: never ahead of the leader's.
    removed = {"type": "request_vote", "term": 9, "last_log_index": r.last_index(), "last_log_term": 2}
    r.receive(NEWCOMER, removed)
    assert r.sync._isLeader() and r.sync.raftCurrentTerm == 2
    assert r.group.votes_ignored == 1
    campaign = {"type": "request_vote", "term": 9, "last_log_index": 99, "last_log_term": 8}
    assert r.change("add", NEWCOMER) == []
    r.ack_all()  # committed: NEWCOMER is a voter now
    r.receive(NEWCOMER, campaign)
    assert not r.sync._isLeader() and r.sync.raftCurrentTerm == 9
    assert (NEWCOMER, {"type": "response_vote", "term": 9}) in r.sync._SyncObj__transport.sent
    assert r.group.votes_ignored == 1


def test_a_replica_that_missed_a_voter_change_votes_for_the_voter_added_since(replica: Replica) -> None:
    """Issue 19 (liveness): a follower that was down while NEWCOMER was added does not know it as a
    voter; when the leader is gone, NEWCOMER's campaign (its log holds the entry adding it, so it
    is ahead of this follower's) must get this follower's vote, or no majority may be left."""
    r = replica
    assert NEWCOMER not in r.members()
    ahead = {"type": "request_vote", "term": 3, "last_log_index": r.last_index() + 1, "last_log_term": 1}
    r.receive(NEWCOMER, ahead)
    assert (NEWCOMER, {"type": "response_vote", "term": 3}) in r.sync._SyncObj__transport.sent
    assert r.sync.raftCurrentTerm == 3 and r.group.votes_ignored == 0
    # A candidate whose log is not ahead (a removed voter) is still not heard.
    last_term = r.journal[-1][2]
    behind = {"type": "request_vote", "term": 7, "last_log_index": r.last_index(), "last_log_term": last_term}
    r.receive("127.0.0.1:5", behind)
    assert r.sync.raftCurrentTerm == 3 and r.group.votes_ignored == 1


def test_a_candidate_counts_votes_from_voters_only(replica: Replica) -> None:
    r = replica
    r.sync._SyncObj__onNodeConnected(TCPNode(PEERS[0]))  # pysyncobj campaigns only when connected
    r.sync._SyncObj__raftElectionDeadline = 0
    r.sync.doTick(0)
    term = r.sync.raftCurrentTerm
    assert r.sync._SyncObj__raftState == pso._RAFT_STATE.CANDIDATE
    for outsider in (NEWCOMER, "127.0.0.1:5"):  # two votes would be a majority of three
        r.receive(outsider, {"type": "response_vote", "term": term})
    assert not r.sync._isLeader() and r.group.votes_ignored == 2
    r.receive(PEERS[1], {"type": "response_vote", "term": term})
    assert r.sync._isLeader()
