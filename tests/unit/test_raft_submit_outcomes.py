"""Every submit gets its outcome (``RaftGroup.submit``), on three RaftGroups over the real
pysyncobj on localhost, also when the leader it went to loses its leadership before the entry
committed: pysyncobj answers a command only when its replica applies the entry's index, which may
be never (an idle group, a group without a quorum)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_doubles import fast_settings, start_three, submit_all, wait_for

from raftmq.cluster.replication.raft import Outcome, RaftGroup


@pytest.fixture
def groups() -> Iterator[list[RaftGroup]]:
    made: list[RaftGroup] = []
    yield made
    for g in made:
        g.destroy()


def test_a_leader_that_steps_down_answers_what_it_could_not_commit_as_unknown(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """Both followers stop; the leader takes three submits it cannot commit, then steps down
    (leader_fallback_s without a majority) and answers them ``unknown_outcome``, not definite (the
    entries could yet commit under another leader that holds them). Before, they waited for
    their index to be applied here: with no quorum, for ever (as after an election in an idle
    group; a burst of submits followed by an election lost its outcomes in 1 run of 6)."""
    settings = dataclasses.replace(fast_settings(), leader_fallback_s=1.5)
    start_three(tmp_path, settings, groups)
    leader = next(g for g in groups if g.is_leader())
    for g in groups:
        if g is not leader:
            g.destroy()
    # Submitted while it still leads (1.5 s of fallback), so the entries are in its log, not in
    # pysyncobj's queue of commands waiting for a leader.
    assert leader.is_leader()
    outcomes = submit_all(leader, [b"a", b"b", b"c"], timeout=10)
    assert [(o.error, o.definite) for o in outcomes] == [("unknown_outcome", False)] * 3
    assert not leader.is_leader()
    assert not leader._sync._SyncObj__commandsWaitingCommit  # nothing left for a late callback


def test_a_leader_that_loses_its_leadership_answers_an_entry_the_next_leader_settles(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """The leader appends an entry and, in the same tick, steps down as a leadership transfer or a
    fallback makes it (its peers still up): the next leader (it again, or a peer) settles the
    entry within an election, and the submit is answered with what became of it: applied (its
    result), or overwritten (``not_leader``, definite). Before, it was answered ``unknown_outcome``
    at once; a ``receive`` that then committed leased its messages to nobody for a visibility
    timeout (a push stream stalled 30 s across a transfer of its coordinator's group)."""
    start_three(tmp_path, fast_settings(), groups)
    leader = next(g for g in groups if g.is_leader())
    outcomes: list[Outcome] = []
    done = threading.Event()

    def answered(outcome: Outcome) -> None:
        outcomes.append(outcome)
        done.set()

    def submit_and_step_down() -> None:  # tick thread: nothing commits in between
        leader.submit(b"x", answered)
        leader._sync._checkCommandsToApply()  # appended to its log and sent to the followers
        leader._sync._SyncObj__setState(0)  # a follower (as pysyncobj's leader fallback does it)
        leader._sync._SyncObj__raftLeader = None

    leader._on_tick_thread(submit_and_step_down)
    assert done.wait(10), "no outcome"
    wait_for(lambda: any(g.is_leader() for g in groups), "a new leader")
    (outcome,) = outcomes
    assert outcome.error != "unknown_outcome", outcome
    applied = [b"x" in g._machine.commands() for g in groups]  # type: ignore[attr-defined]
    if outcome.error is None:
        assert outcome.result is not None and "index" in outcome.result, outcome
        wait_for(lambda: all(b"x" in g._machine.commands() for g in groups), "x applied everywhere")  # type: ignore[attr-defined]
    else:
        assert (outcome.error, outcome.definite) == ("not_leader", True), outcome
        assert not any(applied), applied


def test_a_replica_stopped_while_it_holds_answers_gives_them_at_once(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """A leader that lost its leadership holds its uncommitted submits' answers for two election
    timeouts; a replica stopped meanwhile (the group moved off the node, the node stopping) has
    no tick thread left to answer them: they are answered ``unknown_outcome`` by the stop, not
    left to their callers' timeouts (before, they were never answered)."""
    settings = dataclasses.replace(fast_settings(), leader_fallback_s=1.0, election_max_s=3.0)
    start_three(tmp_path, settings, groups)
    leader = next(g for g in groups if g.is_leader())
    for g in groups:
        if g is not leader:
            g.destroy()
    outcomes: list[Outcome] = []
    for command in (b"a", b"b"):
        leader.submit(command, outcomes.append)
    wait_for(lambda: not leader.is_leader(), "the leader's fallback", timeout=10)
    assert not outcomes  # held: the grace is 6 s
    leader.destroy()
    wait_for(lambda: len(outcomes) == 2, "both answered by the stop", timeout=2)
    assert [(o.error, o.definite) for o in outcomes] == [("unknown_outcome", False)] * 2
