"""Receive/ack in the queue-group state machine: deliveries, receipts, retries, dead letters,
the floor shared with offset consumers. Pure: a machine over a MemoryStore, time from commands."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq.cluster import commands
from raftmq.cluster.machines.delivery import DLQ_HEADER_PREFIX, REDRIVE_GROUP_HEADER, SCAN_BUDGET, available
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import committed_offset, next_due_ms, pending_record, queue_bounds, read_messages

T, DLQ, OTHER = 1, 2, 3  # topic ids
G = "g"


class Machine:
    """A queue-group machine that numbers entries itself, with shortcuts for the delivery ops."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 0)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(
        self, queue: int, *values: str, now: int = 0, topic: int = T, **fields: Any
    ) -> dict[str, Any]:
        msgs = [{"value": v, **fields} for v in values]
        return self.apply(commands.produce(now, [{"topic_id": topic, "queue": queue, "messages": msgs}]))

    def subscribe(
        self, max_deliveries: int = 3, backoff: list[int] | None = None, dlq: int | None = DLQ
    ) -> None:
        result = self.apply(
            commands.subscribe(G, T, "orders", dlq, max_deliveries, backoff or [100, 200], checked=True)
        )
        assert "subscription" in result, result

    def receive(
        self, now: int, max_messages: int = 100, queues: list[int] | None = None, group: str = G, **kw: Any
    ) -> list[dict[str, Any]]:
        result = self.apply(commands.receive(now, group, T, queues or [0], max_messages, 1000, **kw))
        assert "messages" in result, result
        return [{**m, "token": result["token"]} for m in result["messages"]]

    def op(
        self, name: str, now: int, delivered: list[dict[str, Any]], group: str = G, **kw: Any
    ) -> list[Any]:
        receipts = [(m["queue"], m["offset"], m["token"]) for m in delivered]
        result = self.apply(getattr(commands, name)(now, group, T, receipts, **kw))
        assert "results" in result, result
        return list(result["results"])

    def tick(self, now: int, max_items: int = 1000, **kw: Any) -> dict[str, Any]:
        return self.apply(commands.deliver_tick(now, max_items, **kw))

    def floor(self, queue: int = 0, group: str = G) -> int | None:
        return committed_offset(self.store, group, T, queue)

    def pairs(self) -> list[tuple[bytes, bytes]]:
        # The group's time (T) is bookkeeping written with any stamped command, as applied_index.
        return [(k, v) for k, v in self.store.scan(b"") if k not in (keys.APPLIED, keys.GROUP_TIME)]


def offsets(delivered: list[dict[str, Any]]) -> list[int]:
    return [m["offset"] for m in delivered]


def codes(results: list[dict[str, Any]]) -> list[str]:
    return ["ok" if r.get("ok") else r["error"]["code"] for r in results]


@pytest.fixture
def m() -> Machine:
    machine = Machine()
    machine.subscribe()
    return machine


# -- receive and ack ----------------------------------------------------------------------------


def test_receive_hands_out_new_offsets_in_order_with_attempt_one_and_a_deadline(m: Machine) -> None:
    m.produce(0, "a", "b", "c")
    got = m.receive(now=5000, max_messages=2)
    assert got == [
        {"queue": 0, "offset": 0, "attempt": 1, "deadline_ms": 6000, "first_ms": 5000, "token": m.index},
        {"queue": 0, "offset": 1, "attempt": 1, "deadline_ms": 6000, "first_ms": 5000, "token": m.index},
    ]
    assert offsets(m.receive(now=5000)) == [2]
    assert m.receive(now=5000) == []  # nothing new, nothing due


