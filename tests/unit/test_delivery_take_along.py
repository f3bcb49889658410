"""An ``append``'s take-along (the field level ``append.take``) in the queue-group state machine: a
send that hands its messages (and the queue's other visible ones) to a receive waiting at the
leader, in the send's own entry. Pure: a machine over a MemoryStore, time from commands."""

from __future__ import annotations

from typing import Any

import pytest
from test_delivery import DLQ, G, Machine, T, offsets

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.delivery import NEVER_DEAD_LETTERED
from raftmq.storage.keys import STATE_INFLIGHT
from raftmq.storage.queues import pending_record


def batch(*values: str, ttl_ms: int = 0, delay_ms: int = 0) -> bytes:
    builder = rb.BatchBuilder(None, 0, base_timestamp_ms=0, timestamps=False)
    for v in values:
        builder.append(v, None, None, delay_ms, ttl_ms)
    return builder.finish()


def take(max_messages: int = 10, visibility_ms: int = 1000) -> dict[str, Any]:
    return {
        "group": G,
        "topic_id": T,
        "queues": [0],
        "max": max_messages,
        "visibility_ms": visibility_ms,
        "max_age_ms": None,
    }


def send(
    m: Machine, now: int, *values: str, taking: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    result = m.apply(commands.append(now, [(T, 0, batch(*values, **kw))], taking))
    assert "results" in result, result
    return result


@pytest.fixture
def m() -> Machine:
    """A subscription as the SQS API stores it: no dead letters."""
    machine = Machine()
    machine.subscribe(max_deliveries=NEVER_DEAD_LETTERED, dlq=None)
    return machine


def test_a_send_takes_its_own_messages_along_in_flight_with_the_receives_visibility(m: Machine) -> None:
    result = send(m, 10, "a", "b", "c", taking=take(max_messages=10, visibility_ms=500))
    assert result["results"][0]["base_offset"] == 0 and result["results"][0]["count"] == 3
    assert result["token"] == m.index
    assert offsets(result["messages"]) == [0, 1, 2]
    assert {(d["attempt"], d["deadline_ms"], d["first_ms"]) for d in result["messages"]} == {(1, 510, 10)}
    for o in (0, 1, 2):
        rec = pending_record(m.store, G, T, 0, o)
        assert rec is not None and rec.state == STATE_INFLIGHT and rec.token == m.index
    assert m.receive(20) == []  # nothing left visible: the take-along has them


def test_a_take_along_takes_up_to_its_max_older_visible_messages_first(m: Machine) -> None:
    m.produce(0, "old1", "old2")
    result = send(m, 10, "n1", "n2", "n3", taking=take(max_messages=3))
    assert offsets(result["messages"]) == [0, 1, 2]
    assert offsets(m.receive(20)) == [3, 4]  # the rest is still visible


def test_a_take_along_hands_out_the_same_as_a_receive_entry_after_the_send(m: Machine) -> None:
    """Determinism: the take-along's records are those a receive applied right after the append
    would write (same offsets, deadlines, first times), and the stored state the same but for
    the receipt token."""
    other = Machine()
    other.subscribe(max_deliveries=NEVER_DEAD_LETTERED, dlq=None)
    for machine in (m, other):
        machine.produce(0, "x", now=1)
    together = send(m, 10, "a", "b", taking=take(max_messages=2))
    send(other, 10, "a", "b")
    separate = other.receive(10, max_messages=2)
    strip = [{k: v for k, v in d.items() if k != "token"} for d in separate]
    assert together["messages"] == strip
    for o in (0, 1):
        a, b = pending_record(m.store, G, T, 0, o), pending_record(other.store, G, T, 0, o)
        assert a is not None and b is not None
        assert (a.state, a.attempts, a.time_ms) == (b.state, b.attempts, b.time_ms)


def test_a_take_along_of_a_line_with_nothing_visible_takes_nothing_and_the_append_stands(m: Machine) -> None:
    m.produce(0, "a")
    m.receive(5, max_messages=1)  # in flight
    result = send(m, 10, "later", delay_ms=60_000, taking=take())  # delayed: not visible yet
    assert result["messages"] == []
    assert result["results"][0]["delayed"] == 1


def test_a_take_along_skips_expired_messages_and_delivers_one_of_its_entry_with_a_short_ttl(
    m: Machine,
) -> None:
    send(m, 0, "old", ttl_ms=5)  # expires at 5
    send(m, 1, "kept", ttl_ms=60_000)
    result = send(m, 10, "short", ttl_ms=1, taking=take())
    # now_ms 10: offset 0 expired (skipped); 2's TTL of 1 ms from 10 expires at 11, deliverable at 10
    assert offsets(result["messages"]) == [1, 2]
    assert m.receive(20) == []  # the expired one is never handed out


@pytest.mark.parametrize("max_deliveries", [1, 3, NEVER_DEAD_LETTERED - 1])
def test_a_take_along_for_a_subscription_that_dead_letters_takes_nothing(max_deliveries: int) -> None:
    """As ``ack_receive``'s read-ahead: a take-along whose node crashed would count a delivery
    nobody got, so a subscription that dead-letters (a RedrivePolicy's queue) takes nothing."""
    m = Machine()
    m.subscribe(max_deliveries=max_deliveries, dlq=DLQ)
    result = send(m, 10, "a", "b", taking=take())
    assert result["messages"] == [] and result["results"][0]["count"] == 2
    assert offsets(m.receive(20)) == [0, 1]  # still there, first deliveries


def test_a_take_along_for_a_group_with_no_subscription_takes_nothing_and_writes_no_state() -> None:
    m = Machine()
    result = send(m, 10, "a", taking=take())
    assert result["messages"] == []
    assert pending_record(m.store, G, T, 0, 0) is None


def test_a_take_along_of_two_batches_of_one_queue_reads_both(m: Machine) -> None:
    command = commands.append(10, [(T, 0, batch("a", "b")), (T, 0, batch("c"))], take(max_messages=10))
    result = m.apply(command)
    assert offsets(result["messages"]) == [0, 1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        {**take(), "max": 0},
        {**take(), "max": commands.MAX_RECEIVE + 1},
        {**take(), "queues": []},
        {**take(), "queues": [0, 0]},
        {**take(), "epoch": 3},
        {**take(), "visibility_ms": 0},
        {**take(), "group": ""},
        {k: v for k, v in take().items() if k != "topic_id"},
    ],
)
def test_a_malformed_take_along_refuses_the_entry_and_changes_nothing(
    m: Machine, bad: dict[str, Any]
) -> None:
    before = m.pairs()
    result = m.apply(commands.append(10, [(T, 0, batch("a"))], bad))
    assert result["error"]["code"] == "bad_request"
    assert m.pairs() == before


def test_a_cut_take_along_is_refused() -> None:
    data = commands.append(10, [(T, 0, batch("a"))], take())
    with pytest.raises(commands.BadCommand):
        commands.decode(data[:-3])
    with pytest.raises(commands.BadCommand):
        commands.split_append(data)  # a peer never forwards one


def test_the_take_along_is_a_field_level_gated_for_rolling_upgrades() -> None:
    from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES, previous_release_refuses

    assert commands.FIELD_LEVELS[-1] == "append.take"
    assert "append.take" in CAPABILITIES and "append.take" not in BEFORE_CAPABILITIES
    plain = commands.append(0, [(T, 0, batch("a"))])
    taking = commands.append(0, [(T, 0, batch("a"))], take())
    assert not commands.has_take(plain) and commands.has_take(taking)
    assert not previous_release_refuses(plain) and previous_release_refuses(taking)
