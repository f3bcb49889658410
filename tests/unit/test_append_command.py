"""The binary ``append`` command (cluster/commands/append.py) and its apply (cluster/machines/append.py):
batches stored verbatim but for the stamp, idempotence, delays and TTLs, bad commands changing
nothing, determinism, and the JSON command a rolling upgrade proposes instead giving equal messages."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.replication.upgrade import to_json_batch
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import queue_bounds, read_messages
from raftmq.storage.records import Message, decode_batch, decode_header


class Harness:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 1)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def messages(self, topic_id: int = 1, queue: int = 0) -> list[Message]:
        return read_messages(self.store, topic_id, queue, 0, 10_000)

    def stored(self, topic_id: int = 1, queue: int = 0) -> list[bytes]:
        start, end = keys.queue_range(keys.RECORD, topic_id, queue)
        return [v for _, v in self.store.scan(start, end)]


def sample(producer_id: str | None = None, sequence: int = 0, ttl_ms: int = 0, delay_ms: int = 0) -> bytes:
    b = rb.BatchBuilder(producer_id, sequence, base_timestamp_ms=1_000)
    b.append("a", timestamp_ms=1_000)
    b.append(b"\x00\x01", key="k", headers={"h": "v"}, timestamp_ms=1_001)
    b.append("c", key="", ttl_ms=ttl_ms, delay_ms=delay_ms, timestamp_ms=1_002)
    b.append("d", timestamp_ms=1_003)
    return b.finish()


def test_an_append_round_trips_and_stores_each_batch_stamped_not_re_encoded() -> None:
    h = Harness()
    sent = sample()
    result = h.apply(commands.append(5_000, [(1, 0, sent), (1, 0, sent), (1, 2, sent)]))
    assert result == {
        "results": [
            {"topic_id": 1, "queue": 0, "base_offset": 0, "count": 4},
            {"topic_id": 1, "queue": 0, "base_offset": 4, "count": 4},
            {"topic_id": 1, "queue": 2, "base_offset": 0, "count": 4},
        ]
    }
    stored = h.stored()
    assert [v[40:] for v in stored] == [sent[40:], sent[40:]]  # everything the CRC covers: verbatim
    assert stored[1] == rb.stamp(sent, 4, 5_000, 1)
    assert [(m.offset, m.value, m.binary, m.key, m.headers) for m in h.messages()][:4] == [
        (0, b"a", False, None, None),
        (1, b"\x00\x01", True, "k", {"h": "v"}),
        (2, b"c", False, "", None),
        (3, b"d", False, None, None),
    ]
    assert {(m.timestamp_ms, m.raft_index) for m in h.messages()} == {(5_000, 1)}  # the append time
    assert queue_bounds(h.store, 1, 0) == (0, 8)
    header = decode_header(stored[1])
    assert (header.version, header.base_offset, header.count, header.append_time_ms) == (2, 4, 4, 5_000)
    assert len(decode_batch(stored[0]).messages) == 4


def test_a_ttl_counts_from_the_append_time() -> None:
    h = Harness()
    h.apply(commands.append(5_000, [(1, 0, sample(ttl_ms=700))]))
    assert [m.expires_at_ms for m in h.messages()] == [None, None, 5_700, None]


def test_delayed_records_wait_in_the_due_index_and_the_others_are_stored_in_order() -> None:
    h = Harness()
    result = h.apply(commands.append(5_000, [(1, 0, sample(delay_ms=300, ttl_ms=50))]))
    assert result["results"] == [{"topic_id": 1, "queue": 0, "base_offset": 0, "count": 3, "delayed": 1}]
    assert [m.value for m in h.messages()] == [b"a", b"\x00\x01", b"d"]
    due = [(k, v) for k, v in h.store.scan(keys.DELAYED) if k.startswith(keys.DELAYED)]
    assert len(due) == 1
    held = decode_batch(due[0][1]).messages[0]
    assert (held.value, held.key, held.expires_at_ms) == (b"c", "", 5_000 + 300 + 50)
    # The rest was rebuilt once, deterministically: a second replica stores the same bytes.
    other = Harness()
    other.apply(commands.append(5_000, [(1, 0, sample(delay_ms=300, ttl_ms=50))]))
    assert other.store.scan(b"") and list(other.store.scan(b"")) == list(h.store.scan(b""))


def test_a_retried_batch_is_answered_with_its_first_offsets_and_stored_once() -> None:
    h = Harness()
    first = h.apply(commands.append(5_000, [(1, 0, sample("p", 3))]))
    again = h.apply(commands.append(6_000, [(1, 0, sample("p", 3))]))
    assert again["results"] == [{**first["results"][0], "duplicate": True}]
    assert len(h.stored()) == 1
    for seq in range(4, 12):
        h.apply(commands.append(7_000, [(1, 0, sample("p", seq))]))
    late = h.apply(commands.append(8_000, [(1, 0, sample("p", 3))]))
    assert late["results"][0]["error"]["code"] == "stale_sequence"


def test_a_dropped_topic_refuses_its_batches_and_the_others_apply() -> None:
    h = Harness()
    h.apply(commands.drop_topic(1))
    result = h.apply(commands.append(5_000, [(1, 0, sample()), (2, 0, sample())]))
    assert result["results"][0]["error"]["code"] == "topic_not_found"
    assert result["results"][1]["count"] == 4


def corrupt(data: bytes) -> bytes:
    out = bytearray(data)
    out[-1] ^= 1
    return bytes(out)


GOOD = commands.append(5_000, [(1, 0, sample())])
BAD_BATCH = commands.append(5_000, [(1, 0, sample()), (1, 0, corrupt(sample()))])


@pytest.mark.parametrize(
    ("name", "command", "code"),
    [
        ("cut short", GOOD[:-5], "bad_request"),
        ("trailing bytes", GOOD + b"\x00", "bad_request"),
        ("no batches", commands.append(5_000, []), "bad_request"),
        ("unknown version", GOOD[:1] + b"\x09" + GOOD[2:], "bad_request"),
        (
            "a corrupt batch",
            commands.append(5_000, [(1, 0, sample()), (1, 0, corrupt(sample()))]),
            "bad_batch",
        ),
        ("header only", GOOD[:20], "bad_request"),
    ],
)
def test_a_bad_append_changes_nothing_but_the_applied_index(name: str, command: bytes, code: str) -> None:
    h = Harness()
    result = h.apply(command)
    assert result["error"]["code"] == code, (name, result)
    assert [k for k, _ in h.store.scan(b"")] == [keys.APPLIED]


def test_too_many_messages_in_one_entry_are_refused_whole() -> None:
    store = MemoryStore()
    machine = QueueGroupMachine(store, 1, max_entry_messages=6)
    result = machine.apply(1, commands.append(5_000, [(1, 0, sample()), (1, 1, sample())]))
    assert result["error"]["code"] == "request_too_large"
    assert queue_bounds(store, 1, 0) == (0, 0)


def test_the_group_time_never_goes_backwards_for_an_append() -> None:
    h = Harness()
    h.apply(commands.append(9_000, [(1, 0, sample())]))
    h.apply(commands.append(4_000, [(1, 0, sample())]))  # a new leader whose clock is behind
    assert [decode_header(v).append_time_ms for v in h.stored()] == [9_000, 9_000]


def test_the_json_command_of_a_rolling_upgrade_stores_equal_messages() -> None:
    binary, json = Harness(), Harness()
    sent = sample("p", 9, ttl_ms=700)
    binary.apply(commands.append(5_000, [(1, 0, sent)]))
    json.apply(commands.produce(5_000, [to_json_batch(5_000, 1, 0, sent)]))

    def fields(h: Harness) -> list[tuple[Any, ...]]:
        return [(m.offset, m.value, m.binary, m.key, m.headers, m.expires_at_ms) for m in h.messages()]

    assert fields(binary) == fields(json)
    assert [decode_header(v).version for v in json.stored()] == [1]
    again = json.apply(commands.append(6_000, [(1, 0, sent)]))  # idempotence carries over
    assert again["results"][0]["duplicate"] is True


def test_equal_delays_of_two_batches_for_one_queue_in_one_entry_are_both_kept() -> None:
    """Group commit merges producers' batches for one queue into one entry: each delayed record
    must keep a key of its own (review finding: per batch, the second overwrote the first)."""

    def one(value: str) -> bytes:
        b = rb.BatchBuilder(base_timestamp_ms=1_000)
        b.append(value, delay_ms=5_000)
        return b.finish()

    h = Harness()
    result = h.apply(commands.append(10_000, [(1, 0, one("first")), (1, 0, one("second"))]))
    assert [r["delayed"] for r in result["results"]] == [1, 1]
    held = [v for k, v in h.store.scan(keys.DELAYED) if k.startswith(keys.DELAYED)]
    assert sorted(decode_batch(v).messages[0].value for v in held) == [b"first", b"second"]


def test_a_leader_takes_forwarded_batches_as_the_bytes_the_entry_node_checked() -> None:
    """A forwarded ``append`` is split by its framing only (the entry node ran
    ``raftmq.batch.validate``): the leader gets the very bytes, without reading the records."""
    first, second = sample("p", 3), sample(ttl_ms=5)
    now_ms, items = commands.split_append(commands.append(77, [(1, 0, first), (2, 5, second)]))
    assert now_ms == 77
    assert [(t, q, bytes(b)) for t, q, b in items] == [(1, 0, first), (2, 5, second)]
    # What it does not read: a record's bytes damaged after the batch CRC was computed still split
    # (the apply's raftmq.batch.read refuses them: nothing is stored unchecked).
    damaged = bytearray(first)
    damaged[-1] ^= 0xFF
    _, items = commands.split_append(commands.append(0, [(1, 0, bytes(damaged))]))
    assert bytes(items[0][2]) == bytes(damaged)
    h = Harness()
    assert h.apply(commands.append(0, [(1, 0, bytes(damaged))]))["error"]["code"] == "bad_batch"
    assert h.messages() == []


@pytest.mark.parametrize(
    "command",
    [
        commands.append(0, [(1, 0, sample())]) + b"\0",  # trailing bytes
        commands.append(0, [(1, 0, sample())])[:-3],  # a batch cut short
        commands.append(0, [(1, 0, sample())])[:10],  # shorter than the header
        b"\xa2\x02" + commands.append(0, [(1, 0, sample())])[2:],  # another version
    ],
)
def test_a_forwarded_append_with_broken_framing_is_refused(command: bytes) -> None:
    with pytest.raises(commands.BadCommand) as info:
        commands.split_append(command)
    assert info.value.code == "bad_request"