def test_a_redelivery_keeps_the_time_of_the_first_delivery(m: Machine) -> None:
    """``first_ms`` (the SQS API's ApproximateFirstReceiveTimestamp) is the first delivery's time,
    through an expiry and a nack, while ``deadline_ms`` moves with each delivery."""
    m.produce(0, "a", "b")
    first = m.receive(now=1000)
    assert [(g["attempt"], g["first_ms"]) for g in first] == [(1, 1000), (1, 1000)]
    m.tick(now=2000)  # both expire: due again at once
    again = m.receive(now=2500, max_messages=1)
    assert [(g["offset"], g["attempt"], g["first_ms"], g["deadline_ms"]) for g in again] == [
        (0, 2, 1000, 3500)
    ]
    m.op("nack", 2600, again, delay_ms=0)
    third = m.receive(now=2700)
    assert sorted((g["offset"], g["attempt"], g["first_ms"]) for g in third) == [(0, 3, 1000), (1, 2, 1000)]
    m.produce(0, "c")
    assert [(g["offset"], g["first_ms"]) for g in m.receive(now=4000)] == [(2, 4000)]


def test_the_floor_is_the_committed_offset_and_stays_below_the_first_unfinished(m: Machine) -> None:
    m.produce(0, "a", "b", "c", "d")
    got = m.receive(now=0)
    assert m.floor() == 0
    assert codes(m.op("ack", 1, [got[1], got[2]])) == ["ok", "ok"]
    assert m.floor() == 0  # offset 0 is still in flight
    m.op("ack", 2, [got[0]])
    assert m.floor() == 3
    m.op("ack", 3, [got[3]])
    assert m.floor() == 4
    assert all(pending_record(m.store, G, T, 0, o) is None for o in range(4))


def test_a_stale_receipt_is_refused_per_receipt_and_changes_nothing(m: Machine) -> None:
    m.produce(0, "a", "b")
    first = m.receive(now=0)
    m.op("ack", 1, [first[0]])
    m.tick(now=1000)  # offset 1 expires: retry due at 1100
    again = m.receive(now=1100)
    assert again[0]["attempt"] == 2
    before = m.pairs()
    forged = {**first[1], "offset": 7}
    results = m.op("ack", 1200, [first[0], first[1], forged, {**again[0], "token": 1}])
    assert codes(results) == ["stale_receipt"] * 4
    assert m.pairs() == before
    assert codes(m.op("ack", 1200, [again[0], first[0]])) == ["ok", "stale_receipt"]
    assert m.floor() == 2


def test_ack_after_the_deadline_but_before_the_tick_is_accepted(m: Machine) -> None:
    m.produce(0, "a")
    got = m.receive(now=0)
    assert codes(m.op("ack", 5000, got)) == ["ok"]
    assert m.tick(now=5000)["expired"] == 0


# -- expiry, retry, nack, extend ----------------------------------------------------------------


def test_an_expired_delivery_is_available_again_at_its_deadline_with_attempt_plus_one(m: Machine) -> None:
    # The visibility timeout alone brings it back (issue 21: a 2 s timeout came back after 12 s,
    # the default backoff on top); the backoff is for nacks.
    m.produce(0, "a")
    m.receive(now=0)
    assert m.tick(now=999)["expired"] == 0
    assert m.tick(now=1000) == {"released": 0, "expired": 1, "dead_lettered": 0, "more": False}
    got = m.receive(now=1000)
    assert (got[0]["offset"], got[0]["attempt"], got[0]["deadline_ms"]) == (0, 2, 2000)
    m.tick(now=2000)
    assert m.receive(now=2000)[0]["attempt"] == 3


def test_a_tick_written_as_before_issue_21_still_waits_the_backoff_after_expiry(m: Machine) -> None:
    # Entries of older leaders have no expiry_backoff field: replayed, they apply as they did.
    old_tick = b'{"v":1,"op":"deliver_tick","now_ms":1000,"max":1000}'
    assert commands.deliver_tick(1000, 1000, expiry_backoff=True) == old_tick
    m.produce(0, "a")
    m.receive(now=0)
    assert m.apply(old_tick)["expired"] == 1
    assert m.receive(now=1099) == []  # backoff[0] = 100 ms
    got = m.receive(now=1100)
    assert (got[0]["offset"], got[0]["attempt"]) == (0, 2)
    m.tick(now=2100, expiry_backoff=True)
    assert m.receive(now=2299) == []  # backoff[1] = 200 ms
    assert m.receive(now=2300)[0]["attempt"] == 3


