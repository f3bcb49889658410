"""The storage side of receive/ack: the record expiry flag (old records still decode), the new key
codecs, the metadata group's dead-letter topics, and the [delivery] settings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.cluster import commands
from raftmq.cluster.config.cluster_file import ConfigError, parse_config
from raftmq.cluster.machines.delivery import DEFAULT_BACKOFF_MS, available
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.keys import STATE_INFLIGHT, LockState, PendingRecord
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import first_pending, next_due_ms, scan_prefix
from raftmq.storage.records import CorruptRecord, NewMessage, decode_batch, encode_batch
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

# A batch written before records could expire (format version 1, flags 0 and 1 only): two
# records, "a" with key "k" and headers, binary "\x00" without either. It must decode forever.
OLD_BATCH = bytes.fromhex(  # encode_batch(7, 1000, 5, ...) of the codec before the expiry flag
    "01000000000000000700000000000003e8000000020000000000000005ea9088d000000000016b00"
    "0000097b2268223a2276227d0000000161726aa0db01ffffffff000000000000000100"
)


def test_a_record_batch_written_before_expiry_existed_still_decodes() -> None:
    batch = decode_batch(OLD_BATCH)
    assert [(m.offset, m.key, m.value, m.binary, m.headers, m.expires_at_ms) for m in batch.messages] == [
        (5, "k", b"a", False, {"h": "v"}, None),
        (6, None, b"\x00", True, None, None),
    ]
    # and records without an expiry are still written exactly as before
    messages = [NewMessage(b"a", False, "k", {"h": "v"}), NewMessage(b"\x00", True)]
    assert encode_batch(7, 1000, 5, messages) == OLD_BATCH


@given(
    expires=st.lists(st.none() | st.integers(0, 2**64 - 1), min_size=1, max_size=5),
    key=st.none() | st.text(max_size=5),
)
def test_the_expiry_round_trips_with_every_other_field(expires: list[int | None], key: str | None) -> None:
    messages = [NewMessage(f"v{i}".encode(), i % 2 == 0, key, None, e) for i, e in enumerate(expires)]
    decoded = decode_batch(encode_batch(1, 2, 3, messages)).messages
    assert [(m.value, m.binary, m.key, m.expires_at_ms) for m in decoded] == [
        (n.value, n.binary, n.key, n.expires_at_ms) for n in messages
    ]


def test_a_flipped_expiry_byte_is_detected() -> None:
    data = bytearray(encode_batch(1, 2, 3, [NewMessage(b"v", expires_at_ms=99)]))
    data[-1] ^= 0x01
    with pytest.raises(CorruptRecord):
        decode_batch(bytes(data))


def test_message_expiry_by_ttl_and_by_age() -> None:
    (m,) = decode_batch(encode_batch(1, 1000, 0, [NewMessage(b"v", expires_at_ms=1500)])).messages
    assert not m.expired(1499) and m.expired(1500)
    assert not m.expired(1100, max_age_ms=200) and m.expired(1200, max_age_ms=200)


@given(
    deadline=st.integers(0, 2**64 - 1),
    topic_id=st.integers(0, 2**32 - 1),
    queue=st.integers(0, 2**32 - 1),
    group=st.text(min_size=1, max_size=60),
    offset=st.integers(0, 2**64 - 1),
)
def test_deadline_keys_round_trip_and_sort_by_deadline_first(
    deadline: int, topic_id: int, queue: int, group: str, offset: int
) -> None:
    key = keys.deadline_key(deadline, topic_id, queue, group, offset)
    assert keys.decode_deadline_key(key) == (deadline, topic_id, queue, group, offset)
    if deadline < 2**64 - 1:
        assert key < keys.deadline_key(deadline + 1, 0, 0, "", 0)


def test_subscription_keys_of_one_group_never_prefix_another_groups() -> None:
    a = keys.pending_key(1, 0, "g", 0)
    b = keys.pending_key(1, 0, "g\x00\x00\x00\x00\x00\x00\x00\x00", 0)
    prefix = keys.sub_key(keys.PENDING, 1, 0, "g")
    assert a.startswith(prefix) and not b.startswith(prefix)


def test_pending_records_and_locks_round_trip_and_bad_bytes_are_corrupt() -> None:
    rec = PendingRecord(STATE_INFLIGHT, 3, 1000, 77, 10, 20)
    assert PendingRecord.decode(rec.encode()) == rec
    lock = LockState(4, 900, "consumer-ü")
    assert LockState.decode(lock.encode()) == lock
    for bad in (b"", rec.encode()[:-1], b"\x09" + rec.encode()[1:]):
        with pytest.raises(CorruptRecord):
            PendingRecord.decode(bad)
    with pytest.raises(CorruptRecord):
        keys.decode_deadline_key(b"E" + b"\x00" * 5)


# -- dead-letter topics in the metadata group ---------------------------------------------------


def meta_apply(machine: MetadataMachine, index: int, **command: object) -> dict[str, object]:
    result: dict[str, object] = machine.apply(index, orjson.dumps({"v": 1, **command}))
    return result


def test_the_dead_letter_topic_copies_the_source_placement_and_is_created_once() -> None:
    machine = MetadataMachine(MemoryStore())
    meta_apply(machine, 1, op="create_topic", name="orders", queues=5, group_count=3, now_ms=1)
    meta_apply(machine, 2, op="create_topic", name="other", queues=2, group_count=3, now_ms=1)
    created = meta_apply(
        machine, 3, op="ensure_dlq_topic", source="orders", group="billing", now_ms=9, by_record=True
    )
    source, dlq = machine.topic("orders"), machine.topic("orders.billing.dlq")
    assert source is not None and dlq is not None and created == {"topic": dlq.to_json(), "created": True}
    assert (dlq.queues, dlq.queue_groups, dlq.retention_ms) == (5, source.queue_groups, None)
    again = meta_apply(
        machine, 4, op="ensure_dlq_topic", source="orders", group="billing", now_ms=10, by_record=True
    )
    assert again == {"topic": dlq.to_json(), "created": False}


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ({"source": "nope", "group": "g"}, "topic_not_found"),
        ({"source": "orders", "group": "bad group"}, "bad_request"),
        ({"source": "orders", "group": "g" * 200}, "bad_request"),
        ({"source": "orders", "group": 5}, "bad_request"),
        ({"source": "orders", "group": "taken"}, "dead_letter_topic_conflict"),
    ],
)
def test_a_dead_letter_topic_that_cannot_be_made_is_refused(command: dict[str, object], code: str) -> None:
    machine = MetadataMachine(MemoryStore())
    meta_apply(machine, 1, op="create_topic", name="orders", queues=2, group_count=3, now_ms=1)
    meta_apply(machine, 2, op="create_topic", name="orders.taken.dlq", queues=1, group_count=3, now_ms=1)
    result = meta_apply(machine, 3, op="ensure_dlq_topic", now_ms=5, by_record=True, **command)
    assert result["error"]["code"] == code  # type: ignore[index]
    assert machine.topic("orders.g.dlq") is None


# -- settings -----------------------------------------------------------------------------------

NODES = [{"id": "n1", "http": "127.0.0.1:1", "raft": "127.0.0.1:2", "data_dir": "d"}]


def test_delivery_settings_have_rocketmq_like_defaults_and_can_be_set_in_the_file_or_env() -> None:
    default = parse_config({"cluster": {"secret": "s" * 16}, "nodes": NODES})
    assert (default.delivery.max_deliveries, default.delivery.backoff_ms) == (16, DEFAULT_BACKOFF_MS)
    assert DEFAULT_BACKOFF_MS[0] == 10_000 and DEFAULT_BACKOFF_MS[-1] == 7_200_000
    raw = {"cluster": {"secret": "s" * 16}, "nodes": NODES, "delivery": {"backoff_ms": [5, 6], "tick_ms": 50}}
    config = parse_config(raw, env={"RAFTMQ_DELIVERY_MAX_DELIVERIES": "3", "RAFTMQ_LIMITS_MAX_DELAY_MS": "9"})
    assert (config.delivery.backoff_ms, config.delivery.tick_ms, config.delivery.max_deliveries) == (
        (5, 6),
        50,
        3,
    )
    assert config.limits.max_delay_ms == 9
    from_env = parse_config(
        {"cluster": {"secret": "s" * 16}, "nodes": NODES}, env={"RAFTMQ_DELIVERY_BACKOFF_MS": "1,2"}
    )
    assert from_env.delivery.backoff_ms == (1, 2)


@pytest.mark.parametrize(
    "delivery",
    [{"backoff_ms": []}, {"backoff_ms": [1, -1]}, {"backoff_ms": "1"}, {"max_deliveries": 0}, {"tick_ms": 0}],
)
def test_bad_delivery_settings_are_listed(delivery: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="delivery"):
        parse_config({"cluster": {"secret": "s" * 16}, "nodes": NODES, "delivery": delivery})


# -- the real store ------------------------------------------------------------------------------


def test_scan_prefix_on_a_rocks_store_returns_every_key_of_the_prefix(tmp_path: Path) -> None:
    """RocksDB keeps a pointer to a scan's upper bound, not the bytes object: with a bound that is
    a temporary, these scans returned 1 key of 5 (``scan_prefix`` holds the bound)."""
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        batch = Batch()
        for i in range(5):
            batch.put(b"Yprefix-%d" % i, b"v")
        batch.put(b"Yprefiy", b"outside")
        store.write(batch)
        for _ in range(30):
            assert sum(1 for _ in scan_prefix(store, b"Yprefix-")) == 5
            assert [k for k, _ in scan_prefix(store, b"Yprefix-", start=b"Yprefix-3")] == [
                b"Yprefix-3",
                b"Yprefix-4",
            ]
    finally:
        store.close()


def test_delivery_reads_on_a_rocks_store_see_their_keys_every_time(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        machine = QueueGroupMachine(store, 0)
        machine.apply(1, commands.produce(0, [{"topic_id": 1, "queue": 0, "messages": [{"value": "a"}]}]))
        machine.apply(2, commands.produce(0, [{"topic_id": 1, "queue": 1, "messages": [{"value": "b"}]}]))
        machine.apply(3, commands.receive(10, "g", 1, [0, 1], 5, 400))
        machine.apply(4, commands.nack(20, "g", 1, [(0, 0, 3)]))
        for _ in range(30):
            assert available(store, "g", 1, [0], 30) == (False, 20 + DEFAULT_BACKOFF_MS[0])
            assert first_pending(store, "g", 1, 1) == 0
            assert next_due_ms(store) == 410
    finally:
        store.close()
