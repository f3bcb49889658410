"""The pending-record reads of a settle and of the floor after it are only a cost: an ack reads
its receipts' records with one multi-get, not a scan, and the floor is not looked up in the store
when the cursor or an offset this apply handed out is at or below where that look-up would start
(``cluster/machines/delivery/state.py``). SQS's cycle (SendMessageBatch, ReceiveMessage,
DeleteMessageBatch) ran three scans of the pending records per cycle on every replica before
(docs/benchmarks.md, "A follower's applies of the SQS cycle"). What each apply decides is
unchanged: the floors below are the lowest offset still in flight, and
``test_sqs_receive_log_replay.py`` replays a log to its digest from before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.rocks import RocksStore

TOPIC, GROUP, START_MS, VISIBILITY_MS = 1, "sqs", 1_796_000_000_000, 30_000


class CountingStore(RocksStore):
    """A real RocksStore that counts the scans of pending records and the multi-gets."""

    pending_scans = 0
    multi_gets = 0

    def scan(self, start: bytes, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        self.pending_scans += start.startswith(keys.PENDING)
        return super().scan(start, *args, **kwargs)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.multi_gets += 1
        return super().get_many(keys)


class Replica:
    """A queue group's machine on a counting store, applying commands one index after another."""

    def __init__(self, path: Path) -> None:
        self.store = CountingStore.open(str(path))
        self.machine = QueueGroupMachine(self.store, 1)
        self.index = 0
        self.now_ms = START_MS

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        result = self.machine.apply(self.index, command)
        assert "error" not in result, result
        return result

    def send(self, count: int) -> None:
        builder = rb.BatchBuilder(base_timestamp_ms=self.now_ms)
        for i in range(count):
            builder.append(f"m{i}", headers={"sqs-id": f"id-{i}"})
        self.apply(commands.append(self.now_ms, [(TOPIC, 0, builder.finish())]))

    def receive(self, count: int) -> list[tuple[int, int, int]]:
        got = self.apply(commands.receive(self.now_ms, GROUP, TOPIC, [0], count, VISIBILITY_MS))
        return [(m["queue"], m["offset"], got["token"]) for m in got["messages"]]

    def floor(self) -> int | None:
        data = self.store.get(keys.offset_key(TOPIC, 0, GROUP))
        return None if data is None else keys.decode_u64(data)

    def counted(self) -> tuple[int, int]:
        """The scans of pending records and the multi-gets since the last call."""
        out = (self.store.pending_scans, self.store.multi_gets)
        self.store.pending_scans = self.store.multi_gets = 0
        return out


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = Replica(tmp_path / "db")
    r.apply(commands.subscribe(GROUP, TOPIC, "test", None, 2**32 - 1, [0], now_ms=START_MS))
    yield r
    r.store.close()


def test_the_sqs_cycle_scans_no_pending_record(replica: Replica) -> None:
    for cycle in range(3):
        replica.send(10)
        replica.counted()
        receipts = replica.receive(10)
        assert [o for _, o, _ in receipts] == list(range(10 * cycle, 10 * cycle + 10))
        assert replica.counted() == (0, 0)
        assert replica.floor() == 10 * cycle
        results = replica.apply(commands.ack(replica.now_ms, GROUP, TOPIC, receipts))["results"]
        assert results == [{"ok": True}] * 10
        assert replica.counted() == (0, 1)  # the ten records in one call
        assert replica.floor() == 10 * cycle + 10


def test_the_floor_is_still_the_lowest_offset_in_flight(replica: Replica) -> None:
    replica.send(10)
    receipts = replica.receive(10)
    replica.counted()
    # acks of the middle: offset 0 stays in flight, the floor with it (the store's look-up finds it)
    replica.apply(commands.ack(replica.now_ms, GROUP, TOPIC, receipts[3:6]))
    assert replica.floor() == 0
    assert replica.counted() == (1, 1)
    # the oldest two acked: the floor moves to the next record in flight, found the same way
    replica.apply(commands.ack(replica.now_ms, GROUP, TOPIC, receipts[:2]))
    assert replica.floor() == 2
    assert replica.counted() == (1, 1)
    # the rest acked but 7: the floor is 7
    replica.apply(commands.ack(replica.now_ms, GROUP, TOPIC, receipts[2:3] + receipts[6:7] + receipts[8:]))
    assert replica.floor() == 7
    replica.counted()
    # a stale receipt (acked before) changes nothing and reads its record all the same (the one
    # multi-get, which finds none), with no scan
    again = replica.apply(commands.ack(replica.now_ms, GROUP, TOPIC, receipts[:1]))["results"]
    assert again[0]["error"]["code"] == "stale_receipt"
    assert replica.counted() == (0, 1)
    assert replica.floor() == 7
