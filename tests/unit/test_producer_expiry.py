"""Idle producer states expire (``expire_producers``, cluster/machines/producers.py): the idle index follows
every use, expiry is bounded per apply, states of the old encoding decode and are swept; on the
memory store and on RocksDB."""

from __future__ import annotations

import struct
from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.config.cluster_file import ConfigError, parse_config
from raftmq.cluster.machines.producers import expiry_due
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.keys import ProducerState
from raftmq.storage.records import CorruptRecord
from raftmq.storage.store import Batch, Store

Pairs = list[tuple[bytes, bytes]]


class Harness:
    """A machine numbering entries itself; ``started`` applies the group's first
    ``expire_producers`` (which finds nothing), from which on producer states record their time."""

    def __init__(self, store: Store, started: bool = True) -> None:
        self.store = store
        self.machine = QueueGroupMachine(store, 1)
        self.index = 0
        if started:
            assert self.expire(now_ms=0, idle_ms=1) == {"expired": 0, "more": False}

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(self, producer: str, sequence: int, now_ms: int, topic_id: int = 1, queue: int = 0) -> Any:
        b = {"topic_id": topic_id, "queue": queue, "messages": [{"value": "v"}]}
        r = self.apply(commands.produce(now_ms, [{**b, "producer_id": producer, "sequence": sequence}]))
        return r["results"][0]

    def expire(self, now_ms: int, idle_ms: int, max_items: int = 1000) -> dict[str, Any]:
        return self.apply(expire_producers(now_ms, idle_ms, max_items))

    def state(self, producer: str, topic_id: int = 1, queue: int = 0) -> ProducerState | None:
        data = self.store.get(keys.producer_key(topic_id, queue, producer))
        return None if data is None else ProducerState.decode(data)

    def index_keys(self) -> list[tuple[int, int, int, str]]:
        return [keys.decode_producer_idle_key(k) for k, _ in self.store.scan(b"W", b"X")]

    def pairs(self) -> Pairs:
        # The group's time (T) is bookkeeping written with any stamped command, as applied_index.
        return [(k, v) for k, v in self.store.scan(b"") if k not in (keys.APPLIED, keys.GROUP_TIME)]


@pytest.fixture
def h(store: Store) -> Harness:
    return Harness(store)


@pytest.fixture
def fresh(store: Store) -> Harness:
    """A group that never applied an ``expire_producers`` (as after an upgrade)."""
    return Harness(store, started=False)


def legacy(*entries: tuple[int, int, int]) -> bytes:
    """A producer state as versions before ``last_used_ms`` wrote it."""
    return bytes([len(entries)]) + b"".join(struct.pack(">QQI", *e) for e in entries)


# -- the state and its index --------------------------------------------------------------------


def test_old_encoding_decodes_without_a_time_and_is_written_back_unchanged() -> None:
    old = legacy((7, 0, 2), (8, 2, 1))
    state = ProducerState.decode(old)
    assert state == ProducerState(((7, 0, 2), (8, 2, 1)), None)
    assert state.encode() == old
    timed = state.add(9, 3, 1, now_ms=1234)
    assert timed.last_used_ms == 1234 and ProducerState.decode(timed.encode()) == timed
    for bad in (b"", legacy((1, 0, 1))[:-1], timed.encode()[:5], timed.encode() + b"\x00"):
        with pytest.raises(CorruptRecord):
            ProducerState.decode(bad)


def test_every_append_moves_the_one_index_key_of_its_state(h: Harness) -> None:
    h.produce("p", 0, now_ms=1000)
    assert h.state("p") == ProducerState(((0, 0, 1),), 1000)
    assert h.index_keys() == [(1000, 1, 0, "p")]
    h.produce("p", 1, now_ms=5000)
    h.produce("p", 2, now_ms=5000)  # same time: the key stays
    h.produce("p", 0, now_ms=5000, queue=1)
    assert h.index_keys() == [(5000, 1, 0, "p"), (5000, 1, 1, "p")]
    assert h.state("p") == ProducerState(((0, 0, 1), (1, 1, 1), (2, 2, 1)), 5000)


def test_two_batches_of_one_producer_in_one_command_leave_one_index_key(h: Harness) -> None:
    h.produce("p", 0, now_ms=1000)
    b = {"topic_id": 1, "queue": 0, "messages": [{"value": "v"}], "producer_id": "p"}
    h.apply(commands.produce(2000, [{**b, "sequence": 1}, {**b, "sequence": 2}]))
    assert h.index_keys() == [(2000, 1, 0, "p")]


