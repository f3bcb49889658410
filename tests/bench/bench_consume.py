"""Consume benchmark: a consumer group of 3 ``raftmq.client.Consumer`` processes on a real 3-node
cluster (3 queue groups, replication 3, ``durability = "fsync"``), and end-to-end latency.

Everything runs ON THE SAME MACHINE (3 nodes, 3 consumer processes, the producer): they share the
cores, so the figures are a floor for separate machines.

Phases:

- ``throughput``: ``--messages`` messages of 100 bytes are produced first (raw HTTP, 1,000 per
  request, to each queue's leader), over ``--queues`` queues. Then 3 consumer processes of one
  group start and join; once every one owns its share of the queues (the group has formed) they
  are told "go", and each iterates ``Consumer.poll`` and acks every message. Before "go" each has
  prefetched up to ``max_backlog`` messages per queue. Every consumer reports (time, messages,
  queues owned) every 50 ms. Figures:

  - ``steady msgs/s``: messages per second of the whole group from 0.5 s after "go" until the
    first consumer runs dry (the rate the group sustains);
  - ``drain msgs/s``: (messages - those prefetched before "go") / (last message - "go");
  - every message arrives (distinct (queue, offset) pairs = ``--messages``); duplicates counted;
  - CPU per message of the nodes and of the consumers (from "go" on).

- ``latency``: an open-loop producer (``raftmq.client.AsyncProducer``, ``--linger-ms`` 5, the
  client's default) sends ``--rate`` messages/s at fixed times for ``--duration`` s (after
  ``--warmup`` s); each message carries its scheduled send time. One consumer process (long
  polling, ``wait_ms`` 5,000) records receive time - scheduled send time: no coordinated omission.
  Also split: producer send -> acknowledged (durable), broker append timestamp -> receive.

Both phases start once every queue group is led by its preferred node (the leader balancer moves
leaders after start-up, and a transfer stalls produces for about a second).

    .venv/bin/python tests/bench/bench_consume.py                        # ~1 min, both phases
    .venv/bin/python tests/bench/bench_consume.py --phases throughput --profile   # py-spy
    .venv/bin/python tests/bench/bench_consume.py --max-batch 32         # the old default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    PYTHON,
    RESULTS,
    CpuMeter,
    fs_type,
    header,
    loadavg,
    start_py_spy,
    summarize_raw_profile,
    table,
    wait_quiet,
    write_result,
)

from tests.integration.harness import Cluster, wait_until  # noqa: E402

TARGET_MSGS = 100_000
TARGET_P99_MS = 50.0
CONSUMERS = 3
VALUE_BYTES = 100
THREADS = {"_run_once": "asyncio", "run_forever": "asyncio", "_worker": "executor"}


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def leaders_settled(cluster: Cluster, groups: int = 3) -> bool:
    """Every queue group is led by its preferred node (n{g+1}), as the node's balancer arranges."""
    return all(cluster.leader(str(g)) == f"n{(g % len(cluster.nodes)) + 1}" for g in range(groups))


# -- the consumer processes (this script run with --role) -----------------------------------------


