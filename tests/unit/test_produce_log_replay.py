"""A log written by the release before one produce path replays to the same state.

That release proposed JSON requests as JSON ``produce`` entries (and binary ones as ``append``, or
as ``produce`` while a voter could not read format 2). Its logs stay in journals and checkpoints
after an upgrade, so a replica of this release must apply every such entry as that release did:
the same store bytes (record batches in the format that release wrote, delayed messages, producer
states, queue bounds) and the same results.

The fixed log below mixes both ops with everything that changes how a produce applies: keys,
headers, binary values, TTLs, delays (released by ``deliver_tick``), producer ids with new,
duplicate and stale sequences, a dropped topic and a refused oversized entry. Its digest was taken
with that release's apply (``QueueGroupMachine._produce`` and ``append._append_one``, before they
were one function); a replay must give it again.
"""

from __future__ import annotations

import base64
import hashlib
import random
from typing import Any

import orjson

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.memory import MemoryStore

# sha256 over every key and value of the store and every result, from the release before. Renewed
# once on purpose: a commit's result gained its per-queue "offsets" (advance-only commits); the
# store and every other result were checked to be byte-identical to the release before.
PREVIOUS_RELEASE_DIGEST = "1f5f4f7b1ff2de095da54f92d172c721dbe706d8f4bc60b3ca55652e136c1bdc"


def _message(rng: random.Random, now_ms: int) -> dict[str, Any]:
    m: dict[str, Any] = (
        {"value_b64": base64.b64encode(rng.randbytes(rng.randint(0, 12))).decode()}
        if rng.random() < 0.3
        else {"value": "".join(rng.choice("abcdé€ ") for _ in range(rng.randint(0, 12)))}
    )
    if rng.random() < 0.5:
        m["key"] = rng.choice(["alice", "bob", "carol"])
    if rng.random() < 0.3:
        m["headers"] = {"h": rng.choice(["1", "2"]), "trace": "x"}
    if rng.random() < 0.2:
        m["deliver_at_ms"] = now_ms + rng.randint(1, 3000)
    if rng.random() < 0.2:
        m["ttl_ms"] = rng.randint(1, 5000)
    return m


Sequences = dict[tuple[str, int, int], int]


def _produce_batch(rng: random.Random, now_ms: int, sequences: Sequences) -> dict[str, Any]:
    topic_id, queue = rng.choice([1, 2, 3]), rng.randint(0, 2)
    batch: dict[str, Any] = {
        "topic_id": topic_id,
        "queue": queue,
        "messages": [_message(rng, now_ms) for _ in range(rng.randint(1, 4))],
    }
    if rng.random() < 0.5:
        producer = rng.choice(["p1", "p2"])
        last = sequences.get((producer, topic_id, queue), -1)
        # mostly the next sequence; sometimes a duplicate of the last, or an old one
        sequence = rng.choice([last + 1, last + 1, last + 1, max(last, 0), max(last - 40, 0)])
        sequences[(producer, topic_id, queue)] = max(last, sequence)
        batch.update(producer_id=producer, sequence=sequence)
    return batch


def _binary_item(rng: random.Random, sequences: Sequences) -> tuple[int, int, bytes]:
    topic_id, queue = rng.choice([1, 2, 3]), rng.randint(0, 2)
    producer, sequence = None, 0
    if rng.random() < 0.5:
        producer = rng.choice(["p1", "p2"])
        last = sequences.get((producer, topic_id, queue), -1)
        sequence = rng.choice([last + 1, last + 1, max(last, 0)])
        sequences[(producer, topic_id, queue)] = max(last, sequence)
    b = rb.BatchBuilder(producer, sequence, base_timestamp_ms=1000)
    for _ in range(rng.randint(1, 4)):
        b.append(
            "v" * rng.randint(0, 9),
            rng.choice([None, "alice", "bob"]),
            rng.choice([None, {"h": "1"}]),
            delay_ms=rng.choice([0, 0, 0, rng.randint(1, 3000)]),
            ttl_ms=rng.choice([0, 0, rng.randint(1, 5000)]),
        )
    return topic_id, queue, b.finish()


def previous_release_log(seed: int = 20, entries: int = 400) -> list[bytes]:
    rng = random.Random(seed)
    now_ms, log = 1_000_000, []
    sequences: Sequences = {}
    for i in range(entries):
        now_ms += rng.randint(0, 400)
        roll = rng.random()
        if roll < 0.55:
            batches = [_produce_batch(rng, now_ms, sequences) for _ in range(rng.randint(1, 3))]
            log.append(commands.produce(now_ms, batches))
        elif roll < 0.8:
            items = [_binary_item(rng, sequences) for _ in range(rng.randint(1, 3))]
            log.append(commands.append(now_ms, items))
        elif roll < 0.93:
            log.append(commands.deliver_tick(now_ms, 50))
        elif roll < 0.97:
            big = [{"topic_id": 1, "queue": 0, "messages": [{"value": "x"}] * 60}]
            log.append(commands.produce(now_ms, big))  # over max_entry_messages: refused whole
        elif i > entries // 2:
            log.append(commands.drop_topic(3))
        else:
            log.append(commands.commit_offsets("g", 1, {0: 0}))
    return log


def replay_digest(log: list[bytes]) -> str:
    machine = QueueGroupMachine(MemoryStore(), group_id=0, max_entry_messages=50)
    h = hashlib.sha256()
    for index, command in enumerate(log, start=1):
        h.update(orjson.dumps(machine.apply(index, command), option=orjson.OPT_SORT_KEYS))
    for key, value in machine.store.scan(b""):
        h.update(len(key).to_bytes(4, "little") + key + len(value).to_bytes(4, "little") + value)
    return h.hexdigest()


def test_a_previous_release_log_of_produce_and_append_entries_replays_to_the_same_state() -> None:
    log = previous_release_log()
    ops = [b"json" if c[:1] == b"{" and b'"op":"produce"' in c else b"append" for c in log]
    assert ops.count(b"json") > 100 and ops.count(b"append") > 50  # the log holds both forms
    assert replay_digest(log) == PREVIOUS_RELEASE_DIGEST
