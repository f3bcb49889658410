"""CPU cost of reading stored record batches (format v2) on a node, in one process (no Raft, no
sockets): ``raftmq.batch.read`` (every check) against ``read_stored`` (CRCs and lengths, for values
this node stored after ``read`` checked them at apply), per batch; and ``storage.columns``'s
``read_columns`` (the Arrow fetch, the sealer) over a queue of such batches, per message, as the
code stands and with ``read`` in place of ``read_stored`` (the reader swapped, nothing else).

The batches are an SQS send's: 10 bodies of ``--value-size`` bytes, each with two headers
(``sqs-id``, ``sqs-attributes``) and a TTL (the queue's retention), and a plain one (100 values,
no key, no header).

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_stored_reads.py   # ~15 s
"""

from __future__ import annotations

import argparse
import sys
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, table, timeit, write_result

from raftmq import batch as rb
from raftmq.storage import columns, keys
from raftmq.storage.keys import QueueMeta
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, Store

NOW_MS = 1_700_000_000_000
RETENTION_MS = 345_600_000  # an SQS queue's default MessageRetentionPeriod: every message's TTL


def sqs_batch(value_size: int, base_offset: int) -> bytes:
    b = rb.BatchBuilder(base_timestamp_ms=NOW_MS)
    for _ in range(10):
        headers = {"sqs-id": str(uuid.uuid4()), "sqs-attributes": '{"customer":["String","alice"]}'}
        b.append("x" * value_size, headers=headers, ttl_ms=RETENTION_MS, timestamp_ms=NOW_MS)
    return rb.stamp(b.finish(), base_offset, NOW_MS, base_offset + 1)


def plain_batch(value_size: int) -> bytes:
    b = rb.BatchBuilder(base_timestamp_ms=NOW_MS)
    for _ in range(100):
        b.append("y" * value_size, timestamp_ms=NOW_MS)
    return rb.stamp(b.finish(), 0, NOW_MS, 1)


S = TypeVar("S", bound=Store)


def queue_of(batches: int, value_size: int, store: S) -> S:
    """``store`` holding one queue (topic 1, queue 0) of ``batches`` SQS batches of 10 messages."""
    b, total = Batch(), 0
    for i in range(batches):
        value = sqs_batch(value_size, 10 * i)
        b.put(keys.record_key(1, 0, 10 * i), value)
        total += len(value)
    b.put(keys.meta_key(1, 0), QueueMeta(0, 10 * batches, total).encode())
    store.write(b)
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--batches", type=int, default=1_000, help="batches of 10 in the queue read_columns reads"
    )
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    sqs, plain = sqs_batch(args.value_size, 0), plain_batch(args.value_size)
    store = queue_of(args.batches, args.value_size, MemoryStore())
    messages = 10 * args.batches

    def whole_queue() -> None:
        offset = 0
        while offset < messages:
            _, offset = columns.read_columns(store, 1, "t", 0, offset, None, 10_000)

    with_read = types.SimpleNamespace(**{**vars(rb), "read_stored": rb.read})
    as_is = columns.rb

    def whole_queue_with_read() -> None:
        columns.rb = with_read  # the reader swapped for the measurement
        try:
            whole_queue()
        finally:
            columns.rb = as_is

    steps: list[tuple[str, Callable[[], Any], int, str]] = [
        ("read, SQS batch (10 x 2 headers, TTL)", lambda: rb.read(sqs), 1, "µs/batch"),
        ("read_stored, SQS batch", lambda: rb.read_stored(sqs), 1, "µs/batch"),
        ("read, plain batch (100)", lambda: rb.read(plain), 1, "µs/batch"),
        ("read_stored, plain batch", lambda: rb.read_stored(plain), 1, "µs/batch"),
        ("read_columns (as is)", whole_queue, messages, "µs/message"),
        ("read_columns with read", whole_queue_with_read, messages, "µs/message"),
        ("read_columns (as is), again", whole_queue, messages, "µs/message"),
    ]
    rows = [[name, timeit(fn, args.min_time) / n * 1e6, unit] for name, fn, n, unit in steps]
    print(table([[r[0], round(r[1], 2), r[2]] for r in rows], ["step", "median", "unit"]))
    result = header("stored_reads", vars(args))
    result["results"] = {r[0]: round(r[1], 3) for r in rows}
    print(write_result("stored_reads", result))


if __name__ == "__main__":
    main()
