"""Produce latency through the Python client at a fixed offered rate (issue 14: p99 <= 10 ms at
10,000 msgs/s offered through the client).

A real 3-node cluster (3 queue groups, replication 3, ``durability = "fsync"``, as ``raftmq dev``)
and one sync ``Producer`` with default settings. The application thread offers ``--rate``
messages a second of ``--value-size`` bytes for ``--duration`` s after ``--warmup`` s, each
``send`` at its scheduled time (open loop: a slow acknowledgement does not slow the offering); a
delivery callback takes the time each message is acknowledged (durable on a majority). Latency is
from the scheduled send time to the acknowledgement, so a send that ran late counts its delay
(no coordinated omission). Prints p50 / p90 / p99 / p99.9 / max in ms, the rate achieved and the
CPU of nodes and client, and writes JSON to bench-results/.

    .venv/bin/python tests/bench/bench_produce_latency.py                 # 10,000 msgs/s, 20 s
    .venv/bin/python tests/bench/bench_produce_latency.py --rate 30000 --value-size 1024
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._common import (
    cpu_seconds,
    data_folder,
    node_pids,
    percentile,
    recorded_run,
    settle_leaders,
    table,
    three_node_cluster,
)


def _client_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def offer(urls: list[str], topic: str, args: argparse.Namespace) -> dict[str, Any]:
    """Offer ``args.rate`` msgs/s for warm-up + duration; latencies of the timed part in ms."""
    from raftmq.client import Producer

    value = "x" * args.value_size
    total = int(args.rate * (args.warmup + args.duration))
    first_timed = int(args.rate * args.warmup)
    latencies: list[float] = []
    failures: list[str] = []
    done = threading.Event()
    remaining = [total]
    lock = threading.Lock()

    def callback_for(scheduled: float, timed: bool) -> Any:
        def callback(metadata: Any, error: Any) -> None:
            now = time.perf_counter()
            with lock:
                if error is not None:
                    failures.append(str(error))
                elif timed:
                    latencies.append((now - scheduled) * 1000)
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        return callback

    with Producer(urls) as producer:
        start = time.perf_counter() + 0.2
        cpu0 = 0.0
        late_ms = 0.0
        for i in range(total):
            scheduled = start + i / args.rate
            if i == first_timed:
                cpu0 = _client_cpu_s()
            wait = scheduled - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late_ms = max(late_ms, -wait * 1000)
            producer.send(topic, value, callback=callback_for(scheduled, i >= first_timed))
        if not done.wait(120):
            raise RuntimeError(f"{remaining[0]} messages still unacknowledged after 120 s")
        elapsed = time.perf_counter() - (start + args.warmup)
        client_cpu = _client_cpu_s() - cpu0
    return {
        "latencies_ms": latencies,
        "failures": failures,
        "client_cpu_s": client_cpu,
        "max_send_late_ms": round(late_ms, 2),
        "achieved_msgs_per_s": (total - first_timed) / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=10_000, help="messages offered per second")
    ap.add_argument("--duration", type=float, default=20.0, help="timed seconds")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds offered before the timed part")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--data-dir", default=None, help="where the nodes' data goes (default: temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's folder")
    ap.add_argument("--wait-quiet", type=float, default=60.0, help="wait up to this long for an idle machine")
    ap.add_argument("--tag", default="", help="a label stored with the result")
    args = ap.parse_args()
    base, fs = data_folder(args)

    def report(result: dict[str, Any]) -> None:
        r = result["results"]
        rows = [
            [
                f"{args.rate:,.0f}",
                f"{r['achieved_msgs_per_s']:,.0f}",
                *(f"{r[k]:.2f}" for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")),
                f"{r['cpu_us_per_msg']:.1f}",
                r["failures"],
            ]
        ]
        heads = [
            "offered/s",
            "acked/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "CPU µs/msg",
            "failed",
        ]
        print(f"\nbench_produce_latency  commit {result['commit']}  value {args.value_size} B  data on {fs}")
        print(table(rows, heads))
        print(
            f"  nodes' CPU s {r['node_cpu_s']}, client {r['client_cpu_s']:.2f} s; "
            f"sends late by up to {r['max_send_late_ms']} ms"
        )
        verdict = "met" if r["p99_ms"] <= 10 else "MISSED"
        print(f"  p99 {r['p99_ms']:.2f} ms at {args.rate:,.0f} msgs/s offered (target <= 10 ms): {verdict}")

    with recorded_run(
        "produce_latency",
        args,
        notes="open loop through one sync Producer (defaults); latency from the scheduled send to the ack",
        data_fs=fs,
        report=report,
        internal=("keep", "data_dir", "wait_quiet"),
    ) as result:
        with three_node_cluster(base, "latency-", 'durability = "fsync"', keep=args.keep) as cluster:
            settle_leaders(cluster)
            r = cluster.post("/v1/topics", {"name": "latency"})
            if r.status_code != 201:
                raise RuntimeError(f"cannot create the topic: {r.status_code} {r.text}")
            pids = node_pids(cluster)
            nodes0 = {k: cpu_seconds(p) for k, p in pids.items()}
            out = offer([n.url for n in cluster.nodes.values()], "latency", args)
            node_cpu = {k: round(cpu_seconds(p) - nodes0[k], 2) for k, p in pids.items()}
        lat = out["latencies_ms"]
        n = len(lat)
        result["results"] = {
            "messages": n,
            "failures": len(out["failures"]),
            "achieved_msgs_per_s": out["achieved_msgs_per_s"],
            "p50_ms": percentile(lat, 50),
            "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99),
            "p999_ms": percentile(lat, 99.9),
            "max_ms": max(lat) if lat else float("nan"),
            "node_cpu_s": node_cpu,
            "client_cpu_s": out["client_cpu_s"],
            # the nodes' CPU covers the warm-up too: counted against raftmq
            "cpu_us_per_msg": (sum(node_cpu.values()) + out["client_cpu_s"]) / max(n, 1) * 1e6,
            "max_send_late_ms": out["max_send_late_ms"],
            "pid": os.getpid(),
        }


if __name__ == "__main__":
    main()
