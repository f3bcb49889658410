"""Dead letters without a dead-letter topic in the queue-group state machine: parked, reported to
the leader (``Applied.parked``), and moved to the dead-letter topic once the leader recorded it.
Pure: a machine over a MemoryStore (``test_delivery.Machine``), time from commands."""

from __future__ import annotations

import pytest
from test_delivery import DLQ, G, Machine, T

from raftmq.cluster import commands
from raftmq.cluster.machines.delivery import DLQ_HEADER_PREFIX
from raftmq.cluster.machines.queue_group import Applied
from raftmq.storage.queues import next_due_ms, queue_bounds, read_messages


@pytest.mark.parametrize("reason", ["nacked", "expired"])
def test_a_parked_message_is_reported_and_moves_to_the_dead_letter_topic_once_there_is_one(
    reason: str,
) -> None:
    m = Machine()
    applied: list[Applied] = []
    m.machine.on_applied = applied.append
    m.subscribe(max_deliveries=1, backoff=[100, 5000], dlq=None)
    m.produce(0, "a", now=3)
    got = m.receive(now=10)
    if reason == "nacked":
        assert m.op("nack", 20, got) == [{"ok": True, "parked": True}]
    else:
        assert m.tick(now=1010) == {"released": 0, "expired": 1, "dead_lettered": 0, "more": False}
    parked_at = 20 if reason == "nacked" else 1010
    assert applied[-1].parked == ((T, "orders", G),)  # the leader creates the dead-letter topic
    assert queue_bounds(m.store, DLQ, 0) == (0, 0) and m.floor() == 0
    # The leader records the new dead-letter topic; the stored settings stay.
    stored = m.apply(commands.subscribe(G, T, "orders", DLQ, 16, [1], checked=True))["subscription"]
    assert stored == {
        "topic": "orders",
        "dlq_topic_id": DLQ,
        "max_deliveries": 1,
        "backoff_ms": [100, 5000],
        "dlq_checked": True,
    }
    assert m.tick(now=parked_at + 999)["dead_lettered"] == 0  # still parked
    assert m.receive(now=parked_at + 999) == [] and queue_bounds(m.store, DLQ, 0) == (0, 0)
    moved = m.tick(now=parked_at + 1000)  # looked at after PARK_MS: moved, no receiver needed
    assert moved == {"released": 0, "expired": 1, "dead_lettered": 1, "more": False}
    assert not applied[-1].parked
    (letter,) = read_messages(m.store, DLQ, 0, 0, 10)
    assert letter.value == b"a" and letter.headers is not None
    assert letter.headers[f"{DLQ_HEADER_PREFIX}reason"] == reason
    assert letter.headers[f"{DLQ_HEADER_PREFIX}attempts"] == "1"
    assert letter.headers[f"{DLQ_HEADER_PREFIX}first-delivery-ms"] == "10"
    assert m.floor() == 1 and next_due_ms(m.store) is None


def test_a_parked_message_waits_while_there_is_no_dead_letter_topic_and_is_reported_again() -> None:
    m = Machine()
    applied: list[Applied] = []
    m.machine.on_applied = applied.append
    m.subscribe(max_deliveries=1, backoff=[5000], dlq=None)
    m.produce(0, "a")
    assert m.op("nack", 10, m.receive(now=0)) == [{"ok": True, "parked": True}]
    applied.clear()
    m.tick(now=1010)  # no topic yet: parked again for the last level, never handed out again
    assert applied[-1].parked == ((T, "orders", G),)  # the leader is asked again
    assert m.receive(now=6009) == [] and m.tick(now=6009)["expired"] == 0
    m.apply(commands.subscribe(G, T, "orders", DLQ, 16, [1], checked=True))
    assert m.tick(now=6010)["dead_lettered"] == 1
    (letter,) = read_messages(m.store, DLQ, 0, 0, 10)
    assert letter.headers is not None and letter.headers[f"{DLQ_HEADER_PREFIX}reason"] == "nacked"
    assert m.floor() == 1


def test_a_dead_letter_topic_given_again_replaces_the_stored_one_and_keeps_the_settings() -> None:
    m = Machine()
    m.subscribe(max_deliveries=5, backoff=[7], dlq=DLQ)
    kept = m.apply(commands.subscribe(G, T, "orders", None, 16, [1]))["subscription"]
    assert kept == {
        "topic": "orders",
        "dlq_topic_id": DLQ,
        "max_deliveries": 5,
        "backoff_ms": [7],
        "dlq_checked": True,
    }
    # Given by an older leader (not checked): stored, but unchecked until a checked one replaces it.
    again = m.apply(commands.subscribe(G, T, "orders", 11, 16, [1]))["subscription"]
    assert again == {"topic": "orders", "dlq_topic_id": 11, "max_deliveries": 5, "backoff_ms": [7]}
