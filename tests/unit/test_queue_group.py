"""The queue-group state machine: offsets, idempotence, replay, bad input, offsets, retention, drops."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.machines import append as append_module
from raftmq.cluster.machines.queue_group import Applied, QueueGroupMachine, QueueHigh
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import (
    OffsetOutOfRange,
    applied_index,
    committed_offset,
    queue_bounds,
    queue_meta,
    read_messages,
)
from raftmq.storage.records import decode_header
from raftmq.storage.store import Batch, StoreError

Pairs = list[tuple[bytes, bytes]]


class Harness:
    """A machine over a MemoryStore that numbers entries itself."""

    def __init__(self, **kwargs: Any) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 1, **kwargs)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(self, *batches: dict[str, Any], now_ms: int = 1000) -> dict[str, Any]:
        return self.apply(commands.produce(now_ms, list(batches)))

    def pairs(self) -> Pairs:
        return list(self.store.scan(b""))

    def pairs_without_applied(self) -> Pairs:
        # The group's time (T) is bookkeeping written with any stamped command, as applied_index.
        return [(k, v) for k, v in self.pairs() if k not in (keys.APPLIED, keys.GROUP_TIME)]

    def values(self, topic_id: int, queue: int, offset: int = 0, max_messages: int = 1000) -> list[bytes]:
        return [m.value for m in read_messages(self.store, topic_id, queue, offset, max_messages)]


def batch(topic_id: int, queue: int, *values: str, **extra: Any) -> dict[str, Any]:
    return {"topic_id": topic_id, "queue": queue, "messages": [{"value": v} for v in values], **extra}


def ok(topic_id: int, queue: int, base_offset: int, count: int) -> dict[str, Any]:
    return {"topic_id": topic_id, "queue": queue, "base_offset": base_offset, "count": count}


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- produce ------------------------------------------------------------------------------------


def test_offsets_are_dense_from_zero_per_queue(h: Harness) -> None:
    assert h.produce(batch(1, 0, "a", "b", "c")) == {"results": [ok(1, 0, 0, 3)]}
    assert h.produce(batch(1, 1, "x", "y")) == {"results": [ok(1, 1, 0, 2)]}
    assert h.produce(batch(1, 0, "d", "e")) == {"results": [ok(1, 0, 3, 2)]}
    assert queue_bounds(h.store, 1, 0) == (0, 5)
    assert queue_bounds(h.store, 1, 1) == (0, 2)
    assert h.values(1, 0) == [b"a", b"b", b"c", b"d", b"e"]
    assert [m.offset for m in read_messages(h.store, 1, 0, 0, 100)] == [0, 1, 2, 3, 4]


def test_one_command_appends_to_many_queues_and_topics_and_continues_within_a_queue(h: Harness) -> None:
    result = h.produce(batch(1, 0, "a"), batch(2, 0, "b", "c"), batch(1, 0, "d", "e"), batch(1, 3, "f"))
    assert result == {"results": [ok(1, 0, 0, 1), ok(2, 0, 0, 2), ok(1, 0, 1, 2), ok(1, 3, 0, 1)]}
    assert h.values(1, 0) == [b"a", b"d", b"e"]
    assert h.values(2, 0) == [b"b", b"c"]
    assert h.values(1, 3) == [b"f"]


def test_messages_keep_key_headers_binary_append_time_and_raft_index(h: Harness) -> None:
    message = {"value_b64": "AAEC", "key": "k", "headers": {"h": "v"}}
    h.produce({"topic_id": 1, "queue": 0, "messages": [message]}, now_ms=1234)
    (m,) = read_messages(h.store, 1, 0, 0, 10)
    assert (m.value, m.binary, m.key, m.headers) == (b"\x00\x01\x02", True, "k", {"h": "v"})
    assert (m.timestamp_ms, m.raft_index) == (1234, h.index)


def test_retried_producer_sequence_returns_original_offsets_and_stores_nothing(h: Harness) -> None:
    h.produce(batch(1, 0, "a", "b", producer_id="p", sequence=7))
    h.produce(batch(1, 0, "c"))
    before = h.pairs_without_applied()
    retry = h.produce(batch(1, 0, "a", "b", producer_id="p", sequence=7))
    assert retry == {"results": [{**ok(1, 0, 0, 2), "duplicate": True}]}
    assert h.pairs_without_applied() == before
    assert h.values(1, 0) == [b"a", b"b", b"c"]


def test_duplicate_sequence_within_one_command_is_stored_once(h: Harness) -> None:
    result = h.produce(
        batch(1, 0, "a", producer_id="p", sequence=1), batch(1, 0, "a", producer_id="p", sequence=1)
    )
    assert result == {"results": [ok(1, 0, 0, 1), {**ok(1, 0, 0, 1), "duplicate": True}]}
    assert h.values(1, 0) == [b"a"]


def test_producer_sequences_are_per_queue_and_only_the_last_five_are_remembered(h: Harness) -> None:
    h.produce(batch(1, 0, "a", producer_id="p", sequence=0))
    assert h.produce(batch(1, 1, "a", producer_id="p", sequence=0)) == {"results": [ok(1, 1, 0, 1)]}
    for sequence in range(1, 6):
        h.produce(batch(1, 0, "x", producer_id="p", sequence=sequence))
    # Sequence 0 fell out of the window of 5, but it is older than the newest: refused, not stored.
    before = h.pairs_without_applied()
    late = h.produce(batch(1, 0, "a", producer_id="p", sequence=0))["results"][0]
    assert (
        late["error"]["code"] == "stale_sequence" and "newest on this queue (5)" in late["error"]["message"]
    )
    assert h.pairs_without_applied() == before
    assert h.produce(batch(1, 0, "x", producer_id="p", sequence=5))["results"][0]["duplicate"] is True


def test_a_late_batch_that_was_never_stored_is_refused_once_newer_ones_are(h: Harness) -> None:
    # Sequence 3 gave up (its command stuck while the group had no leader); 4 and 5 were stored;
    # then 3's command is applied at last. It must not land behind them.
    h.produce(batch(1, 0, "a", producer_id="p", sequence=2))
    h.produce(batch(1, 0, "c", producer_id="p", sequence=4))
    h.produce(batch(1, 0, "d", producer_id="p", sequence=5))
    late = h.produce(
        batch(1, 0, "b", producer_id="p", sequence=3), batch(1, 1, "b", producer_id="p", sequence=3)
    )
    assert late["results"][0]["error"]["code"] == "stale_sequence"
    assert late["results"][1] == ok(1, 1, 0, 1)  # sequences are per queue: queue 1 never saw p
    assert h.values(1, 0) == [b"a", b"c", b"d"]
    assert h.produce(batch(1, 0, "e", producer_id="p", sequence=9)) == {"results": [ok(1, 0, 3, 1)]}


def test_too_many_messages_in_one_entry_is_rejected_whole() -> None:
    h = Harness(max_entry_messages=3)
    result = h.produce(batch(1, 0, "a", "b"), batch(1, 1, "c", "d"))
    assert result["error"]["code"] == "request_too_large"
    assert h.pairs_without_applied() == []


# -- replay and bad input ---------------------------------------------------------------------


def test_replayed_index_is_skipped_and_changes_nothing(h: Harness) -> None:
    cmd = commands.produce(1000, [batch(1, 0, "a")])
    h.machine.apply(1, cmd)
    h.machine.apply(2, commands.commit_offsets("g", 1, {0: 1}))
    before = h.pairs()
    assert h.machine.apply(1, cmd) == {"skipped": True}
    assert h.machine.apply(2, commands.drop_topic(1)) == {"skipped": True}
    assert h.pairs() == before
    assert h.machine.applied_index == 2


def test_applied_index_is_loaded_from_the_store(h: Harness) -> None:
    h.produce(batch(1, 0, "a"))
    h.apply(commands.noop())
    restarted = QueueGroupMachine(h.store, 1)
    assert restarted.applied_index == applied_index(h.store) == 2
    assert restarted.apply(2, commands.produce(1000, [batch(1, 0, "again")])) == {"skipped": True}


def _cmd(**fields: Any) -> bytes:
    return orjson.dumps({"v": 1, **fields})


def _produce_msg(message: dict[str, Any], **batch_fields: Any) -> bytes:
    b = {"topic_id": 1, "queue": 0, "messages": [message], **batch_fields}
    return _cmd(op="produce", now_ms=5, batches=[b])


MALFORMED: list[tuple[str, bytes, str]] = [
    ("not json", b"not json", "invalid_json"),
    ("invalid utf-8", b'{"v": 1, "op": "noop", "x": "\xff"}', "invalid_json"),
    ("empty", b"", "invalid_json"),
    ("a list", b"[]", "bad_request"),
    ("a string", b'"noop"', "bad_request"),
    ("no version", b'{"op": "noop"}', "bad_request"),
    ("wrong version", b'{"v": 2, "op": "noop"}', "bad_request"),
    ("bool version", b'{"v": true, "op": "noop"}', "bad_request"),
    ("unknown op", _cmd(op="explode"), "bad_request"),
    ("no op", _cmd(), "bad_request"),
    ("unknown field", _cmd(op="noop", extra=1), "bad_request"),
    ("string offset", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"0": "1"}), "bad_request"),
    ("negative offset", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"0": -1}), "bad_request"),
    ("bool offset", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"0": True}), "bad_request"),
    ("float offset", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"0": 1.0}), "bad_request"),
    ("padded queue", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"01": 0}), "bad_request"),
    ("negative queue", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"-1": 0}), "bad_request"),
    ("huge queue", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"9" * 5000: 0}), "bad_request"),
    ("empty offsets", _cmd(op="commit_offsets", group="g", topic_id=1, offsets={}), "bad_request"),
    ("empty group", _cmd(op="commit_offsets", group="", topic_id=1, offsets={"0": 0}), "bad_request"),
    ("long group", _cmd(op="commit_offsets", group="g" * 256, topic_id=1, offsets={"0": 0}), "bad_request"),
    ("bool topic", _cmd(op="drop_topic", topic_id=True), "bad_request"),
    ("topic over u32", _cmd(op="drop_topic", topic_id=2**32), "bad_request"),
    ("bool now_ms", _cmd(op="produce", now_ms=True, batches=[batch(1, 0, "a")]), "bad_request"),
    ("no batches", _cmd(op="produce", now_ms=5, batches=[]), "bad_request"),
    ("no messages", _cmd(op="produce", now_ms=5, batches=[batch(1, 0)]), "bad_request"),
    ("bad base64", _produce_msg({"value_b64": "!!!!"}), "bad_request"),
    ("unpadded base64", _produce_msg({"value_b64": "AAE"}), "bad_request"),
    ("value and b64", _produce_msg({"value": "a", "value_b64": "AA=="}), "bad_request"),
    ("no value", _produce_msg({"key": "k"}), "bad_request"),
    ("bytes-ish value", _produce_msg({"value": [1, 2]}), "bad_request"),
    ("null key", _produce_msg({"value": "a", "key": None}), "bad_request"),
    ("int header value", _produce_msg({"value": "a", "headers": {"h": 1}}), "bad_request"),
    ("list headers", _produce_msg({"value": "a", "headers": ["h"]}), "bad_request"),
    ("unknown message field", _produce_msg({"value": "a", "delay_ms": 5}), "bad_request"),
    ("sequence without producer", _produce_msg({"value": "a"}, sequence=1), "bad_request"),
    ("bool sequence", _produce_msg({"value": "a"}, producer_id="p", sequence=True), "bad_request"),
    ("negative sequence", _produce_msg({"value": "a"}, producer_id="p", sequence=-1), "bad_request"),
    ("negative queue in batch", _produce_msg({"value": "a"}, queue=-1), "bad_request"),
    (
        "retain twice",
        _cmd(op="retain", now_ms=5, queues=[{"topic_id": 1, "queue": 0}, {"topic_id": 1, "queue": 0}]),
        "bad_request",
    ),
    (
        "retain bool",
        _cmd(op="retain", now_ms=5, queues=[{"topic_id": 1, "queue": 0, "max_bytes": False}]),
        "bad_request",
    ),
]


@pytest.mark.parametrize(("name", "command", "code"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_command_returns_error_and_changes_only_applied_index(
    h: Harness, name: str, command: bytes, code: str
) -> None:
    h.produce(batch(1, 0, "a", "b"))
    h.apply(commands.commit_offsets("g", 1, {0: 1}))
    before = h.pairs_without_applied()
    result = h.apply(command)
    assert result["error"]["code"] == code, result
    assert set(result["error"]) >= {"message", "retriable", "definite"}
    assert h.pairs_without_applied() == before
    assert applied_index(h.store) == h.machine.applied_index == h.index


def test_unexpected_exception_returns_internal_error_and_next_command_applies(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h.produce(batch(1, 0, "a"))
    before = h.pairs_without_applied()

    def broken(*args: Any) -> bytes:
        raise RuntimeError("encoder broke")

    monkeypatch.setattr(append_module, "encode_batch", broken)
    result = h.produce(batch(1, 0, "b"), batch(2, 0, "c"))
    assert result["error"]["code"] == "internal"
    assert h.pairs_without_applied() == before
    assert applied_index(h.store) == h.index
    monkeypatch.undo()
    assert h.produce(batch(1, 0, "b")) == {"results": [ok(1, 0, 1, 1)]}


class FailingWrites(MemoryStore):
    def write(self, batch: Batch, *, sync: bool = False) -> None:
        raise StoreError("disk on fire")


def test_store_write_failure_escapes_and_does_not_advance_applied_index() -> None:
    machine = QueueGroupMachine(FailingWrites(), 1)
    with pytest.raises(StoreError):
        machine.apply(1, commands.noop())
    assert machine.applied_index == 0


def test_corrupt_stored_batch_escapes_as_store_error(h: Harness) -> None:
    h.produce(batch(1, 0, "a"), now_ms=1)
    damage = Batch()
    damage.put(keys.record_key(1, 0, 0), b"\x09garbage")
    h.store.write(damage)
    with pytest.raises(StoreError):
        h.apply(commands.retain(10_000, [{"topic_id": 1, "queue": 0, "max_age_ms": 1}]))


def test_on_applied_hook_sees_grown_queues_and_its_errors_are_swallowed(h: Harness) -> None:
    seen: list[Applied] = []
    h.machine.on_applied = seen.append
    h.produce(batch(1, 0, "a", "b"), batch(2, 5, "c"))
    h.apply(commands.noop())
    assert seen == [Applied(1, (QueueHigh(1, 0, 2), QueueHigh(2, 5, 1))), Applied(2, ())]

    def explode(applied: Applied) -> None:
        raise ValueError("hook broke")

    h.machine.on_applied = explode
    assert h.produce(batch(1, 0, "d")) == {"results": [ok(1, 0, 2, 1)]}


# -- consumer offsets -------------------------------------------------------------------------


def test_commit_offsets_accepts_zero_to_high_and_is_all_or_nothing(h: Harness) -> None:
    h.produce(batch(1, 0, "a", "b"), batch(1, 1, "c"))
    assert h.apply(commands.commit_offsets("g", 1, {0: 2, 1: 0})) == {
        "ok": True,
        "offsets": {"0": {"offset": 2, "applied": True}, "1": {"offset": 0, "applied": True}},
    }
    assert committed_offset(h.store, "g", 1, 0) == 2
    assert committed_offset(h.store, "g", 1, 1) == 0
    assert committed_offset(h.store, "other", 1, 0) is None

    result = h.apply(commands.commit_offsets("g", 1, {0: 1, 1: 2}))
    assert result["error"]["code"] == "offset_out_of_range"
    assert (result["error"]["queue"], result["error"]["low_offset"], result["error"]["high_offset"]) == (
        1,
        0,
        1,
    )
    assert committed_offset(h.store, "g", 1, 0) == 2  # the valid half was not applied


def test_commit_on_unknown_queue_accepts_only_zero(h: Harness) -> None:
    assert h.apply(commands.commit_offsets("g", 9, {4: 0}))["ok"] is True
    assert h.apply(commands.commit_offsets("g", 9, {4: 1}))["error"]["code"] == "offset_out_of_range"


def test_an_advance_only_commit_older_than_the_stored_one_is_kept(h: Harness) -> None:
    """A late copy of an older commit (held up at a paused node, or a retry racing the original)
    must not move the group back: the chaos soak's committed offsets that went backwards."""
    h.produce(batch(1, 0, *"abcdef"), batch(1, 1, *"xyz"))
    assert h.apply(commands.commit_offsets("g", 1, {0: 2}, advance=True))["offsets"] == {
        "0": {"offset": 2, "applied": True}  # none stored yet: applied
    }
    assert h.apply(commands.commit_offsets("g", 1, {0: 5, 1: 1}, advance=True))["ok"] is True
    before = h.pairs_without_applied()
    # The older commit lands after the newer one: queue 0 keeps 5; queue 1's 2 moves it forward.
    result = h.apply(commands.commit_offsets("g", 1, {0: 2, 1: 2}, advance=True))
    assert result == {
        "ok": True,
        "offsets": {"0": {"offset": 5, "applied": False}, "1": {"offset": 2, "applied": True}},
    }
    assert (committed_offset(h.store, "g", 1, 0), committed_offset(h.store, "g", 1, 1)) == (5, 2)
    # The same offset again (a resent commit) is kept too and changes no key of the group.
    again = h.apply(commands.commit_offsets("g", 1, {0: 5}, advance=True))
    assert again["offsets"] == {"0": {"offset": 5, "applied": False}}
    assert committed_offset(h.store, "g", 1, 0) == 5
    assert [k for k, _ in before if k not in dict(h.pairs_without_applied())] == []


