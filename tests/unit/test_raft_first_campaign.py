"""A group's preferred replica asks for votes at its first tick after a start (``campaign_first``),
through pre-vote: a cluster that starts gets each group's leader where the leader balancer wants it
without waiting out an election timeout and then a transfer, and a preferred replica that restarts
while its group has a leader deposes nobody. Real pysyncobj groups on localhost, election timeouts
of 6 s so that a wait for one shows plainly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_doubles import Machine, free_port, settled_leader, wait_for

from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore

SLOW_ELECTIONS = RaftSettings(
    password="x" * 16, election_min_s=6.1, election_max_s=6.2, heartbeat_s=0.05, tick_s=0.01
)


class Three:
    """Three replicas of one group; the first is its preferred replica (``campaign_first``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.stores = [MemoryStore() for _ in range(3)]
        self.replicas: list[RaftGroup | None] = [None, None, None]

    def start(self, i: int) -> RaftGroup:
        group = RaftGroup(
            name="g",
            node_id=f"n{i + 1}",
            self_addr=self.addrs[i],
            peer_addrs=[a for a in self.addrs if a != self.addrs[i]],
            journal_store=self.stores[i],
            machine=Machine(),
            snapshot_file=str(self.tmp_path / f"n{i + 1}" / "g.snapshot"),
            settings=SLOW_ELECTIONS,
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
def three(tmp_path: Path) -> Iterator[Three]:
    replicas = Three(tmp_path)
    yield replicas
    for group in replicas.running():
        group.destroy()


def test_the_preferred_replica_leads_at_once_after_a_start(three: Three) -> None:
    # Before, every replica waited out its election timeout (6.1 s here, 0.8-1.6 s by default) and
    # any of them could win: the balancer then moved the leadership, seconds after every start.
    began = time.monotonic()
    for i in range(3):
        three.start(i)
    leader = settled_leader(three.running(), timeout=SLOW_ELECTIONS.election_min_s + 2)
    took = time.monotonic() - began
    assert leader is three.replicas[0], f"{leader.node_id} leads, not the preferred replica"
    assert took < 2.0, f"a leader after {took:.1f} s: an election timeout was waited out"
    assert leader.status().term == 1


def test_a_preferred_replica_restarted_under_a_leader_deposes_nobody(three: Three) -> None:
    for i in range(3):
        three.start(i)
    settled_leader(three.running(), timeout=SLOW_ELECTIONS.election_min_s + 2)
    three.stop(0)  # the survivors see its connections close and elect one of themselves
    leader = settled_leader(three.running(), timeout=SLOW_ELECTIONS.election_min_s * 2 + 2)
    term = leader.status().term
    restarted = three.start(0)
    # It asks at its first tick connected (a pre-vote round), and the voters, hearing their
    # leader, refuse: no term moves, the leadership stays.
    wait_for(lambda: restarted.pre_vote.rounds >= 1, "the restarted replica asked", timeout=3.0)
    wait_for(lambda: restarted.leader() == leader.self_addr, "it follows the leader", timeout=3.0)
    time.sleep(1.0)
    assert leader.is_leader() and not restarted.is_leader()
    assert [g.status().term for g in three.running()] == [term] * 3
    assert restarted.status().hears_leader
