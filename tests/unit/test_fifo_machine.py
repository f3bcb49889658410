"""The state-machine pieces of FIFO queues: ``dedup_produce`` (the replicated deduplication window:
expiry on the command's time, its bound, replay) and ``receive_ordered`` (a message's key as its
message group). Pure: machines over a MemoryStore and a RocksStore, time from commands."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.machines import dedup
from raftmq.cluster.machines.delivery import available_ordered, not_due
from raftmq.cluster.machines.delivery.ordered import PENDING_CAP, OrderedLooks
from raftmq.cluster.machines.delivery.state import SCAN_BUDGET
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import dedup_keys, keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import read_messages
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store

T = 1
G = "sqs"
WINDOW = dedup.DEDUP_WINDOW_MS


def send(dedup_key: str, value: str = "v", key: str = "g", message_id: str | None = None) -> dict[str, Any]:
    return {"value": value, "key": key, "dedup": dedup_key, "id": message_id or f"id-{dedup_key}-{value}"}


class Machine:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or MemoryStore()
        self.machine = QueueGroupMachine(self.store, 0)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def send(self, now: int, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        result = self.apply(commands.dedup_produce(now, T, 0, list(messages)))
        assert "results" in result, result
        return list(result["results"])

    def values(self) -> list[str]:
        return [m.value.decode() for m in read_messages(self.store, T, 0, 0, 1000)]

    def count(self) -> int:
        data = self.store.get(dedup_keys.dedup_count_key(T, 0))
        return 0 if data is None else keys.decode_u64(data)

    def entries(self) -> int:
        return sum(1 for _ in self.store.scan(keys.DEDUP, keys.prefix_end(keys.DEDUP)))

    def index_keys(self) -> int:
        return sum(1 for _ in self.store.scan(keys.DEDUP_EXPIRY, keys.prefix_end(keys.DEDUP_EXPIRY)))

    def receive(
        self, now: int, max_messages: int = 10, visibility_ms: int = 1000, delay_ms: int | None = None
    ) -> list[dict[str, Any]]:
        command = commands.receive(
            now, G, T, [0], max_messages, visibility_ms, ordered=True, delay_ms=delay_ms
        )
        result = self.apply(command)
        assert "messages" in result, result
        return [{**m, "token": result["token"]} for m in result["messages"]]

    def ack(self, now: int, delivered: list[dict[str, Any]]) -> None:
        receipts = [(m["queue"], m["offset"], m["token"]) for m in delivered]
        result = self.apply(commands.ack(now, G, T, receipts))
        assert all(r.get("ok") for r in result["results"]), result

    def values_of(self, delivered: list[dict[str, Any]]) -> list[str]:
        found = {m.offset: m for m in read_messages(self.store, T, 0, 0, 1000)}
        return [found[m["offset"]].value.decode() for m in delivered]


# -- the deduplication window ---------------------------------------------------------------------


def test_a_key_seen_within_the_window_is_answered_with_the_original_and_not_stored() -> None:
    m = Machine()
    first = m.send(1000, send("a", "one", message_id="m1"))
    assert first == [{"offset": 0, "id": "m1"}]
    again = m.send(1000 + WINDOW - 1, send("a", "other body", message_id="m2"))
    assert again == [{"offset": 0, "id": "m1", "duplicate": True}]
    assert m.values() == ["one"]


def test_a_key_is_forgotten_when_the_window_is_over_by_the_commands_time() -> None:
    m = Machine()
    m.send(1000, send("a", "one", message_id="m1"))
    later = m.send(1000 + WINDOW, send("a", "two", message_id="m2"))
    assert later == [{"offset": 1, "id": "m2"}]
    assert m.values() == ["one", "two"]
    assert (m.count(), m.entries(), m.index_keys()) == (1, 1, 1)  # the old entry was replaced


def test_keys_repeated_in_one_command_store_the_first_only() -> None:
    m = Machine()
    got = m.send(
        5, send("a", "x", message_id="1"), send("b", "y", message_id="2"), send("a", "z", message_id="3")
    )
    assert got == [
        {"offset": 0, "id": "1"},
        {"offset": 1, "id": "2"},
        {"offset": 0, "id": "1", "duplicate": True},
    ]
    assert m.values() == ["x", "y"]


def test_expired_entries_are_purged_and_counted_down() -> None:
    m = Machine()
    m.send(0, *(send(f"k{i}") for i in range(20)))
    assert (m.count(), m.entries(), m.index_keys()) == (20, 20, 20)
    m.send(WINDOW + 10, send("new"))
    assert (m.count(), m.entries(), m.index_keys()) == (1, 1, 1)


def test_the_window_is_bounded_and_a_full_window_stores_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "MAX_DEDUP_ENTRIES", 5)
    m = Machine()
    assert all("offset" in r for r in m.send(0, *(send(f"k{i}") for i in range(4))))
    full = m.send(10, send("x"), send("y"))  # 4 + 2 > 5: neither
    assert [r["error"]["code"] for r in full] == ["dedup_window_full", "dedup_window_full"]
    assert len(m.values()) == 4 and m.count() == 4
    assert m.send(20, send("k0")) == [{"offset": 0, "id": "id-k0-v", "duplicate": True}]  # dups still answer
    # Once the entries expire, the window takes new keys again.
    assert m.send(WINDOW + 1, send("x"), send("y")) == [
        {"offset": 4, "id": "id-x-v"},
        {"offset": 5, "id": "id-y-v"},
    ]
    assert m.count() == 2


def test_a_dropped_topic_stores_nothing_and_its_entries_go() -> None:
    m = Machine()
    m.send(0, send("a"))
    m.apply(commands.drop_topic(T))
    assert m.send(1, send("b"))[0]["error"]["code"] == "topic_not_found"
    assert m.entries() == 0 and m.count() == 0
    m.send(WINDOW + 1, send("c"))  # (topic 1 is dropped: nothing) the dangling index key goes
    assert m.index_keys() == 0


def test_a_bad_command_is_refused_with_nothing_written() -> None:
    m = Machine()
    before = list(m.store.scan(b""))
    bad = commands.dedup_produce(0, T, 0, [{"value": "v", "dedup": "", "id": "x"}])
    assert m.apply(bad)["error"]["code"] == "bad_request"
    delayed = commands.dedup_produce(0, T, 0, [{**send("a"), "deliver_at_ms": 5}])
    assert m.apply(delayed)["error"]["code"] == "bad_request"
    assert [kv for kv in m.store.scan(b"") if kv[0] != keys.APPLIED] == [
        kv for kv in before if kv[0] != keys.APPLIED
    ]


def random_log(rng: random.Random, length: int) -> list[bytes]:
    """Sends, ordered receives, acks, nacks (ChangeMessageVisibility 0) and ticks, the settlements
    naming real deliveries: built against a machine of its own, so the valid paths run."""
    builder = Machine()
    log: list[bytes] = []
    held: list[dict[str, Any]] = []
    now = 0

    def add(command: bytes) -> dict[str, Any]:
        log.append(command)
        return builder.apply(command)

    for _ in range(length):
        now += rng.choice([0, 1, 300, 1000, WINDOW // 3, WINDOW])
        count = rng.randrange(1, 4)
        msgs = [
            send(f"k{rng.randrange(8)}", f"v{rng.randrange(100)}", f"g{rng.randrange(3)}")
            for _ in range(count)
        ]
        add(commands.dedup_produce(now, T, 0, msgs))
        if rng.random() < 0.6:
            result = add(commands.receive(now, G, T, [0], rng.randrange(1, 4), 500, ordered=True))
            held += [{**m, "token": result["token"]} for m in result["messages"]]
        if held and rng.random() < 0.6:
            picked = rng.sample(held, rng.randrange(1, len(held) + 1))
            held = [m for m in held if m not in picked]
            receipts = [(m["queue"], m["offset"], m["token"]) for m in picked]
            if rng.random() < 0.7:
                add(commands.ack(now, G, T, receipts))
            else:
                add(commands.nack(now, G, T, receipts, delay_ms=0))
        if rng.random() < 0.3:
            add(commands.deliver_tick(now, 100))
    return log


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replicas_replaying_the_log_hold_the_same_window_and_results(seed: int) -> None:
    """The window is state like the rest: a replica that restarts and replays, and one on
    RocksDB, end with the same bytes and results."""
    log = random_log(random.Random(seed), 120)
    first = Machine()
    results = [first.apply(c) for c in log]
    # The log exercises the paths: handed out, settled, deduplicated.
    assert sum(len(r.get("messages", [])) for r in results) > 20
    assert sum(1 for r in results for x in r.get("results", []) if x.get("ok")) > 20
    assert sum(1 for r in results for x in r.get("results", []) if x.get("duplicate")) > 20
    second = Machine()
    for i, c in enumerate(log, start=1):
        assert second.apply(c) == results[i - 1]
        if i % 37 == 0:  # a restart: the journal replayed from the start is skipped
            machine = QueueGroupMachine(second.store, 0)
            assert all(machine.apply(j, old) == {"skipped": True} for j, old in enumerate(log[:i], start=1))
            second.machine = machine
    assert list(second.store.scan(b"")) == list(first.store.scan(b""))
    with tempfile.TemporaryDirectory() as tmp:
        rocks = RocksStore.open(os.path.join(tmp, "db"))
        try:
            third = Machine(rocks)
            assert [third.apply(c) for c in log] == results
            assert list(rocks.scan(b"")) == list(first.store.scan(b""))
        finally:
            rocks.close()


# -- receive_ordered --------------------------------------------------------------------------------


def fill(m: Machine, *pairs: tuple[str, str]) -> None:
    m.send(0, *(send(f"d{i}", value, key) for i, (key, value) in enumerate(pairs)))


def test_a_group_with_a_message_in_flight_hands_out_no_other_while_other_groups_go_on() -> None:
    m = Machine()
    fill(m, ("a", "a1"), ("a", "a2"), ("b", "b1"), ("a", "a3"), ("b", "b2"), ("c", "c1"))
    first = m.receive(10, max_messages=1)
    assert m.values_of(first) == ["a1"]
    second = m.receive(20, max_messages=10)
    assert m.values_of(second) == ["b1", "b2", "c1"]  # a is blocked by a1, the others go on
    assert m.receive(30) == []
    assert available_ordered(m.store, G, T, [0], 30) == (False, None)
    m.ack(40, first)
    assert available_ordered(m.store, G, T, [0], 40) == (True, None)
    assert m.values_of(m.receive(50)) == ["a2", "a3"]


def test_a_message_whose_visibility_ends_comes_back_before_the_rest_of_its_group() -> None:
    m = Machine()
    fill(m, ("a", "a1"), ("a", "a2"), ("b", "b1"))
    got = m.receive(0, max_messages=1, visibility_ms=100)
    assert m.values_of(got) == ["a1"]
    assert m.values_of(m.receive(10, max_messages=1)) == ["b1"]
    m.apply(commands.deliver_tick(200, 100))  # a1's visibility is over
    again = m.receive(210)
    assert m.values_of(again) == ["a1", "a2"]
    assert [x["attempt"] for x in again] == [2, 1]


def test_order_within_each_group_across_many_groups_and_random_acks() -> None:
    rng = random.Random(5)
    m = Machine()
    sent: dict[str, list[str]] = {}
    pairs = []
    for i in range(200):
        group = f"g{rng.randrange(12)}"
        pairs.append((group, f"{group}-{i}"))
        sent.setdefault(group, []).append(f"{group}-{i}")
    for start in range(0, len(pairs), 50):
        m.send(0, *(send(f"d{start + j}", v, g) for j, (g, v) in enumerate(pairs[start : start + 50])))
    got: dict[str, list[str]] = {}
    now = 1
    while sum(len(v) for v in got.values()) < len(pairs):
        now += 1
        delivered = m.receive(now, max_messages=rng.randrange(1, 10), visibility_ms=10_000)
        values = m.values_of(delivered)
        for value in values:
            got.setdefault(value.split("-")[0], []).append(value)
        assert now < 1_000, "stalled"
        m.ack(now, delivered)
    assert got == sent


def test_a_plain_receive_of_the_same_group_still_hands_out_waiting_messages() -> None:
    m = Machine()
    fill(m, ("a", "a1"), ("a", "a2"))
    m.receive(0, max_messages=1)
    assert m.receive(1) == []  # a2 now waits (a pending retry record, attempt 0)
    plain = m.apply(commands.receive(2, G, T, [0], 10, 1000))
    assert [x["offset"] for x in plain["messages"]] == [1]
    assert [x["attempt"] for x in plain["messages"]] == [1]


def test_receive_ordered_is_a_new_op_gated_for_rolling_upgrades() -> None:
    from raftmq.cluster.replication.upgrade import (
        BEFORE_CAPABILITIES,
        capability_of,
        previous_release_refuses,
    )

    ordered = commands.receive(0, G, T, [0], 1, 1000, ordered=True)
    produce = commands.dedup_produce(0, T, 0, [send("a")])
    assert capability_of("1", ordered) == "receive_ordered"
    assert capability_of("1", produce) == "dedup_produce"
    assert "receive_ordered" not in BEFORE_CAPABILITIES and "dedup_produce" not in BEFORE_CAPABILITIES
    assert previous_release_refuses(ordered) and previous_release_refuses(produce)
    start = commands.OPS.index("dedup_produce")  # added at the end then; later ops come after
    assert commands.OPS[start : start + 2] == ("dedup_produce", "receive_ordered")


def test_a_retry_not_due_yet_holds_its_group_and_says_when_to_look_again() -> None:
    m = Machine()
    fill(m, ("a", "a1"), ("a", "a2"), ("b", "b1"))
    got = m.receive(0, max_messages=1)
    result = m.apply(commands.nack(10, G, T, [(0, got[0]["offset"], got[0]["token"])], delay_ms=500))
    assert result["results"] == [{"ok": True}]
    assert m.values_of(m.receive(20)) == ["b1"]  # a1 waits for its due time; a2 behind it
    assert available_ordered(m.store, G, T, [0], 30) == (False, 510)
    assert m.receive(30) == []
    assert m.values_of(m.receive(510)) == ["a1", "a2"]


def pending_records(m: Machine) -> int:
    prefix = keys.sub_key(keys.PENDING, T, 0, G)
    return sum(1 for _ in m.store.scan(prefix, keys.prefix_end(prefix)))


def test_a_hot_groups_backlog_fills_the_look_ahead_to_its_cap_and_no_receive_spins() -> None:
    m = Machine()
    backlog = SCAN_BUDGET + 1000  # more than one receive may read
    for start in range(0, backlog, 100):  # at most 100 messages a command
        m.send(0, *(send(f"g{i}", f"g{i}", "g") for i in range(start, min(start + 100, backlog))))
    m.send(0, send("h0", "h0", "h"))
    first = m.receive(10, max_messages=1)
    assert m.values_of(first) == ["g0"]  # g is held from now on
    receives = 0
    while available_ordered(m.store, G, T, [0], 20 + receives)[0]:
        receives += 1
        assert receives < 10, "a waiting receiver would propose receives that hand out nothing"
        assert m.receive(20 + receives) == []
    assert pending_records(m) <= PENDING_CAP  # bounded: the cursor waits at g's next message
    assert available_ordered(m.store, G, T, [0], 100) == (False, None)
    m.ack(200, first)  # g is free again: its messages come in order
    assert m.values_of(m.receive(300, max_messages=10)) == [f"g{i}" for i in range(1, 11)]


# -- receive_ordered with a delay (an SQS FIFO queue's DelaySeconds) ------------------------------


def test_a_delayed_message_is_numbered_at_once_and_handed_out_first_at_its_timestamp_plus_the_delay() -> None:
    m = Machine()
    sent = [
        m.send(1000, send("a1", "a1", "a")),
        m.send(1500, send("b1", "b1", "b")),
        m.send(1600, send("a2", "a2", "a")),
    ]
    assert [r[0]["offset"] for r in sent] == [0, 1, 2]  # its SequenceNumber at the send
    assert [not_due(m.store, G, T, 0, now, 1000) for now in (1200, 1999, 2000)] == [3, 3, 2]
    assert m.receive(1200, delay_ms=1000) == []
    assert available_ordered(m.store, G, T, [0], 1200, 1000) == (False, 2000)
    assert available_ordered(m.store, G, T, [0], 1200) == (True, None)  # without the delay: due now
    first = m.receive(2000, delay_ms=1000)
    assert m.values_of(first) == ["a1"]  # b1 and a2 are not due: none passes a1
    assert available_ordered(m.store, G, T, [0], 2100, 1000) == (False, 2500)
    # Above the cursor (a1 was handed out): b1 due at 2500, a2 at 2600.
    assert [not_due(m.store, G, T, 0, now, 1000) for now in (2100, 2499, 2500, 2600)] == [2, 2, 1, 0]
    assert not_due(m.store, G, T, 0, 2100, 0) == 0
    assert m.values_of(m.receive(2500, delay_ms=1000)) == ["b1"]
    assert m.receive(2600, delay_ms=1000) == []  # a2 is due, and waits for a1 in flight
    assert available_ordered(m.store, G, T, [0], 2600, 1000) == (False, None)
    m.ack(2700, first)
    assert m.values_of(m.receive(2800, delay_ms=1000)) == ["a2"]


def test_a_group_whose_head_is_not_due_waits_and_a_redelivery_is_not_delayed_again() -> None:
    m = Machine()
    m.send(1000, send("a1", "a1", "a"), send("a2", "a2", "a"))
    first = m.receive(1000, max_messages=1)  # no delay yet: a1 handed out, a2 waits behind it
    assert m.values_of(first) == ["a1"]
    assert m.receive(1100) == []
    m.ack(1200, first)
    # The queue's delay raised to 5 s: it applies to the messages in it (as AWS's FIFO delay), so
    # a2, sent at 1000, waits until 6000 though it was already passed by the cursor.
    assert m.receive(1300, delay_ms=5000) == []
    assert available_ordered(m.store, G, T, [0], 1300, 5000) == (False, 6000)
    again = m.receive(6000, max_messages=1, visibility_ms=100, delay_ms=5000)
    assert m.values_of(again) == ["a2"]
    m.apply(commands.deliver_tick(6200, 100))  # its visibility is over
    assert available_ordered(m.store, G, T, [0], 6200, 5000) == (True, None)
    back = m.receive(6200, delay_ms=5000)
    assert (m.values_of(back), back[0]["attempt"]) == (["a2"], 2)  # at once: not delayed again


def test_the_delay_is_a_field_level_of_receive_ordered_and_older_entries_replay_without_it() -> None:
    from raftmq.cluster.replication.upgrade import CAPABILITIES

    delayed = commands.receive(0, G, T, [0], 1, 1000, ordered=True, delay_ms=900_000)
    assert commands.decode(delayed)["delay_ms"] == 900_000
    assert commands.decode(commands.receive(0, G, T, [0], 1, 1000, ordered=True)).get("delay_ms") is None
    assert "receive_ordered.delay" in commands.FIELD_LEVELS and "receive_ordered.delay" in CAPABILITIES
    with pytest.raises(ValueError):
        commands.receive(0, G, T, [0], 1, 1000, delay_ms=5)  # a plain receive has no delay
    plain = orjson.loads(commands.receive(0, G, T, [0], 1, 1000))
    with pytest.raises(commands.BadCommand):
        commands.decode(orjson.dumps({**plain, "delay_ms": 5}))


# -- the leader's kept looks (OrderedLooks) -----------------------------------------------------------


class CountingStore(MemoryStore):
    """A MemoryStore that counts its reads, and those of stored messages (``R`` keys) apart."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.message_reads = 0

    def _count(self, key: bytes) -> None:
        self.reads += 1
        self.message_reads += key.startswith(keys.RECORD)

    def get(self, key: bytes) -> bytes | None:
        self._count(key)
        return super().get(key)

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        self._count(start)
        return super().scan(start, end, reverse=reverse, limit=limit)

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        self._count(key)
        return super().last_before(key, floor)