def test_due_retries_come_before_new_messages_oldest_due_first_across_queues(m: Machine) -> None:
    m.produce(0, "a0", "b0")
    m.produce(1, "a1")
    first = m.receive(now=0, queues=[0, 1], max_messages=2)  # q0:0, q0:1
    m.op("nack", 10, [first[1]], delay_ms=5)  # q0:1 due at 15
    q1 = m.receive(now=10, queues=[1])
    m.op("nack", 11, q1, delay_ms=1)  # q1:0 due at 12
    m.op("nack", 20, [first[0]], delay_ms=0)  # q0:0 due at 20
    m.produce(0, "c0")
    got = m.receive(now=20, queues=[0, 1])
    assert [(g["queue"], g["offset"], g["attempt"]) for g in got] == [
        (1, 0, 2),
        (0, 1, 2),
        (0, 0, 2),
        (0, 2, 1),
    ]


def test_nack_without_delay_waits_for_the_backoff_level_of_the_attempt(m: Machine) -> None:
    m.produce(0, "a")
    m.op("nack", 50, m.receive(now=0))
    assert m.receive(now=149) == [] and len(m.receive(now=150)) == 1


def test_extend_moves_the_deadline_and_keeps_the_receipt_valid(m: Machine) -> None:
    m.produce(0, "a")
    got = m.receive(now=0)
    assert m.op("extend", 500, got, visibility_ms=3000) == [{"ok": True, "deadline_ms": 3500}]
    assert m.tick(now=1000)["expired"] == 0  # the old deadline is gone from the index
    assert m.tick(now=3499)["expired"] == 0
    assert codes(m.op("ack", 3400, got)) == ["ok"]
    assert next_due_ms(m.store) is None


# -- dead letters -------------------------------------------------------------------------------


def test_after_max_deliveries_the_message_moves_to_the_dead_letter_topic_with_its_history(m: Machine) -> None:
    m.produce(0, "poison", now=7, key="k", headers={"h": "v"})
    m.produce(0, "fine")
    got = m.receive(now=100, max_messages=1)
    for attempt, now in ((1, 100), (2, 300), (3, 600)):
        assert got[0]["attempt"] == attempt
        results = m.op("nack", now + 50, got, delay_ms=10)
        assert results == ([{"ok": True, "dead_lettered": True}] if attempt == 3 else [{"ok": True}])
        got = m.receive(now=now + 200, max_messages=1)
    assert offsets(got) == [1]  # the next message; the poison one is gone
    assert m.floor() == 1
    (letter,) = read_messages(m.store, DLQ, 0, 0, 10)
    assert (letter.value, letter.key, letter.headers) == (
        b"poison",
        "k",
        {
            "h": "v",
            f"{DLQ_HEADER_PREFIX}topic": "orders",
            f"{DLQ_HEADER_PREFIX}queue": "0",
            f"{DLQ_HEADER_PREFIX}offset": "0",
            f"{DLQ_HEADER_PREFIX}group": G,
            f"{DLQ_HEADER_PREFIX}attempts": "3",
            f"{DLQ_HEADER_PREFIX}first-delivery-ms": "100",
            f"{DLQ_HEADER_PREFIX}last-delivery-ms": "500",
            f"{DLQ_HEADER_PREFIX}timestamp-ms": "7",
            f"{DLQ_HEADER_PREFIX}reason": "nacked",
        },
    )