def test_a_duplicate_or_stale_retry_does_not_keep_a_state_alive(h: Harness) -> None:
    for sequence in range(7):
        h.produce("p", sequence, now_ms=1000)
    before = h.pairs()
    assert h.produce("p", 6, now_ms=8000)["duplicate"] is True
    assert h.produce("p", 0, now_ms=8000)["error"]["code"] == "stale_sequence"
    assert h.pairs() == before
    assert h.expire(now_ms=8000, idle_ms=5000) == {"expired": 1, "more": False}


# -- expiry -------------------------------------------------------------------------------------


def test_states_idle_longer_than_idle_ms_are_forgotten_and_active_ones_kept(h: Harness) -> None:
    h.produce("gone", 0, now_ms=1000)
    h.produce("gone", 0, now_ms=1000, queue=1)
    h.produce("edge", 0, now_ms=5000)  # idle exactly idle_ms at 10000: kept
    h.produce("active", 0, now_ms=1000)
    h.produce("active", 1, now_ms=9000)
    assert h.expire(now_ms=10_000, idle_ms=5000) == {"expired": 2, "more": False}
    assert h.state("gone") is None and h.state("gone", queue=1) is None
    assert h.state("edge") is not None and h.state("active") == ProducerState(((0, 2, 1), (1, 3, 1)), 9000)
    assert h.index_keys() == [(5000, 1, 0, "edge"), (9000, 1, 0, "active")]
    assert h.expire(now_ms=10_001, idle_ms=5000) == {"expired": 1, "more": False}
    assert h.state("edge") is None

    # Forgotten entirely: its old sequence is a new batch now (stored again, not refused).
    again = h.produce("gone", 0, now_ms=10_002)
    assert again == {"topic_id": 1, "queue": 0, "base_offset": 4, "count": 1}
    assert h.state("active") is not None


def test_nothing_due_changes_only_applied_index(h: Harness) -> None:
    h.produce("p", 0, now_ms=1000)
    before = h.pairs()
    assert h.expire(now_ms=6000, idle_ms=5000) == {"expired": 0, "more": False}
    assert h.expire(now_ms=0, idle_ms=5000) == {"expired": 0, "more": False}  # cutoff below zero
    assert h.pairs() == before


def test_each_step_looks_at_most_at_max_keys_and_says_more(h: Harness) -> None:
    for i in range(25):
        h.produce(f"p{i:02}", 0, now_ms=1000 + i)
    h.produce("active", 0, now_ms=50_000)
    steps = []
    while True:
        before = len(h.index_keys())
        result = h.expire(now_ms=50_000, idle_ms=10_000, max_items=10)
        steps.append((result["expired"], result["more"], before - len(h.index_keys())))
        if not result["more"]:
            break
    # The oldest go first; the last step sees the 5 that are left and finds no more.
    assert steps == [(10, True, 10), (10, True, 10), (5, False, 5)]
    assert [k[3] for k in h.index_keys()] == ["active"]
    assert len([k for k, _ in h.pairs() if k[:1] == b"P"]) == 1


def test_index_keys_of_a_dropped_topic_are_removed_when_due(h: Harness) -> None:
    h.produce("p", 0, now_ms=1000, topic_id=3)
    h.produce("p", 0, now_ms=1000, topic_id=1)
    h.apply(commands.drop_topic(3))
    assert h.state("p", topic_id=3) is None and len(h.index_keys()) == 2  # dangling until due
    assert h.expire(now_ms=7000, idle_ms=5000) == {"expired": 1, "more": False}
    assert h.index_keys() == [] and h.state("p", topic_id=1) is None


# -- states written before states had a time ------------------------------------------------------


def put_legacy(h: Harness, producer: str, queue: int, *entries: tuple[int, int, int]) -> None:
    batch = Batch()
    batch.put(keys.producer_key(1, queue, producer), legacy(*entries))
    h.store.write(batch)


def test_until_the_first_expire_producers_states_are_written_as_older_releases_wrote_them(
    fresh: Harness,
) -> None:
    fresh.produce("p", 0, now_ms=1000)
    fresh.produce("p", 1, now_ms=2000)
    assert fresh.store.get(keys.producer_key(1, 0, "p")) == legacy((0, 0, 1), (1, 1, 1))
    assert fresh.index_keys() == [] and fresh.store.get(keys.PRODUCER_SWEEP) is None
    assert expiry_due(fresh.store, 0, 10**9)  # the leader starts expiry at its first tick


