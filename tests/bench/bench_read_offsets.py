"""CPU cost of a ReceiveMessage's read of its messages, in one process (no Raft, no sockets):
``read_offsets`` of 10 offsets, all in one stored SQS batch, on RocksDB, per call. The read the
single-seek cut of ``_batches_from`` changed (docs/benchmarks.md, "The floor ...").

The queue holds ``--batches`` SQS send batches (``bench_stored_reads.py``'s: 10 bodies, two
headers, a TTL); each call reads the 10 offsets of the next batch, cycling through the queue.
A pass times ``--calls`` calls with ``time.process_time`` (CPU, not wall); the median of
``--passes`` passes is printed and written. Compare two trees by alternating runs, the other
tree's code on ``PYTHONPATH``:

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_read_offsets.py   # ~10 s
    mkdir -p /tmp/base/raftmq && git archive aef4eb9 | tar -x -C /tmp/base/raftmq   # the tree before
    PYTHONPATH=/tmp/base flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_read_offsets.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, write_result
from bench_stored_reads import queue_of

from raftmq.cluster.node.messages import read_offsets
from raftmq.storage import queues
from raftmq.storage.rocks import RocksStore


def filled(path: Path, batches: int, value_size: int) -> RocksStore:
    """A RocksDB store holding one queue of ``batches`` SQS batches of 10 messages."""
    return queue_of(batches, value_size, RocksStore.open(str(path)))


def one_pass(store: RocksStore, batches: int, calls: int) -> float:
    """CPU µs per ``read_offsets`` call over ``calls`` calls, each reading one whole batch."""
    t0 = time.process_time()
    for i in range(calls):
        base = 10 * (i % batches)
        found = read_offsets(store, 1, 0, list(range(base, base + 10)))
        assert len(found) == 10, found
    return 1e6 * (time.process_time() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2_000, help="SQS batches of 10 in the queue")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--calls", type=int, default=20_000, help="read_offsets calls per pass")
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-read-offsets-"))
    try:
        store = filled(folder / "db", args.batches, args.value_size)
        one_pass(store, args.batches, args.batches)  # warm-up: every batch read once
        passes = [round(one_pass(store, args.batches, args.calls), 2) for _ in range(args.passes)]
        store.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = header("read_offsets", vars(args))
    result["raftmq_from"] = queues.__file__  # which tree's code ran
    result["passes_us_per_call"] = passes
    result["median_us_per_call"] = statistics.median(passes)
    print(f"read_offsets of 10 in one SQS batch ({result['raftmq_from']}): passes {passes}")
    print(f"median {result['median_us_per_call']} µs of CPU per call")
    print(write_result("read_offsets", result))


if __name__ == "__main__":
    main()