def test_an_explicit_set_still_moves_the_offset_back(h: Harness) -> None:
    h.produce(batch(1, 0, *"abcdef"))
    h.apply(commands.commit_offsets("g", 1, {0: 5}, advance=True))
    assert h.apply(commands.commit_offsets("g", 1, {0: 1}))["offsets"] == {
        "0": {"offset": 1, "applied": True}
    }
    assert committed_offset(h.store, "g", 1, 0) == 1


def test_commit_entries_written_before_advance_replay_as_sets() -> None:
    """An entry of the release before the field (no ``advance``) applies as it did: a later, lower
    offset overwrites. Two replicas replaying the same log end with the same bytes."""
    log = [
        commands.produce(1000, [batch(1, 0, *"abcdef")]),
        b'{"v":1,"op":"commit_offsets","group":"g","topic_id":1,"offsets":{"0":5}}',
        b'{"v":1,"op":"commit_offsets","group":"g","topic_id":1,"offsets":{"0":2}}',
    ]
    replicas = [Harness(), Harness()]
    for r in replicas:
        for entry in log:
            assert "error" not in r.apply(entry)
    assert committed_offset(replicas[0].store, "g", 1, 0) == 2
    assert replicas[0].pairs() == replicas[1].pairs()


@pytest.mark.parametrize("advance", ["yes", 1, [], {}])
def test_advance_must_be_a_bool(h: Harness, advance: Any) -> None:
    h.produce(batch(1, 0, "a"))
    bad_cmd = _cmd(op="commit_offsets", group="g", topic_id=1, offsets={"0": 1}, advance=advance)
    assert h.apply(bad_cmd)["error"]["code"] == "bad_request"
    assert committed_offset(h.store, "g", 1, 0) is None