def test_an_expiring_last_delivery_goes_to_the_dead_letter_topic_in_the_tick(m: Machine) -> None:
    m.produce(0, "a")
    m.receive(now=0)
    for now in (1000, 2000):
        result = m.tick(now=now)
        m.receive(now=now)
    assert result["dead_lettered"] == 0
    assert m.tick(now=3000) == {"released": 0, "expired": 1, "dead_lettered": 1, "more": False}
    assert queue_bounds(m.store, DLQ, 0) == (0, 1)
    assert m.floor() == 1 and next_due_ms(m.store) is None


def test_other_groups_are_unaffected_by_one_groups_retries_and_dead_letters(m: Machine) -> None:
    m.produce(0, "a")
    got = m.receive(now=0)
    other = m.receive(now=0, group="other")
    assert other[0]["attempt"] == 1
    m.op("nack", 1, got, delay_ms=0)
    assert m.receive(now=1, group="other") == []
    assert m.op("ack", 2, other, group="other") == [{"ok": True}]
    assert m.floor(group="other") == 1 and m.floor() == 0


def test_without_a_dead_letter_topic_a_spent_message_is_parked_and_never_handed_out_again() -> None:
    m = Machine()
    m.subscribe(max_deliveries=1, backoff=[100, 5000], dlq=None)
    m.produce(0, "a")
    assert m.op("nack", 10, m.receive(now=0)) == [{"ok": True, "parked": True}]

    def deadline_ms() -> int:
        rec = pending_record(m.store, G, T, 0, 0)
        assert rec is not None and rec.state == keys.STATE_INFLIGHT and rec.attempts == 1
        return rec.time_ms

    assert deadline_ms() == 1010  # looked at again after PARK_MS (the leader creates the topic meanwhile)
    for now, then in ((1009, 1010), (1010, 6010), (6010, 11010)):  # then every last backoff level
        m.tick(now=now)
        assert m.receive(now=now) == []
        assert deadline_ms() == then
    assert m.floor() == 0  # kept (test_dead_letter_topic.py: it moves once there is a topic)


def test_a_spent_message_whose_ttl_passed_is_discarded_not_dead_lettered(m: Machine) -> None:
    m.produce(0, "a", ttl_ms=1000)
    got = m.receive(now=0)
    for now in (100, 200):
        m.op("nack", now, got, delay_ms=0)
        got = m.receive(now=now)
    assert m.op("nack", 1500, got) == [{"ok": True}]
    assert queue_bounds(m.store, DLQ, 0) == (0, 0) and m.floor() == 1


def test_redrive_appends_dead_letters_as_new_messages_only_this_group_receives(m: Machine) -> None:
    m.produce(0, "a", headers={"h": "v"})
    got = m.receive(now=0)
    other = m.receive(now=0, group="other")
    for now in (10, 20):
        m.op("nack", now, got, delay_ms=0)
        got = m.receive(now=now)
    m.op("nack", 30, got)
    m.op("ack", 30, other, group="other")
    result = m.apply(commands.redrive(40, G, T, DLQ, [0, 1], 10))
    assert result == {
        "queues": [
            {"queue": 0, "count": 1, "redrive_offset": 1, "high_offset": 1},
            {"queue": 1, "count": 0, "redrive_offset": 0, "high_offset": 0},
        ],
        "more": False,
    }
    (again,) = m.receive(now=50)
    assert (again["offset"], again["attempt"]) == (1, 1)
    (copy,) = read_messages(m.store, T, 0, 1, 1)
    assert copy.headers == {"h": "v", REDRIVE_GROUP_HEADER: G}
    assert m.receive(now=50, group="other") == []  # skipped: finished for the other group
    assert m.floor(group="other") == 2
    assert m.apply(commands.redrive(60, G, T, DLQ, [0], 10))["queues"][0]["count"] == 0


# -- delayed messages and TTL -------------------------------------------------------------------


