"""Who raised a replica's term, and why (``cluster/replication/term_record.py``): three RaftGroups
over the real pysyncobj on localhost, the record read from ``RaftGroup.status()``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raft_doubles import fast_settings, settled_leader, start_three, wait_for

from raftmq.cluster.replication.contract import TermRise
from raftmq.cluster.replication.pso import RaftNode
from raftmq.cluster.replication.raft import RaftGroup
from raftmq.cluster.replication.term_record import (
    APPEND_ENTRIES,
    CAMPAIGN,
    NON_VOTER_VOTE_REQUEST,
    OTHER,
    PRE_VOTE_GRANTED,
    VOTE_REQUEST,
    TermRecord,
)

OWN = (PRE_VOTE_GRANTED, CAMPAIGN)


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[RaftGroup]]:
    groups: list[RaftGroup] = []
    try:
        yield start_three(tmp_path, fast_settings(), groups)
    finally:
        for group in groups:
            group.destroy()


def rows(group: RaftGroup) -> dict[tuple[str, str], TermRise]:
    return {(r.cause, r.peer): r for r in group.status().term_rises}


def since(group: RaftGroup, before: dict[tuple[str, str], TermRise]) -> dict[tuple[str, str], int]:
    """The rises counted at ``group`` after ``before`` was read, by (cause, peer)."""
    now = rows(group)
    old = {k: r.count for k, r in before.items()}
    return {k: r.count - old.get(k, 0) for k, r in now.items() if r.count > old.get(k, 0)}


def test_the_record_counts_own_campaigns_messages_and_depositions() -> None:
    record = TermRecord("me:1")
    record.look(4)
    record.raised(5, "request_vote", "peer:2", voter=True, deposed=False)
    record.look(5)  # the message's rise is counted once, not again as a campaign
    record.pre_vote_granted = lambda term: term == 6
    record.look(6)
    record.look(7)  # a transfer's campaign, say: no round won
    record.hinted = frozenset({"peer:4"})
    record.raised(8, "append_entries", "peer:4", voter=False, deposed=False)
    record.raised(9, "request_vote", "peer:3", voter=False, deposed=True)
    record.raised(10, "next_node_idx", "peer:2", voter=True, deposed=False)  # no Raft rise: "other"
    assert record.rows() == (
        TermRise(APPEND_ENTRIES, "peer:4", 1, 0),
        TermRise(CAMPAIGN, "me:1", 1, 0),
        TermRise(NON_VOTER_VOTE_REQUEST, OTHER, 1, 1),
        TermRise(OTHER, "peer:2", 1, 0),
        TermRise(PRE_VOTE_GRANTED, "me:1", 1, 0),
        TermRise(VOTE_REQUEST, "peer:2", 1, 0),
    )


def test_a_leader_deposed_by_a_peers_higher_term_names_that_peer(three: list[RaftGroup]) -> None:
    leader = settled_leader(three)
    target = next(g for g in three if g is not leader)
    before = rows(leader)
    wait_for(lambda: leader.transfer_leadership(target.self_addr) or target.is_leader(), "the transfer")
    # The target campaigns (asked by the leader: no pre-vote), its vote request deposes the leader.
    old = {k: r.deposed for k, r in before.items()}
    deposed = {k for k, r in rows(leader).items() if r.deposed > old.get(k, 0)}
    assert deposed and {peer for _, peer in deposed} == {target.self_addr}, rows(leader)
    assert set(deposed) <= {(VOTE_REQUEST, target.self_addr), (APPEND_ENTRIES, target.self_addr)}
    assert since(target, {}).get((CAMPAIGN, target.self_addr), 0) >= 1, rows(target)


def test_an_ordinary_election_counts_as_the_campaigners(three: list[RaftGroup]) -> None:
    """The leader stops; one survivor campaigns after the other granted its pre-vote. The winner
    counts its own campaign, the other survivor a rise the winner brought, and no replica names
    the stopped leader or a sender outside the voters."""
    leader = settled_leader(three)
    survivors = [g for g in three if g is not leader]
    before = {g.self_addr: rows(g) for g in survivors}
    leader.destroy()
    winner = settled_leader(survivors)
    other = next(g for g in survivors if g is not winner)
    mine = since(winner, before[winner.self_addr])
    assert {cause for cause, peer in mine if peer == winner.self_addr} & set(OWN), mine
    theirs = since(other, before[other.self_addr])
    assert {peer for _, peer in theirs} & {winner.self_addr}, theirs
    for changes in (mine, theirs):
        assert {peer for _, peer in changes} <= {winner.self_addr, other.self_addr}, changes


def _deliver(group: RaftGroup, sender: str, message: dict[str, Any]) -> None:
    """``message`` from ``sender`` through ``group``'s transport, as a connection delivers it (on
    the tick thread)."""
    transport = group._sync._SyncObj__transport
    group._on_tick_thread(lambda: transport._onMessageReceived(RaftNode(sender), message))


def test_a_sender_neither_voter_nor_hinted_counts_as_other(three: list[RaftGroup]) -> None:
    """A vote request from outside the voters passes the transport only when the candidate's log is
    ahead (a voter added in entries this replica lacks): it raises the term. Its sender is named
    when the placement hints it, and counted under "other" when not."""
    leader = settled_leader(three)
    follower = next(g for g in three if g is not leader)
    ahead = {"type": "request_vote", "last_log_index": 10**6, "last_log_term": 10**6}
    stranger, hinted = "127.0.0.1:1", "127.0.0.1:2"
    _deliver(leader, stranger, {**ahead, "term": leader.status().term + 5})
    row = wait_for(lambda: rows(leader).get((NON_VOTER_VOTE_REQUEST, OTHER)), "the stranger's rise")
    assert row == TermRise(NON_VOTER_VOTE_REQUEST, OTHER, 1, 1)  # it deposed the leader
    assert stranger not in {peer for _, peer in rows(leader)}
    follower.hint_peers([hinted])
    _deliver(follower, hinted, {**ahead, "term": follower.status().term + 50})
    wait_for(lambda: rows(follower).get((NON_VOTER_VOTE_REQUEST, hinted)), "the hinted peer's rise")
    assert (NON_VOTER_VOTE_REQUEST, OTHER) not in rows(follower)
