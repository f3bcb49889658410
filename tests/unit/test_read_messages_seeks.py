"""A read of stored messages reads the batch holding its first offset once: the seek that finds it
(``last_before``) returns it, and the scans start after it. A receive of 10 SQS messages (one
batch) cost a seek and a scan of the same batch before (docs/benchmarks.md, "The floor")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq import batch as rb
from raftmq.cluster.node.messages import read_offsets
from raftmq.storage import keys
from raftmq.storage.keys import QueueMeta
from raftmq.storage.queues import read_messages
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

TOPIC, QUEUE, PER_BATCH, BATCHES = 1, 0, 10, 8


class CountingStore(RocksStore):
    """A real RocksStore that counts the reads of record batches (seeks and scans)."""

    seeks = 0

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        self.seeks += 1
        return super().last_before(key, floor)

    def scan(self, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        self.seeks += 1
        return super().scan(*args, **kwargs)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CountingStore]:
    s = CountingStore.open(str(tmp_path / "db"))
    b, total = Batch(), 0
    for i in range(BATCHES):
        builder = rb.BatchBuilder(base_timestamp_ms=1)
        for j in range(PER_BATCH):
            builder.append(f"m{PER_BATCH * i + j}", timestamp_ms=1)
        value = rb.stamp(builder.finish(), PER_BATCH * i, 1, i + 1)
        b.put(keys.record_key(TOPIC, QUEUE, PER_BATCH * i), value)
        total += len(value)
    b.put(keys.meta_key(TOPIC, QUEUE), QueueMeta(0, PER_BATCH * BATCHES, total).encode())
    s.write(b)
    s.seeks = 0
    yield s
    s.close()


def test_a_receive_of_one_batch_reads_it_once(store: CountingStore) -> None:
    found = read_offsets(store, TOPIC, QUEUE, list(range(20, 30)))
    assert [m.value for m in found.values()] == [f"m{o}".encode() for o in range(20, 30)]
    assert store.seeks == 1


@pytest.mark.parametrize("first_chunk", [0, 1, 16])
@pytest.mark.parametrize("offset", [0, 7, 20, 79])
def test_reads_across_batches_return_every_message_once_in_order(
    store: CountingStore, offset: int, first_chunk: int
) -> None:
    got = read_messages(store, TOPIC, QUEUE, offset, 1000, first_chunk=first_chunk)
    assert [m.offset for m in got] == list(range(offset, PER_BATCH * BATCHES))
    assert [m.value for m in got] == [f"m{o}".encode() for o in range(offset, PER_BATCH * BATCHES)]


def test_a_read_inside_one_batch_needs_no_scan(store: CountingStore) -> None:
    got = read_messages(store, TOPIC, QUEUE, 33, 5, first_chunk=1)
    assert [m.offset for m in got] == [33, 34, 35, 36, 37]
    assert store.seeks == 1


@pytest.mark.parametrize("first_chunk", [0, 1, 16])
def test_a_read_ends_at_a_gap_right_after_its_first_batch(store: CountingStore, first_chunk: int) -> None:
    """Retention removed the second batch under the read: the read ends with the first batch (the
    one its seek found), never skipping to the third."""
    gap = Batch()
    gap.delete(keys.record_key(TOPIC, QUEUE, PER_BATCH))
    store.write(gap)
    got = read_messages(store, TOPIC, QUEUE, 3, 1000, first_chunk=first_chunk)
    assert [m.offset for m in got] == list(range(3, PER_BATCH))
    assert read_offsets(store, TOPIC, QUEUE, [8, 9, 10, 11, 25]).keys() == {8, 9, 25}
