"""An SQS receiver's log replays to the same state: the receive's reads of its batches are only a
cost, never a change of what it decides.

A receive reads of each batch it hands out from only what it decides on (``storage/queues.py``,
``read_delivery_fields``: offsets, expiry times from the TTL and delay columns, the redrive
group's header) through the store's gate (``storage/rocks.py``), and those reads are cut for CPU
(issue 24: an ``ack_receive`` apply runs on every replica for each DeleteMessageBatch). The fixed
log below is what boto3 senders and receivers make through the SQS API and more: batches whose
records all carry a TTL (a queue's retention) or only some, delays on all, some or none (the
delayed records are held at the append and never released here: the log has no ``deliver_tick``,
so the receive's reads of delay columns are not covered), the
``sqs-id`` header on each message or no headers at all, the redrive header naming this group or
another, then receives, ``ack_receive`` cycles (the read-ahead), nacks (the only retries here) and
releases while TTLs run out. Its digest was taken at ``5489c58`` (before the cuts, on a real
RocksDB); a replay by this code must give it again: every key and value of the store and every
result.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.delivery.state import REDRIVE_GROUP_HEADER
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.rocks import RocksStore

# sha256 over every result and every key and value of the store, replayed at 5489c58.
BEFORE_THE_CUTS_DIGEST = "bbb1bfb2c0d69f19709813e3f808d74766498f988f561686982de7d76fa410a6"

TOPIC, GROUP, OTHER = 1, "sqs", "other"
START_MS = 1_796_000_000_000


def _batch(rng: random.Random, now_ms: int, serial: int) -> bytes:
    builder = rb.BatchBuilder(base_timestamp_ms=now_ms, timestamps=False)  # no clock read
    ttl_kind, delay_kind, header_kind = rng.choice("ASN"), rng.choice("ASN"), rng.choice("IRN")
    for i in range(rng.randint(1, 12)):
        headers: dict[str, str] | None = None
        if header_kind != "N":  # I: the sqs-id header only; R: the redrive header on some too
            headers = {"sqs-id": f"id-{serial}-{i}"}
            if header_kind == "R" and rng.random() < 0.5:
                headers[REDRIVE_GROUP_HEADER] = rng.choice([GROUP, OTHER])
        ttl = rng.randint(50, 4_000) if ttl_kind == "A" or (ttl_kind == "S" and rng.random() < 0.5) else 0
        delay = rng.randint(1, 300) if delay_kind == "A" or (delay_kind == "S" and rng.random() < 0.5) else 0
        builder.append(f"body {serial} {i}", headers=headers, ttl_ms=ttl, delay_ms=delay)
    return builder.finish()


def receiver_log(folder: Path, entries: int = 400, seed: int = 24, takes: bool = False) -> list[bytes]:
    """Sends, receives and settlements in a fixed order; the receipts are those a machine in
    ``folder`` handed out as the log was written (the replay's give the same). ``takes``: half the
    sends carry a take-along (``append.take``: a receive waiting at the leader), drawn from a
    random source of their own (the log without them is the one whose digest is fixed)."""
    rng = random.Random(seed)
    take_rng = random.Random(seed + 1)
    now = START_MS
    log = [commands.subscribe(GROUP, TOPIC, "q", None, 2**32 - 1, [0], now_ms=now)]
    held: list[tuple[int, int, int]] = []  # receipts the replay's last take handed out
    machine = _Replayer(folder)
    machine.apply(log[0])
    for serial in range(entries):
        now += rng.randint(1, 60)
        roll = rng.random()
        if roll < 0.4:
            items = [(TOPIC, rng.randint(0, 2), _batch(rng, now, serial))]
            take = None
            if takes and take_rng.random() < 0.5:
                take = {
                    "group": GROUP,
                    "topic_id": TOPIC,
                    "queues": [0, 1, 2],
                    "max": take_rng.randint(1, 10),
                    "visibility_ms": take_rng.choice([100, 30_000]),
                    "max_age_ms": None,
                }
            entry = commands.append(now, items, take)
        elif roll < 0.6 or not held:
            most = rng.randint(1, 10)
            # 100: expired before the next receive (no deliver_tick here: no retry from it)
            visibility_ms = rng.choice([100, 30_000])
            entry = commands.receive(now, GROUP, TOPIC, [0, 1, 2], most, visibility_ms)
        elif roll < 0.85:
            entry = commands.ack_receive(now, GROUP, TOPIC, held, [0, 1, 2], 10, 30_000)
        elif roll < 0.93:
            entry = commands.nack(now, GROUP, TOPIC, held, delay_ms=rng.choice([None, 0, 500]))
        else:
            entry = commands.release(now, GROUP, TOPIC, held)
        log.append(entry)
        result = machine.apply(entry)
        if "messages" in result:
            held = [(m["queue"], m["offset"], result["token"]) for m in result["messages"]]
        elif "results" in result:
            held = []
    machine.close()
    return log


class _Replayer:
    """A machine on a real RocksDB in ``folder``, applying entries in order."""

    def __init__(self, folder: Path) -> None:
        self.store = RocksStore.open(str(folder))
        self.machine = QueueGroupMachine(self.store, group_id=0)
        self.index = 0

    def apply(self, entry: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, entry)

    def close(self) -> None:
        self.store.close()


def replay_digest(log: list[bytes], folder: Path) -> str:
    replayer = _Replayer(folder)
    digest = _digest([replayer.apply(entry) for entry in log], replayer.store)
    replayer.close()
    return digest


def _digest(results: list[dict[str, Any]], store: RocksStore) -> str:
    """sha256 over ``results`` and every key and value of ``store``."""
    h = hashlib.sha256()
    for result in results:
        h.update(orjson.dumps(result, option=orjson.OPT_SORT_KEYS))
    for key, value in store.scan(b""):
        h.update(len(key).to_bytes(4, "little") + key + len(value).to_bytes(4, "little") + value)
    return h.hexdigest()


def test_an_sqs_receiver_log_replays_to_the_state_before_the_read_cuts(tmp_path: Path) -> None:
    log = receiver_log(tmp_path / "writer")
    ops = [orjson.loads(e)["op"] if e[:1] == b"{" else "append" for e in log]
    counts = {op: ops.count(op) for op in set(ops)}
    print(counts)
    assert min(counts.get(op, 0) for op in ("append", "receive", "ack_receive", "nack", "release")) >= 10
    assert replay_digest(log, tmp_path / "replay") == BEFORE_THE_CUTS_DIGEST


def test_a_log_with_take_alongs_replays_to_the_same_bytes_on_every_replica(tmp_path: Path) -> None:
    """Determinism of ``append.take``: the sends' take-alongs read the batches of their own entry
    (not yet in the store) and hand out the same records, results and bytes on every replica."""
    log = receiver_log(tmp_path / "writer", takes=True)
    taking = [e for e in log if commands.has_take(e)]
    assert len(taking) >= 20
    replayer, handed = _Replayer(tmp_path / "count"), 0
    for entry in log:
        result = replayer.apply(entry)
        if commands.has_take(entry):
            handed += len(result["messages"])
    replayer.close()
    assert handed > 0
    assert replay_digest(log, tmp_path / "a") == replay_digest(log, tmp_path / "b")


@pytest.mark.parametrize("seed", [24, 25])
def test_a_replica_restarted_mid_log_with_take_alongs_ends_with_the_writers_bytes(
    tmp_path: Path, seed: int
) -> None:
    """A replica reopened mid-log (a cold cache; the log replayed from index 1, what it applied
    skipped) gives the same results and bytes as one that applied the log straight through, and
    its store is the writer's: a take-along reads its entry's batches from the apply's own
    writes, never from what a cache kept across entries."""
    log = receiver_log(tmp_path / "writer", seed=seed, takes=True)
    straight = replay_digest(log, tmp_path / "straight")
    writer = RocksStore.open(str(tmp_path / "writer"))
    written = _digest([], writer)
    writer.close()
    for cut in (len(log) // 3, len(log) // 2, 2 * len(log) // 3):
        folder = tmp_path / f"restarted-{cut}"
        replica = _Replayer(folder)
        results = [replica.apply(entry) for entry in log[:cut]]
        replica.close()
        replica = _Replayer(folder)
        for i, entry in enumerate(log):
            result = replica.apply(entry)
            if i < cut:
                assert result == {"skipped": True}, i
            else:
                results.append(result)
        assert _digest(results, replica.store) == straight, cut
        assert _digest([], replica.store) == written, cut
        replica.close()