def test_a_look_while_nothing_was_applied_reads_nothing_and_a_held_backlog_is_read_once() -> None:
    store = CountingStore()
    m = Machine(store)
    backlog = 200
    for start in range(0, backlog, 100):
        m.send(0, *(send(f"a{i}", f"a{i}", "a") for i in range(start, start + 100)))
    first = m.receive(10, max_messages=1)
    assert m.values_of(first) == ["a0"]
    assert m.receive(20) == []  # a1.. wait behind a0: one pending record each
    assert pending_records(m) == backlog
    looks = OrderedLooks()

    def look(now: int) -> tuple[tuple[bool, int | None], int, int]:
        """The kept look's answer (checked against a look from scratch) and its reads."""
        reads, message_reads = store.reads, store.message_reads
        answer = looks.available(store, m.machine.applied_index, G, T, [0], now)
        counted = store.reads - reads, store.message_reads - message_reads
        assert answer == available_ordered(store, G, T, [0], now)
        return answer, *counted

    answer, _, message_reads = look(30)
    assert answer == (False, None) and message_reads >= backlog  # each waiting message's group read
    assert look(40) == ((False, None), 0, 0)  # nothing applied since: nothing read at all
    m.apply(commands.noop())  # something applied: the records are scanned again, no message is read
    answer, reads, message_reads = look(50)
    assert answer == (False, None) and 0 < reads < backlog and message_reads == 0
    m.apply(commands.nack(60, G, T, [(0, first[0]["offset"], first[0]["token"])], delay_ms=1000))
    assert look(70)[0] == (False, 1060)  # a0 retries at 1060 and holds its group until then
    assert look(1059) == ((False, 1060), 0, 0)  # kept until its wake time
    assert look(1060)[0] == (True, None)  # then looked at again
    assert m.values_of(m.receive(1060, max_messages=3)) == ["a0", "a1", "a2"]
    assert look(1080)[0] == (False, None)  # the group in flight again
