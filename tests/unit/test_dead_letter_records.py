"""Dead-letter topics are found by their record, never by name; consume rights are bounded (issue 19).

Pure: the metadata machine and a queue-group machine over MemoryStores, time from commands.
"""

from __future__ import annotations

import orjson
from test_delivery import DLQ, G, Machine, T
from test_delivery_storage import meta_apply

from raftmq.cluster import commands
from raftmq.cluster.machines.metadata import MetadataMachine, Topic
from raftmq.cluster.machines.topics import permission_names
from raftmq.cluster.machines.views import consumer_queues
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import queue_bounds, scan_prefix
from raftmq.storage.store import Batch

# -- the record in the metadata group -----------------------------------------------------------


def topics(machine: MetadataMachine, *names: str, queues: int = 1) -> None:
    for name in names:
        r = meta_apply(
            machine,
            machine.applied_index + 1,
            op="create_topic",
            name=name,
            queues=queues,
            group_count=1,
            now_ms=1,
        )
        assert "topic" in r, r


def ensure(machine: MetadataMachine, source: str, group: str) -> dict[str, object]:
    return meta_apply(
        machine,
        machine.applied_index + 1,
        op="ensure_dlq_topic",
        source=source,
        group=group,
        now_ms=9,
        by_record=True,
    )


def test_a_dead_letter_topic_records_its_source_and_a_dotted_group_cannot_take_another_ones() -> None:
    machine = MetadataMachine(MemoryStore())
    topics(machine, "payments", "payments.eu")
    payments, eu = machine.topic("payments"), machine.topic("payments.eu")
    assert payments is not None and eu is not None
    created = ensure(machine, "payments.eu", "billing")
    dlq = machine.topic("payments.eu.billing.dlq")
    assert dlq is not None and created == {"topic": dlq.to_json(), "created": True}
    assert dlq.dead_letter_of == (eu.id, "billing")
    assert machine.dead_letter_topic(eu.id, "billing") == dlq
    # The same name spelled as group "eu.billing" of "payments": refused, nothing made or changed.
    refused = ensure(machine, "payments", "eu.billing")
    assert refused["error"]["code"] == "dead_letter_topic_conflict"  # type: ignore[index]
    assert machine.dead_letter_topic(payments.id, "eu.billing") is None
    assert machine.topic("payments.eu.billing.dlq") == dlq
    # A topic an admin created under a dead-letter-like name is nobody's dead-letter topic.
    topics(machine, "payments.ops.dlq")
    assert ensure(machine, "payments", "ops")["error"]["code"] == "dead_letter_topic_conflict"  # type: ignore[index]
    # The record survives a restart (reload from the store).
    again = MetadataMachine(machine.store)
    assert (
        again.dead_letter_topic(eu.id, "billing") == dlq
        and again.topic("payments.ops.dlq").dead_letter_of is None
    )  # type: ignore[union-attr]


def test_a_dead_letter_topic_of_a_dead_letter_topic_answers_for_the_first_source() -> None:
    machine = MetadataMachine(MemoryStore())
    topics(machine, "ledger", "ledger.eu")
    ensure(machine, "ledger", "billing")
    ensure(machine, "ledger.billing.dlq", "g")
    ensure(machine, "ledger.billing.dlq.g.dlq", "h")
    table = {t.name: t for t in machine.topics()}
    # ledger.* matches every one of these names: each must answer for ledger itself.
    for name in ("ledger.billing.dlq", "ledger.billing.dlq.g.dlq", "ledger.billing.dlq.g.dlq.h.dlq"):
        assert permission_names(name, table) == ["ledger"], name
    assert permission_names("ledger.eu", table) == ["ledger.eu"]
    # No such topic: as if it were created (a token without a right on ledger learns nothing).
    assert permission_names("ledger.other.dlq", table) == ["ledger.other.dlq", "ledger"]
    assert permission_names("nowhere.other.dlq", table) == ["nowhere.other.dlq"]
    # Creating under a dead-letter name: also each existing topic it could be the dead letters of.
    assert permission_names("ledger.billing.dlq.x.dlq", table, creating=True) == [
        "ledger.billing.dlq.x.dlq",
        "ledger",
        "ledger",  # ledger.billing.dlq, as it answers
    ]
    # A source deleted ends the walk: the last topic found goes by its own name.
    meta_apply(machine, machine.applied_index + 1, op="delete_topic", name="ledger")
    table = {t.name: t for t in machine.topics()}
    assert permission_names("ledger.billing.dlq.g.dlq", table) == ["ledger.billing.dlq"]
    assert permission_names("ledger.billing.dlq", table) == ["ledger.billing.dlq"]


def test_a_deleted_source_leaves_its_dead_letter_topic_to_no_new_topic_of_that_name() -> None:
    machine = MetadataMachine(MemoryStore())
    topics(machine, "orders")
    ensure(machine, "orders", "g")
    meta_apply(machine, machine.applied_index + 1, op="delete_topic", name="orders")
    topics(machine, "orders")
    new = machine.topic("orders")
    assert new is not None and machine.dead_letter_topic(new.id, "g") is None
    assert ensure(machine, "orders", "g")["error"]["code"] == "dead_letter_topic_conflict"  # type: ignore[index]