def test_delayed_messages_get_offsets_when_released_in_due_order(m: Machine) -> None:
    result = m.apply(
        commands.produce(
            1000,
            [
                {
                    "topic_id": T,
                    "queue": 0,
                    "messages": [
                        {"value": "late", "deliver_at_ms": 3000},
                        {"value": "now"},
                        {"value": "soon", "deliver_at_ms": 2000},
                        {"value": "also-late", "deliver_at_ms": 3000},
                    ],
                }
            ],
        )
    )
    assert result == {"results": [{"topic_id": T, "queue": 0, "base_offset": 0, "count": 1, "delayed": 3}]}
    assert next_due_ms(m.store) == 2000
    assert m.tick(now=1999)["released"] == 0
    assert m.tick(now=2000)["released"] == 1
    assert m.tick(now=3000)["released"] == 2
    values = [(x.value, x.timestamp_ms) for x in read_messages(m.store, T, 0, 0, 10)]
    assert values == [(b"now", 1000), (b"soon", 2000), (b"late", 3000), (b"also-late", 3000)]


def test_a_deliver_tick_does_bounded_work_and_says_when_there_is_more(m: Machine) -> None:
    m.produce(0, *[f"d{i}" for i in range(5)], now=0, deliver_at_ms=10)
    assert m.tick(now=10, max_items=2) == {"released": 2, "expired": 0, "dead_lettered": 0, "more": True}
    assert m.tick(now=10, max_items=2)["more"] is True
    assert m.tick(now=10, max_items=2) == {"released": 1, "expired": 0, "dead_lettered": 0, "more": False}
    assert queue_bounds(m.store, T, 0) == (0, 5)


def test_expired_messages_are_never_received_and_the_floor_moves_past_them(m: Machine) -> None:
    m.produce(0, "short", now=0, ttl_ms=100)
    m.produce(0, "long", now=0, ttl_ms=10_000)
    m.produce(0, "old", now=0)
    assert offsets(m.receive(now=100)) == [1, 2]
    assert m.receive(now=100, group="aged", max_age_ms=50) == []  # a topic's retention as TTL
    assert m.floor(group="aged") == 3
    ttl = [x.expires_at_ms for x in read_messages(m.store, T, 0, 0, 3)]
    assert ttl == [100, 10_000, None]


def test_a_delayed_messages_ttl_counts_from_its_due_time(m: Machine) -> None:
    m.produce(0, "x", now=0, deliver_at_ms=1000, ttl_ms=500)
    m.tick(now=1000)
    assert read_messages(m.store, T, 0, 0, 1)[0].expires_at_ms == 1500
    assert offsets(m.receive(now=1499)) == [0]


def test_a_receive_does_bounded_work_on_expired_messages(m: Machine) -> None:
    m.produce(0, *["x"] * (SCAN_BUDGET + 10), now=0, ttl_ms=1)
    assert m.receive(now=10) == []
    assert m.floor() == SCAN_BUDGET
    m.produce(0, "fresh", now=10)
    assert offsets(m.receive(now=10)) == [SCAN_BUDGET + 10]


# -- offsets committed by offset consumers ------------------------------------------------------


def test_a_commit_above_the_floor_finishes_what_is_below_it(m: Machine) -> None:
    m.produce(0, "a", "b", "c", "d")
    got = m.receive(now=0, max_messages=3)
    assert m.apply(commands.commit_offsets(G, T, {0: 2}))["offsets"] == {"0": {"offset": 2, "applied": True}}
    assert codes(m.op("ack", 1, got)) == ["stale_receipt", "stale_receipt", "ok"]
    assert m.floor() == 3
    assert m.tick(now=5000)["expired"] == 0  # the index entries of the finished ones were dangling
    assert offsets(m.receive(now=5000)) == [3]


def test_a_commit_below_the_floor_rewinds_and_redelivers_as_new(m: Machine) -> None:
    m.produce(0, "a", "b", "c")
    got = m.receive(now=0)
    m.op("ack", 1, got[:2])
    m.apply(commands.commit_offsets(G, T, {0: 1}))
    again = m.receive(now=2)
    assert [(g["offset"], g["attempt"]) for g in again] == [(1, 1), (2, 1)]
    assert codes(m.op("ack", 3, got[2:])) == ["stale_receipt"]


