"""Produce latency at ordinary load, raftmq against NATS JetStream ``sync_interval: always``, in one
run (issue 23: p50 <= 2 ms at 1,000 and 10,000 msgs/s, p99 <= 5 / 10 ms, ahead of NATS).

One system after another, never at the same time, on 127.0.0.1:

- ``nats-always``  3 ``nats-server`` 2.15.1 (as ``bench_vs_nats.py`` runs and installs them), a file
                   stream with 3 replicas and an fsync per write; the Go publisher (``nats_pub
                   -rate``) calls ``PublishAsync`` at each message's scheduled time and a goroutine
                   per message waits on its acknowledgement.
- ``raftmq``       3 ``raftmq serve`` nodes (3 queue groups, replication 3, ``durability =
                   "fsync"``), a topic of ``--queues`` queues, one sync ``Producer`` with default
                   settings; ``send`` at each scheduled time from one application thread, a delivery
                   callback per message. ``keyed``: keys spread evenly over the queues; ``unkeyed``:
                   no key (the producer's sticky spreading).
- ``anchor``       (``--anchor-tree DIR``) the ``raftmq`` runs again with another checkout's code
                   (nodes and client): this script run by ``DIR/.venv/bin/python``.

Open loop at each ``--rates`` value: message i is offered at ``t0 + i / rate``, and its latency runs
from that instant to its acknowledgement, so a send that ran late counts its lateness (no
coordinated omission). ``--warmup`` seconds are offered first and not counted. raftmq's leaders are
left to settle on their preferred nodes before anything is measured (the balancer moves them in the
first seconds of a cluster), and the run records whether a leader changed during the measurement.
Prints p50 / p90 / p99 / max per system, mode and rate, the CPU per message and the produce
requests per message, and for raftmq the CPU per produce request (all processes, and the client's
apart: ``client_cpu_us_per_request``), and writes JSON to bench-results/. ``--profile``: py-spy
each node and the client during every raftmq row (top self frames printed, the summaries in the
JSON).

    .venv/bin/python tests/bench/bench_latency_vs_nats.py
    .venv/bin/python tests/bench/bench_latency_vs_nats.py --anchor-tree ../raftmq-base --duration 5
    .venv/bin/python tests/bench/bench_latency_vs_nats.py --systems raftmq --modes keyed --rates 1000
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    CLIENT_THREADS,
    RESULTS,
    Spy,
    add_run_arguments,
    collect_profiles,
    cpu_seconds,
    data_folder,
    node_pids,
    percentile,
    profile_nodes,
    recorded_run,
    settle_leaders,
    start_py_spy,
    table,
    thread_cpu,
    thread_cpu_delta,
    thread_kinds,
    three_node_cluster,
)

NATS_WARMUP_MESSAGES = 2_000
# A process's threads, by a frame on their stack (first match wins): nodes and the client.
THREADS = {"_autoTickThread": "tick", "offer": "application", **CLIENT_THREADS}


def _stats(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(latencies, 50), 3),
        "p90_ms": round(percentile(latencies, 90), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "max_ms": round(max(latencies), 3) if latencies else float("nan"),
    }


# -- NATS ------------------------------------------------------------------------------------------


def run_nats(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench_vs_nats import _lines, _next_json, nats_cluster, set_up

    tools = set_up()
    out = []
    with nats_cluster(tools.nats_server, base, True, args.keep) as cluster:
        for i, rate in enumerate(args.rates):
            n = int(rate * args.duration)
            cmd = [
                str(tools.publisher),
                *("-urls", ",".join(cluster.urls), "-stream", f"LAT{i}", "-n", str(n)),
                *("-warmup", str(NATS_WARMUP_MESSAGES), "-size", str(args.value_size), "-values", "x"),
                *("-rate", str(rate), "-max-pending", "65536"),
            ]
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            try:
                lines = _lines(proc)
                _next_json(proc, lines, 90)
                servers0 = {k: cpu_seconds(p) for k, p in cluster.pids.items()}
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                done = _next_json(proc, lines, 600)
                server_cpu = sum(cpu_seconds(p) - servers0[k] for k, p in cluster.pids.items())
                proc.wait(30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            if done["ack_errors"] or done["stream_msgs"] != n:
                raise RuntimeError(f"NATS: {done['ack_errors']} errors, {done['stream_msgs']} of {n} stored")
            row = {
                "system": "nats-always",
                "mode": "-",
                "rate": rate,
                "messages": n,
                **_stats(done["latencies_ms"]),
                "cpu_us_per_msg": round((server_cpu + done["client_cpu_s"]) / n * 1e6, 1),
                "max_send_late_ms": round(done["max_send_late_ms"], 2),
            }
            print(f"  nats-always {rate:,.0f}/s: p50 {row['p50_ms']} p99 {row['p99_ms']} ms", flush=True)
            out.append(row)
    return out


# -- raftmq ----------------------------------------------------------------------------------------


def _keys(queues: int) -> list[str]:
    """One key per queue (by the client's partitioner), so keyed traffic covers every queue evenly."""
    from raftmq.client._metadata import key_queue

    keys: dict[int, str] = {}
    i = 0
    while len(keys) < queues:
        keys.setdefault(key_queue(f"key-{i}", queues), f"key-{i}")
        i += 1
    return [keys[q] for q in range(queues)]


def _time_requests(producer: Any) -> dict[int, float]:
    """When each batch's first request started (``id`` of its outcome -> perf_counter), recorded
    by wrapping the producer's sender (a private name, present in every tree measured so far;
    none recorded if it is missing)."""
    sent_at: dict[int, float] = {}
    core = getattr(producer, "_core", None)
    send_batches = getattr(core, "_send_batches", None)
    if send_batches is None:
        return sent_at

    async def timed(batches: list[Any]) -> None:
        now = time.perf_counter()
        for b in batches:
            sent_at[id(b.outcome)] = now
        await send_batches(batches)

    core._send_batches = timed  # type: ignore[union-attr]
    return sent_at


def offer(
    urls: list[str],
    topic: str,
    rate: float,
    keys: list[str] | None,
    settings: dict[str, int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Offer ``rate`` msgs/s for warm-up + duration through one sync Producer (its defaults, but
    ``settings``). Besides each message's latency, its two parts: from its scheduled time to its
    batch's request (waiting in the producer) and from there to its callback (the request)."""
    from raftmq.client import Producer

    value = "x" * args.value_size
    total = int(rate * (args.warmup + args.duration))
    first_timed = int(rate * args.warmup)
    latencies: list[float] = []
    waits: list[float] = []  # scheduled -> its batch's request started, ms
    requests: list[float] = []  # its batch's request started -> its callback, ms
    failures: list[str] = []
    done = threading.Event()
    remaining = [total]
    lock = threading.Lock()
    sent_at: dict[int, float] = {}

    def callback_for(scheduled: float, timed: bool, handle: list[Any]) -> Any:
        def callback(_metadata: Any, error: Any) -> None:
            now = time.perf_counter()
            with lock:
                if error is not None:
                    failures.append(str(getattr(error, "code", type(error).__name__)))  # the catalogue code
                elif timed:
                    latencies.append((now - scheduled) * 1000)
                    sent = sent_at.get(id(getattr(handle[0], "_batch", None))) if handle else None
                    if sent is not None:
                        waits.append((sent - scheduled) * 1000)
                        requests.append((now - sent) * 1000)
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        return callback

    late_ms = 0.0
    with Producer(urls, **settings) as producer:
        sent_at = _time_requests(producer)
        start = time.perf_counter() + 0.2
        cpu0 = 0.0
        for i in range(total):
            scheduled = start + i / rate
            if i == first_timed:
                ru = resource.getrusage(resource.RUSAGE_SELF)
                cpu0 = ru.ru_utime + ru.ru_stime
            wait = scheduled - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            elif i >= first_timed:
                late_ms = max(late_ms, -wait * 1000)
            key = keys[i % len(keys)] if keys else None
            handle: list[Any] = []
            callback = callback_for(scheduled, i >= first_timed, handle)
            handle.append(producer.send(topic, value, key=key, callback=callback))
        if not done.wait(120):
            raise RuntimeError(f"{remaining[0]} messages still unacknowledged after 120 s")
        ru = resource.getrusage(resource.RUSAGE_SELF)
        client_cpu = ru.ru_utime + ru.ru_stime - cpu0
    return {
        "latencies": latencies,
        "waits": waits,
        "requests": requests,
        "failures": failures,
        "client_cpu_s": client_cpu,
        "late_ms": late_ms,
    }


def _leaders(cluster: Any) -> dict[str, tuple[str | None, int]]:
    groups = cluster.get("/v1/cluster").json().get("groups", [])
    return {str(g.get("name")): (g.get("leader"), int(g.get("term") or 0)) for g in groups}


def _produce_requests(cluster: Any) -> float:
    """Produce requests (POST to a topic's messages) the nodes answered so far."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for nid in cluster.nodes:
        for family in text_string_to_metric_families(cluster.get("/metrics", nid).text):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name == "raftmq_http_requests_total"
                    and labels.get("method") == "POST"
                    and labels.get("route", "").endswith("/messages")
                ):
                    total += sample.value
    return total


# The nodes' histograms that split a request's time: metric -> the column of its mean.
_NODE_TIMES = {
    "raftmq_http_request_seconds": "node_request",  # a produce request at the node that took it
    "raftmq_raft_commit_seconds": "commit",  # proposed at this node until applied here
    "raftmq_raft_apply_seconds": "apply",  # one entry's apply, on every replica
    "raftmq_journal_fsync_seconds": "fsync",  # one journal fsync, on every replica
}


def _node_times(cluster: Any) -> dict[str, tuple[float, float]]:
    """Sum (s) and count of the nodes' :data:`_NODE_TIMES` histograms, over every node (the HTTP
    one only for produce requests)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {column: (0.0, 0.0) for column in _NODE_TIMES.values()}
    for nid in cluster.nodes:
        for family in text_string_to_metric_families(cluster.get("/metrics", nid).text):
            column = _NODE_TIMES.get(family.name)
            if column is None:
                continue
            for sample in family.samples:
                if not sample.name.endswith(("_sum", "_count")):
                    continue
                labels = sample.labels
                if column == "node_request" and not (
                    labels.get("method") == "POST" and labels.get("route", "").endswith("/messages")
                ):
                    continue
                total, count = out[column]
                if sample.name.endswith("_sum"):
                    out[column] = (total + sample.value, count)
                else:
                    out[column] = (total, count + sample.value)
    return out


def _node_means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Each column's mean over a row (ms), from two :func:`_node_times` readings."""
    out = {}
    for column, (total, count) in after.items():
        total0, count0 = before.get(column, (0.0, 0.0))
        if count > count0:
            out[column] = round((total - total0) / (count - count0) * 1000, 3)
    return out


def run_raftmq(base: Path, args: argparse.Namespace, system: str) -> list[dict[str, Any]]:
    out = []
    durability = f'durability = "{args.durability}"'
    with three_node_cluster(base, "latvsnats-", durability, keep=args.keep) as cluster:
        settle_leaders(cluster)
        urls = [n.url for n in cluster.nodes.values()]
        if args.prefill_mb:
            prefill(cluster, urls, args.prefill_mb)
        time.sleep(args.settle)  # the balancer's last moves land a moment after the leaders do
        lingers: list[int | None] = list(args.linger_ms) if args.linger_ms else [None]
        limits: list[int | None] = list(args.leader_requests) if args.leader_requests else [None]
        variants = [(linger, limit) for linger in lingers for limit in limits]
        for rep in range(args.repeat):
            for mode in args.modes:
                for rate in args.rates:
                    for variant in variants:  # interleaved: one cluster, the same minutes
                        row = _measure(cluster, urls, mode, rate, variant, system, args, rep)
                        out.append(row)
    return out


def prefill(cluster: Any, urls: list[str], megabytes: int) -> None:
    """Write ``megabytes`` of 64 KiB messages to a topic with a queue on every group, and wait for
    the stores to settle: every journal's write-ahead log has then been rolled over (a memtable is
    16 MiB), as on a node that has run for a while, not the fresh files of a new cluster."""
    from raftmq.client import Producer

    r = cluster.post("/v1/topics", {"name": "prefill", "queues": 6})
    if r.status_code != 201:
        raise RuntimeError(f"cannot create prefill: {r.status_code} {r.text}")
    value = b"p" * 65536
    started = time.monotonic()
    with Producer(urls) as producer:
        for i in range(megabytes * 16):
            producer.send("prefill", value, key=str(i % 6))
        producer.flush()
    print(f"  prefilled {megabytes} MB in {time.monotonic() - started:.1f} s", flush=True)
    time.sleep(5)  # the memtable flushes and the journals' compactions


def _settings(variant: tuple[int | None, int | None]) -> dict[str, int]:
    """The Producer's settings of ``(linger_ms, max_requests_per_leader)``: None is its default."""
    linger_ms, limit = variant
    out = {} if linger_ms is None else {"linger_ms": linger_ms}
    return out if limit is None else {**out, "max_requests_per_leader": limit}


def _variant_name(row: dict[str, Any]) -> str:
    linger_ms, limit = row.get("linger_ms"), row.get("max_requests_per_leader")
    linger = "" if linger_ms is None else f" linger {linger_ms}"
    return linger + ("" if limit is None else f" per-leader {limit}")


def _measure(
    cluster: Any,
    urls: list[str],
    mode: str,
    rate: float,
    variant: tuple[int | None, int | None],
    system: str,
    args: Any,
    rep: int,
) -> dict[str, Any]:
    linger_ms, limit = variant
    names = "-".join("default" if v is None else str(v) for v in variant)
    topic = f"lat-{mode}-{int(rate)}-{names}-{rep}"
    r = cluster.post("/v1/topics", {"name": topic, "queues": args.queues})
    if r.status_code != 201:
        raise RuntimeError(f"cannot create {topic}: {r.status_code} {r.text}")
    keys = _keys(args.queues) if mode == "keyed" else None
    pids = node_pids(cluster)
    before = _leaders(cluster)
    requests0 = _produce_requests(cluster)
    times0 = _node_times(cluster)
    # Named before the profiler attaches: py-spy's dump and its recording of one process collide.
    kinds = {k: thread_kinds(p) for k, p in pids.items()} if args.thread_cpu else {}
    spies: list[Spy] = []
    if args.profile:  # py-spy every node and this process (the client) over warm-up and timed part
        seconds = args.warmup + args.duration
        spies = profile_nodes(cluster, topic, seconds, gil=args.profile_gil)
        out = RESULTS / f"profile-{topic}-client.raw.txt"
        spies.append(("client", out, start_py_spy(os.getpid(), seconds, out, gil=args.profile_gil)))
    threads0 = {k: thread_cpu(p) for k, p in pids.items()} if args.thread_cpu else {}
    nodes0 = {k: cpu_seconds(p) for k, p in pids.items()}
    got = offer(urls, topic, rate, keys, _settings(variant), args)
    node_cpu = sum(cpu_seconds(p) - nodes0[k] for k, p in pids.items())
    threads = {k: thread_cpu_delta(threads0[k], thread_cpu(p), kinds[k]) for k, p in pids.items() if threads0}
    requests = _produce_requests(cluster) - requests0
    node_means = _node_means_ms(times0, _node_times(cluster))
    after = _leaders(cluster)
    n = len(got["latencies"])
    row = {
        "system": system,
        "mode": mode,
        "rate": rate,
        "linger_ms": linger_ms,
        "max_requests_per_leader": limit,
        "messages": n,
        **_stats(got["latencies"]),
        # the nodes' CPU covers the warm-up too (counted against raftmq)
        "cpu_us_per_msg": round((node_cpu + got["client_cpu_s"]) / max(n, 1) * 1e6, 1),
        # the client's (this process: the application thread and the producer's I/O thread), timed part
        "client_cpu_us_per_msg": round(got["client_cpu_s"] / max(n, 1) * 1e6, 1),
        "max_send_late_ms": round(got["late_ms"], 2),
        "failures": len(got["failures"]),
        "failure_codes": dict(collections.Counter(got["failures"])),
        "leader_changes": sorted(g for g in after if after[g] != before.get(g)),
        # produce requests the nodes answered per message offered (warm-up included on both sides)
        "requests_per_msg": round(requests / max(int(rate * (args.warmup + args.duration)), 1), 3),
        # a message's two parts: waiting in the producer for its batch's request, then the request
        "producer_wait_ms": _parts(got["waits"]),
        "request_ms": _parts(got["requests"]),
        # means over the row (warm-up included): a produce request at its node, its entry's commit
        # at the leader (submit to applied there), one apply and one fsync on any replica
        "node_ms": node_means,
    }
    per_request = max(row["requests_per_msg"], 1e-9)  # CPU per produce request: per message / requests
    row["cpu_us_per_request"] = round(row["cpu_us_per_msg"] / per_request, 1)
    row["client_cpu_us_per_request"] = round(row["client_cpu_us_per_msg"] / per_request, 1)
    if threads:  # µs per message timed, by node and kind of thread (the warm-up's CPU included)
        row["thread_cpu_us_per_msg"] = {
            node: {
                kind: {part: round(seconds / max(n, 1) * 1e6, 1) for part, seconds in cpu.items()}
                for kind, cpu in sorted(by_kind.items())
                if sum(cpu.values()) > 0
            }
            for node, by_kind in threads.items()
        }
        for node, by_kind in row["thread_cpu_us_per_msg"].items():
            parts = ", ".join(f"{kind} {c['user']:.0f}+{c['system']:.0f}" for kind, c in by_kind.items())
            print(f"    {node} CPU µs/msg (user+system): {parts}")
    if spies:
        row["profiles"] = collect_profiles(spies, THREADS, args.warmup + args.duration, 60)
        for name, prof in row["profiles"].items():
            print(
                f"    {name}: busy cores {prof['busy_cores']}, fsync share {prof['fsync_wait_share_of_busy']}"
            )
            for frame, pct in prof["self"][:8]:
                print(f"      {pct:5.1f}%  {frame}")
    wait, request = row["producer_wait_ms"], row["request_ms"]
    print(
        f"  {system} {mode}{_variant_name(row)} {rate:,.0f}/s: p50 {row['p50_ms']} p99 {row['p99_ms']} ms"
        f" max {row['max_ms']}; in the producer p50 {wait.get('p50')} p99 {wait.get('p99')},"
        f" request p50 {request.get('p50')} p99 {request.get('p99')} mean {request.get('mean')};"
        f" at the nodes (means) {node_means}; {row['requests_per_msg']} requests/msg;"
        f" CPU µs per request {row['cpu_us_per_request']:.0f}, of it the client's"
        f" {row['client_cpu_us_per_request']:.0f} ({row['client_cpu_us_per_msg']:.0f} per message)"
        + (f"  LEADERS CHANGED {row['leader_changes']}" if row["leader_changes"] else ""),
        flush=True,
    )
    return row


def _parts(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / mean of one part of the messages' latencies (empty when none was recorded)."""
    if not samples:
        return {}
    return {
        "p50": round(percentile(samples, 50), 3),
        "p99": round(percentile(samples, 99), 3),
        "mean": round(sum(samples) / len(samples), 3),
    }


def run_anchor(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The raftmq runs with another checkout's code: this script under that tree's interpreter."""
    python = Path(args.anchor_tree) / ".venv/bin/python"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        rows_file = f.name
    cmd = [
        str(python),
        __file__,
        *("--systems", "raftmq", "--rates", *map(str, args.rates), "--modes", *args.modes),
        *("--duration", str(args.duration), "--warmup", str(args.warmup), "--queues", str(args.queues)),
        *("--value-size", str(args.value_size), "--wait-quiet", "0", "--rows-out", rows_file),
        *("--system-name", "anchor", "--repeat", str(args.repeat)),
        *("--prefill-mb", str(args.prefill_mb)),
    ]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if args.thread_cpu:  # its py-spy (naming the threads) found on PATH, as this run's
        cmd += ["--thread-cpu"]
    subprocess.run(cmd, check=True)
    rows: list[dict[str, Any]] = json.loads(Path(rows_file).read_text())
    os.unlink(rows_file)
    anchor_commit = subprocess.run(
        ["git", "-C", args.anchor_tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    for row in rows:
        row["tree"] = f"{args.anchor_tree}@{anchor_commit}"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[1_000, 10_000], help="offered msgs/s")
    ap.add_argument("--modes", nargs="+", choices=("keyed", "unkeyed"), default=["keyed", "unkeyed"])
    ap.add_argument("--systems", nargs="+", choices=("nats", "raftmq"), default=["nats", "raftmq"])
    ap.add_argument("--anchor-tree", default="", help="also run raftmq from this checkout (its .venv)")
    ap.add_argument("--duration", type=float, default=10.0, help="timed seconds per rate and mode")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds offered before the timed part")
    ap.add_argument("--repeat", type=int, default=1, help="measure every raftmq row this many times")
    ap.add_argument(
        "--prefill-mb", type=int, default=0, help="write this many MB first (journals past their first logs)"
    )
    ap.add_argument("--settle", type=float, default=3.0, help="seconds to wait after leaders settled")
    ap.add_argument("--queues", type=int, default=6, help="the raftmq topic's queues")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--linger-ms",
        type=int,
        nargs="+",
        default=None,
        help="the Producer's linger_ms (default: its own); several: each in turn",
    )
    ap.add_argument(
        "--leader-requests",
        type=int,
        nargs="+",
        default=None,
        help="the Producer's max_requests_per_leader (default: its own); several: each in turn",
    )
    ap.add_argument("--profile", action="store_true", help="py-spy the nodes and the client per raftmq row")
    ap.add_argument("--profile-gil", action="store_true", help="... sampling only the thread holding the GIL")
    ap.add_argument(
        "--thread-cpu",
        action="store_true",
        help="per raftmq row, each node's CPU per message by kind of thread (loop, tick, ...): user, system",
    )
    ap.add_argument(
        "--durability",
        choices=("fsync", "os"),
        default="fsync",
        help='the cluster\'s durability; "os" (no fsync) bounds what any change of the flushes could gain',
    )
    ap.add_argument("--rows-out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--system-name", default="raftmq", help=argparse.SUPPRESS)
    add_run_arguments(ap, keep="keep the clusters' folders")
    args = ap.parse_args()
    base, fs = data_folder(args)

    if args.rows_out:  # the anchor's child: measure, hand the rows back, print nothing more
        rows = run_raftmq(base, args, args.system_name)
        Path(args.rows_out).write_text(json.dumps(rows))
        return

    def report(result: dict[str, Any]) -> None:
        heads = [
            "system",
            "mode",
            "offered/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "CPU µs/msg",
            "req/msg",
            "in producer p50/p99",
            "request p50/p99",
            "leaders moved",
        ]
        rows = [
            [
                r["system"],
                r["mode"] + _variant_name(r),
                f"{r['rate']:,.0f}",
                *(f"{r[k]:.2f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
                f"{r['cpu_us_per_msg']:.0f}",
                f"{r['requests_per_msg']:.3f}" if "requests_per_msg" in r else "-",
                *(
                    f"{r[part]['p50']:.2f} / {r[part]['p99']:.2f}" if r.get(part) else "-"
                    for part in ("producer_wait_ms", "request_ms")
                ),
                ",".join(r.get("leader_changes", [])) or "-",
            ]
            for r in result["results"]
        ]
        print(f"\nbench_latency_vs_nats  commit {result['commit']}  {args.value_size} B  data on {fs}")
        print(table(rows, heads))

    with recorded_run(
        "latency_vs_nats",
        args,
        notes="open loop; latency from each message's scheduled send to its acknowledgement",
        data_fs=fs,
        report=report,
        internal=("keep", "data_dir", "wait_quiet", "rows_out", "system_name"),
    ) as result:
        rows: list[dict[str, Any]] = []
        if "nats" in args.systems:
            rows += run_nats(base, args)
        if "raftmq" in args.systems:
            rows += run_raftmq(base, args, "raftmq")
        if args.anchor_tree:
            rows += run_anchor(args)
        result["results"] = rows


if __name__ == "__main__":
    main()
