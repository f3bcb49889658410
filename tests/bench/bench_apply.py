"""CPU cost of one ``QueueGroupMachine.apply`` on a real RocksDB store, for the entries a keyed
producer at ordinary load makes (``bench_latency_vs_nats.py`` at 1,000 msgs/s: one request per
entry, a batch of 1-3 keyed 100 B records per queue), in one process: no Raft, no sockets.

Every replica applies every entry, so at low rates this is paid three times per request.
Entries: ``append`` commands of 1 batch (and of 3, a few requests coalesced), 1-3 records each,
keys spread over 6 queues, ``--producers`` producers, each batch's sequence the next of its
producer on its queue; the group's producer expiry started (an ``expire_producers`` first), as
in a running cluster. Also timed alone: decoding the entry (``commands.decode_stamped``).

    .venv/bin/python tests/bench/bench_apply.py                      # ~10 s
    ../base/.venv/bin/python tests/bench/bench_apply.py --tag base   # another tree's machine

Prints CPU µs per apply, the thread's (median of ``--rounds`` rounds of ``--entries`` entries,
each on a new store; the wall clock's alongside) and writes JSON to bench-results/. Where the
tree's machine takes ``cache_entries`` (its cache of the keys every apply reads), the rows are
measured with it off too.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, header, loadavg, table, write_result

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.rocks import RocksStore

QUEUES = 6
VALUE = "v" * 100
START_MS = 1_800_000_000_000


def make_entries(count: int, batches: int, producers: int) -> list[bytes]:
    """``count`` append commands of ``batches`` batches each (see the module docstring)."""
    sequences: dict[tuple[str, int], int] = {}
    out = []
    n = 0
    for i in range(count):
        items = []
        for _ in range(batches):
            producer, queue, records = f"producer-{n % producers}", n % QUEUES, 1 + n % 3
            sequence = sequences.get((producer, queue), 0)
            sequences[(producer, queue)] = sequence + records
            b = rb.BatchBuilder(producer, sequence, base_timestamp_ms=START_MS + i)
            for r in range(records):
                b.append(VALUE, key=f"key-{n}-{r}", timestamp_ms=START_MS + i)
            items.append((1, queue, b.finish()))
            n += 1
        out.append(commands.append(START_MS + i, items))
    return out


def machine_factory(cache: bool) -> Callable[[RocksStore], QueueGroupMachine] | None:
    """How to make a machine with its cache on or off (None: this tree's machine has no cache)."""
    takes_cache = "cache_entries" in inspect.signature(QueueGroupMachine).parameters
    if takes_cache:
        kwargs: dict[str, Any] = {} if cache else {"cache_entries": 0}
        return lambda store: QueueGroupMachine(store, 1, **kwargs)
    return (lambda store: QueueGroupMachine(store, 1)) if cache else None


def one_round(
    tmp: Path, make: Callable[[RocksStore], QueueGroupMachine], entries: list[bytes]
) -> tuple[float, float]:
    """CPU and wall-clock µs per apply of ``entries`` on a new store (after the group's first
    ``expire_producers``). The CPU time is this thread's (RocksDB writes in the caller's thread):
    the figure that holds on a shared machine, where the wall clock counts the waits for a core."""
    path = tmp / f"state-{time.monotonic_ns()}"
    store = RocksStore.open(str(path))
    try:
        machine = make(store)
        result = machine.apply(1, expire_producers(START_MS - 1, 3_600_000))
        assert "error" not in result, result
        t0, cpu0 = time.perf_counter(), time.thread_time()
        for index, entry in enumerate(entries, start=2):
            result = machine.apply(index, entry)
        cpu, elapsed = time.thread_time() - cpu0, time.perf_counter() - t0
        assert all("error" not in r for r in result["results"]), result
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    return cpu * 1e6 / len(entries), elapsed * 1e6 / len(entries)


def decode_us(entries: list[bytes]) -> float:
    """CPU µs per entry of its decode alone (what every apply does first)."""
    t0 = time.thread_time()
    for entry in entries:
        commands.decode_stamped(entry, lambda stamp: stamp)
    return (time.thread_time() - t0) * 1e6 / len(entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=4_000, help="entries per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--tag", default="", help="free text stored in the JSON (e.g. which tree)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    result = header("apply", {**vars(args), "tree": str(Path(inspect.getfile(QueueGroupMachine)).parents[2])})
    result["loadavg_start"] = loadavg()
    cases = []
    try:
        for batches in (1, 3):
            entries = make_entries(args.entries, batches, args.producers)
            case: dict[str, Any] = {"batches_per_entry": batches, "decode_us": round(decode_us(entries), 1)}
            for name, cache in (("cache", True), ("no_cache", False)):
                make = machine_factory(cache)
                if make is None:
                    continue
                print(f"  {batches} batch(es) per entry, {name} ...", flush=True)
                rounds = [one_round(tmp, make, entries) for _ in range(args.rounds)]
                case[f"apply_cpu_us_{name}"] = round(statistics.median(r[0] for r in rounds), 1)
                case[f"apply_wall_us_{name}"] = round(statistics.median(r[1] for r in rounds), 1)
                case[f"apply_cpu_us_{name}_rounds"] = [round(r[0], 1) for r in rounds]
            cases.append(case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["cases"] = cases
    result["loadavg_end"] = loadavg()
    rows = [
        [
            f"{c['batches_per_entry']} batch(es)",
            c.get("apply_cpu_us_cache", float("nan")),
            c.get("apply_cpu_us_no_cache", float("nan")),
            c["decode_us"],
            c.get("apply_wall_us_cache", float("nan")),
            c.get("apply_wall_us_no_cache", float("nan")),
        ]
        for c in cases
    ]
    print(f"\nbench_apply  commit {result['commit']}  {args.tag}  tree {result['params']['tree']}")
    print(f"loadavg {result['loadavg_start']}")
    heads = ["entry", "apply CPU µs", "cache off", "decode CPU µs", "apply wall µs", "cache off"]
    print(table(rows, heads))
    path = write_result("apply", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