def test_a_commit_beyond_the_cursor_skips_ahead(m: Machine) -> None:
    m.produce(0, "a", "b", "c")
    m.receive(now=0, max_messages=1)
    m.apply(commands.commit_offsets(G, T, {0: 3}))
    m.produce(0, "d")
    assert offsets(m.receive(now=1)) == [3]


# -- locks ---------------------------------------------------------------------------------------


def lock(m: Machine, now: int, consumer: str, lease_ms: int = 100) -> dict[str, Any]:
    return m.apply(commands.lock(now, G, T, 0, consumer, lease_ms))


def test_a_lock_is_exclusive_until_its_lease_ends_and_each_new_holder_gets_the_next_epoch(m: Machine) -> None:
    assert lock(m, 0, "a") == {"consumer": "a", "epoch": 1, "lease_until_ms": 100, "committed_offset": None}
    held = lock(m, 50, "b")["error"]
    assert (held["code"], held["holder"], held["lease_until_ms"], held["retriable"]) == (
        "lock_held",
        "a",
        100,
        False,
    )
    assert lock(m, 60, "a")["epoch"] == 1  # renewal keeps the epoch
    assert lock(m, 161, "b")["epoch"] == 2
    assert m.apply(commands.unlock(G, T, 0, "a", 1)) == {"released": False}
    assert m.apply(commands.unlock(G, T, 0, "b", 2)) == {"released": True}
    assert lock(m, 170, "b")["epoch"] == 3  # released: the same consumer is a new holder


def test_commits_and_acks_from_a_stale_holder_are_refused(m: Machine) -> None:
    m.produce(0, "a", "b")
    lock(m, 0, "a")
    assert m.apply(commands.commit_fenced(G, T, {0: 1}, 1))["ok"] is True
    lock(m, 200, "b")
    assert lock(m, 200, "b")["committed_offset"] == 1
    before = m.pairs()
    refused = m.apply(commands.commit_fenced(G, T, {0: 2}, 1))
    assert (refused["error"]["code"], refused["error"]["epoch"]) == ("stale_epoch", 2)
    assert m.pairs() == before
    got = m.receive(now=210, epoch=2)
    assert offsets(got) == [1]
    stale = m.apply(commands.ack(211, G, T, [(0, 1, got[0]["token"])], epoch=1))
    assert stale["error"]["code"] == "stale_epoch"
    assert codes(m.op("ack", 212, got, epoch=2)) == ["ok"]


def test_receive_leaves_out_queues_locked_by_someone_and_needs_the_epoch_under_a_lock(m: Machine) -> None:
    m.produce(0, "locked")
    m.produce(1, "free")
    lock(m, 0, "a")
    assert [(g["queue"], g["offset"]) for g in m.receive(now=10, queues=[0, 1])] == [(1, 0)]
    refused = m.apply(commands.receive(10, G, T, [0], 10, 1000, epoch=7))
    assert refused["error"]["code"] == "stale_epoch"
    assert offsets(m.receive(now=10, queues=[0], epoch=1)) == [0]
    assert available(m.store, G, T, [0], 50) == (False, 100)  # wake when the lease ends


# -- housekeeping --------------------------------------------------------------------------------


def test_drop_topic_removes_the_delivery_state_and_the_tick_clears_dangling_entries(m: Machine) -> None:
    m.produce(0, "a")
    m.produce(0, "later", deliver_at_ms=50)
    m.receive(now=0)
    m.apply(commands.lock(0, G, T, 1, "c", 10))
    m.apply(commands.drop_topic(T))
    assert {k[:1] for k, _ in m.pairs()} == {keys.DROPPED, keys.DEADLINE, keys.DELAYED}
    assert m.tick(now=5000) == {"released": 1, "expired": 0, "dead_lettered": 0, "more": False}
    assert {k[:1] for k, _ in m.pairs()} == {keys.DROPPED}
    assert m.apply(commands.receive(1, G, T, [0], 1, 1))["error"]["code"] == "topic_not_found"


