"""Consumer-group membership: average allocation, generations, expiry, coordinator changes."""

from __future__ import annotations

from raftmq.cluster.membership import GroupMembership, average_allocation


def test_average_allocation_gives_contiguous_ranges_over_sorted_members() -> None:
    assert average_allocation(4, ["c", "a", "b"]) == {"a": [0, 1], "b": [2], "c": [3]}
    assert average_allocation(2, ["a", "b", "c"]) == {"a": [0], "b": [1], "c": []}
    assert average_allocation(8, ["x"]) == {"x": list(range(8))}
    assert average_allocation(3, []) == {}


def test_every_queue_is_assigned_to_exactly_one_member() -> None:
    for queues in range(0, 17):
        for n in range(1, 7):
            members = [f"m{i}" for i in range(n)]
            got = average_allocation(queues, members)
            flat = sorted(q for qs in got.values() for q in qs)
            assert flat == list(range(queues))
            sizes = [len(qs) for qs in got.values()]
            assert max(sizes) - min(sizes) <= 1


def test_joining_and_leaving_bump_the_generation_and_rebalance() -> None:
    m = GroupMembership(session_timeout_ms=10_000)
    m.set_term(3)
    m.heartbeat("g", "a", ["t"], now_ms=0)
    v1 = m.view("g", "a", {"t": 4})
    assert v1["assignment"] == {"t": [0, 1, 2, 3]} and v1["generation"] > 3 << 32 - 1
    m.heartbeat("g", "b", ["t"], now_ms=10)
    v2 = m.view("g", "a", {"t": 4})
    assert v2["generation"] > v1["generation"] and v2["assignment"] == {"t": [0, 1]}
    assert m.view("g", "b", {"t": 4})["assignment"] == {"t": [2, 3]}
    m.heartbeat("g", "a", ["t"], now_ms=20)  # a plain heartbeat changes nothing
    assert m.view("g", "a", {"t": 4})["generation"] == v2["generation"]
    assert m.leave("g", "b") and not m.leave("g", "b")
    assert m.view("g", "a", {"t": 4})["assignment"] == {"t": [0, 1, 2, 3]}


def test_a_member_missing_heartbeats_is_dropped_and_its_queues_move() -> None:
    m = GroupMembership(session_timeout_ms=1_000)
    m.heartbeat("g", "a", ["t"], now_ms=0)
    m.heartbeat("g", "b", ["t"], now_ms=0)
    m.heartbeat("g", "a", ["t"], now_ms=900)
    m.heartbeat("g", "a", ["t"], now_ms=1_500)  # b last seen at 0: expired
    view = m.view("g", "a", {"t": 2})
    assert view["members"] == ["a"] and view["assignment"] == {"t": [0, 1]}


def test_groups_and_topics_are_independent() -> None:
    m = GroupMembership()
    m.heartbeat("g1", "a", ["t", "u"], now_ms=0)
    m.heartbeat("g1", "b", ["u"], now_ms=0)
    m.heartbeat("g2", "c", ["t"], now_ms=0)
    counts = {"t": 2, "u": 2}
    assert m.view("g1", "a", counts)["assignment"] == {"t": [0, 1], "u": [0]}
    assert m.view("g1", "b", counts)["assignment"] == {"u": [1]}
    assert m.view("g2", "c", counts)["assignment"] == {"t": [0, 1]}


def test_a_new_coordinator_term_starts_higher_generations_and_forgets_members() -> None:
    m = GroupMembership()
    m.set_term(1)
    m.heartbeat("g", "a", ["t"], now_ms=0)
    old = m.view("g", "a", {"t": 1})["generation"]
    m.set_term(2)
    assert m.view("g", "a", {"t": 1})["members"] == []
    m.heartbeat("g", "a", ["t"], now_ms=0)
    assert m.view("g", "a", {"t": 1})["generation"] > old