# -- retention --------------------------------------------------------------------------------


def _batch_sizes(h: Harness, topic_id: int, queue: int) -> list[tuple[int, int]]:
    """(base_offset, stored size) of each record batch of a queue."""
    start, end = keys.queue_range(keys.RECORD, topic_id, queue)
    return [(decode_header(v).base_offset, len(v)) for _, v in h.store.scan(start, end)]


def _assert_meta_matches_batches(h: Harness, topic_id: int, queue: int) -> None:
    meta = queue_meta(h.store, topic_id, queue)
    assert meta is not None
    sizes = _batch_sizes(h, topic_id, queue)
    assert meta.retained_bytes == sum(size for _, size in sizes)
    assert meta.low_offset == (sizes[0][0] if sizes else meta.high_offset)


def test_retention_by_age_removes_whole_old_batches_and_moves_low_offset(h: Harness) -> None:
    h.produce(batch(1, 0, "a", "b"), now_ms=1000)
    h.produce(batch(1, 0, "c", "d"), now_ms=2000)
    h.produce(batch(1, 0, "e"), now_ms=3000)
    result = h.apply(
        commands.retain(3500, [{"topic_id": 1, "queue": 0, "max_age_ms": 1000, "max_bytes": None}])
    )
    assert result == {"removed": [{"topic_id": 1, "queue": 0, "low_offset": 4}]}
    assert queue_bounds(h.store, 1, 0) == (4, 5)
    _assert_meta_matches_batches(h, 1, 0)
    with pytest.raises(OffsetOutOfRange) as caught:
        read_messages(h.store, 1, 0, 2, 10)
    assert (caught.value.low_offset, caught.value.high_offset) == (4, 5)
    assert h.values(1, 0, offset=4) == [b"e"]


