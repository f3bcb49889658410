"""The read-only views behind the metrics and the consumer-group API (cluster/machines/views.py), over the
pure queue-group machine: queue bounds, lag, in flight, retrying and dead letters per group, and
delayed messages per queue."""

from __future__ import annotations

from typing import Any

from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.machines.views import ConsumerQueue, consumer_queues, delayed_messages, queue_metas
from raftmq.storage.memory import MemoryStore

T, DLQ, OTHER = 1, 2, 3  # topic ids
G = "g"


class Machine:
    """A queue-group machine that numbers its entries, with shortcuts for the delivery ops."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 0)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(self, queue: int, *values: str, topic: int = T) -> None:
        msgs = [{"value": v} for v in values]
        assert "results" in self.apply(
            commands.produce(0, [{"topic_id": topic, "queue": queue, "messages": msgs}])
        )

    def subscribe(self, max_deliveries: int, backoff: list[int] | None = None) -> None:
        result = self.apply(
            commands.subscribe(G, T, "orders", DLQ, max_deliveries, backoff or [100], checked=True)
        )
        assert "subscription" in result, result

    def receive(self, now: int, max_messages: int = 100) -> list[dict[str, Any]]:
        result = self.apply(commands.receive(now, G, T, [0], max_messages, 1000))
        return [{**m, "token": result["token"]} for m in result["messages"]]

    def op(self, name: str, now: int, delivered: list[dict[str, Any]], **kw: Any) -> None:
        receipts = [(m["queue"], m["offset"], m["token"]) for m in delivered]
        result = self.apply(getattr(commands, name)(now, G, T, receipts, **kw))
        assert all(r.get("ok") for r in result["results"]), result


def test_queue_metas_lists_every_queue_or_one_topics() -> None:
    m = Machine()
    m.produce(0, "a", "b")
    m.produce(1, "c")
    m.produce(0, "x", topic=OTHER)
    metas = queue_metas(m.store)
    assert sorted(metas) == [(T, 0), (T, 1), (OTHER, 0)]
    assert (metas[(T, 0)].low_offset, metas[(T, 0)].high_offset) == (0, 2)
    assert metas[(T, 0)].retained_bytes > 0
    assert list(queue_metas(m.store, OTHER)) == [(OTHER, 0)]


def test_an_offset_consumer_has_a_row_per_queue_of_the_topic_with_its_lag() -> None:
    m = Machine()
    m.produce(0, *"abcde")
    m.produce(1, *"xyz")
    m.apply(commands.commit_offsets("billing", T, {0: 2}))
    rows = consumer_queues(m.store)
    assert rows == [
        ConsumerQueue(T, 0, "billing", committed_offset=2, high_offset=5, lag=3),
        # Nothing committed on queue 1: everything retained is lag.
        ConsumerQueue(T, 1, "billing", committed_offset=None, high_offset=3, lag=3),
    ]
    assert consumer_queues(m.store, OTHER) == []


def test_a_receive_ack_group_without_a_dead_letter_topic_lags_by_everything_it_has_not_received() -> None:
    # Issue 21: a group that had received 6 of 101,500 messages, all from one queue group, showed
    # the lag of that group's queue only: the other queue groups hold its subscription (stored
    # there at its first receive, with no dead-letter topic yet) but no cursor.
    m = Machine()
    assert "subscription" in m.apply(commands.subscribe(G, T, "orders", None, 16, [100]))
    m.produce(0, *"abcde")
    m.produce(1, *"xyz")
    assert consumer_queues(m.store, T) == [
        ConsumerQueue(T, 0, G, committed_offset=None, high_offset=5, lag=5),
        ConsumerQueue(T, 1, G, committed_offset=None, high_offset=3, lag=3),
    ]
    got = m.apply(commands.receive(0, G, T, [0], 2, 1000))["messages"]
    assert [g["offset"] for g in got] == [0, 1]
    rows = {r.queue: r for r in consumer_queues(m.store, T)}
    assert (rows[0].lag, rows[0].in_flight, rows[1].lag) == (5, 2, 3)  # in flight is not done


def test_in_flight_retrying_and_dead_letters_follow_receive_nack_expiry_and_redrive() -> None:
    m = Machine()
    m.subscribe(max_deliveries=2, backoff=[100])
    m.produce(0, *"abcd")
    got = m.receive(now=0, max_messages=3)  # offsets 0, 1, 2 in flight until 1000

    def row() -> ConsumerQueue:
        (r,) = [r for r in consumer_queues(m.store, T) if r.group == G]
        return r

    assert (row().in_flight, row().retrying, row().dead_letters, row().lag) == (3, 0, 0, 4)
    m.op("ack", 10, got[2:])
    m.op("nack", 10, got[1:2], delay_ms=500)  # offset 1 waits for a retry
    assert (row().in_flight, row().retrying, row().committed_offset) == (1, 1, 0)
    m.op("nack", 20, got[:1])
    again = m.receive(now=200, max_messages=1)  # offset 0 again (due at 120), attempt 2
    assert (again[0]["offset"], again[0]["attempt"]) == (0, 2)
    m.op("nack", 210, again)  # its last delivery: dead-lettered
    assert (row().in_flight, row().retrying, row().dead_letters) == (0, 1, 1)
    assert m.apply(commands.redrive(300, G, T, DLQ, [0], 10))["queues"][0]["count"] == 1
    assert (row().dead_letters, row().high_offset) == (0, 5)  # the redriven copy is offset 4


def test_the_dead_letter_topic_is_a_queue_too() -> None:
    m = Machine()
    m.subscribe(max_deliveries=1)
    m.produce(0, "poison")
    m.op("nack", 0, m.receive(now=0))
    meta = queue_metas(m.store, DLQ)[(DLQ, 0)]
    assert (meta.low_offset, meta.high_offset) == (0, 1)
    (r,) = consumer_queues(m.store, T)
    assert (r.dead_letters, r.committed_offset, r.lag) == (1, 1, 0)


def test_delayed_messages_counts_a_topics_unreleased_messages_per_queue_until_released() -> None:
    m = Machine()

    def delayed(queue: int, due_ms: int, n: int, topic: int = T) -> None:
        msgs = [{"value": f"d{i}", "deliver_at_ms": due_ms} for i in range(n)]
        assert "results" in m.apply(
            commands.produce(0, [{"topic_id": topic, "queue": queue, "messages": msgs}])
        )

    m.produce(0, "now")  # not delayed: not counted
    delayed(0, 1000, 2)
    delayed(1, 5000, 3)
    delayed(0, 3000, 4, topic=OTHER)
    assert delayed_messages(m.store, T) == ({0: 2, 1: 3}, True)
    assert delayed_messages(m.store, OTHER) == ({0: 4}, True)
    assert delayed_messages(m.store, DLQ) == ({}, True)
    m.apply(commands.deliver_tick(1000, 1000))  # T's queue 0 released: appended, no longer delayed
    assert delayed_messages(m.store, T) == ({1: 3}, True)
    # Bounded: the entries due first only (OTHER's 4 due at 3000, then T's 3 at 5000).
    assert delayed_messages(m.store, T, max_keys=5) == ({1: 1}, False)
    assert delayed_messages(m.store, T, max_keys=7) == ({1: 3}, True)
