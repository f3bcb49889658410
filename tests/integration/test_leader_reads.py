"""A queue's bounds come only from a leader whose state holds every acknowledged message (issue
25: a 1 GB fill read 726,530 of its 976,562 acknowledged messages back from ``GET
/v1/topics/{topic}`` right after its flush, and consumers' commits were refused as ``offset N
above high_offset M`` while leaders changed). Real nodes: a replica that missed the messages (it
was paused while they were produced) and hears no leader (its peers are gone) answered the
topic's bounds from its own replica, and any replica answered ``/internal/groups/{g}/bounds``.
Raft's read rule on a new leader: ``tests/unit/test_raft_leader_reads.py``."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.node.node import PEER_STATUS_MAX_AGE_S

from .conftest import assert_error
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

MESSAGES = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes, one queue group on all three (the test kills and pauses nodes)."""
    with Cluster(tmp_path, nodes=3, queue_groups=1, replication=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        yield c


def _pause(c: Cluster, nid: str, paused: bool) -> None:
    proc = c.nodes[nid].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


def _high_offset(c: Cluster, nid: str) -> Any:
    r = c.get("/v1/topics/t", nid, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["queues"][0]["high_offset"]


def test_a_replica_that_missed_acknowledged_messages_never_answers_the_bounds(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("t", queues=1)
    leader = c.wait_leader("0")
    follower, lagging = (n for n in c.nodes if n != leader)
    assert _high_offset(c, lagging) == 0

    _pause(c, lagging, True)  # it misses every message below: the other two acknowledge them
    try:
        r = c.produce("t", [{"value": f"m{i}"} for i in range(MESSAGES)], node=leader)
        assert r.status_code == 200, r.text
        assert _high_offset(c, leader) == MESSAGES
        c.kill(leader)
        _pause(c, follower, True)  # the one replica holding the messages cannot answer
    finally:
        _pause(c, lagging, False)
    try:
        # Alone, the lagging replica hears no leader, and cannot become one.
        wait_until(
            lambda: c.status(lagging)["groups"]["0"]["leader"] is None,
            30,
            0.1,
            "the lagging replica hears no leader",
        )
        # Its own replica lacks the acknowledged messages (a local read, which may lag, says so) ...
        r = c.get("/v1/topics/t/queues/0/messages", lagging, params={"offset": 0, "read_from": "local"})
        assert r.status_code == 200 and r.json()["high_offset"] == 0, r.text
        # ... so the topic's description gives no figure rather than a smaller one, also once the
        # leader it knew of from its peers' statuses is forgotten (those say nothing after a while).
        deadline = time.monotonic() + PEER_STATUS_MAX_AGE_S + 2
        while time.monotonic() < deadline:
            assert _high_offset(c, lagging) is None
        r = c.internal("GET", "/internal/groups/0/bounds?topic_id=" + str(_topic_id(c, lagging)), lagging)
        assert_error(r, 421, "not_leader")
    finally:
        _pause(c, follower, False)

    # A leader is elected: the replica holding the messages, or the lagging one if it read them
    # from its socket after its pause (the dead leader's last sends wait in its kernel buffer),
    # which Raft's vote rule allows only then. It serves reads once its first entry applied.
    elected = wait_until(lambda: c.leader("0") in (follower, lagging) and c.leader("0"), 60, 0.2, "a leader")
    for nid in (follower, lagging):
        assert wait_until(lambda nid=nid: _high_offset(c, nid) == MESSAGES, 30, 0.2, f"bounds at {nid}")
    r = c.get("/v1/topics/t/queues/0/messages", lagging, params={"offset": MESSAGES - 1})
    assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == [f"m{MESSAGES - 1}"]
    other = lagging if elected == follower else follower
    r = c.internal("GET", "/internal/groups/0/bounds?topic_id=" + str(_topic_id(c, other)), other)
    assert_error(r, 421, "not_leader")  # a follower, caught up or not, leaves the bounds to its leader


def _topic_id(c: Cluster, nid: str) -> int:
    r = c.internal("GET", "/internal/topics", nid)
    return int(next(t["id"] for t in r.json()["topics"] if t["name"] == "t"))
