"""Raft's read rule (``cluster/replication/leader_reads.py``) on three RaftGroups over the real
pysyncobj on localhost: a replica that has just won an election may lead while its state lacks
entries the previous leader committed and answered (issue 25: a queue's bounds read from such a
state were below what producers were acknowledged), and it serves reads only once it has applied
the no-op entry of its own term, which carries every committed entry before it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from raft_doubles import fast_settings, start_three, wait_for

from raftmq.cluster.replication.pso import FlushingTransport
from raftmq.cluster.replication.raft import Outcome, RaftGroup


@pytest.fixture
def three_groups(tmp_path: Path) -> Iterator[Callable[[], list[RaftGroup]]]:
    """Starts three replicas (after a test patched the transport: connections bind its methods)."""
    groups: list[RaftGroup] = []

    def start() -> list[RaftGroup]:
        # A leader that stops hearing its followers' acknowledgements steps down only after 30 s:
        # the test holds the new leader's first entry uncommitted that long at most.
        settings = dataclasses.replace(
            fast_settings(), election_min_s=0.3, election_max_s=0.5, heartbeat_s=0.03, leader_fallback_s=30.0
        )
        return start_three(tmp_path, settings, groups)

    yield start
    for group in groups:
        group.destroy()


def _submit(group: RaftGroup, command: bytes) -> Outcome:
    outcomes: list[Outcome] = []
    group.submit(command, outcomes.append)
    wait_for(lambda: outcomes, f"the outcome of {command!r}")
    assert outcomes[0].error is None, outcomes[0]
    return outcomes[0]


def test_a_new_leader_serves_reads_only_once_it_applied_its_terms_first_entry(
    three_groups: Callable[[], list[RaftGroup]], monkeypatch: pytest.MonkeyPatch
) -> None:
    capped: dict[Any, int] = {}  # SyncObj -> the highest commit index its leader may tell it
    deaf: set[Any] = set()  # SyncObjs that drop their followers' acknowledgements
    receive = FlushingTransport._onMessageReceived

    def filtered_receive(self: Any, node: Any, message: Any) -> None:
        sync = self._syncObj
        if isinstance(message, dict):
            if message.get("type") == "append_entries" and sync in capped:
                message = {**message, "commit_index": min(message["commit_index"], capped[sync])}
            if message.get("type") == "next_node_idx" and sync in deaf:
                return
        receive(self, node, message)

    monkeypatch.setattr(FlushingTransport, "_onMessageReceived", filtered_receive)
    groups = three_groups()
    old = next(g for g in groups if g.is_leader())
    followers = [g for g in groups if g is not old]
    first = _submit(old, b"before").result["index"]
    wait_for(lambda: all(g._machine.applied_index >= first for g in groups), "every replica applied")
    wait_for(old.reads.ready, "the first leader serves reads")
    assert not any(f.reads.ready() for f in followers)

    # The followers store and acknowledge the next entries, but never learn that they committed:
    # the leader answers its clients, and dies before its next message would tell them.
    for f in followers:
        capped[f._sync] = first
    last = max(_submit(old, f"acknowledged {i}".encode()).result["index"] for i in range(5))
    assert all(f._machine.applied_index == first for f in followers)
    for f in followers:
        deaf.add(f._sync)  # the new leader's first entry stays uncommitted while this holds
    old.destroy()

    new = wait_for(lambda: next((f for f in followers if f.is_leader()), None), "a new leader")
    # The gap is real: a leader whose state lacks writes its predecessor acknowledged ...
    assert new._machine.applied_index == first < last
    # ... and it does not serve reads, however long its first entry waits for a majority.
    time.sleep(0.3)
    assert new.is_leader() and new._machine.applied_index == first
    assert not new.reads.ready()

    deaf.clear()
    capped.clear()
    wait_for(new.reads.ready, "the new leader serves reads")
    applied = new._machine.commands()
    assert new._machine.applied_index >= last
    assert applied[-5:] == [f"acknowledged {i}".encode() for i in range(5)]