def test_retention_by_age_may_empty_a_queue_and_produce_continues_at_high(h: Harness) -> None:
    h.produce(batch(1, 0, "a", "b"), now_ms=1000)
    h.apply(commands.retain(10_000, [{"topic_id": 1, "queue": 0, "max_age_ms": 1}]))
    assert queue_bounds(h.store, 1, 0) == (2, 2)
    assert _batch_sizes(h, 1, 0) == []
    _assert_meta_matches_batches(h, 1, 0)
    assert read_messages(h.store, 1, 0, 2, 10) == []
    assert h.produce(batch(1, 0, "c")) == {"results": [ok(1, 0, 2, 1)]}


def test_retention_and_a_dropped_topic_report_the_key_ranges_they_freed_and_nothing_else_does(
    h: Harness,
) -> None:
    seen: list[Applied] = []
    h.machine.on_applied = seen.append
    h.produce(batch(1, 0, "a"), batch(1, 0, "b"), batch(1, 1, "c"), now_ms=1000)
    retained = h.apply(commands.retain(1000, [{"topic_id": 1, "queue": 0, "max_bytes": 1}]))
    assert retained["removed"] == [{"topic_id": 1, "queue": 0, "low_offset": 2}]
    h.apply(commands.retain(1000, [{"topic_id": 1, "queue": 1, "max_age_ms": 60_000}]))  # nothing due
    h.apply(commands.drop_topic(1))
    start, _ = keys.queue_range(keys.RECORD, 1, 0)
    assert [a.freed for a in seen] == [
        (),
        ((start, keys.record_key(1, 0, 2)),),
        (),
        tuple(keys.topic_range(prefix, 1) for prefix in keys.TOPIC_PREFIXES),
    ]
    assert h.values(1, 0) == [] and queue_bounds(h.store, 1, 0) == (0, 0)  # dropped: all gone