def old_release_store(*specs: tuple[str, int, tuple[int, ...]]) -> MemoryStore:
    """A metadata store as a release before the record wrote it: topics without
    ``dead_letter_of``, no migration marker, applied up to index 10."""
    store = MemoryStore()
    batch = Batch()
    for name, topic_id, groups in specs:
        t = Topic(topic_id, name, len(groups), groups, None, None, None, 1)
        batch.put(b"T" + name.encode(), orjson.dumps(t.to_json()))
    batch.put(b"N", (100).to_bytes(4, "big"))
    batch.put(b"A", (10).to_bytes(8, "big"))
    store.write(batch)
    return store


def test_an_upgrade_records_the_sources_of_old_dead_letter_topics_at_the_record_entry_on_every_replica() -> (
    None
):
    specs = (
        ("payments", 1, (0,)),
        ("payments.eu", 2, (0,)),
        ("payments.eu.billing.dlq", 3, (0,)),  # made for (payments.eu, billing)
        ("orders", 4, (0, 1)),
        ("orders.svc.a.dlq", 5, (0, 1)),  # group "svc.a" of orders: no topic orders.svc
        ("orders.x.dlq", 6, (1, 0)),  # another placement: not made by ensure_dlq_topic
        ("late.g.dlq", 7, (0,)),
        ("late", 8, (0,)),  # created after: cannot claim it
    )
    replicas = [MetadataMachine(old_release_store(*specs)) for _ in range(2)]
    for m in replicas:
        m.apply(11, commands.noop())
        assert m.dead_letter_topic(2, "billing") is None  # nothing before the record entry
        assert meta_apply(m, 12, op="record_dead_letters") == {"recorded": 2}
    records = [{t.name: t.dead_letter_of for t in m.topics() if t.dead_letter_of} for m in replicas]
    assert (
        records[0]
        == records[1]
        == {
            "payments.eu.billing.dlq": (2, "billing"),
            "orders.svc.a.dlq": (4, "svc.a"),
        }
    )
    # Done once: the marker is in the store, a reload keeps the records.
    reloaded = MetadataMachine(replicas[0].store)
    assert reloaded.dead_letter_topic(2, "billing") is not None
    assert reloaded.dead_letter_topic(1, "eu.billing") is None


# -- the link in the queue group ----------------------------------------------------------------


def test_a_dead_letter_link_stored_by_name_is_not_used_until_checked_against_the_record() -> None:
    m = Machine()
    m.apply(commands.subscribe(G, T, "orders", DLQ, 1, [100]))  # as an older release stored it
    m.produce(0, "a")
    assert m.op("nack", 10, m.receive(now=0)) == [{"ok": True, "parked": True}]
    assert queue_bounds(m.store, DLQ, 0) == (0, 0)
    # The leader checks the record: there is none for this group, so the link is cleared.
    cleared = m.apply(commands.subscribe(G, T, "orders", None, 1, [100], checked=True))["subscription"]
    assert cleared["dlq_topic_id"] is None
    assert m.tick(now=2000)["dead_lettered"] == 0 and queue_bounds(m.store, DLQ, 0) == (0, 0)
    # With the record's topic, the parked message moves.
    m.apply(commands.subscribe(G, T, "orders", DLQ, 1, [100], checked=True))
    assert m.tick(now=4000)["dead_lettered"] == 1 and queue_bounds(m.store, DLQ, 0) == (0, 1)


# -- caps and expiry ----------------------------------------------------------------------------


def sub(m: Machine, group: str, now: int, **kw: object) -> dict[str, object]:
    return m.apply(commands.subscribe(group, T, "orders", None, 16, [1], checked=True, now_ms=now, **kw))  # type: ignore[arg-type]


def test_new_unconfigured_groups_are_capped_per_topic_and_per_token_and_configured_ones_are_not() -> None:
    m = Machine()
    for i in range(3):
        assert "subscription" in sub(m, f"a{i}", 1, creator="alice", max_topic_groups=5, max_token_groups=3)
    over = sub(m, "a3", 1, creator="alice", max_topic_groups=5, max_token_groups=3)
    assert over["error"]["code"] == "too_many_groups"  # type: ignore[index]
    assert over["error"]["limit"] == "max_groups_per_token"  # type: ignore[index]
    assert "subscription" in sub(m, "a0", 2, creator="alice", max_topic_groups=5, max_token_groups=3)  # known
    for i in range(2):
        assert "subscription" in sub(m, f"b{i}", 1, creator="bob", max_topic_groups=5, max_token_groups=3)
    over = sub(m, "b2", 1, creator="bob", max_topic_groups=5, max_token_groups=3)
    assert over["error"]["limit"] == "max_groups_per_topic"  # type: ignore[index]
    assert "subscription" in sub(m, "admins", 1, configured=True)  # an admin's: no cap
    assert len(list(scan_prefix(m.store, keys.SUBSCRIPTION))) == 6