def test_subscribe_keeps_settings_unless_overwritten_and_keeps_a_known_dead_letter_topic(m: Machine) -> None:
    kept = m.apply(commands.subscribe(G, T, "orders", None, 16, [1]))
    assert kept == {
        "subscription": {
            "topic": "orders",
            "dlq_topic_id": DLQ,
            "max_deliveries": 3,
            "backoff_ms": [100, 200],
            "dlq_checked": True,
        },
        "changed": False,
    }
    changed = m.apply(commands.subscribe(G, T, "orders", 9, 5, [7], overwrite=True))["subscription"]
    assert changed == {"topic": "orders", "dlq_topic_id": 9, "max_deliveries": 5, "backoff_ms": [7]}


def test_available_says_when_a_receive_would_find_something(m: Machine) -> None:
    assert available(m.store, G, T, [0], 0) == (False, None)
    m.produce(0, "a")
    assert available(m.store, G, T, [0], 0) == (True, None)
    m.op("nack", 10, m.receive(now=0), delay_ms=90)
    assert available(m.store, G, T, [0], 50) == (False, 100)
    assert available(m.store, G, T, [0], 100) == (True, None)


@pytest.mark.parametrize(
    "command",
    [
        commands.receive(0, G, T, [0, 0], 1, 1),
        commands.receive(0, G, T, [0], 0, 1),
        commands.receive(0, G, T, [0], 1, 0),
        commands.receive(2**62 + 1, G, T, [0], 1, 1),
        commands.ack(0, G, T, []),
        commands.nack(0, G, T, [(0, 0, 0)], delay_ms=2**40 + 1),
        commands.deliver_tick(0, 0),
        b'{"v": 1, "op": "deliver_tick", "now_ms": 0, "max": 1, "expiry_backoff": 0}',
        commands.lock(0, G, T, 0, "", 1),
        commands.subscribe(G, T, "t", None, 0, [1]),
        commands.subscribe(G, T, "t", None, 1, []),
        commands.redrive(0, G, T, DLQ, [], 1),
        b'{"v": 1, "op": "ack", "now_ms": 0, "group": "g", "topic_id": 1, "receipts": [[0, 0]]}',
        b'{"v": 1, "op": "extend", "now_ms": 0, "group": "g", "topic_id": 1, "receipts": [[0, 0, 1]]}',
        b'{"v": 1, "op": "subscribe", "group": "g", "topic_id": 1, "topic": "t", "max_deliveries": 1,'
        b' "backoff_ms": [1], "overwrite": 1}',
        b'{"v": 1, "op": "produce", "now_ms": 0, "batches": [{"topic_id": 1, "queue": 0, "messages":'
        b' [{"value": "a", "ttl_ms": true}]}]}',
    ],
)
def test_malformed_delivery_commands_are_refused_and_change_nothing(m: Machine, command: bytes) -> None:
    m.produce(0, "a")
    before = m.pairs()
    assert m.apply(command)["error"]["code"] == "bad_request"
    assert m.pairs() == before


def test_an_advance_only_fenced_commit_older_than_the_stored_one_is_kept(m: Machine) -> None:
    m.produce(0, "a", "b", "c")
    lock(m, 0, "a")
    assert m.apply(commands.commit_fenced(G, T, {0: 3}, 1, advance=True))["offsets"]["0"]["applied"] is True
    late = m.apply(commands.commit_fenced(G, T, {0: 1}, 1, advance=True))
    assert late["offsets"] == {"0": {"offset": 3, "applied": False}}
    assert m.floor() == 3
