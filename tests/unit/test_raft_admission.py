"""RaftAdmission (cluster/replication/admission.py): the node's count of unauthenticated Raft
connections, its two caps and the reasons it counts. The sockets are in
tests/integration/test_raft_connections.py."""

from __future__ import annotations

from raftmq.cluster.replication.admission import (
    AUTH_TIMEOUT,
    BAD_FRAME,
    NODE_LIMIT,
    SOURCE_LIMIT,
    AdmissionLimits,
    RaftAdmission,
)


def test_the_per_source_cap_refuses_one_address_and_not_another() -> None:
    a = RaftAdmission(AdmissionLimits(max_unauthenticated=10, max_per_source=2))
    assert [a.admit("10.0.0.1") for _ in range(3)] == [None, None, SOURCE_LIMIT]
    assert a.admit("10.0.0.2") is None
    assert a.unauthenticated == 3
    assert a.closed()[SOURCE_LIMIT] == 1


def test_the_node_cap_counts_every_source() -> None:
    a = RaftAdmission(AdmissionLimits(max_unauthenticated=3, max_per_source=2))
    assert [a.admit(f"10.0.0.{i}") for i in range(4)] == [None, None, None, NODE_LIMIT]
    a.release("10.0.0.0")  # authenticated: a place is free again, and nothing is counted
    assert a.admit("10.0.0.9") is None
    assert a.closed() == {NODE_LIMIT: 1, SOURCE_LIMIT: 0, AUTH_TIMEOUT: 0, BAD_FRAME: 0}


def test_a_release_frees_the_source_and_counts_why_it_was_closed() -> None:
    a = RaftAdmission(AdmissionLimits(max_unauthenticated=5, max_per_source=1))
    assert a.admit("h") is None
    a.release("h", AUTH_TIMEOUT)
    assert a.admit("h") is None
    a.release("h", BAD_FRAME)
    a.release("h", BAD_FRAME)  # never admitted again: ignored, not counted
    assert a.unauthenticated == 0
    assert a.closed()[AUTH_TIMEOUT] == 1 and a.closed()[BAD_FRAME] == 1
