"""Every submit gets its outcome (``RaftGroup.submit``), on three RaftGroups over the real
pysyncobj on localhost, also when the leader it went to loses its leadership before the entry
committed: pysyncobj answers a command only when its replica applies the entry's index, which may
be never (an idle group, a group without a quorum)."""

from __future__ import annotations

import dataclasses
import threading
import time
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


def _cut_off_leader(tmp_path: Path, groups: list[RaftGroup], cut_s: float) -> tuple[RaftGroup, float]:
    """Three replicas, the first leading (its followers never campaign), whose followers then
    neither read nor answer for ``cut_s`` (their tick threads held: a partition): the leader and
    its grace (two of its election timeouts, 0.6 s)."""
    fast = dataclasses.replace(fast_settings(), leader_fallback_s=30.0)
    slow = dataclasses.replace(fast_settings(), election_min_s=20.0, election_max_s=30.0)
    start_three(tmp_path, [fast, slow, slow], groups)
    leader = groups[0]
    assert leader.is_leader()
    cut_off = threading.Barrier(3)
    for follower in groups[1:]:
        follower._on_tick_thread(lambda: (cut_off.wait(5), time.sleep(cut_s)))
    cut_off.wait(5)
    return leader, 2 * fast.election_max_s


def _lose(leader: RaftGroup, elected_again: bool) -> None:
    """Tick thread: the leader loses its leadership (as pysyncobj's fallback makes it) and, if
    ``elected_again``, wins the next term's election at once (it has the longest log: the
    followers' votes, were they answering; they take its entries as that term's leader's)."""
    sync = leader._sync
    sync._SyncObj__setState(0)
    sync._SyncObj__raftLeader = None
    if elected_again:
        sync._SyncObj__setCurrentTerm(int(sync.raftCurrentTerm) + 1, sync._SyncObj__selfNode.id)
        sync._SyncObj__onBecomeLeader()