def test_old_states_keep_working_and_the_sweep_gives_them_a_time_in_bounded_steps(fresh: Harness) -> None:
    h = fresh
    h.produce("new", 0, now_ms=1000)
    for i in range(12):
        put_legacy(h, f"old{i:02}", 0, (4, 0, 1))
    assert h.produce("old00", 4, now_ms=1000)["duplicate"] is True  # still remembered
    assert h.produce("old01", 3, now_ms=1000)["error"]["code"] == "stale_sequence"
    assert h.produce("old02", 5, now_ms=1000)["base_offset"] == 1
    assert h.state("old02") == ProducerState(((4, 0, 1), (5, 1, 1)), None)

    # 13 P keys, 5 per step: the cursor moves through them, states without a time get the step's;
    # an append during the sweep records its own time, and the sweep leaves that state alone.
    steps = [h.expire(now_ms=2000, idle_ms=5000, max_items=5)]
    assert h.produce("old05", 6, now_ms=2500)["base_offset"] == 2
    steps += [h.expire(now_ms=t, idle_ms=5000, max_items=5) for t in (3000, 4000)]
    assert [r["more"] for r in steps] == [True, True, False]
    assert h.store.get(keys.PRODUCER_SWEEP) == b""  # done
    times = {pid: t for t, _, _, pid in h.index_keys()}
    assert times == {
        **{p: 2000 for p in ("new", "old00", "old01", "old02", "old03")},
        **{p: 3000 for p in ("old04", "old06", "old07", "old08")},
        **{"old05": 2500, "old09": 4000, "old10": 4000, "old11": 4000},
    }
    assert {pid: getattr(h.state(pid), "last_used_ms", None) for pid in times} == times

    assert not expiry_due(h.store, 6999, 5000)
    assert h.expire(now_ms=7001, idle_ms=5000) == {"expired": 5, "more": False}
    assert h.expire(now_ms=7501, idle_ms=5000) == {"expired": 1, "more": False}
    assert expiry_due(h.store, 8001, 5000)
    assert h.expire(now_ms=9001, idle_ms=5000) == {"expired": 7, "more": False}
    assert [k for k, _ in h.pairs() if k[:1] in (b"P", b"W")] == []


def test_expiry_due_sees_due_states_only_once_the_sweep_is_done(fresh: Harness) -> None:
    h = fresh
    assert expiry_due(h.store, 0, 1)  # a new group runs the (empty) sweep once
    h.expire(now_ms=0, idle_ms=1)
    assert not expiry_due(h.store, 10**12, 1)
    h.produce("p", 0, now_ms=1000)
    assert not expiry_due(h.store, 6000, 5000)
    assert expiry_due(h.store, 6001, 5000)


# -- bad commands and configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"idle_ms": 0},
        {"idle_ms": 2**40 + 1},
        {"max": 0},
        {"max": 100_001},
        {"max": True},
        {"now_ms": -1},
        {"now_ms": 2**62 + 1},
        {"now_ms": None},
        {"extra": 1},
    ],
)
def test_malformed_expire_commands_are_errors_that_change_nothing(h: Harness, fields: dict[str, Any]) -> None:
    h.produce("p", 0, now_ms=1000)
    before = h.pairs()
    command = {**orjson.loads(expire_producers(10**9, 1, 10)), **fields}
    assert h.apply(orjson.dumps(command))["error"]["code"] == "bad_request"
    assert h.pairs() == before


def test_expire_producers_is_added_after_every_older_op() -> None:
    assert commands.OPS.index("expire_producers") == 16  # its position never changes
    cmd = commands.decode(expire_producers(5, 6, 7))
    assert cmd == {"v": 1, "op": "expire_producers", "now_ms": 5, "idle_ms": 6, "max": 7}


def test_producer_idle_ms_defaults_to_seven_days_and_is_checked() -> None:
    node = {"id": "n1", "http": "127.0.0.1:8001", "raft": "127.0.0.1:7001", "data_dir": "/d"}
    raw: dict[str, Any] = {"cluster": {"secret": "0123456789abcdef"}, "nodes": [node]}
    assert parse_config(raw).limits.producer_idle_ms == 7 * 24 * 3600 * 1000
    assert parse_config({**raw, "limits": {"producer_idle_ms": 0}}).limits.producer_idle_ms == 0
    env = {"RAFTMQ_LIMITS_PRODUCER_IDLE_MS": "2000"}
    assert parse_config(raw, env=env).limits.producer_idle_ms == 2000
    with pytest.raises(ConfigError, match="producer_idle_ms"):
        parse_config({**raw, "limits": {"producer_idle_ms": 2**41}})
    with pytest.raises(ConfigError, match="producer_idle_ms"):
        parse_config({**raw, "limits": {"producer_idle_ms": -1}})
