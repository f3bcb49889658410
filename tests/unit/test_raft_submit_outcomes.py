"""Every submit gets its outcome (``RaftGroup.submit``), on three RaftGroups over the real
pysyncobj on localhost, also when the leader it went to loses its leadership before the entry
committed: pysyncobj answers a command only when its replica applies the entry's index, which may
be never (an idle group, a group without a quorum)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_doubles import fast_settings, start_three, submit_all

from raftmq.cluster.replication.raft import RaftGroup


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
