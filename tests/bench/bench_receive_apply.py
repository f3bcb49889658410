"""CPU cost of the applies of an SQS receiver's cycle on a real RocksDB store, in one process: no
Raft, no sockets (issue 24: each of them runs on every replica, and the leader's is on the
DeleteMessageBatch's critical path).

The entries are those a boto3 sender and receiver make through the SQS API (as a node logged them
in ``bench_sqs.py``'s harness): ``append`` of an SendMessageBatch (10 x ``--value-size`` bytes,
each with its ``sqs-id`` header and the queue's retention as a TTL), the first ``receive`` of 10,
then ``ack_receive`` entries (a DeleteMessageBatch of the 10 received, taking the next 10 along:
docs/sqs.md, "Read-ahead"). The queue is filled first (``--messages``), then received and deleted
through to its end.

    .venv/bin/python tests/bench/bench_receive_apply.py                      # ~10 s
    ../base/.venv/bin/python tests/bench/bench_receive_apply.py --tag base   # another tree's machine

``--cycle``: instead, ``bench_sqs_node.py``'s cycle on one store, ``--messages`` / 10 times:
the ``append`` of a SendMessageBatch of 10, a ``receive`` of them, and an ``ack`` of the 10 (a
DeleteMessageBatch whose read-ahead takes nothing: the queue is empty), the entries a follower
applies per cycle there (docs/benchmarks.md, "A follower's applies").

    .venv/bin/python tests/bench/bench_receive_apply.py --cycle
    PYTHONPATH=/tmp/base .venv/bin/python tests/bench/bench_receive_apply.py --cycle --tag base

``--backoff``: the cost of a receive over a retry index of many retries not due yet (nacked with
an hour's delay, ``--messages`` of them): 1,000 receives of up to 1,000 that find none due.

    .venv/bin/python tests/bench/bench_receive_apply.py --backoff --messages 5000 --rounds 3

Prints CPU µs per apply of each kind (the thread's: RocksDB's writes run in it; median of
``--rounds`` rounds, each on a new store; the wall clock's alongside) and writes JSON to
bench-results/.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, header, loadavg, table, write_result

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.rocks import RocksStore

START_MS = 1_796_000_000_000
TOPIC_ID = 1
GROUP = "sqs"
RETENTION_MS = 4 * 24 * 3600 * 1000  # SQS's default MessageRetentionPeriod, as its TTL
VISIBILITY_MS = 30_000


def send_entries(messages: int, value_size: int) -> list[bytes]:
    """The ``append`` entries of SendMessageBatch calls of 10 messages each."""
    value = "x" * value_size
    out = []
    for i in range(messages // 10):
        builder = rb.BatchBuilder(base_timestamp_ms=START_MS + i)
        for _ in range(10):
            builder.append(value, headers={"sqs-id": str(uuid.uuid4())}, ttl_ms=RETENTION_MS)
        out.append(commands.append(START_MS + i, [(TOPIC_ID, 0, builder.finish())]))
    return out


class Applies:
    """A new store and queue-group machine under ``tmp`` whose applies are timed per kind
    (only the kinds in ``timed`` when given); removed on leaving."""

    def __init__(self, tmp: Path, timed: frozenset[str] | None = None) -> None:
        self.path = tmp / f"state-{time.monotonic_ns()}"
        self.store = RocksStore.open(str(self.path))
        self.machine = QueueGroupMachine(self.store, 1)
        self.timed = timed
        self.index = 0
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def __enter__(self) -> Applies:
        self.apply(
            "subscribe", commands.subscribe(GROUP, TOPIC_ID, "bench", None, 2**32 - 1, [0], now_ms=START_MS)
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def apply(self, op: str, entry: bytes) -> dict[str, Any]:
        self.index += 1
        t0, cpu0 = time.perf_counter(), time.thread_time()
        result = self.machine.apply(self.index, entry)
        if self.timed is None or op in self.timed:
            self.cpu[op] += time.thread_time() - cpu0
            self.wall[op] += time.perf_counter() - t0
            self.count[op] += 1
        assert "error" not in result, result
        return result

    def figures(self) -> dict[str, tuple[float, float, int]]:
        """``op -> (CPU µs, wall µs, count)`` per apply."""
        return {op: (self.cpu[op] * 1e6 / n, self.wall[op] * 1e6 / n, n) for op, n in self.count.items()}


def one_round(tmp: Path, sends: list[bytes]) -> dict[str, tuple[float, float, int]]:
    """``op -> (CPU µs, wall µs, count)`` per apply, on a new store."""
    with Applies(tmp) as a:
        for entry in sends:
            a.apply("append", entry)
        now = START_MS + 1_000
        got = a.apply("receive", commands.receive(now, GROUP, TOPIC_ID, [0], 10, VISIBILITY_MS))
        while got["messages"]:
            receipts = [(m["queue"], m["offset"], got["token"]) for m in got["messages"]]
            now += 2
            entry = commands.ack_receive(now, GROUP, TOPIC_ID, receipts, [0], 10, VISIBILITY_MS)
            got = a.apply("ack_receive", entry)
            assert all(r.get("ok") for r in got["results"]), got["results"]
        return a.figures()


def cycle_round(tmp: Path, messages: int, value_size: int) -> dict[str, tuple[float, float, int]]:
    """``op -> (CPU µs, wall µs, count)`` per apply of ``--cycle``'s entries, on a new store."""
    now, value = START_MS, "x" * value_size
    with Applies(tmp) as a:
        for _ in range(messages // 10):
            now += 3
            builder = rb.BatchBuilder(base_timestamp_ms=now)
            for _ in range(10):
                builder.append(value, headers={"sqs-id": str(uuid.uuid4())}, ttl_ms=RETENTION_MS)
            a.apply("append", commands.append(now, [(TOPIC_ID, 0, builder.finish())]))
            got = a.apply("receive", commands.receive(now + 1, GROUP, TOPIC_ID, [0], 10, VISIBILITY_MS))
            receipts = [(m["queue"], m["offset"], got["token"]) for m in got["messages"]]
            acked = a.apply("ack", commands.ack(now + 2, GROUP, TOPIC_ID, receipts))
            assert len(receipts) == 10 and all(r.get("ok") for r in acked["results"]), acked
        return a.figures()


def backoff_round(tmp: Path, retries: int, value_size: int) -> dict[str, tuple[float, float, int]]:
    """``op -> (CPU µs, wall µs, count)`` of ``--backoff``'s receives, on a new store: ``retries``
    messages nacked with an hour's delay, then 1,000 receives of up to 1,000 with none due."""
    now = START_MS
    with Applies(tmp, timed=frozenset({"receive"})) as a:
        for entry in send_entries(retries, value_size):
            a.apply("append", entry)
        while retries > 0:
            got = a.apply("fill", commands.receive(now, GROUP, TOPIC_ID, [0], 1_000, VISIBILITY_MS))
            receipts = [(m["queue"], m["offset"], got["token"]) for m in got["messages"]]
            a.apply("nack", commands.nack(now, GROUP, TOPIC_ID, receipts, delay_ms=3_600_000))
            retries -= len(receipts)
        for _ in range(1_000):
            now += 1
            got = a.apply("receive", commands.receive(now, GROUP, TOPIC_ID, [0], 1_000, VISIBILITY_MS))
            assert not got["messages"], got
        return a.figures()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="messages sent, then received and deleted")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cycle", action="store_true", help="bench_sqs_node.py's cycle: append, receive, ack")
    ap.add_argument("--backoff", action="store_true", help="receives over --messages retries not due")
    ap.add_argument("--tag", default="", help="free text stored in the JSON (e.g. which tree)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-receive-apply-"))
    result = header(
        "receive_apply", {**vars(args), "tree": str(Path(inspect.getfile(QueueGroupMachine)).parents[2])}
    )
    result["loadavg_start"] = loadavg()
    sends = [] if args.cycle or args.backoff else send_entries(args.messages, args.value_size)
    try:
        if args.backoff:
            rounds = [backoff_round(tmp, args.messages, args.value_size) for _ in range(args.rounds)]
        elif args.cycle:
            rounds = [cycle_round(tmp, args.messages, args.value_size) for _ in range(args.rounds)]
        else:
            rounds = [one_round(tmp, sends) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ops = {}
    kinds = ("receive",) if args.backoff else ("append", "receive", "ack") if args.cycle else None
    for op in kinds or ("append", "receive", "ack_receive"):
        ops[op] = {
            "cpu_us": round(statistics.median(r[op][0] for r in rounds), 1),
            "wall_us": round(statistics.median(r[op][1] for r in rounds), 1),
            "cpu_us_rounds": [round(r[op][0], 1) for r in rounds],
            "applies_per_round": rounds[0][op][2],
        }
    result["ops"] = ops
    result["loadavg_end"] = loadavg()
    print(f"\nbench_receive_apply  commit {result['commit']}  {args.tag}  tree {result['params']['tree']}")
    print(f"loadavg {result['loadavg_start']}")
    rows = [[op, o["cpu_us"], o["wall_us"], o["applies_per_round"]] for op, o in ops.items()]
    print(table(rows, ["entry", "apply CPU µs", "apply wall µs", "applies per round"]))
    path = write_result("receive_apply", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
