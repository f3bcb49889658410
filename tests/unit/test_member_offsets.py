"""A consumer group with a live member keeps its offsets while it commits nothing, as Kafka's do
(``limits.offset_retention_ms`` counts only once the group has no member): the coordinator marks
the groups of its live members used with one ``touch_subscriptions`` entry per queue group and
period (``cluster/machines/delivery/expiry.py``, ``cluster/api/handlers/groups.py``).

Pure: a queue-group machine over a MemoryStore, time from the commands; the membership
coordinator with times as arguments.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_delivery import Machine, T
from test_offset_retention import commit, expire, records, sub

from raftmq.cluster import commands
from raftmq.cluster.api.handlers.groups import touch_interval_ms
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.delivery import read_subscription
from raftmq.cluster.machines.delivery.expiry import next_expiry_ms
from raftmq.cluster.machines.membership import GroupMembership
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES, previous_release_refuses

IDLE, RETENTION = 1000, 5000


def touch(m: Machine, now: int, *groups: str) -> dict[str, Any]:
    return m.apply(commands.touch_subscriptions(now, [(T, g) for g in groups]))


def test_a_touched_groups_offsets_outlive_the_retention_and_an_untouched_ones_go() -> None:
    m = Machine()
    m.produce(0, "a", "b")
    for group in ("member", "gone"):
        sub(m, group, 0, creator="t")
        commit(m, group, 2)
    expire(m, 1000)  # both dormant: their receive/ack state went, the records stay for the offsets
    for now in (2000, 4000, 6000, 8000):  # the coordinator's rounds while "member" has a member
        assert touch(m, now, "member") == {"touched": 1}
        expire(m, now)
    assert records(m) == {"member"}  # "gone" was unused for 5000
    assert m.floor(group="member") == 2 and m.floor(group="gone") is None
    stored = read_subscription(m.store, T, "member")
    assert stored is not None and stored.used_ms == 8000 and stored.dormant  # not woken
    assert next_expiry_ms(m.store, IDLE, RETENTION) == 8000 + RETENTION
    # Once the member is gone nothing touches it, and the offsets go after the retention.
    assert expire(m, 8000 + RETENTION) == {"expired": 1, "more": False, "dormant": 0}
    assert m.floor(group="member") is None


def test_a_touch_creates_nothing_and_leaves_configured_and_freshly_used_records_alone() -> None:
    m = Machine()
    sub(m, "admins", 0, configured=True)
    sub(m, "fresh", 1500, creator="t")
    before = read_subscription(m.store, T, "admins")
    assert touch(m, 2000, "admins", "fresh", "never-stored") == {"touched": 0}
    assert records(m) == {"admins", "fresh"}  # no record made for a group that has none
    assert read_subscription(m.store, T, "admins") == before
    stored = read_subscription(m.store, T, "fresh")
    assert stored is not None and stored.used_ms == 1500  # moved by less than a second: not written


@pytest.mark.parametrize(
    "groups",
    [
        [],
        [[T, "a"], [T, "a"]],
        [[T]],
        [["1", "a"]],
        [[T, ""]],
        [[T, f"g{i}"] for i in range(commands.MAX_TOUCH_GROUPS + 1)],
    ],
)
def test_a_malformed_touch_is_refused(groups: list[Any]) -> None:
    with pytest.raises(BadCommand):
        commands.validate({"v": 1, "op": "touch_subscriptions", "now_ms": 1, "groups": groups})


def test_the_touch_is_a_new_op_gated_for_rolling_upgrades() -> None:
    assert "touch_subscriptions" in CAPABILITIES and "touch_subscriptions" not in BEFORE_CAPABILITIES
    assert previous_release_refuses(commands.touch_subscriptions(1, [(T, "g")]))


def test_the_coordinator_names_each_topic_of_its_live_members_until_they_expire() -> None:
    membership = GroupMembership(session_timeout_ms=10_000)
    membership.heartbeat("billing", "m1", ["orders", "refunds"], 0)
    membership.heartbeat("billing", "m2", ["orders"], 5_000)
    membership.heartbeat("audit", "m3", ["orders"], 5_000)
    assert membership.subscribed(9_000) == [
        ("audit", "orders"),
        ("billing", "orders"),
        ("billing", "refunds"),
    ]
    assert membership.subscribed(12_000) == [("audit", "orders"), ("billing", "orders")]  # m1 expired
    assert membership.subscribed(16_000) == []


def test_the_touch_interval_is_a_quarter_of_the_shorter_bound_within_a_second_and_a_minute() -> None:
    assert touch_interval_ms(Limits()) == 60_000  # 24 h idle, 7 days retention
    assert touch_interval_ms(Limits(subscription_idle_ms=10_000, offset_retention_ms=45_000)) == 2_500
    assert touch_interval_ms(Limits(subscription_idle_ms=0, offset_retention_ms=20_000)) == 5_000
    assert touch_interval_ms(Limits(subscription_idle_ms=2_000, offset_retention_ms=0)) == 1_000
    assert touch_interval_ms(Limits(subscription_idle_ms=0, offset_retention_ms=0)) is None