def test_a_replayed_retain_or_drop_topic_reports_its_freed_ranges_again_and_nothing_else_does(
    h: Harness,
) -> None:
    """A restart replays the journal from the last snapshot: entries the state already applied are
    skipped, but the compaction of what a retain or drop_topic removed may not have run yet."""
    h.produce(batch(1, 0, "a"), batch(1, 0, "b"), batch(1, 1, "c"), batch(2, 0, "d"), now_ms=1000)
    log = [
        commands.produce(1000, [batch(1, 0, "retain drop_topic")]),  # the words in a value: nothing
        commands.retain(1000, [{"topic_id": 1, "queue": 0, "max_bytes": 1}]),
        commands.retain(1000, [{"topic_id": 2, "queue": 0, "max_age_ms": 60_000}]),  # nothing due
        commands.drop_topic(2),
        commands.noop(),
    ]
    for command in log:
        h.apply(command)
    restarted = QueueGroupMachine(h.store, 1)  # the same store, as a node's start opens it
    seen: list[Applied] = []
    restarted.on_applied = seen.append
    before = h.pairs()
    for index, command in enumerate(log, start=2):
        assert restarted.apply(index, command) == {"skipped": True}
    assert h.pairs() == before
    start, _ = keys.queue_range(keys.RECORD, 1, 0)
    assert [(a.index, a.freed, a.grown) for a in seen] == [
        (3, ((start, keys.record_key(1, 0, 3)),), ()),  # as the queue stands now: below its low offset
        (5, tuple(keys.topic_range(prefix, 2) for prefix in keys.TOPIC_PREFIXES), ()),
    ]


