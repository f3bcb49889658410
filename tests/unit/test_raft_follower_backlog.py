"""A leader's backlog to a follower is bounded (``cluster/replication/follower_backlog.py``): with
a follower that reads nothing, the leader queues about ``max_follower_backlog_bytes`` for it, not
every entry it has; commits go on through the other follower, and the stalled one catches up once
it reads again. Three RaftGroups over the real pysyncobj on localhost."""

from __future__ import annotations

import dataclasses
import inspect
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj
from raft_doubles import fast_settings, start_three, wait_for

from raftmq.cluster.replication.raft import Outcome, RaftGroup

BOUND = 1 << 20  # 1 MiB
ENTRY = 128 * 1024
BATCH = 1 << 20  # appendEntriesBatchSizeBytes with these entries (raft.py: at least 1 MiB)
ENTRIES = 160  # 20 MiB: far more than the bound and the kernel's socket buffers hold


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[list[RaftGroup]]:
    settings = dataclasses.replace(
        fast_settings(),
        election_min_s=0.3,
        election_max_s=0.5,
        heartbeat_s=0.03,
        max_follower_backlog_bytes=BOUND,
    )
    started = start_three(tmp_path, settings, [])
    yield started
    for group in started:
        group.destroy()


def _stall(group: RaftGroup) -> threading.Event:
    """Stop ``group``'s tick thread (it reads nothing: its socket fills, then its leader's queue)
    until the returned event is set."""
    go = threading.Event()
    tick = group._sync._onTick

    def stalled_tick(timeToWait: float = 0.0) -> None:
        go.wait()
        tick(timeToWait)

    group._sync._onTick = stalled_tick
    return go


def test_a_leader_queues_about_the_bound_for_a_follower_that_reads_nothing(groups: list[RaftGroup]) -> None:
    leader = wait_for(lambda: next((g for g in groups if g.is_leader()), None), "a leader")
    wait_for(lambda: all(g.leader() == leader.self_addr for g in groups), "every replica follows")
    slow = next(g for g in groups if g is not leader)
    node = next(n for n in leader._sync._SyncObj__otherNodes if n.id == slow.self_addr)
    go = _stall(slow)
    try:
        peak, outcomes = _submit_while_sampling(leader, node)
    finally:
        go.set()  # the teardown stops every tick thread: this one must not wait for ever
    assert [o.error for o in outcomes] == [None] * ENTRIES  # committed with the other follower
    assert leader.is_leader()
    # The bound, plus at most the message that crossed it (pysyncobj's batch of entries: here
    # 1 MiB, its floor) and a heartbeat.
    assert 0 < peak <= BOUND + BATCH + 64 * 1024, peak
    assert leader.backlog.holds > 0  # what metrics report

    wait_for(lambda: len(slow._machine.applied) >= ENTRIES, "the stalled follower catches up", timeout=30)
    applied: Any = slow._machine.commands()
    assert [int.from_bytes(c[:4], "big") for c in applied[-ENTRIES:]] == list(range(ENTRIES))
    assert leader.is_leader()


def _submit_while_sampling(leader: RaftGroup, node: Any) -> tuple[int, list[Outcome]]:
    """Submit ENTRIES entries one after the other, each committed before the next; returns the
    most bytes the leader had queued for ``node`` meanwhile, and the outcomes."""
    peak = 0
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, leader.backlog.queued_bytes(node))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    outcomes: list[Outcome] = []
    try:
        for i in range(ENTRIES):
            done = threading.Event()

            def on_done(outcome: Outcome, done: threading.Event = done) -> None:
                outcomes.append(outcome)
                done.set()

            leader.submit(i.to_bytes(4, "big") + b"x" * ENTRY, on_done)
            if not done.wait(10):
                break
    finally:
        sampling = False
        sampler.join()
    return peak, outcomes


def test_pysyncobj_skips_and_stops_sending_to_a_follower_outside_its_connected_set() -> None:
    """The seams: a round skips a follower not in the connected set, stops sending to one that
    left it after a send, and the round and the send are looked up on the objects."""
    source = inspect.getsource(SyncObj._SyncObj__sendAppendEntries)  # type: ignore[attr-defined]
    skip = (
        "if node not in self.__connectedNodes:\n                self.__serializer.cancelTransmisstion(node)\n"
    )
    assert skip + "                continue" in source
    assert source.count("self.__transport.send(node, message)\n") == 3
    assert source.count("if node not in self.__connectedNodes:\n") == 4  # the skip, then after each send
    assert "self.__sendAppendEntries()" in inspect.getsource(SyncObj._onTick)


def test_a_held_follower_that_reads_nothing_is_still_timed_out(groups: list[RaftGroup]) -> None:
    """pysyncobj times a connection out only when it sends on it or the socket has an event: a
    follower held back because it read nothing (a host gone without a reset) would keep its
    connection for good, and the leader would not reconnect when it came back."""
    leader = wait_for(lambda: next((g for g in groups if g.is_leader()), None), "a leader")
    wait_for(lambda: all(g.leader() == leader.self_addr for g in groups), "every replica follows")
    slow = next(g for g in groups if g is not leader)
    node = next(n for n in leader._sync._SyncObj__otherNodes if n.id == slow.self_addr)
    conn = leader._sync._SyncObj__transport._connections[node]
    dropped = threading.Event()
    disconnect = conn.disconnect

    def recording_disconnect() -> None:
        dropped.set()
        disconnect()

    conn.disconnect = recording_disconnect  # pysyncobj calls self.disconnect()
    go = _stall(slow)
    try:
        _peak, outcomes = _submit_while_sampling(leader, node)
        assert leader.backlog.holds > 0 and [o.error for o in outcomes] == [None] * ENTRIES
        # Nothing read from it for the connection timeout (3.5 s): the leader drops it.
        assert dropped.wait(10), "the held connection never timed out"
    finally:
        go.set()
    wait_for(lambda: len(slow._machine.applied) >= ENTRIES, "the follower catches up", timeout=30)