def test_a_leader_elected_again_within_the_grace_answers_its_entry_by_its_own_commit(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """The leader takes an entry its followers do not answer (a partition), loses its leadership
    and wins the next term's election at once, then commits only after its first loss's grace
    (the followers answer late). Its own commit answers the entry with its result. Before, the
    grace ran from the first loss even while it led again: ``unknown_outcome`` at its end, for an
    entry that then committed."""
    leader, grace_s = _cut_off_leader(tmp_path, groups, cut_s=4 * 0.6)
    outcomes: list[Outcome] = []

    def submit_lose_and_win_again() -> None:
        leader.submit(b"x", outcomes.append)
        leader._sync._checkCommandsToApply()  # in its log, sent (the followers read it later)
        _lose(leader, elected_again=True)

    leader._on_tick_thread(submit_lose_and_win_again)
    time.sleep(2 * grace_s)  # past the first loss's grace, the followers still cut off
    assert leader.is_leader()
    assert outcomes == [], outcomes  # held while it leads, not answered unknown
    wait_for(lambda: outcomes, "the entry's outcome once the followers answer", timeout=10)
    (outcome,) = outcomes
    assert outcome.error is None and outcome.result is not None and "index" in outcome.result, outcome
    wait_for(lambda: all(b"x" in g._machine.commands() for g in groups), "x applied everywhere")  # type: ignore[attr-defined]


def test_a_leader_elected_again_that_loses_again_holds_for_a_grace_from_that_loss(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """Elected again, then deposed again before its commit (the followers still cut off): its
    entry is held for a grace from the second loss, then answered ``unknown_outcome`` (never
    waiting without end)."""
    leader, grace_s = _cut_off_leader(tmp_path, groups, cut_s=10 * 0.6)
    outcomes: list[Outcome] = []

    def submit_lose_and_win_again() -> None:
        leader.submit(b"y", outcomes.append)
        leader._sync._checkCommandsToApply()
        _lose(leader, elected_again=True)

    leader._on_tick_thread(submit_lose_and_win_again)
    time.sleep(2 * grace_s)
    lost = threading.Event()
    leader._on_tick_thread(lambda: (_lose(leader, elected_again=False), lost.set()))
    assert lost.wait(5)
    lost_at = time.monotonic()
    time.sleep(grace_s / 2)
    assert outcomes == [], outcomes  # a grace from this loss, not the first one's (long past)
    wait_for(lambda: outcomes, "the entry answered at the grace's end", timeout=3 * grace_s)
    assert time.monotonic() - lost_at < 4 * grace_s  # before the followers answer again
    assert [(o.error, o.definite) for o in outcomes] == [("unknown_outcome", False)]


def test_a_leader_elected_again_answers_an_entry_a_checkpoint_passed_over(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """Held without a deadline while it leads again, an entry whose index this replica passed
    without applying it (a checkpoint installed over it while it followed: pysyncobj never
    answers such a command) would wait until the replica stops: it is answered
    ``unknown_outcome`` at the next tick. (The install is played by moving the applied index.)"""
    leader, _ = _cut_off_leader(tmp_path, groups, cut_s=3.0)
    outcomes: list[Outcome] = []

    def submit_lose_skip_and_win_again() -> None:
        sync = leader._sync
        leader.submit(b"z", outcomes.append)
        sync._checkCommandsToApply()
        _lose(leader, elected_again=False)
        sync._SyncObj__raftLastApplied = max(sync._SyncObj__commandsWaitingCommit)  # the checkpoint's
        sync._SyncObj__setCurrentTerm(int(sync.raftCurrentTerm) + 1, sync._SyncObj__selfNode.id)
        sync._SyncObj__onBecomeLeader()

    leader._on_tick_thread(submit_lose_skip_and_win_again)
    wait_for(lambda: outcomes, "the passed-over entry answered", timeout=1.0)
    assert [(o.error, o.definite) for o in outcomes] == [("unknown_outcome", False)]


def test_a_leader_elected_again_holds_an_entry_its_log_lost_for_a_grace_only(
    tmp_path: Path, groups: list[RaftGroup]
) -> None:
    """Held entries at n+1..n+3; while the replica follows, another leader's no-op at n+1 cuts
    them from its log; elected again, its own no-op takes n+2. No commit of its own answers them
    (n+1, n+2 hold other entries now; n+3 is past its log, answered by pysyncobj only when the
    log grows that far: in an idle group, never), nor is any provably gone (a replica holding them
    may yet lead and commit them): each keeps its grace from the loss and is answered
    ``unknown_outcome`` at its end, before the followers answer again. Before, all waited without
    a deadline while it led; n+3 for ever."""
    leader, _ = _cut_off_leader(tmp_path, groups, cut_s=4.0)
    outcomes: list[Outcome] = []

    def submit_lose_be_cut_and_win_again() -> None:
        sync = leader._sync
        for command in (b"p", b"q", b"r"):
            leader.submit(command, outcomes.append)
        sync._checkCommandsToApply()
        first = min(sync._SyncObj__commandsWaitingCommit)
        _lose(leader, elected_again=False)
        term = int(sync.raftCurrentTerm) + 1  # another leader's term: its no-op cuts the held entries
        sync._SyncObj__setCurrentTerm(term, None)
        sync._SyncObj__deleteEntriesFrom(first)
        sync._SyncObj__raftLog.add(b"\x01", first, term)  # pysyncobj's NO_OP command
        sync._SyncObj__setCurrentTerm(term + 1, sync._SyncObj__selfNode.id)
        sync._SyncObj__onBecomeLeader()  # its no-op at first + 1

    started = time.monotonic()
    leader._on_tick_thread(submit_lose_be_cut_and_win_again)
    wait_for(lambda: len(outcomes) == 3, "the three answered at the grace's end", timeout=8.0)
    assert time.monotonic() - started < 4.0, "answered only once the followers answered"
    assert leader.is_leader()
    assert [(o.error, o.definite) for o in outcomes] == [("unknown_outcome", False)] * 3