def test_retention_by_size_removes_oldest_batches_until_within_max_bytes(h: Harness) -> None:
    for value in ("a" * 100, "b" * 100, "c" * 100):
        h.produce(batch(1, 0, value))
    newest_size = _batch_sizes(h, 1, 0)[-1][1]
    result = h.apply(commands.retain(0, [{"topic_id": 1, "queue": 0, "max_bytes": newest_size}]))
    assert result == {"removed": [{"topic_id": 1, "queue": 0, "low_offset": 2}]}
    assert h.values(1, 0, offset=2) == [b"c" * 100]
    _assert_meta_matches_batches(h, 1, 0)


def test_retention_with_nothing_to_remove_changes_only_applied_index(h: Harness) -> None:
    h.produce(batch(1, 0, "a"), now_ms=1000)
    before = h.pairs_without_applied()
    result = h.apply(
        commands.retain(
            1500,
            [
                {"topic_id": 1, "queue": 0, "max_age_ms": 1000, "max_bytes": 10**6},
                {"topic_id": 1, "queue": 1, "max_age_ms": 0},  # unknown queue
                {"topic_id": 1, "queue": 2},  # no limits
            ],
        )
    )
    assert result == {"removed": []}
    assert h.pairs_without_applied() == before


# -- drop_topic -------------------------------------------------------------------------------