def consumer_main(args: argparse.Namespace) -> None:
    """Consume and ack; print a JSON sample line every 50 ms and a summary at the end."""
    from raftmq.client import Consumer

    if os.environ.get("RAFTMQ_BENCH_LOG"):  # the consumer's own log on stderr (debugging)
        import logging

        logging.basicConfig(level=logging.INFO, format="%(created).3f %(name)s %(message)s")
        logging.getLogger("raftmq.client.consumer").setLevel(logging.DEBUG)
    urls = args.urls.split(",")
    started = time.time()
    consumer = Consumer(
        urls,
        group=args.group,
        topics=args.topic,
        max_batch=args.max_batch,
        max_backlog=args.max_backlog,
        wait_ms=5_000 if args.role == "latency" else 200,
        reset=args.reset,
    )
    print(json.dumps({"started": started, "ready": time.time()}), flush=True)
    prefetched = 0
    if args.role == "throughput":
        # The start barrier: report the assignment until the parent says "go" (the group has
        # formed); meanwhile fetching stops at max_backlog per queue, as nothing is acked.
        import threading

        go = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
        while not go.wait(0.05):
            print(json.dumps({"t": time.time(), "n": 0, "owned": len(consumer.assignment())}), flush=True)
        prefetched = len(consumer._core.buffer)  # a benchmark may peek
        print(json.dumps({"go": time.time(), "prefetched": prefetched}), flush=True)
    if args.spy_out:  # profile this process from now on (not its start-up)
        start_py_spy(os.getpid(), args.profile_s, Path(args.spy_out))
    cpu_start = sum(os.times()[:2])
    count = 0
    seen: Counter[tuple[int, int]] = Counter()
    latencies: list[float] = []
    from_append: list[float] = []  # receive time - the broker's append timestamp
    last_sample = 0.0
    first_at = last_at = 0.0
    idle_since = time.monotonic()
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=50, max_messages=10_000)
        now = time.time()
        if batch:
            if not first_at:
                first_at = now
            last_at = now
            idle_since = time.monotonic()
            for m in batch:
                if args.role == "latency":
                    latencies.append(now - float(str(m.value)[:20]))
                    from_append.append(now - m.timestamp_ms / 1000)
                else:
                    seen[(m.queue, m.offset)] += 1
                m.ack()
            count += len(batch)
        if now - last_sample >= 0.05:
            last_sample = now
            print(json.dumps({"t": now, "n": count, "owned": len(consumer.assignment())}), flush=True)
        if args.role == "throughput" and count and time.monotonic() - idle_since > args.idle_s:
            break
        if args.role == "latency" and os.path.exists(args.stop_file) and time.monotonic() - idle_since > 1.0:
            break
    cpu_s = sum(os.times()[:2]) - cpu_start
    consumer.close()
    summary: dict[str, Any] = {
        "done": True,
        "count": count,
        "first_at": first_at,
        "last_at": last_at,
        "cpu_s": cpu_s,  # consuming (not start-up), this process
        "prefetched": prefetched,
    }
    if args.role == "throughput":
        summary["distinct"] = [[q, o] for q, o in seen]  # the parent checks the union
        summary["duplicates"] = sum(n - 1 for n in seen.values())
    else:
        summary["latencies"] = latencies
        summary["from_append"] = from_append
    print(json.dumps(summary), flush=True)


def spawn_consumer(
    role: str,
    cluster: Cluster,
    topic: str,
    group: str,
    args: argparse.Namespace,
    stop_file: str = "",
    spy_out: str = "",
) -> subprocess.Popen[str]:
    urls = ",".join(n.url for n in cluster.nodes.values())
    cmd = [
        PYTHON,
        __file__,
        "--role",
        role,
        "--urls",
        urls,
        "--topic",
        topic,
        "--group",
        group,
        "--max-batch",
        str(args.max_batch),
        "--max-backlog",
        str(args.max_backlog),
        "--reset",
        "latest" if role == "latency" else "earliest",
        "--stop-file",
        stop_file,
        "--spy-out",
        spy_out,
        "--profile-s",
        str(args.profile_s),
    ]
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )


# -- producing ------------------------------------------------------------------------------------


async def preproduce(cluster: Cluster, topic: str, queues: int, total: int) -> float:
    """``total`` messages spread evenly over the queues, 1,000 per request, sent to the leaders."""
    desc = cluster.get(f"/v1/topics/{topic}").json()
    leaders = {q["queue"]: cluster.nodes[q["leader"]].url for q in desc["queues"]}
    per_request = 1_000
    bodies = {
        q: orjson.dumps(
            {"messages": [{"value": f"{q:04d}" + "x" * (VALUE_BYTES - 4), "queue": q}] * per_request}
        )
        for q in range(queues)
    }
    requests_per_queue = total // per_request // queues // 2  # two senders per queue
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:

        async def fill(q: int) -> None:
            for _ in range(requests_per_queue):
                for attempt in range(20):
                    async with session.post(
                        f"{leaders[q]}/v1/topics/{topic}/messages",
                        data=bodies[q],
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        await r.read()
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.1 * (attempt + 1))
                else:
                    raise RuntimeError(f"cannot produce to queue {q}")

        await asyncio.gather(*(fill(q) for q in range(queues)), *(fill(q) for q in range(queues)))
    return time.perf_counter() - t0


