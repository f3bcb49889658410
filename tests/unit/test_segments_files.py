"""The segment writer/reader and the stored-batch → Arrow decoder (no Spark, no cluster), and the
Spark source's planning helpers (plain Python)."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raftmq import batch as rb
from raftmq.spark._client import DataLossError, Piece, check_start, plan_queue, rate_limit, split_further
from raftmq.storage import keys
from raftmq.storage.columns import SCHEMA, batch_to_ipc_stream, ipc_stream_to_batches, read_columns
from raftmq.storage.keys import QueueMeta
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import OffsetOutOfRange, read_messages
from raftmq.storage.records import CorruptRecord, NewMessage, encode_batch
from raftmq.storage.segments import SegmentFile, SegmentStore, read_segment, segment_name
from raftmq.storage.store import Batch


def random_messages(rng: random.Random, n: int) -> list[NewMessage]:
    out = []
    for _ in range(n):
        key = rng.choice([None, "", "k", "ключ"])
        headers = rng.choice([None, {}, {"a": "1", "ü": "v"}])
        expires = rng.choice([None, None, 123456])
        binary = rng.random() < 0.5
        size = rng.randrange(0, 40)
        # A text value is UTF-8 (format v2 checks it; v1 stored whatever it was given).
        value = rng.randbytes(size) if binary else "".join(rng.choice("aé✓z") for _ in range(size)).encode()
        out.append(NewMessage(value, binary, key, headers, expires))
    return out


def fill(
    store: MemoryStore,
    batches: list[list[NewMessage]],
    topic_id: int = 1,
    queue: int = 0,
    v2: Any = False,
) -> int:
    """Store ``batches``; ``v2``: True stores each in format v2 (docs/format.md), a ``Random``
    picks the format per batch (a queue produced before and after an upgrade)."""
    b = Batch()
    offset = total = 0
    for i, msgs in enumerate(batches):
        value = encode_batch(i + 1, 1_700_000_000_000 + i, offset, msgs)
        if v2 is True or (isinstance(v2, random.Random) and v2.random() < 0.5):
            value = rb.v1_to_v2(value)
        b.put(keys.record_key(topic_id, queue, offset), value)
        offset += len(msgs)
        total += len(value)
    b.put(keys.meta_key(topic_id, queue), QueueMeta(0, offset, total).encode())
    store.write(b)
    return offset


def as_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    return [
        (r["offset"], r["key"], r["value"], r["timestamp"], r["headers"], r["partition"], r["topic"])
        for r in batch.to_pylist()
    ]


def expected_rows(store: MemoryStore, start: int, n: int) -> list[tuple[Any, ...]]:
    out = []
    for m in read_messages(store, 1, 0, start, n):
        headers = (
            None if m.headers is None else [{"key": k, "value": v.encode()} for k, v in m.headers.items()]
        )
        key = None if m.key is None else m.key.encode()
        ts = pa.scalar(m.timestamp_ms * 1000, pa.timestamp("us", tz="UTC")).as_py()
        out.append((m.offset, key, m.value, ts, headers, 0, "tópic"))
    return out


@pytest.mark.parametrize("formats", ["v1", "v2", "mixed"])
@pytest.mark.parametrize("seed", range(5))
def test_fast_decoder_matches_the_record_codec(seed: int, formats: str) -> None:
    rng = random.Random(seed)
    store = MemoryStore()
    v2 = {"v1": False, "v2": True, "mixed": random.Random(seed)}[formats]
    high = fill(store, [random_messages(rng, rng.randrange(1, 30)) for _ in range(20)], v2=v2)
    for _ in range(10):
        start = rng.randrange(0, high + 1)
        max_rows = rng.randrange(1, 80)
        batch, nxt = read_columns(store, 1, "tópic", 0, start, None, max_rows)
        assert batch.schema == SCHEMA
        assert as_rows(batch) == expected_rows(store, start, max_rows)
        assert nxt == start + batch.num_rows
    whole, nxt = read_columns(store, 1, "tópic", 0, 0, None, 10**6)
    assert whole.num_rows == high and nxt == high
    stopped, nxt = read_columns(store, 1, "tópic", 0, 0, 17, 10**6)
    assert stopped.num_rows == 17 and nxt == 17


@pytest.mark.parametrize("v2", [False, True])
def test_decoder_limits_errors_and_checks(v2: bool) -> None:
    store = MemoryStore()
    msgs = [NewMessage(b"x" * 100) for _ in range(10)]
    fill(store, [msgs, msgs], v2=v2)
    batch, nxt = read_columns(store, 1, "t", 0, 5, None, 100, max_bytes=250)
    assert batch.column("offset").to_pylist() == [5, 6] and nxt == 7
    one, _ = read_columns(store, 1, "t", 0, 0, None, 100, max_bytes=1)  # the first always comes
    assert one.num_rows == 1
    empty, nxt = read_columns(store, 1, "t", 0, 20)
    assert empty.num_rows == 0 and nxt == 20
    with pytest.raises(OffsetOutOfRange):
        read_columns(store, 1, "t", 0, 21)
    # A flipped byte inside a value fails its CRC.
    key = keys.record_key(1, 0, 10)
    data = bytearray(store.get(key) or b"")
    data[-3] ^= 0xFF
    b = Batch()
    b.put(key, bytes(data))
    store.write(b)
    with pytest.raises(CorruptRecord):
        read_columns(store, 1, "t", 0, 10)
    # Flags the fast path does not know go to the record codec (which refuses unknown flags).
    bad = bytearray(encode_batch(1, 1, 0, [NewMessage(b"v")]))
    bad[29 + 4] |= 0x80  # the first record's flags byte (header 29 bytes + CRC)
    store2 = MemoryStore()
    b = Batch()
    b.put(keys.record_key(1, 0, 0), bytes(bad))
    b.put(keys.meta_key(1, 0), QueueMeta(0, 1, len(bad)).encode())
    store2.write(b)
    with pytest.raises(CorruptRecord):
        read_columns(store2, 1, "t", 0, 0)


def test_ipc_stream_round_trip_keeps_the_schema() -> None:
    store = MemoryStore()
    fill(store, [[NewMessage(b"a", key="k", headers={"h": "v"})]])
    batch, _ = read_columns(store, 1, "t", 0, 0)
    got = ipc_stream_to_batches(batch_to_ipc_stream([batch]).to_pybytes())
    assert got[0].schema == SCHEMA and got[0].to_pylist() == batch.to_pylist()
    assert ipc_stream_to_batches(batch_to_ipc_stream([]).to_pybytes()) == []


def test_segment_store_writes_atomically_and_reads_back_ranges(tmp_path: Path) -> None:
    store = MemoryStore()
    high = fill(store, [[NewMessage(bytes([i % 256]) * 10) for i in range(100)] for _ in range(3)])
    batch, _ = read_columns(store, 1, "t", 0, 0, None, 10**6)
    seg_store = SegmentStore(str(tmp_path / "segments"))
    arrow = segment_name("t", 1, 0, 0, high, "n1", "arrow")
    parquet = segment_name("t", 1, 0, 0, high, "n1", "parquet")
    assert SegmentFile.parse(arrow) == SegmentFile("arrow", "t", 1, 0, 0, high, "n1")
    written = seg_store.write([batch], arrow, parquet)
    assert written.rows == high and written.first_ts_ms == 1_700_000_000_000
    assert written.last_ts_ms == 1_700_000_000_002
    opened, size = seg_store.open_file(arrow)
    data = opened.read(size + 1)
    opened.close()
    assert len(data) == size == written.bytes
    rows = [r for b in read_segment(data, 0, high, 0, written.crc32c) for r in b.to_pylist()]
    assert rows == batch.to_pylist()
    middle = [b for b in read_segment(data, 150, 160, 0, written.crc32c)]
    assert [r["offset"] for b in middle for r in b.to_pylist()] == list(range(150, 160))
    assert pq.read_table(seg_store.location(parquet)).to_pylist() == batch.to_pylist()
    with pytest.raises(CorruptRecord):
        list(read_segment(data, 0, 1, 0, written.crc32c ^ 1))
    listed = {rel for rel, _, tmp in seg_store.list_files() if not tmp}
    assert listed == {arrow, parquet}
    assert seg_store.delete(arrow) and not seg_store.delete(arrow)


def test_a_failed_write_leaves_no_visible_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    fill(store, [[NewMessage(b"v")] * 5])
    batch, _ = read_columns(store, 1, "t", 0, 0)
    seg_store = SegmentStore(str(tmp_path))

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        seg_store.write([batch], segment_name("t", 1, 0, 0, 5, "n1", "arrow"), None)
    assert list(seg_store.list_files()) == []


SEGS = [
    {"base": 0, "end": 100, "url": "u0"},
    {"base": 100, "end": 200, "url": "u1"},
]


def test_planning_uses_segments_then_the_tail_and_splits_as_asked() -> None:
    info = {"queue": 3, "segments": SEGS, "leader_url": "http://l"}
    splits = plan_queue("t", info, 50, 260, max_rows_per_split=1000, tail_rows_per_split=25)
    pieces = [(p.start, p.end, p.segment["url"] if p.segment else None) for s in splits for p in s.pieces]
    assert pieces == [(50, 100, "u0"), (100, 200, "u1"), (200, 225, None), (225, 250, None), (250, 260, None)]
    assert len(splits) == 4  # both segments in one task, the tail in chunks of 25
    more = split_further(splits, 8)
    assert len(more) == 8
    covered = sorted((p.start, p.end) for s in more for p in s.pieces)
    assert covered[0][0] == 50 and covered[-1][1] == 260
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    assert plan_queue("t", info, 120, 130, 1000, 1000)[0].pieces == [Piece(120, 130, SEGS[1])]


def test_data_loss_and_rate_limit() -> None:
    assert check_start("t", 0, 5, 10, 20, fail_on_data_loss=False) == 10
    with pytest.raises(DataLossError, match="no longer retained"):
        check_start("t", 0, 5, 10, 20, fail_on_data_loss=True)
    start = {"t": {"0": 0, "1": 10, "2": 5}}
    end = {"t": {"0": 100, "1": 10, "2": 35}}
    limited = rate_limit(start, end, 13)
    assert sum(limited["t"][q] - start["t"][q] for q in "012") == 13
    assert limited["t"]["1"] == 10 and limited["t"]["0"] > limited["t"]["2"] - 5
    assert rate_limit(start, end, 10_000) == end


def test_a_stored_v2_batch_with_a_key_that_is_not_utf8_is_a_corrupt_record_for_columns() -> None:
    """read_columns reads stored v2 batches without checking their records again
    (raftmq.batch.read_stored): a key that is not UTF-8 behind a matching CRC (a writer's bug)
    is still a CorruptRecord when its row is built, not another error."""
    value = bytearray(rb.v1_to_v2(encode_batch(1, 1_700_000_000_000, 0, [NewMessage(b"v", key="ab")])))
    at = bytes(value).index(b"ab")
    value[at] = 0xFF
    value[36:40] = crc32c.crc32c(memoryview(value)[40:]).to_bytes(4, "little")
    store = MemoryStore()
    b = Batch()
    b.put(keys.record_key(1, 0, 0), bytes(value))
    b.put(keys.meta_key(1, 0), QueueMeta(0, 1, len(value)).encode())
    store.write(b)
    with pytest.raises(CorruptRecord, match="unreadable"):
        read_columns(store, 1, "t", 0, 0)
