"""Rolling upgrades: a group whose voters run different releases applies every entry alike.

Pure: queue-group and metadata machines over MemoryStores. A replica of the release before
capabilities is played as ``faults.previous_release_node`` plays it on a real node (its machine
refuses what that release refused, ``upgrade.previous_release_refuses``); the metadata group's
previous release is played by writing its entries' keys as it wrote them.
"""

from __future__ import annotations

from typing import Any

import orjson
from test_dead_letter_records import old_release_store
from test_delivery_storage import meta_apply

from raftmq.cluster import commands
from raftmq.cluster.machines import metadata
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.replication.upgrade import (
    BEFORE_CAPABILITIES,
    CAPABILITIES,
    advertised,
    capability_of,
    everywhere,
    old_subscribe,
    previous_release_refuses,
)
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, Store

T = 1  # topic id


def state(store: Store) -> list[tuple[bytes, bytes]]:
    return list(store.scan(b""))


class Replicas:
    """One queue group, replicated on a replica of this release and one of the release before."""

    def __init__(self) -> None:
        self.new = QueueGroupMachine(MemoryStore(), 0)
        self.previous = QueueGroupMachine(MemoryStore(), 0)
        self.previous.refuses = previous_release_refuses
        self.index = 0

    def apply(self, command: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        self.index += 1
        return self.new.apply(self.index, command), self.previous.apply(self.index, command)


def subscribe_fields(**kw: Any) -> dict[str, Any]:
    """The fields a leader builds for ``subscribe`` (handlers/subscriptions.py, None dropped)."""
    fields = {
        "group": "g",
        "topic_id": T,
        "topic": "orders",
        "dlq_topic_id": None,
        "checked": True,
        "max_deliveries": 3,
        "backoff_ms": [100],
        "overwrite": False,
        "now_ms": 50,
        **kw,
    }
    return {k: v for k, v in fields.items() if v is not None}


def command(op: str, fields: dict[str, Any]) -> bytes:
    return orjson.dumps({"v": commands.VERSION, "op": op, **fields})


def test_a_previous_release_replica_refuses_the_new_forms_and_applies_the_gated_ones_as_an_upgraded_one() -> (
    None
):
    r = Replicas()
    # What a leader wrote without the gate: the new replica applies it, the previous one refuses.
    new_form, expire = (
        command("subscribe", subscribe_fields(creator="tok", max_topic_groups=10)),
        commands.expire_subscriptions(60, 10, 100),
    )
    for cmd in (new_form, expire):
        assert previous_release_refuses(cmd)
    applied, refused = r.apply(new_form)
    assert "subscription" in applied and refused["error"]["code"] == "bad_request"
    assert state(r.new.store) != state(r.previous.store)  # the divergence the gate prevents

    # What a gated leader writes instead: both replicas apply each entry alike.
    r = Replicas()
    unconfigured_new = subscribe_fields(creator="tok", max_topic_groups=10)
    assert old_subscribe(unconfigured_new, exists=False) is None  # no safe old form: 503
    put = old_subscribe(subscribe_fields(overwrite=True, configured=True), exists=False)
    old_fields = {"group", "topic_id", "topic", "max_deliveries", "backoff_ms", "overwrite"}
    assert put is not None and set(put) <= old_fields
    steps = [
        commands.produce(10, [{"topic_id": T, "queue": 0, "messages": [{"value": "a"}, {"value": "b"}]}]),
        command("subscribe", put),
        commands.receive(20, "g", T, [0], 10, 1000),
        command("subscribe", old_subscribe(subscribe_fields(dlq_topic_id=7), exists=True) or {}),
        commands.ack(30, "g", T, [(0, 0, 3)]),
        command("subscribe", old_subscribe(subscribe_fields(configured=True, group="h"), exists=False) or {}),
    ]
    for step in steps:
        assert not previous_release_refuses(step)
        a, b = r.apply(step)
        assert a == b and "error" not in a, (a, b)
    assert state(r.new.store) == state(r.previous.store)


def test_capabilities_come_from_the_op_tables_and_a_silent_node_is_the_previous_release() -> None:
    assert set(commands.OPS) | set(commands.FIELD_LEVELS) <= CAPABILITIES
    assert {f"meta.{op}" for op in (*metadata.OPS, *metadata.FIELD_LEVELS)} <= CAPABILITIES
    # Every op added after the release before capabilities is gated without more code.
    after = commands.OPS[commands.OPS.index("append") + 1 :]
    assert after and not set(after) & BEFORE_CAPABILITIES
    assert "meta.record_dead_letters" not in BEFORE_CAPABILITIES
    assert advertised({"node_id": "n2", "batch_formats": [1, 2]}) == BEFORE_CAPABILITIES
    listed = advertised({"capabilities": ["noop", "subscribe.records", "an.op.of.a.newer.release", 7]})
    assert listed == {"noop", "subscribe.records"}


def test_the_dead_letter_migration_is_one_proposed_entry_so_replicas_upgraded_apart_agree() -> None:
    specs = (("payments.eu", 2, (0,)), ("payments.eu.billing.dlq", 3, (0,)))
    upgraded, previous = MetadataMachine(old_release_store(*specs)), old_release_store(*specs)
    # Entry 11 deletes the source. The upgraded replica applies it; the previous release wrote
    # exactly these keys for delete_topic.
    assert "deleted" in meta_apply(upgraded, 11, op="delete_topic", name="payments.eu")
    batch = Batch()
    batch.delete(b"Tpayments.eu")
    batch.put(b"A", (11).to_bytes(8, "big"))
    previous.write(batch)
    # The second replica is upgraded before entry 12; then both apply the same entries.
    later = MetadataMachine(previous)
    for m in (upgraded, later):
        m.apply(12, commands.noop())
        # Its source deleted, the topic has nothing to record: the leader need not wait for the
        # entry before it makes dead-letter topics (a new cluster neither), but the entry applies
        # alike everywhere.
        assert not m.needs_dead_letter_records
        assert meta_apply(m, 13, op="record_dead_letters") == {"recorded": 0}
        assert not m.needs_dead_letter_records
        assert meta_apply(m, 14, op="record_dead_letters") == {"recorded": 0}  # once
    assert [t.to_json() for t in upgraded.topics()] == [t.to_json() for t in later.topics()]
    assert upgraded.topic("payments.eu.billing.dlq").dead_letter_of is None  # type: ignore[union-attr]


def test_an_older_leaders_ensure_dlq_topic_is_applied_as_its_release_did_until_the_records_entry() -> None:
    """While an older release leads the metadata group, its ensure_dlq_topic (without by_record)
    finds the topic by name and makes it without a record, on upgraded replicas as on its own; the
    record comes from record_dead_letters, on every replica at that entry."""
    specs = (("payments", 1, (0,)), ("payments.eu", 2, (0,)), ("payments.eu.billing.dlq", 3, (0,)))
    upgraded = MetadataMachine(old_release_store(*specs))
    found = meta_apply(upgraded, 11, op="ensure_dlq_topic", source="payments", group="eu.billing", now_ms=5)
    assert found["created"] is False and found["topic"]["name"] == "payments.eu.billing.dlq"  # type: ignore[index]
    made = meta_apply(upgraded, 12, op="ensure_dlq_topic", source="payments", group="ops", now_ms=5)
    assert made["created"] is True and upgraded.topic("payments.ops.dlq").dead_letter_of is None  # type: ignore[index,union-attr]
    assert meta_apply(upgraded, 13, op="record_dead_letters") == {"recorded": 2}
    assert upgraded.topic("payments.ops.dlq").dead_letter_of == (1, "ops")  # type: ignore[union-attr]
    # This release's leader writes by_record: the dotted group is refused.
    refused = meta_apply(
        upgraded, 14, op="ensure_dlq_topic", source="payments", group="eu.billing", now_ms=5, by_record=True
    )
    assert refused["error"]["code"] == "dead_letter_topic_conflict"  # type: ignore[index]


def test_the_op_a_proposal_writes_is_read_from_its_first_bytes_for_the_propose_backstop() -> None:
    assert capability_of("0", commands.expire_subscriptions(1, 2, 3)) == "expire_subscriptions"
    assert capability_of("0", commands.noop()) == "noop"
    assert (
        capability_of("meta", orjson.dumps({"v": 1, "op": "record_dead_letters"}))
        == "meta.record_dead_letters"
    )
    built = commands.subscribe("g", 1, "orders", None, 3, [100], checked=True)
    assert capability_of("0", built) == "subscribe"
    assert capability_of("0", commands.append(5, [])) is None  # binary: gated by batch_formats
    assert capability_of("0", b'{"op":"expire_subscriptions","v":1}') is None  # not a builder's


def test_the_newer_delivery_tick_and_topic_attributes_are_gated_as_the_previous_release_lacks_them() -> None:
    # Added by issue 21 (expiry without backoff) and the SQS API (topic attributes): a previous
    # release refused both, so neither may be written before every voter advertises it.
    for capability in ("deliver_tick.expiry", "meta.set_topic_attributes", "meta.create_topic.attributes"):
        assert capability in CAPABILITIES and capability not in BEFORE_CAPABILITIES, capability
    assert previous_release_refuses(commands.deliver_tick(1, 10))  # the new rule names its field
    assert not previous_release_refuses(commands.deliver_tick(1, 10, expiry_backoff=True))


def test_a_new_cluster_needs_no_dead_letter_records_entry_and_an_old_one_with_unrecorded_ones_does() -> None:
    # A new cluster's first dead letters must not wait for record_dead_letters (proposed on the
    # retention tick): they were parked, and the console's tests met it.
    assert not MetadataMachine(MemoryStore()).needs_dead_letter_records
    old = MetadataMachine(old_release_store(("payments", 2, (0,)), ("payments.billing.dlq", 3, (0,))))
    assert old.needs_dead_letter_records
    assert meta_apply(old, 11, op="record_dead_letters") == {"recorded": 1}
    assert not old.needs_dead_letter_records


def test_an_advance_only_commit_is_gated_and_its_older_form_applies_alike_on_both_releases() -> None:
    # A previous release refused the field: until every voter advertises commit_offsets.advance
    # the leader writes the commit without it (a set), which both releases apply alike.
    assert "commit_offsets.advance" in CAPABILITIES and "commit_offsets.advance" not in BEFORE_CAPABILITIES
    advance = commands.commit_offsets("g", T, {0: 1}, advance=True)
    fenced = commands.commit_fenced("g", T, {0: 1}, 1, advance=True)
    assert previous_release_refuses(advance) and previous_release_refuses(fenced)
    r = Replicas()
    r.apply(commands.produce(10, [{"topic_id": T, "queue": 0, "messages": [{"value": "a"}, {"value": "b"}]}]))
    applied, refused = r.apply(advance)
    assert applied["ok"] is True and refused["error"]["code"] == "bad_request"  # the divergence gated

    r = Replicas()
    r.apply(commands.produce(10, [{"topic_id": T, "queue": 0, "messages": [{"value": "a"}, {"value": "b"}]}]))
    for offset in (2, 1):
        step = commands.commit_offsets("g", T, {0: offset})
        assert not previous_release_refuses(step)
        a, b = r.apply(step)
        assert "error" not in a and "error" not in b, (a, b)
    assert state(r.new.store) == state(r.previous.store)


def test_a_capability_is_everywhere_only_once_every_node_advertised_it() -> None:
    fifo_release = "receive_ordered.delay"  # the SQS API's FIFO DelaySeconds, RedrivePolicy, move tasks
    # The release before it served FIFO queues (dedup_produce, receive_ordered) without them.
    before = advertised({"capabilities": sorted(CAPABILITIES - {fifo_release})})
    assert "receive_ordered" in before and fifo_release not in before
    new = {"n2": CAPABILITIES, "n3": CAPABILITIES}
    assert everywhere(fifo_release, CAPABILITIES, ["n2", "n3"], new)
    # A node of the release before, one never heard of, one advertising nothing, or this node's own
    # older release each keep it closed, whatever the groups' voters are.
    assert not everywhere(fifo_release, CAPABILITIES, ["n2", "n3"], {**new, "n3": before})
    assert not everywhere(fifo_release, CAPABILITIES, ["n2", "n3", "n4"], new)
    assert not everywhere(fifo_release, CAPABILITIES, ["n2"], {"n2": advertised({})})
    assert not everywhere(fifo_release, before, ["n2", "n3"], new)
    # What every release applies needs nobody's word.
    assert everywhere("produce", BEFORE_CAPABILITIES, ["n2"], {})
