"""Same log in, same bytes out: the queue-group machine on several replicas and store kinds.

Random command logs (valid commands of every op, invalid ones and garbage bytes) are applied to
independent machines; every key and value of their stores, and every result, must be equal. One
replica restarts at random points and replays entries it already applied, as after a crash; one
is a RocksStore, so the test double cannot hide a difference of the real store.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import subprocess
import sys
import tempfile
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.cluster import commands
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store

# -- random command logs ----------------------------------------------------------------------

topic_ids = st.sampled_from([1, 2, 3])
queues = st.integers(0, 2)
now_ms = st.integers(0, 20_000)
short_text = st.text(max_size=8)

message_extras = {
    "key": short_text,
    "headers": st.dictionaries(short_text, short_text, max_size=2),
    "deliver_at_ms": now_ms,  # a delayed message
    "ttl_ms": st.integers(1, 5000),
}
messages = st.one_of(
    st.fixed_dictionaries({"value": st.text(max_size=30)}, optional=message_extras),
    st.fixed_dictionaries(
        {"value_b64": st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode())},
        optional=message_extras,
    ),
)
producers: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"producer_id": st.sampled_from(["p1", "p2"]), "sequence": st.integers(0, 8)}),
)
produce_batches = st.builds(
    lambda t, q, msgs, producer: {"topic_id": t, "queue": q, "messages": msgs, **producer},
    topic_ids,
    queues,
    st.lists(messages, min_size=1, max_size=4),
    producers,
)
retain_queues = st.lists(
    st.fixed_dictionaries(
        {"topic_id": topic_ids, "queue": queues},
        optional={
            "max_age_ms": st.none() | st.integers(0, 10_000),
            "max_bytes": st.none() | st.integers(0, 2000),
        },
    ),
    max_size=4,
    unique_by=lambda q: (q["topic_id"], q["queue"]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)

groups = st.sampled_from(["g1", "g2"])
some_queues = st.lists(queues, min_size=1, max_size=3, unique=True)
epochs = st.none() | st.integers(0, 3)
receipts = st.lists(st.tuples(queues, st.integers(0, 10), st.integers(1, 40)), min_size=1, max_size=4)
delivery_commands = st.one_of(
    st.builds(
        lambda g, t, dlq, n, backoff, overwrite: commands.subscribe(
            g, t, "t", dlq, n, backoff, overwrite=overwrite
        ),
        groups,
        topic_ids,
        st.none() | topic_ids,
        st.integers(1, 3),
        st.lists(st.integers(0, 3000), min_size=1, max_size=3),
        st.booleans(),
    ),
    st.builds(
        lambda now, g, t, qs, n, vis, epoch, age: commands.receive(
            now, g, t, qs, n, vis, epoch=epoch, max_age_ms=age
        ),
        now_ms,
        groups,
        topic_ids,
        some_queues,
        st.integers(1, 5),
        st.integers(1, 5000),
        epochs,
        st.none() | st.integers(0, 10_000),
    ),
    st.builds(
        lambda now, g, t, r, e: commands.ack(now, g, t, r, epoch=e),
        now_ms,
        groups,
        topic_ids,
        receipts,
        epochs,
    ),
    st.builds(
        lambda now, g, t, r, d, e: commands.nack(now, g, t, r, delay_ms=d, epoch=e),
        now_ms,
        groups,
        topic_ids,
        receipts,
        st.none() | st.integers(0, 3000),
        epochs,
    ),
    st.builds(
        lambda now, g, t, r, v, e: commands.extend(now, g, t, r, v, epoch=e),
        now_ms,
        groups,
        topic_ids,
        receipts,
        st.integers(1, 5000),
        epochs,
    ),
    st.builds(commands.deliver_tick, now_ms, st.integers(1, 5), expiry_backoff=st.booleans()),
    st.builds(
        commands.lock, now_ms, groups, topic_ids, queues, st.sampled_from(["c1", "c2"]), st.integers(1, 5000)
    ),
    st.builds(commands.unlock, groups, topic_ids, queues, st.sampled_from(["c1", "c2"]), st.integers(0, 3)),
    st.builds(
        commands.commit_fenced,
        groups,
        topic_ids,
        st.dictionaries(queues, st.integers(0, 15), min_size=1, max_size=3),
        st.integers(0, 3),
    ),
    st.builds(commands.redrive, now_ms, groups, topic_ids, topic_ids, some_queues, st.integers(1, 5)),
)

command_bytes = st.one_of(
    delivery_commands,
    delivery_commands,
    st.builds(commands.produce, now_ms, st.lists(produce_batches, min_size=1, max_size=3)),
    st.builds(commands.produce, now_ms, st.lists(produce_batches, min_size=1, max_size=3)),
    st.builds(
        commands.commit_offsets,
        st.sampled_from(["g1", "g2"]),
        topic_ids,
        st.dictionaries(queues, st.integers(0, 15), min_size=1, max_size=3),
    ),
    st.builds(commands.retain, now_ms, retain_queues),
    st.builds(
        lambda n, q, jump, most: commands.retain(n, q, max_jump_ms=jump, max_batches=most),
        now_ms,
        retain_queues,
        st.integers(0, 5000),
        st.integers(1, 3),
    ),
    st.builds(expire_producers, now_ms, st.integers(1, 10_000), st.integers(1, 3)),
    st.builds(commands.drop_topic, st.just(3)),  # topic ids are never reused: keep 1 and 2 alive
    st.just(commands.noop()),
    st.binary(max_size=40),
    json_values.map(orjson.dumps),
    st.builds(
        lambda op, v: orjson.dumps({"v": 1, "op": op, "topic_id": v}),
        st.sampled_from(commands.OPS),
        json_values,
    ),
)


# -- replicas ---------------------------------------------------------------------------------


def everything(store: Store) -> list[tuple[bytes, bytes]]:
    return list(store.scan(b""))


def apply_log(store: Store, log: list[bytes]) -> list[dict[str, Any]]:
    machine = QueueGroupMachine(store, 1, max_entry_messages=10)
    return [machine.apply(index, command) for index, command in enumerate(log, start=1)]


def apply_log_with_restarts(store: Store, log: list[bytes], restarts: list[int]) -> list[dict[str, Any]]:
    """Apply ``log``, restarting the machine after each entry in ``restarts`` and replaying the
    entries before it from the start, as the Raft journal does after a crash."""
    machine = QueueGroupMachine(store, 1, max_entry_messages=10)
    results = []
    for index, command in enumerate(log, start=1):
        results.append(machine.apply(index, command))
        if index in restarts:
            machine = QueueGroupMachine(store, 1, max_entry_messages=10)
            for replayed, old in enumerate(log[:index], start=1):
                assert machine.apply(replayed, old) == {"skipped": True}
    return results


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=st.lists(command_bytes, max_size=40), data=st.data())
def test_replicas_applying_the_same_log_have_identical_stores_and_results(
    log: list[bytes], data: st.DataObject
) -> None:
    restarts = data.draw(st.lists(st.integers(1, max(len(log), 1)), max_size=3))
    first, second = MemoryStore(), MemoryStore()
    results = apply_log(first, log)
    assert apply_log_with_restarts(second, log, restarts) == results
    assert everything(second) == everything(first)

    with tempfile.TemporaryDirectory() as tmp:
        rocks = RocksStore.open(os.path.join(tmp, "db"))
        try:
            assert apply_log(rocks, log) == results
            assert everything(rocks) == everything(first)
        finally:
            rocks.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), restarts=st.lists(st.integers(1, 150), max_size=3))
def test_replicas_agree_on_realistic_receive_ack_logs(seed: int, restarts: list[int]) -> None:
    """Logs whose acks, nacks and extends name real deliveries (see ``seeded_log``), so the valid
    paths (retries, dead letters, floors moving) run, not only refusals."""
    log = seeded_log(random.Random(seed), 150)
    first, second = MemoryStore(), MemoryStore()
    results = apply_log(first, log)
    assert apply_log_with_restarts(second, log, restarts) == results
    assert everything(second) == everything(first)
    with tempfile.TemporaryDirectory() as tmp:
        rocks = RocksStore.open(os.path.join(tmp, "db"))
        try:
            assert apply_log(rocks, log) == results
            assert everything(rocks) == everything(first)
        finally:
            rocks.close()


def test_replica_restored_from_a_checkpoint_converges(tmp_path: Any) -> None:
    log = seeded_log(random.Random(7), 300)
    whole = MemoryStore()
    apply_log(whole, log)

    half = MemoryStore()
    apply_log(half, log[:150])
    half.checkpoint(str(tmp_path / "snap"))
    restored = MemoryStore.load(str(tmp_path / "snap"))
    machine = QueueGroupMachine(restored, 1, max_entry_messages=10)
    assert machine.applied_index == 150
    for index, command in enumerate(log, start=1):  # the whole log again: the first half is skipped
        machine.apply(index, command)
    assert everything(restored) == everything(whole)


def test_machine_restored_from_a_peer_checkpoint_reloads_applied_index_and_converges(tmp_path: Any) -> None:
    log = seeded_log(random.Random(3), 200)
    leader = RocksStore.open(str(tmp_path / "leader"))
    follower = RocksStore.open(str(tmp_path / "follower"))
    try:
        apply_log(leader, log[:120])
        leader.checkpoint(str(tmp_path / "snap"))
        behind = QueueGroupMachine(follower, 1, max_entry_messages=10)
        for index, command in enumerate(log[:30], start=1):
            behind.apply(index, command)
        behind.restore(str(tmp_path / "snap"))
        assert behind.applied_index == 120
        ahead = QueueGroupMachine(leader, 1, max_entry_messages=10)
        for index, command in enumerate(log, start=1):
            assert behind.apply(index, command) == ahead.apply(index, command)
        assert everything(follower) == everything(leader)
    finally:
        leader.close()
        follower.close()


# -- across processes: nothing may depend on hash seeds or object identity ---------------------


def seeded_log(rng: random.Random, length: int) -> list[bytes]:
    """A reproducible log of every kind of command, without hypothesis. A shadow machine applies
    it as it is built, so that acks, nacks and extends can name receipts of real deliveries."""
    log: list[bytes] = []
    shadow = QueueGroupMachine(MemoryStore(), 1, max_entry_messages=10)
    delivered: list[tuple[str, int, tuple[int, int, int]]] = []  # (group, topic_id, receipt)
    for _ in range(length):
        kinds = ["produce", "produce", "produce", "commit", "retain", "expire", "drop", "garbage"]
        kind = rng.choice([*kinds, "delivery", "delivery"])
        topic_id, queue = rng.randint(1, 3), rng.randint(0, 2)
        if kind == "produce":
            extra = (
                {"producer_id": rng.choice(["p1", "p2"]), "sequence": rng.randint(0, 6)}
                if rng.random() < 0.5
                else {}
            )
            msgs: list[dict[str, Any]] = [
                {"value": "v" * rng.randint(0, 50), "key": str(i), "headers": {"a": "b"}}
                for i in range(rng.randint(1, 4))
            ]
            for msg in msgs:
                if rng.random() < 0.2:
                    msg["deliver_at_ms"] = rng.randint(0, 9999)
                if rng.random() < 0.2:
                    msg["ttl_ms"] = rng.randint(1, 3000)
            log.append(
                commands.produce(
                    rng.randint(0, 9999), [{"topic_id": topic_id, "queue": queue, "messages": msgs, **extra}]
                )
            )
        elif kind == "commit":
            log.append(
                commands.commit_offsets(rng.choice(["g1", "g2"]), topic_id, {queue: rng.randint(0, 10)})
            )
        elif kind == "retain":
            spec = {
                "topic_id": topic_id,
                "queue": queue,
                "max_age_ms": rng.randint(0, 5000),
                "max_bytes": rng.randint(0, 800),
            }
            bounds = {"max_jump_ms": rng.randint(0, 5000), "max_batches": rng.randint(1, 3)}
            log.append(
                commands.retain(rng.randint(0, 9999), [spec], **(bounds if rng.random() < 0.5 else {}))
            )
        elif kind == "expire":
            log.append(expire_producers(rng.randint(0, 9999), rng.randint(1, 5000), rng.randint(1, 3)))
        elif kind == "drop":
            log.append(commands.drop_topic(3) if rng.random() < 0.2 else commands.noop())
        elif kind == "delivery":
            log.append(seeded_delivery_command(rng, len(log) + 1, topic_id, queue, delivered))
        else:
            log.append(rng.randbytes(rng.randint(0, 20)))
        result = shadow.apply(len(log), log[-1])
        if b'"op":"receive"' in log[-1][:30] and "messages" in result:
            cmd = orjson.loads(log[-1])
            delivered += [
                (cmd["group"], cmd["topic_id"], (m["queue"], m["offset"], result["token"]))
                for m in result["messages"]
            ]
            del delivered[:-30]
    return log


def seeded_delivery_command(
    rng: random.Random,
    index: int,
    topic_id: int,
    queue: int,
    delivered: list[tuple[str, int, tuple[int, int, int]]],
) -> bytes:
    """One receive/ack/lock/... command; receipts are mostly of recent deliveries (so valid, or
    stale after a redelivery), sometimes made up."""
    now, group = rng.randint(0, 9999), rng.choice(["g1", "g2"])
    receipts = [
        (queue, rng.randint(0, 8), rng.randint(max(1, index - 12), index)) for _ in range(rng.randint(1, 3))
    ]
    if delivered and rng.random() < 0.8:
        group, topic_id, _ = rng.choice(delivered)
        mine = [r for g, t, r in delivered if (g, t) == (group, topic_id)]
        receipts = rng.sample(mine, rng.randint(1, min(3, len(mine))))
    epoch = rng.choice([None, None, None, None, 1, 2])
    op = rng.choice(
        ["subscribe", "receive", "receive", "ack", "nack", "extend", "tick", "lock", "fenced", "redrive"]
    )
    if op == "subscribe":
        return commands.subscribe(
            group, topic_id, "t", rng.choice([None, 1, 2, 3]), rng.randint(1, 3), [50, 500]
        )
    if op == "receive":
        return commands.receive(
            now, group, topic_id, rng.sample([0, 1, 2], rng.randint(1, 3)), rng.randint(1, 6), 1000
        )
    if op == "ack":
        return commands.ack(now, group, topic_id, receipts, epoch=epoch)
    if op == "nack":
        return commands.nack(now, group, topic_id, receipts, delay_ms=rng.choice([None, 0, 100]), epoch=epoch)
    if op == "extend":
        return commands.extend(now, group, topic_id, receipts, rng.randint(1, 3000))
    if op == "tick":
        return commands.deliver_tick(now, rng.randint(1, 10), expiry_backoff=rng.random() < 0.5)
    if op == "lock":
        return commands.lock(now, group, topic_id, queue, rng.choice(["c1", "c2"]), rng.randint(1, 3000))
    if op == "fenced":
        return commands.commit_fenced(group, topic_id, {queue: rng.randint(0, 10)}, rng.randint(0, 2))
    return commands.redrive(now, group, topic_id, rng.randint(1, 3), [queue], rng.randint(1, 5))


_DIGEST_SCRIPT = """
import hashlib, sys
import orjson
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.memory import MemoryStore
log = [bytes.fromhex(line) for line in open(sys.argv[1]).read().split()]
store = MemoryStore()
machine = QueueGroupMachine(store, 1, max_entry_messages=10)
results = [machine.apply(i, c) for i, c in enumerate(log, start=1)]
print(hashlib.sha256(orjson.dumps([results, [(k.hex(), v.hex()) for k, v in store.scan(b"")]])).hexdigest())
"""


def test_separate_processes_with_different_hash_seeds_produce_identical_bytes(tmp_path: Any) -> None:
    # Empty entries are left out: the script reads one hex command per whitespace-separated word.
    log = [c for c in seeded_log(random.Random(11), 400) if c]
    path = tmp_path / "log.txt"
    path.write_text("\n".join(c.hex() for c in log))
    store = MemoryStore()
    results = apply_log(store, log)
    local = hashlib.sha256(
        orjson.dumps([results, [(k.hex(), v.hex()) for k, v in everything(store)]])
    ).hexdigest()
    digests = set()
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST_SCRIPT, str(path)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(out.stdout.strip())
    assert digests == {local}