def test_idle_unconfigured_subscriptions_expire_with_their_state_and_used_or_configured_ones_stay() -> None:
    m = Machine()
    m.produce(0, "a", "b")
    for group in ("idle", "used", "admins"):
        sub(m, group, 0, configured=group == "admins", creator=None if group == "admins" else "t")
        assert len(m.receive(now=0, group=group)) == 2
    sub(m, "used", 1900)  # refreshed by its receiver
    # In use until the deadline of what it handed out (1000): idle from 2000 on.
    assert m.apply(commands.expire_subscriptions(1999, 1000, 100)) == {"expired": 0, "more": False}
    assert m.apply(commands.expire_subscriptions(2500, 1000, 100)) == {"expired": 1, "more": False}
    left = {k[6:].decode() for k, _ in scan_prefix(m.store, keys.SUBSCRIPTION)}
    assert left == {"used", "admins"}
    groups = {g for p in (keys.PENDING, keys.SUB_CURSOR) for g in _groups(m, p)}
    assert groups == {"used", "admins"}  # the idle group's receive/ack state went with it
    # Its expired deliveries' deadline entries are dangling: the tick drops them, hands nothing out.
    assert m.tick(now=5000)["expired"] == 4
    # Received again, the group starts over as a new one: first deliveries from the oldest.
    assert [(d["offset"], d["attempt"]) for d in m.receive(now=5000, group="idle")] == [(0, 1), (1, 1)]


def test_expiry_never_removes_a_delivery_or_lease_a_consumer_holds() -> None:
    m = Machine()
    m.produce(0, "a", "b")
    for group in ("extender", "nacker", "locker"):
        sub(m, group, 0, creator="t")
    locked = m.apply(commands.lock(0, "locker", T, 0, "c", 4000))
    assert locked["lease_until_ms"] == 4000, locked
    held = m.receive(now=0, group="extender", max_messages=1)  # in flight until 1000
    nacked = m.receive(now=0, group="nacker", max_messages=1)
    extended = m.op("extend", 900, held, group="extender", visibility_ms=5000)
    assert extended == [{"ok": True, "deadline_ms": 5900}]
    assert m.op("nack", 2100, nacked, group="nacker", delay_ms=0) == [{"ok": True}]
    # Idle for 1000 by their subscribe and first receive, not by what they did since.
    assert m.apply(commands.expire_subscriptions(2500, 1000, 100)) == {"expired": 0, "more": False}
    assert m.op("ack", 2500, held, group="extender") == [{"ok": True}]  # not stale: still held
    assert m.apply(commands.expire_subscriptions(4999, 1000, 100)) == {"expired": 1, "more": False}  # nacker
    assert m.apply(commands.expire_subscriptions(5000, 1000, 100)) == {"expired": 1, "more": False}  # locker
    assert m.apply(commands.expire_subscriptions(6900, 1000, 100)) == {"expired": 1, "more": False}
    assert not list(scan_prefix(m.store, keys.SUBSCRIPTION))


def test_expiry_leaves_a_committed_offset_the_offset_api_wrote_and_removes_a_receivers() -> None:
    m = Machine()
    m.produce(0, "a", "b", "c")
    sub(m, "shared", 0, creator="t")  # a receive group, then an offset consumer of the same name
    assert "error" not in m.apply(commands.commit_offsets("shared", T, {0: 2}))
    assert "error" not in m.apply(commands.commit_offsets("early", T, {0: 1}))
    sub(m, "early", 0, creator="t")  # an offset consumer first, then a receive group
    sub(m, "receiver", 0, creator="t")
    assert m.op("ack", 0, m.receive(now=0, group="receiver"), group="receiver") == [{"ok": True}] * 3
    assert m.floor(group="receiver") == 3
    assert m.apply(commands.expire_subscriptions(5000, 1000, 100)) == {"expired": 3, "more": False}
    # The offset API's commits survive the receive side's expiry; a receiver's own goes with it.
    assert (m.floor(group="shared"), m.floor(group="early"), m.floor(group="receiver")) == (2, 1, None)
    # Received again, a group resumes from a kept offset, not from the oldest message.
    assert [d["offset"] for d in m.receive(now=5000, group="shared")] == [2]


def _groups(m: Machine, prefix: bytes) -> set[str]:
    out = set()
    for key, _ in scan_prefix(m.store, prefix):
        size = key[9]
        out.add(key[10 : 10 + size].decode())
    return out


def test_the_consumer_view_counts_dead_letters_only_over_a_checked_link() -> None:
    m = Machine()
    m.apply(commands.subscribe(G, T, "orders", DLQ, 1, [100]))  # an older release's link, by name
    m.produce(0, "someone else's dead letter", topic=DLQ)
    m.produce(0, "a")
    m.receive(now=0)

    def dead_letters() -> int:
        return sum(r.dead_letters for r in consumer_queues(m.store, T) if r.group == G)

    assert dead_letters() == 0
    m.apply(commands.subscribe(G, T, "orders", DLQ, 1, [100], checked=True))  # the record says so
    assert dead_letters() == 1
