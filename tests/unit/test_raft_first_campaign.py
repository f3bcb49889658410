"""A group's preferred replica asks for votes at its first tick after a start (``campaign_first``),
through pre-vote: a cluster that starts gets each group's leader where the leader balancer wants it
without waiting out an election timeout and then a transfer, and a preferred replica that restarts
while its group has a leader deposes nobody. Real pysyncobj groups on localhost, election timeouts
of 6 s so that a wait for one shows plainly."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode
from raft_doubles import Machine, free_port, settled_leader, wait_for
from test_raft_pre_vote import RecordingTransport

from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.pre_vote import install_pre_vote
from raftmq.cluster.replication.pso import install_journal_seam, monotonic
from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore

SLOW_ELECTIONS = RaftSettings(
    password="x" * 16, election_min_s=6.1, election_max_s=6.2, heartbeat_s=0.05, tick_s=0.01
)
SHORT_ELECTIONS = dataclasses.replace(SLOW_ELECTIONS, election_min_s=2.0, election_max_s=2.1)


class Replicas:
    """The replicas of one group; the first is its preferred replica (``campaign_first``)."""

    def __init__(self, tmp_path: Path, n: int = 3, settings: RaftSettings = SLOW_ELECTIONS) -> None:
        self.tmp_path = tmp_path
        self.settings = settings
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.stores = [MemoryStore() for _ in range(n)]
        self.replicas: list[RaftGroup | None] = [None] * n

    def start(self, i: int) -> RaftGroup:
        group = RaftGroup(
            name="g",
            node_id=f"n{i + 1}",
            self_addr=self.addrs[i],
            peer_addrs=[a for a in self.addrs if a != self.addrs[i]],
            journal_store=self.stores[i],
            machine=Machine(),
            snapshot_file=str(self.tmp_path / f"n{i + 1}" / "g.snapshot"),
            settings=self.settings,
            campaign_first=i == 0,
        )
        self.replicas[i] = group
        return group

    def running(self) -> list[RaftGroup]:
        return [g for g in self.replicas if g is not None]

    def stop(self, i: int) -> None:
        group, self.replicas[i] = self.replicas[i], None
        assert group is not None
        group.destroy()


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Callable[..., Replicas]]:
    made: list[Replicas] = []

    def make(n: int = 3, settings: RaftSettings = SLOW_ELECTIONS) -> Replicas:
        made.append(Replicas(tmp_path / str(len(made)), n, settings))
        return made[-1]

    yield make
    for replicas in made:
        for group in replicas.running():
            group.destroy()


@pytest.mark.parametrize("n", [3, 5])
def test_the_preferred_replica_leads_at_once_after_a_start(groups: Callable[..., Replicas], n: int) -> None:
    # Before, every replica waited out its election timeout (6.1 s here, 0.8-1.6 s by default) and
    # any of them could win: the balancer then moved the leadership, seconds after every start.
    replicas = groups(n)
    began = time.monotonic()
    for i in range(n):
        replicas.start(i)
    leader = settled_leader(replicas.running(), timeout=SLOW_ELECTIONS.election_min_s + 2)
    took = time.monotonic() - began
    assert leader is replicas.replicas[0], f"{leader.node_id} leads, not the preferred replica"
    assert took < SLOW_ELECTIONS.election_min_s - 2, f"a leader after {took:.1f} s: a timeout was waited out"
    assert leader.status().term == 1


def test_a_replica_waiting_to_ask_when_the_preferred_one_starts_splits_no_vote(
    groups: Callable[..., Replicas],
) -> None:
    # n2 starts alone and its election deadline passes while no voter is there to ask; then the
    # preferred n1 starts (n3 stays down). Both asked at their first connection and granted each
    # other's pre-vote: both campaigned for term 1, each voted for itself, and nobody won until a
    # whole timeout later. The starting preferred replica refuses others' pre-votes until its own
    # round is over, so it wins at once.
    replicas = groups(3, SHORT_ELECTIONS)
    waiting = replicas.start(1)
    time.sleep(SHORT_ELECTIONS.election_max_s + 0.3)
    assert not waiting.is_leader()
    replicas.start(0)
    leader = settled_leader(replicas.running(), timeout=SHORT_ELECTIONS.election_max_s * 3)
    assert leader is replicas.replicas[0], f"{leader.node_id} leads, not the preferred replica"
    assert leader.status().term == 1, "a split vote (or another election) came first"


def test_a_preferred_replica_restarted_under_a_leader_deposes_nobody(groups: Callable[..., Replicas]) -> None:
    replicas = groups(3)
    for i in range(3):
        replicas.start(i)
    settled_leader(replicas.running(), timeout=SLOW_ELECTIONS.election_min_s + 2)
    replicas.stop(0)  # the survivors see its connections close and elect one of themselves
    leader = settled_leader(replicas.running(), timeout=SLOW_ELECTIONS.election_min_s * 2 + 2)
    term = leader.status().term
    for restart in range(3):
        # From the second restart on it comes back at the group's term (it heard the leader before
        # its stop): only the voters' refusal keeps it from starting an election. Its round asks
        # as soon as a majority is connected; a voter that hears a leader refuses.
        restarted = replicas.start(0)
        wait_for(lambda r=restarted: r.pre_vote.rounds >= 1, f"restart {restart}: it asked", timeout=3.0)
        wait_for(lambda r=restarted: r.leader() == leader.self_addr, "it follows the leader", timeout=3.0)
        time.sleep(0.5)
        assert leader.is_leader() and not restarted.is_leader()
        assert [g.status().term for g in replicas.running()] == [term] * 3, f"restart {restart}"
        replicas.stop(0)
        time.sleep(0.2)


def test_an_early_ask_never_judges_an_ordinary_round_its_unconnected_voters_missed() -> None:
    # Five voters; a restarted preferred replica at its group's term, one voter connected (it hears
    # the leader and refuses). Its election deadline passes first: an ordinary round reaches that
    # voter only. A majority connects next: the early ask judged that round at once, counted the
    # three voters it never reached as releases before pre-vote and campaigned against the live
    # leader at once. The ordinary round is judged a whole timeout later instead, as any replica's
    # (by when the leader's heartbeats have usually come; main's own rule after that). Timeouts of
    # 30 s: the two ticks must fall inside one.
    install_journal_seam()
    peers = [f"127.0.0.1:{port}" for port in range(2, 6)]
    conf = SyncObjConf(
        autoTick=False,
        journalFile=DurableJournal(MemoryStore()),
        raftMinTimeout=30,
        raftMaxTimeout=31,
        connectionTimeout=31,
    )
    sync = SyncObj("127.0.0.1:1", peers, conf=conf, transportClass=RecordingTransport)
    try:
        pre_vote = install_pre_vote(sync, lease_s=0.4, clock=monotonic)
        pre_vote.ask_first()
        sync._SyncObj__onNodeConnected(TCPNode(peers[0]))  # one voter of four: no majority
        sync._SyncObj__raftElectionDeadline = monotonic() - 0.01  # its own deadline comes first
        sync._onTick(0)
        assert sorted(to for to, m in sync._SyncObj__transport.sent if m["type"] == "pre_vote") == peers
        refusal = {"type": "pre_vote_response", "term": 1, "granted": False, "voter_term": 0}
        pre_vote.on_response(peers[0], refusal)
        sync._SyncObj__onNodeConnected(TCPNode(peers[1]))  # a majority (with itself) now
        sync._onTick(0)
        assert not [m for _, m in sync._SyncObj__transport.sent if m["type"] == "request_vote"]
        assert sync.raftCurrentTerm == 0 and pre_vote.campaigns_unanswered == 0
    finally:
        sync.destroy()