def test_drop_topic_removes_every_key_of_the_topic_and_refuses_later_writes(h: Harness) -> None:
    h.produce(batch(1, 0, "a", producer_id="p", sequence=1), batch(1, 1, "b"), batch(2, 0, "keep"))
    h.apply(commands.commit_offsets("g", 1, {0: 1}))
    h.apply(commands.commit_offsets("g", 2, {0: 1}))
    assert h.apply(commands.drop_topic(1)) == {"ok": True}

    for prefix in keys.TOPIC_PREFIXES:
        start, end = keys.topic_range(prefix, 1)
        assert list(h.store.scan(start, end)) == []
    assert h.store.get(keys.dropped_key(1)) == b""  # the tombstone
    assert h.values(2, 0) == [b"keep"]
    assert committed_offset(h.store, "g", 2, 0) == 1

    result = h.produce(batch(1, 0, "late"), batch(2, 0, "fine"))
    assert result["results"][0]["error"]["code"] == "topic_not_found"
    assert result["results"][1] == ok(2, 0, 1, 1)
    assert queue_bounds(h.store, 1, 0) == (0, 0)
    assert h.apply(commands.commit_offsets("g", 1, {0: 0}))["error"]["code"] == "topic_not_found"


# -- reads ------------------------------------------------------------------------------------


def test_read_messages_starts_mid_batch_and_spans_batches(h: Harness) -> None:
    h.produce(batch(1, 0, "0", "1", "2"))
    h.produce(batch(1, 0, "3", "4"))
    h.produce(batch(1, 0, "5"))
    got = read_messages(h.store, 1, 0, 1, 4)
    assert [(m.offset, m.value) for m in got] == [(1, b"1"), (2, b"2"), (3, b"3"), (4, b"4")]
    assert [m.offset for m in read_messages(h.store, 1, 0, 4, 100)] == [4, 5]


def test_read_messages_spans_more_batches_than_one_scan_chunk(h: Harness) -> None:
    for i in range(40):
        h.produce(batch(1, 0, str(i)))
    assert h.values(1, 0, offset=3) == [str(i).encode() for i in range(3, 40)]


def test_read_messages_max_bytes_returns_at_least_one_message(h: Harness) -> None:
    h.produce(batch(1, 0, "a" * 10, "b" * 10, "c" * 10))
    assert len(read_messages(h.store, 1, 0, 0, 10, max_bytes=25)) == 2
    assert len(read_messages(h.store, 1, 0, 0, 10, max_bytes=1)) == 1


def test_read_messages_at_high_is_empty_and_beyond_high_is_out_of_range(h: Harness) -> None:
    h.produce(batch(1, 0, "a"))
    assert read_messages(h.store, 1, 0, 1, 10) == []
    with pytest.raises(OffsetOutOfRange):
        read_messages(h.store, 1, 0, 2, 10)
    assert queue_bounds(h.store, 7, 7) == (0, 0)
    assert read_messages(h.store, 7, 7, 0, 10) == []