# -- phases ---------------------------------------------------------------------------------------


def read_lines(proc: subprocess.Popen[str], into: list[dict[str, Any]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            into.append(json.loads(line))


def phase_throughput(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    import threading

    topic = "bench-consume"
    r = cluster.post("/v1/topics", {"name": topic, "queues": args.queues})
    assert r.status_code == 201, r.text
    total = (args.messages // (1_000 * args.queues * 2)) * 1_000 * args.queues * 2
    produce_s = asyncio.run(preproduce(cluster, topic, args.queues, total))
    print(f"  produced {total:,} messages in {produce_s:.1f} s", flush=True)
    time.sleep(1.0)  # let followers apply, so the nodes are idle when consuming starts
    consumer_spy = RESULTS / "profile-consume-consumer0.raw.txt"
    if args.profile:
        consumer_spy.unlink(missing_ok=True)
    t_spawn = time.time()
    procs = [
        spawn_consumer(
            "throughput",
            cluster,
            topic,
            "bench",
            args,
            spy_out=str(consumer_spy) if i == 0 and args.profile else "",
        )
        for i in range(CONSUMERS)
    ]
    outputs: list[list[dict[str, Any]]] = [[] for _ in procs]
    readers = [threading.Thread(target=read_lines, args=(p, o)) for p, o in zip(procs, outputs, strict=True)]
    for t in readers:
        t.start()
    # The start barrier: every consumer owns its share (the group has formed) for 0.3 s.
    share = args.queues // CONSUMERS
    deadline = time.monotonic() + 60
    stable_since: float | None = None
    while True:
        latest = [next((x for x in reversed(o) if "owned" in x), None) for o in outputs]
        if all(x is not None and x["owned"] == share for x in latest):
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since > 0.3:
                break
        else:
            stable_since = None
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"the group did not form: {latest}")
        time.sleep(0.05)
    group_formed_s = time.time() - t_spawn
    meter = CpuMeter({n: cluster.nodes[n].proc.pid for n in cluster.nodes})  # type: ignore[union-attr]
    meter.start()
    t_go = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    spies = []
    if args.profile:
        for n in cluster.nodes:
            out = RESULTS / f"profile-consume-{n}.raw.txt"
            pid = cluster.nodes[n].proc.pid  # type: ignore[union-attr]
            spies.append((n, out, start_py_spy(pid, args.profile_s, out)))
    for p in procs:
        p.wait(timeout=args.max_seconds + 60)
    for t in readers:
        t.join()
    cpu = meter.stop()
    wall = time.time() - t_go
    for p in procs:
        assert p.stderr is not None
        log = p.stderr.read()
        if p.returncode:
            raise RuntimeError(f"consumer failed: {log[-3000:]}")
        if os.environ.get("RAFTMQ_BENCH_LOG"):
            (RESULTS / f"consume-consumer{procs.index(p)}.log").write_text(log)
    summaries = [next(x for x in o if x.get("done")) for o in outputs]
    samples = [[x for x in o if "t" in x and x["t"] >= t_go] for o in outputs]
    distinct = {(q, o) for s in summaries for q, o in s["distinct"]}
    received = sum(s["count"] for s in summaries)
    prefetched = sum(s["prefetched"] for s in summaries)
    duplicates = received - len(distinct)
    last_msg = max(s["last_at"] for s in summaries)
    dry_at = min(s["last_at"] for s in summaries)  # the first consumer to run out of messages
    drain_s = last_msg - t_go
    consumers_cpu_s = sum(s["cpu_s"] for s in summaries)

    def total_at(t: float) -> float:
        out = 0.0
        for s in samples:
            before = [x for x in s if x["t"] <= t]
            out += before[-1]["n"] if before else 0
        return out

    # Steady: from 0.5 s after "go" (the prefetched messages are behind) until one consumer ran dry.
    steady_from = t_go + 0.5
    window = dry_at - steady_from
    steady = (total_at(dry_at) - total_at(steady_from)) / window if window > 0.3 else float("nan")
    profiles = {}
    for name, out, spy in spies:
        if spy is not None:
            spy.wait(args.profile_s + 30)
            profiles[name] = summarize_raw_profile(out, threads=THREADS, seconds=args.profile_s)
    if args.profile:
        deadline = time.monotonic() + args.profile_s + 10
        while not consumer_spy.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        profiles["consumer0"] = summarize_raw_profile(consumer_spy, threads=THREADS, seconds=args.profile_s)
    return {
        "messages": total,
        "value_bytes": VALUE_BYTES,
        "queues": args.queues,
        "consumers": CONSUMERS,
        "max_batch": args.max_batch,
        "max_backlog": args.max_backlog,
        "produce_s": round(produce_s, 2),
        "group_formed_s": round(group_formed_s, 2),
        "prefetched_before_go": prefetched,
        "received": received,
        "distinct": len(distinct),
        "lost": total - len(distinct),
        "duplicates": duplicates,
        "per_consumer": [s["count"] for s in summaries],
        "drain_s": round(drain_s, 3),
        # messages fetched after "go" / time from "go" to the last message
        "drain_msgs_per_s": (total - prefetched) / drain_s if drain_s > 0 else float("nan"),
        "steady_window_s": round(window, 2),
        "steady_msgs_per_s": steady,
        "timeline": [  # per consumer: [s since go, messages, queues owned], every 0.25 s
            [[round(x["t"] - t_go, 2), x["n"], x["owned"]] for x in s[::5]] for s in samples
        ],
        "cpu_cores": {**cpu, "consumers": round(consumers_cpu_s / wall, 2)},
        "other_load_cores": round(max(0.0, cpu["other"] - consumers_cpu_s / wall), 2),
        # from "go" until the consumers exited (their idle end included): CPU seconds per message
        "cpu_us_per_msg": {
            "nodes": round(sum(v for k, v in cpu.items() if k in cluster.nodes) * wall / total * 1e6, 2),
            "consumers": round(consumers_cpu_s / total * 1e6, 2),
        },
        "profiles": profiles,
    }


async def open_loop_producer(
    cluster: Cluster, topic: str, rate: int, seconds: float, warmup_fraction: float, linger_ms: int
) -> dict[str, Any]:
    from raftmq.client import AsyncProducer

    sent = late = 0
    failures: Counter[str] = Counter()
    acked: list[float] = []  # ack time - scheduled send time
    async with AsyncProducer([n.url for n in cluster.nodes.values()], linger_ms=linger_ms) as producer:
        t0 = time.time() + 0.1
        total = int(rate * seconds)
        futures = []
        while sent < total:
            now = time.time()
            due = min(total, int((now - t0) * rate) + 1)
            while sent < due:
                scheduled = t0 + sent / rate
                if now - scheduled > 0.005:
                    late += 1
                value = f"{scheduled:<20.6f}".ljust(VALUE_BYTES, "x")
                future = await producer.send(topic, value)
                future.add_done_callback(lambda _, s=scheduled: acked.append(time.time() - s))
                futures.append(future)
                sent += 1
            await asyncio.sleep(0.001)
        for f in futures:
            try:
                await f
            except Exception as e:
                failures[type(e).__name__] += 1
    measured = acked[int(len(acked) * warmup_fraction) :]
    return {
        "sent": sent,
        "sent_late_over_5ms": late,
        "failures": dict(failures),
        "ack_p50_ms": percentile(measured, 50) * 1e3,
        "ack_p99_ms": percentile(measured, 99) * 1e3,
    }


def phase_latency(cluster: Cluster, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import threading

    topic = "bench-latency"
    r = cluster.post("/v1/topics", {"name": topic, "queues": args.queues})
    assert r.status_code == 201, r.text
    stop_file = tmp / "latency-stop"
    proc = spawn_consumer("latency", cluster, topic, "lat", args, str(stop_file))
    out: list[dict[str, Any]] = []
    reader = threading.Thread(target=read_lines, args=(proc, out))
    reader.start()
    deadline = time.monotonic() + 30
    while not any("ready" in x for x in out):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the latency consumer did not start")
        time.sleep(0.05)
    time.sleep(0.5)
    meter = CpuMeter({n: cluster.nodes[n].proc.pid for n in cluster.nodes})  # type: ignore[union-attr]
    meter.pids["consumer"] = proc.pid
    meter.start()
    seconds = args.warmup + args.duration
    produced = asyncio.run(
        open_loop_producer(cluster, topic, args.rate, seconds, args.warmup / seconds, args.linger_ms)
    )
    cpu = meter.stop()
    stop_file.write_text("stop")
    proc.wait(timeout=60)
    reader.join()
    if proc.returncode:
        assert proc.stderr is not None
        raise RuntimeError(f"consumer failed: {proc.stderr.read()[-3000:]}")
    summary = next(x for x in out if x.get("done"))
    lat = summary["latencies"]
    measured = lat[int(args.warmup * args.rate) :]  # messages arrive in roughly send order
    after_append = summary["from_append"][int(args.warmup * args.rate) :]
    return {
        "offered_msgs_per_s": args.rate,
        "duration_s": args.duration,
        "producer": produced,
        "received": summary["count"],
        "measured": len(measured),
        "p50_ms": percentile(measured, 50) * 1e3,
        "p90_ms": percentile(measured, 90) * 1e3,
        "p99_ms": percentile(measured, 99) * 1e3,
        "max_ms": max(measured) * 1e3 if measured else float("nan"),
        # the two halves: producer send -> durable (acked), broker append -> consumer receive
        "produce_ack_p50_ms": produced["ack_p50_ms"],
        "produce_ack_p99_ms": produced["ack_p99_ms"],
        "append_to_receive_p50_ms": percentile(after_append, 50) * 1e3,
        "append_to_receive_p99_ms": percentile(after_append, 99) * 1e3,
        "cpu_cores": cpu,
    }


# -- report ---------------------------------------------------------------------------------------


def print_report(result: dict[str, Any]) -> None:
    res = result["results"]
    print(f"\ncommit {result['commit']}  machine {result['machine']['nproc']} cores")
    rows = []
    if "throughput" in res:
        t = res["throughput"]
        rows.append(["steady msgs/s (3 consumers)", t["steady_msgs_per_s"], f"target >= {TARGET_MSGS:,}"])
        rows.append(["drain msgs/s (from go)", t["drain_msgs_per_s"], f"{t['drain_s']} s"])
        rows.append(["lost / duplicates", f"{t['lost']} / {t['duplicates']}", f"of {t['messages']:,}"])
        rows.append(["per consumer", str(t["per_consumer"]), f"max_batch {t['max_batch']}"])
        rows.append(["CPU us/msg nodes / consumers", str(list(t["cpu_us_per_msg"].values())), ""])
        rows.append(["other load (cores)", t["other_load_cores"], ""])
    if "latency" in res:
        lat = res["latency"]
        rows.append(
            [
                f"latency at {lat['offered_msgs_per_s']:,} msgs/s",
                f"p50 {lat['p50_ms']:.1f} / p90 {lat['p90_ms']:.1f} / p99 {lat['p99_ms']:.1f} ms",
                f"target p99 <= {TARGET_P99_MS:.0f} ms",
            ]
        )
        rows.append(["latency max", lat["max_ms"], f"received {lat['received']:,}"])
        rows.append(
            [
                "  produce acked (p50 / p99)",
                f"{lat['produce_ack_p50_ms']:.1f} / {lat['produce_ack_p99_ms']:.1f} ms",
                "send -> durable",
            ]
        )
        rows.append(
            [
                "  append -> receive (p50 / p99)",
                f"{lat['append_to_receive_p50_ms']:.1f} / {lat['append_to_receive_p99_ms']:.1f} ms",
                "broker timestamp -> consumer",
            ]
        )
        rows.append(["other load (cores)", lat["cpu_cores"]["other"], ""])
    print(table(rows, ["figure", "value", "note"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="throughput,latency")
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--queues", type=int, default=6, help="queues of the topic (2 per consumer)")
    ap.add_argument(
        "--max-batch", type=int, default=500, help="consumer max_batch (the client default is 32)"
    )
    ap.add_argument(
        "--max-backlog", type=int, default=None, help="consumer max_backlog (default: the client's)"
    )
    ap.add_argument("--rate", type=int, default=5_000, help="offered messages/s in 'latency'")
    ap.add_argument("--linger-ms", type=int, default=5, help="the latency producer's linger_ms")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--profile", action="store_true", help="py-spy a consumer and the nodes in 'throughput'")
    ap.add_argument("--profile-s", type=float, default=5.0)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument(
        "--idle-s", type=float, default=1.5, help="a consumer stops after this long without messages"
    )
    ap.add_argument("--wait-quiet", type=float, default=60.0)
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--tag", default="")
    # consumer process role (internal)
    ap.add_argument("--role", default="", help=argparse.SUPPRESS)
    ap.add_argument("--urls", default="", help=argparse.SUPPRESS)
    ap.add_argument("--topic", default="", help=argparse.SUPPRESS)
    ap.add_argument("--group", default="", help=argparse.SUPPRESS)
    ap.add_argument("--reset", default="earliest", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--spy-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        consumer_main(args)
        return
    from raftmq.client._consumer_config import ConsumerConfig

    defaults = ConsumerConfig(group="g", topics=("t",))
    args.max_batch = args.max_batch or defaults.max_batch
    args.max_backlog = args.max_backlog or max(defaults.max_backlog, args.max_batch)

    base = Path(args.data_dir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    kind = fs_type(base.resolve())
    tmp = Path(tempfile.mkdtemp(prefix="consume-bench-", dir=base))
    params = {
        k: v
        for k, v in vars(args).items()
        if k not in ("role", "urls", "topic", "group", "stop_file", "spy_out")
    }
    params["data_fs"] = kind
    result = header("consume", params)
    result["notes"] = "3 nodes, the consumer processes and the producer on one machine"
    result["busy_before_start"] = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
    result["loadavg_start"] = loadavg()
    RESULTS.mkdir(exist_ok=True)
    t0 = time.monotonic()
    cluster = Cluster(tmp, nodes=3, queue_groups=3, replication=3, extra_toml='durability = "fsync"')
    phases = args.phases.split(",")
    result["results"] = {}
    try:
        cluster.start()
        cluster.wait_ready(timeout_s=60)
        # Let the leader balancer put each queue group on its preferred node (n{g+1}) first: a
        # leadership transfer while measuring stalls produces for about a second.
        try:
            wait_until(lambda: leaders_settled(cluster), 20, 0.25, "leaders on preferred nodes")
        except AssertionError:
            print("  leaders did not settle on their preferred nodes; measuring anyway", flush=True)
        if "throughput" in phases:
            print("phase throughput", flush=True)
            result["results"]["throughput"] = phase_throughput(cluster, args)
        if "latency" in phases:
            print("phase latency", flush=True)
            result["results"]["latency"] = phase_latency(cluster, args, tmp)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_end"] = loadavg()
    print_report(result)
    path = write_result("consume", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}  ({result['elapsed_s']} s)")


if __name__ == "__main__":
    main()
