"""``ack_receive`` and ``release`` in the queue-group state machine: a delete that takes the next
messages along in the same entry, and a read-ahead nobody received given back uncounted. Pure: a
machine over a MemoryStore, time from commands."""

from __future__ import annotations

from typing import Any

import pytest
from test_delivery import G, Machine, T, codes, offsets

from raftmq.cluster import commands
from raftmq.cluster.machines.delivery import NEVER_DEAD_LETTERED
from raftmq.storage.keys import STATE_INFLIGHT, STATE_RETRY
from raftmq.storage.queues import pending_record


def ack_receive(
    m: Machine, now: int, acked: list[dict[str, Any]], max_messages: int = 10, visibility_ms: int = 1000
) -> tuple[list[Any], list[dict[str, Any]]]:
    receipts = [(d["queue"], d["offset"], d["token"]) for d in acked]
    result = m.apply(commands.ack_receive(now, G, T, receipts, [0], max_messages, visibility_ms))
    assert "results" in result and "messages" in result, result
    return list(result["results"]), [{**d, "token": result["token"]} for d in result["messages"]]


@pytest.fixture
def m() -> Machine:
    """A subscription as the SQS API stores it: no dead letters (a read-ahead's only kind)."""
    machine = Machine()
    machine.subscribe(max_deliveries=NEVER_DEAD_LETTERED, dlq=None)
    return machine


@pytest.mark.parametrize("max_deliveries", [1, 3, NEVER_DEAD_LETTERED - 1])
def test_ack_receive_of_a_subscription_that_dead_letters_acks_and_takes_nothing(max_deliveries: int) -> None:
    """A read-ahead no consumer got (its node crashed) comes back counted as a delivery; with
    dead letters that count could move a message nobody received, so nothing is taken ahead."""
    m = Machine()
    m.subscribe(max_deliveries=max_deliveries)
    m.produce(0, "a", "b", "c")
    first = m.receive(10, max_messages=1)
    results, got = ack_receive(m, 20, first)
    assert codes(results) == ["ok"]
    assert got == []
    assert m.floor() == 1
    assert offsets(m.receive(30)) == [1, 2]  # still there, first deliveries


def test_ack_receive_finishes_the_receipts_and_hands_out_the_next_messages_in_one_entry(m: Machine) -> None:
    m.produce(0, *[f"v{i}" for i in range(6)])
    first = m.receive(10, max_messages=3)
    results, second = ack_receive(m, 20, first, max_messages=3, visibility_ms=500)

    assert codes(results) == ["ok"] * 3
    assert offsets(second) == [3, 4, 5]
    assert [d["attempt"] for d in second] == [1, 1, 1]
    assert {d["deadline_ms"] for d in second} == {520}
    assert m.floor() == 3  # the acked ones are finished, the new ones in flight
    assert [pending_record(m.store, G, T, 0, o) for o in (0, 1, 2)] == [None, None, None]
    assert m.op("ack", 30, second) == [{"ok": True}] * 3
    assert m.floor() == 6


def test_ack_receive_answers_a_stale_receipt_per_receipt_and_still_receives(m: Machine) -> None:
    m.produce(0, "a", "b")
    first = m.receive(10, max_messages=1)
    stale = [{**first[0], "token": first[0]["token"] + 99}]
    results, got = ack_receive(m, 20, stale)
    assert codes(results) == ["stale_receipt"]
    assert offsets(got) == [1]
    assert pending_record(m.store, G, T, 0, 0) is not None  # the real delivery is still in flight


def test_ack_receive_of_a_dropped_topic_is_refused_whole_and_changes_nothing(m: Machine) -> None:
    m.produce(0, "a", "b")
    first = m.receive(10, max_messages=1)
    m.apply(commands.drop_topic(T))
    before = m.pairs()
    receipts = [(d["queue"], d["offset"], d["token"]) for d in first]
    result = m.apply(commands.ack_receive(20, G, T, receipts, [0], 10, 1000))
    assert "error" in result
    assert m.pairs() == before


def test_release_makes_a_delivery_visible_at_once_without_counting_it(m: Machine) -> None:
    m.produce(0, "a", "b")
    first = m.receive(10, max_messages=2)
    assert m.op("nack", 20, first[:1], delay_ms=0) == [{"ok": True}]
    again = m.receive(30, max_messages=1)
    assert [d["attempt"] for d in again] == [2]
    # offset 0 (attempt 2) and offset 1 (attempt 1) given back: each is handed out next with the
    # count it had before the delivery given back
    assert m.op("release", 40, [*again, first[1]]) == [{"ok": True}, {"ok": True}]
    rec = pending_record(m.store, G, T, 0, 1)
    assert rec is not None and rec.state == STATE_RETRY and rec.attempts == 0 and rec.time_ms == 40
    later = m.receive(50, max_messages=2)
    assert sorted((d["offset"], d["attempt"]) for d in later) == [(0, 2), (1, 1)]
    assert all(pending_record(m.store, G, T, 0, d["offset"]).state == STATE_INFLIGHT for d in later)  # type: ignore[union-attr]


def test_release_refuses_a_receipt_of_an_earlier_delivery_and_changes_nothing(m: Machine) -> None:
    m.produce(0, "a")
    first = m.receive(10, max_messages=1)
    assert m.op("ack", 20, first) == [{"ok": True}]
    before = m.pairs()
    assert codes(m.op("release", 30, first)) == ["stale_receipt"]
    assert m.pairs() == before
    assert m.floor() == 1


@pytest.mark.parametrize(
    "command",
    [
        b'{"v":1,"op":"ack_receive","now_ms":1,"group":"g","topic_id":1,"receipts":[],"queues":[0],"max":0,"visibility_ms":1}',
        b'{"v":1,"op":"ack_receive","now_ms":1,"group":"g","topic_id":1,"receipts":[[0,0,1]],"queues":[0],"max":1,"visibility_ms":1,"epoch":3}',
        b'{"v":1,"op":"ack_receive","now_ms":1,"group":"g","topic_id":1,"receipts":[[0,0,1]],"queues":[0,0],"max":1,"visibility_ms":1}',
        b'{"v":1,"op":"release","now_ms":1,"group":"g","topic_id":1,"receipts":[[0,0]]}',
        b'{"v":1,"op":"release","now_ms":1,"group":"g","topic_id":1,"receipts":[[0,0,1]],"delay_ms":5}',
        # A release is never fenced: an epoch it would ignore is refused.
        b'{"v":1,"op":"release","now_ms":1,"group":"g","topic_id":1,"receipts":[[0,0,1]],"epoch":3}',
    ],
)
def test_malformed_ack_receive_and_release_are_refused_and_change_nothing(m: Machine, command: bytes) -> None:
    m.produce(0, "a")
    m.receive(10, max_messages=1)
    before = m.pairs()
    result = m.apply(command)
    assert result["error"]["code"] == "bad_request"
    assert [(k, v) for k, v in m.pairs()] == before


def test_ack_receive_and_release_are_new_ops_gated_for_rolling_upgrades() -> None:
    from raftmq.cluster.replication.upgrade import (
        BEFORE_CAPABILITIES,
        capability_of,
        previous_release_refuses,
    )

    taken = commands.ack_receive(0, G, T, [(0, 0, 1)], [0], 10, 1000)
    released = commands.release(0, G, T, [(0, 0, 1)])
    assert capability_of("1", taken) == "ack_receive" and capability_of("1", released) == "release"
    assert not {"ack_receive", "release"} & BEFORE_CAPABILITIES
    assert previous_release_refuses(taken) and previous_release_refuses(released)
    assert commands.OPS[-2:] == ("ack_receive", "release")
