"""Per-node state keyed by names that clients choose stays bounded: the subscriptions a node
remembers as in place (``base.recent_keys.RecentKeys``) and consumer-group membership
(``membership.GroupMembership``), each fed 10,000 distinct group names."""

from __future__ import annotations

from raftmq.cluster.api.handlers.subscriptions import SUBSCRIBED_MAX, SUBSCRIPTION_REFRESH_S
from raftmq.cluster.base.recent_keys import RecentKeys
from raftmq.cluster.machines.membership import GroupMembership

NAMES = 10_000


def test_recent_keys_keep_at_most_their_bound_the_newest_first() -> None:
    recent = RecentKeys(SUBSCRIBED_MAX, SUBSCRIPTION_REFRESH_S)
    for i in range(NAMES):
        recent.add((7, f"group-{i}"), now=1.0)
        assert len(recent) <= SUBSCRIBED_MAX
    assert len(recent) == SUBSCRIBED_MAX
    assert recent.fresh((7, f"group-{NAMES - 1}"), now=2.0)  # the newest are kept
    assert recent.fresh((7, f"group-{NAMES - SUBSCRIBED_MAX}"), now=2.0)
    assert not recent.fresh((7, f"group-{NAMES - SUBSCRIBED_MAX - 1}"), now=2.0)  # the oldest went


def test_recent_keys_expire_and_expired_keys_are_dropped_as_new_ones_come() -> None:
    recent = RecentKeys(100, ttl_s=60.0)
    for i in range(50):
        recent.add(i, now=float(i))
    assert recent.fresh(10, now=69.9) and not recent.fresh(10, now=70.0)
    recent.add("late", now=120.0)  # everything added before 60.0 has expired
    assert len(recent) == 1 and recent.fresh("late", now=120.0)
    recent.add(1, now=121.0)
    recent.add(1, now=190.0)  # added again: fresh from then on, and not dropped as the oldest
    assert recent.fresh(1, now=240.0) and len(recent) == 1


def test_membership_forgets_groups_without_live_members() -> None:
    m = GroupMembership(session_timeout_ms=10_000)
    m.set_term(3)
    for i in range(NAMES):
        m.heartbeat(f"group-{i}", "member", ["t"], now_ms=0, generation=0)
    assert len(m) == NAMES  # live members: kept
    m.heartbeat("survivor", "a", ["t"], now_ms=10_001)  # the others' sessions timed out
    assert len(m) == 1
    assert m.leave("survivor", "a") and len(m) == 0
    assert not m.leave("group-1", "member")  # nothing left to leave


def test_a_forgotten_group_that_comes_back_never_sees_its_generation_go_backwards() -> None:
    m = GroupMembership(session_timeout_ms=10_000)
    m.set_term(1)
    generations = []
    for now in (0, 1, 2):
        m.heartbeat("g", f"member-{now}", ["t"], now_ms=now)
        generations.append(m.view("g", f"member-{now}", {"t": 4})["generation"])
        assert m.leave("g", f"member-{now}") and len(m) == 0
    assert generations == sorted(set(generations)) and generations[0] > 1 << 32
