"""Consumer-group membership: average allocation, generations, expiry, coordinator changes, and
the revoke barrier (a moved queue waits for its previous owner)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson

from raftmq.cluster.machines.membership import GroupMembership, average_allocation


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
    assert m.member_topics("g", "b") is None and view["assignment"] == {"t": [0, 1]}


def test_a_join_answer_names_no_other_member_and_gives_the_allocation_to_pace_by() -> None:
    m = GroupMembership()
    m.heartbeat("g", "member-a", ["t"], now_ms=0, generation=0)
    m.view("g", "member-a", {"t": 6})  # a holds all six queues until it applies the next assignment
    for member in ("member-b", "member-c"):
        m.heartbeat("g", member, ["t"], now_ms=1, generation=0)
    view = m.view("g", "member-b", {"t": 6})
    assert view["members"] == ["member-b"]  # itself only (older clients read the field)
    assert "member-a" not in orjson.dumps(view).decode() and "member-c" not in orjson.dumps(view).decode()
    assert view["allocation"] == {"t": [2, 3]}  # its share of six queues over three members
    assert view["assignment"] == {"t": []}  # withheld until a lets them go (the revoke barrier)


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


# -- the revoke barrier ---------------------------------------------------------------------------


def beat(
    m: GroupMembership, member: str, now_ms: int, applied: int | None, queues: int = 4
) -> dict[str, Any]:
    """A heartbeat carrying ``applied`` and the view it is answered with."""
    m.heartbeat("g", member, ["t"], now_ms=now_ms, generation=applied)
    return m.view("g", member, {"t": queues})


def test_a_moved_queue_waits_until_its_previous_owner_applied_the_new_generation() -> None:
    m = GroupMembership()
    a = beat(m, "a", 0, 0)
    assert a["assignment"] == {"t": [0, 1, 2, 3]}
    a = beat(m, "a", 10, a["generation"])  # a applied it: holds 0-3
    b = beat(m, "b", 20, 0)
    assert b["generation"] > a["generation"]
    assert b["assignment"] == {"t": []}  # 2, 3 are b's, but a may still be consuming them
    assert m.holders("g") == {("t", q): "a" for q in range(4)}
    # a heartbeats with the generation it applied before b joined: nothing moves yet.
    a2 = beat(m, "a", 30, a["generation"])
    assert a2["assignment"] == {"t": [0, 1]} and a2["generation"] == b["generation"]
    assert beat(m, "b", 40, 0)["assignment"] == {"t": []}
    # a applies the new generation (drops 2, 3, commits) and says so: b gets them.
    beat(m, "a", 50, a2["generation"])
    assert beat(m, "b", 60, b["generation"])["assignment"] == {"t": [2, 3]}
    assert m.holders("g") == {("t", 0): "a", ("t", 1): "a", ("t", 2): "b", ("t", 3): "b"}


def test_free_queues_are_granted_at_once_and_partial_grants_grow() -> None:
    m = GroupMembership()
    a = beat(m, "a", 0, 0, queues=2)  # a: 0, 1
    beat(m, "a", 1, a["generation"], queues=2)
    b = beat(m, "b", 2, 0, queues=2)  # b's share is queue 1, still a's
    assert b["assignment"] == {"t": []}
    a = beat(m, "a", 3, a["generation"], queues=2)
    assert a["assignment"] == {"t": [0]}
    beat(m, "a", 4, a["generation"], queues=2)
    b = beat(m, "b", 5, b["generation"], queues=2)
    assert b["assignment"] == {"t": [1]}
    # A third member: the generation moves, nobody holds queue 2 of a grown topic... here the
    # allocation of 2 queues over 3 members leaves c with nothing, and nothing is withheld.
    c = beat(m, "c", 6, 0, queues=2)
    assert c["assignment"] == {"t": []}


def test_a_previous_owner_that_left_or_expired_releases_its_queues() -> None:
    m = GroupMembership(session_timeout_ms=1_000)
    a = beat(m, "a", 0, 0)
    beat(m, "a", 1, a["generation"])
    b = beat(m, "b", 2, 0)
    assert b["assignment"] == {"t": []}
    assert m.leave("g", "a")
    assert beat(m, "b", 3, b["generation"])["assignment"] == {"t": [0, 1, 2, 3]}
    # expiry: b holds everything; c joins; b goes silent
    c = beat(m, "c", 10, 0)
    assert c["assignment"] == {"t": []}
    c = beat(m, "c", 900, c["generation"])
    assert c["assignment"] == {"t": []}  # b is still live (last seen at 3)
    c = beat(m, "c", 1_100, c["generation"])  # b expired at 1_003
    assert m.member_topics("g", "b") is None and c["assignment"] == {"t": [0, 1, 2, 3]}
    assert set(m.holders("g").values()) == {"c"}


def test_a_member_that_sends_no_generation_gets_no_barrier() -> None:
    """Older clients: their queues move at once, as before the barrier."""
    m = GroupMembership()
    beat(m, "a", 0, None)
    beat(m, "a", 1, None)
    b = beat(m, "b", 2, 0)
    assert b["assignment"] == {"t": [2, 3]}
    assert beat(m, "a", 3, None)["assignment"] == {"t": [0, 1]}


def test_an_acknowledgement_of_an_older_assignment_releases_nothing() -> None:
    m = GroupMembership()
    a1 = beat(m, "a", 0, 0)  # a: 0-3 (generation g1)
    beat(m, "b", 1, 0)  # g2: b's share 2, 3 withheld
    a2 = m.view("g", "a", {"t": 4})  # sent to a, but lost on the way
    assert a2["assignment"] == {"t": [0, 1]}
    # a never saw g2 and still consumes 2, 3: its heartbeat says g1.
    beat(m, "a", 2, a1["generation"])
    assert m.view("g", "b", {"t": 4})["assignment"] == {"t": []}
    beat(m, "a", 3, a2["generation"])
    assert m.view("g", "b", {"t": 4})["assignment"] == {"t": [2, 3]}


def test_a_changed_subscription_moves_queues_through_the_barrier() -> None:
    m = GroupMembership()
    m.heartbeat("g", "a", ["t", "u"], now_ms=0, generation=0)
    a = m.view("g", "a", {"t": 2, "u": 2})
    m.heartbeat("g", "a", ["t", "u"], now_ms=1, generation=a["generation"])
    m.heartbeat("g", "b", ["u"], now_ms=2, generation=0)
    assert m.view("g", "b", {"u": 2})["assignment"] == {"u": []}
    m.heartbeat("g", "a", ["t"], now_ms=3, generation=a["generation"])  # drops u
    a = m.view("g", "a", {"t": 2})
    assert a["assignment"] == {"t": [0, 1]}
    assert m.view("g", "b", {"u": 2})["assignment"] == {"u": []}  # a has not applied it yet
    m.heartbeat("g", "a", ["t"], now_ms=4, generation=a["generation"])
    assert m.view("g", "b", {"u": 2})["assignment"] == {"u": [0, 1]}


def test_no_queue_is_ever_granted_to_two_members_at_once() -> None:
    """Random joins, leaves, lost answers and heartbeats: each queue's consumers (members that were
    granted it and have not applied an assignment without it) never number more than one."""
    rng = random.Random(7)
    m = GroupMembership(session_timeout_ms=50)
    holding: dict[str, set[int]] = {}  # what each member consumes, as a client would
    applied: dict[str, int] = {}
    now = 0
    for _ in range(5_000):
        now += rng.randrange(1, 5)
        member = f"m{rng.randrange(5)}"
        action = rng.random()
        if action < 0.05:
            m.leave("g", member)  # a client leaves after it stopped consuming
            holding.pop(member, None)
            applied.pop(member, None)
            continue
        m.heartbeat("g", member, ["t"], now_ms=now, generation=applied.get(member, 0))
        view = m.view("g", member, {"t": 6})
        if action < 0.15:
            continue  # the answer is lost
        holding[member] = set(view["assignment"].get("t", []))
        applied[member] = view["generation"]
        gone_members = [x for x in holding if m.member_topics("g", x) is None]
        for gone in gone_members:  # expired: such a client gives its queues up itself
            holding.pop(gone)
            applied.pop(gone, None)
        owners = Counter(q for qs in holding.values() for q in qs)
        assert all(n == 1 for n in owners.values()), (now, holding)


def test_describe_shows_members_of_one_topic_and_the_state_through_a_rebalance() -> None:
    m = GroupMembership(session_timeout_ms=10_000)
    m.set_term(1)
    assert m.describe("g", "t", 4, now_ms=0, limit=10)["state"] == "empty"
    m.heartbeat("g", "a", ["t", "secret"], now_ms=0, generation=0)
    sent = m.view("g", "a", {"t": 4, "secret": 2})["generation"]
    gen = m.describe("g", "t", 4, now_ms=0, limit=10)["generation"]  # the topic's generation
    d = m.describe("g", "t", 4, now_ms=0, limit=10)
    assert d["state"] == "rebalancing"  # a has not yet said it applied its assignment
    m.heartbeat("g", "a", ["t", "secret"], now_ms=100, generation=sent)
    d = m.describe("g", "t", 4, now_ms=300, limit=10)
    assert d["state"] == "stable" and d["unassigned_queues"] == []
    assert d["members"] == [
        {
            "member_id": "a",
            "queues": [0, 1, 2, 3],
            "pending": [],
            "last_seen_ms": 100,
            "last_seen_ago_ms": 200,
            "applied_generation": gen,
        }
    ]
    assert "secret" not in orjson.dumps(d).decode()  # only the asked topic of a subscription
    # b joins: a still holds 2 and 3 until it applies the new generation, so b waits for them.
    m.heartbeat("g", "b", ["t"], now_ms=200, generation=0)
    m.view("g", "b", {"t": 4})
    d = m.describe("g", "t", 4, now_ms=200, limit=10)
    assert d["state"] == "rebalancing" and d["member_count"] == 2
    assert [(r["member_id"], r["queues"], r["pending"]) for r in d["members"]] == [
        ("a", [0, 1, 2, 3], []),
        ("b", [], [2, 3]),
    ]
    a_gen = m.view("g", "a", {"t": 4, "secret": 2})["generation"]
    m.heartbeat("g", "a", ["t", "secret"], now_ms=300, generation=a_gen)
    b_gen = m.view("g", "b", {"t": 4})["generation"]
    m.heartbeat("g", "b", ["t"], now_ms=300, generation=b_gen)
    d = m.describe("g", "t", 4, now_ms=300, limit=10)
    assert d["state"] == "stable"
    assert [(r["member_id"], r["queues"]) for r in d["members"]] == [("a", [0, 1]), ("b", [2, 3])]
    assert m.leave("g", "b")
    d = m.describe("g", "t", 4, now_ms=300, limit=10)
    assert [r["member_id"] for r in d["members"]] == ["a"] and d["state"] == "rebalancing"
    assert d["unassigned_queues"] == [2, 3]


def test_describe_caps_the_members_and_says_so() -> None:
    m = GroupMembership()
    m.set_term(1)
    for i in range(7):
        m.heartbeat("g", f"m{i}", ["t"], now_ms=0)
    d = m.describe("g", "t", 3, now_ms=0, limit=5)
    assert d["member_count"] == 7 and d["truncated"] is True
    assert [r["member_id"] for r in d["members"]] == [f"m{i}" for i in range(5)]
    assert m.describe("g", "other", 3, now_ms=0, limit=5)["member_count"] == 0
    assert m.describe("nobody", "t", 3, now_ms=0, limit=5) == {
        "group": "nobody",
        "topic": "t",
        "state": "empty",
        "generation": None,
        "member_count": 0,
        "members": [],
        "truncated": False,
        "unassigned_queues": [0, 1, 2],
        "session_timeout_ms": 10_000,
    }


def test_a_member_keeps_the_owner_that_created_it() -> None:
    m = GroupMembership()
    m.heartbeat("g", "a", ["t"], now_ms=0, owner="billing")
    m.heartbeat("g", "a", ["t"], now_ms=1, owner="intruder")  # an admin's heartbeat, say
    member = m.member("g", "a", now_ms=1)
    assert member is not None and member.owner == "billing"
    m.heartbeat("g", "anon", ["t"], now_ms=1)  # created without a token (an older entry node)
    m.heartbeat("g", "anon", ["t"], now_ms=2, owner="billing")
    anon = m.member("g", "anon", now_ms=2)
    assert anon is not None and anon.owner == "billing"
    assert m.member("g", "nobody", now_ms=2) is None


def test_members_are_capped_per_token_and_per_topic_and_freed_by_leave_and_expiry() -> None:
    m = GroupMembership(session_timeout_ms=1_000, max_members_per_token=2, max_members_per_topic=3)
    for i in range(2):
        assert m.admit(f"g{i}", "a", ["t"], "tok", now_ms=0) is None
        m.heartbeat(f"g{i}", "a", ["t"], now_ms=0, owner="tok")
    refusal = m.admit("g2", "a", ["u"], "tok", now_ms=0)
    assert refusal is not None and "max_members_per_token = 2" in refusal
    assert m.admit("g0", "a", ["t", "u"], "tok", now_ms=0) is None  # an existing member: no new one
    assert m.admit("g2", "a", ["t"], "other", now_ms=0) is None  # another token's count
    m.heartbeat("g2", "a", ["t"], now_ms=0, owner="other")
    refusal = m.admit("g3", "b", ["t"], "third", now_ms=0)
    assert refusal is not None and "topic 't'" in refusal and "max_members_per_topic = 3" in refusal
    # Adding the full topic to an existing member breaks its cap too; another topic does not.
    m.heartbeat("g3", "b", ["u"], now_ms=0, owner="third")
    assert m.admit("g3", "b", ["u", "t"], "third", now_ms=0) is not None
    assert m.admit("g3", "b", ["u", "v"], "third", now_ms=0) is None
    # Without tokens only the topic cap counts.
    assert m.admit("g4", "c", ["u"], None, now_ms=0) is None
    assert m.leave("g0", "a")
    assert m.admit("g3", "b", ["u", "t"], "third", now_ms=0) is None
    assert m.admit("g5", "a", ["u"], "tok", now_ms=0) is None
    # Expired members count no more (g1/a, g2/a, g3/b last seen at 0).
    m.heartbeat("g1", "a", ["t"], now_ms=900, owner="tok")
    m.heartbeat("g1", "z", ["t"], now_ms=900, owner="tok")
    assert m.admit("g9", "y", ["t"], "tok", now_ms=1_000) is not None
    assert m.admit("g9", "y", ["t"], "new", now_ms=1_500) is None  # g2/a expired: 2 on t
    assert m.admit("g9", "y", ["t"], "tok", now_ms=2_000) is None  # all expired


def test_the_members_route_shows_nothing_of_the_other_topics_rebalances() -> None:
    m = GroupMembership()
    m.set_term(1)
    m.heartbeat("g", "a", ["t", "u"], now_ms=0, generation=0)
    m.heartbeat("g", "b", ["t"], now_ms=0, generation=0)
    counts = {"t": 2, "u": 2}
    for member in ("a", "b"):
        applied = m.view("g", member, counts if member == "a" else {"t": 2})["generation"]
        m.heartbeat("g", member, ["t", "u"] if member == "a" else ["t"], now_ms=1, generation=applied)
    before = m.describe("g", "t", 2, now_ms=1, limit=10)
    assert before["state"] == "stable"
    assert [r["applied_generation"] for r in before["members"]] == [before["generation"]] * 2
    # Members come and go on u only: the group's generation moves, t's does not, and t stays
    # stable while a has not yet applied the assignment that changed u.
    for i in range(5):
        m.heartbeat("g", f"u{i}", ["u"], now_ms=2, generation=0)
        m.view("g", f"u{i}", counts)
    assert m.leave("g", "u0")
    group_generation = m.view("g", "a", counts)["generation"]
    assert group_generation > before["generation"]
    after = m.describe("g", "t", 2, now_ms=3, limit=10)
    assert after == {**before, "members": after["members"]}
    assert [r["applied_generation"] for r in after["members"]] == [before["generation"]] * 2
    assert m.describe("g", "u", 2, now_ms=3, limit=10)["state"] == "rebalancing"
    # A member joining t moves t's generation and its state.
    m.heartbeat("g", "c", ["t"], now_ms=4, generation=0)
    moved = m.describe("g", "t", 2, now_ms=4, limit=10)
    assert moved["generation"] == before["generation"] + 1 and moved["state"] == "rebalancing"
