"""Consume benchmark: a consumer group of 3 ``raftmq.client.Consumer`` processes on a real 3-node
cluster (3 queue groups, replication 3, ``durability = "fsync"``), and end-to-end latency.

Everything runs ON THE SAME MACHINE (3 nodes, 3 consumer processes, the producer): they share the
cores, so the figures are a floor for separate machines.

Phases:

- ``throughput``: ``--messages`` messages of 100 bytes are produced first (raw HTTP, 1,000 per
  request, to each queue's leader), over ``--queues`` queues. Then 3 consumer processes of one
  group start and join; once every one owns its share of the queues (the group has formed) they
  are told "go", and each iterates ``Consumer.poll`` and acks every polled list with
  ``consumer.ack(batch)`` (``--ack each``: ``msg.ack()`` message by message). Before "go" each has
  prefetched up to ``max_backlog`` messages per queue. Every consumer reports (time, messages,
  queues owned) every 50 ms. Figures:

  - ``steady msgs/s``: messages per second of the whole group from 0.5 s after "go" until the
    first consumer runs dry (the rate the group sustains);
  - ``drain msgs/s``: (messages - those prefetched before "go") / (last message - "go");
  - every message arrives (distinct (queue, offset) pairs = ``--messages``); duplicates counted
    (each consumer keeps the pairs in two int arrays and sends back per-queue ranges; the parent
    merges them: ``_offset_ranges.py``);
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
import sys
import time
from array import array
from collections import Counter
from operator import attrgetter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    CLIENT_THREADS,
    RESULTS,
    WORKER_OPTIONS,
    CpuMeter,
    Workers,
    add_run_arguments,
    add_worker_arguments,
    collect_profiles,
    data_folder,
    fill_topic,
    node_pids,
    percentile,
    profile_nodes,
    recorded_run,
    settle_leaders,
    start_py_spy,
    steady_rate,
    table,
    three_node_cluster,
    worker_command,
    worker_profile,
)
from _offset_ranges import distinct, holes, merge_ranges, ranges_of  # noqa: E402

from tests.integration.harness import Cluster  # noqa: E402

TARGET_MSGS = 100_000
TARGET_P99_MS = 50.0
CONSUMERS = 3
VALUE_BYTES = 100


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
        wire=args.wire,
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
        prefetched = consumer._core.buffered()  # a benchmark may peek
        print(json.dumps({"go": time.time(), "prefetched": prefetched}), flush=True)
    if args.spy_out:  # profile this process from now on (not its start-up)
        start_py_spy(os.getpid(), args.profile_s, Path(args.spy_out))
    cpu_start = sum(os.times()[:2])
    count = 0
    # Every (queue, offset) received, kept as two int arrays (see _offset_ranges.py)
    seen_queues, seen_offsets = array("q"), array("q")
    queue_of, offset_of = attrgetter("queue"), attrgetter("offset")
    ack_list = args.ack == "list"
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
            if args.role == "latency":
                for m in batch:
                    latencies.append(now - float(str(m.value)[:20]))
                    from_append.append(now - m.timestamp_ms / 1000)
            else:
                seen_queues.extend(map(queue_of, batch))
                seen_offsets.extend(map(offset_of, batch))
            if ack_list:
                consumer.ack(batch)
            else:
                for m in batch:
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
        ranges, repeats = ranges_of(seen_queues, seen_offsets)
        summary["ranges"] = ranges  # the parent merges every consumer's
        summary["repeats"] = repeats
    else:
        summary["latencies"] = latencies
        summary["from_append"] = from_append
    print(json.dumps(summary), flush=True)


def consumer_command(
    role: str,
    cluster: Cluster,
    topic: str,
    group: str,
    args: argparse.Namespace,
    stop_file: str = "",
    spy_out: str = "",
) -> list[str]:
    return worker_command(
        __file__,
        role,
        urls=",".join(n.url for n in cluster.nodes.values()),
        topic=topic,
        group=group,
        max_batch=args.max_batch,
        max_backlog=args.max_backlog,
        reset="latest" if role == "latency" else "earliest",
        wire=args.wire,
        ack=args.ack,
        stop_file=stop_file,
        spy_out=spy_out,
        profile_s=args.profile_s,
    )


# -- phases ---------------------------------------------------------------------------------------


def phase_throughput(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    topic = "bench-consume"
    total, produce_s = fill_topic(cluster, topic, args.queues, args.messages, VALUE_BYTES)
    time.sleep(1.0)  # let followers apply, so the nodes are idle when consuming starts
    consumer_spy = RESULTS / "profile-consume-consumer0.raw.txt"
    if args.profile:
        consumer_spy.unlink(missing_ok=True)
    t_spawn = time.time()
    workers = Workers(
        [
            consumer_command(
                "throughput",
                cluster,
                topic,
                "bench",
                args,
                spy_out=str(consumer_spy) if i == 0 and args.profile else "",
            )
            for i in range(CONSUMERS)
        ]
    )
    procs, outputs = workers.procs, workers.outputs
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
    meter = CpuMeter(node_pids(cluster)).start()
    t_go = workers.go()
    spies = profile_nodes(cluster, "consume", args.profile_s) if args.profile else []
    workers.wait(
        args.max_seconds + 60, "consumer", "consume-consumer" if os.environ.get("RAFTMQ_BENCH_LOG") else None
    )
    cpu = meter.stop()
    wall = time.time() - t_go
    summaries = workers.summaries()
    samples = workers.samples(t_go)
    merged, overlap = merge_ranges(s["ranges"] for s in summaries)
    received = sum(s["count"] for s in summaries)
    prefetched = sum(s["prefetched"] for s in summaries)
    covered = distinct(merged)
    duplicates = overlap + sum(s["repeats"] for s in summaries)
    last_msg = max(s["last_at"] for s in summaries)
    dry_at = min(s["last_at"] for s in summaries)  # the first consumer to run out of messages
    drain_s = last_msg - t_go
    consumers_cpu_s = sum(s["cpu_s"] for s in summaries)
    # Steady: from 0.5 s after "go" (the prefetched messages are behind) until one consumer ran dry.
    steady_from = t_go + 0.5
    window = dry_at - steady_from
    steady = steady_rate(samples, steady_from, dry_at)
    profiles = collect_profiles(spies, CLIENT_THREADS, args.profile_s, args.profile_s + 30)
    if args.profile:
        profiles["consumer0"] = worker_profile(consumer_spy, CLIENT_THREADS, args.profile_s)
    return {
        "messages": total,
        "value_bytes": VALUE_BYTES,
        "queues": args.queues,
        "consumers": CONSUMERS,
        "max_batch": args.max_batch,
        "max_backlog": args.max_backlog,
        "wire": args.wire,
        "produce_s": round(produce_s, 2),
        "group_formed_s": round(group_formed_s, 2),
        "prefetched_before_go": prefetched,
        "received": received,
        "ack": args.ack,
        "distinct": covered,
        "lost": max(total - covered, holes(merged)),
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


def phase_latency(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    topic = "bench-latency"
    r = cluster.post("/v1/topics", {"name": topic, "queues": args.queues})
    assert r.status_code == 201, r.text
    stop_file = cluster.dir / "latency-stop"
    workers = Workers([consumer_command("latency", cluster, topic, "lat", args, str(stop_file))])
    proc, out = workers.procs[0], workers.outputs[0]
    deadline = time.monotonic() + 30
    while not any("ready" in x for x in out):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the latency consumer did not start")
        time.sleep(0.05)
    time.sleep(0.5)
    meter = CpuMeter({**node_pids(cluster), "consumer": proc.pid}).start()
    seconds = args.warmup + args.duration
    produced = asyncio.run(
        open_loop_producer(cluster, topic, args.rate, seconds, args.warmup / seconds, args.linger_ms)
    )
    cpu = meter.stop()
    stop_file.write_text("stop")
    workers.wait(60, "consumer")
    summary = workers.summaries()[0]
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
        rows.append(
            ["per consumer", str(t["per_consumer"]), f"max_batch {t['max_batch']}, wire {t.get('wire')}"]
        )
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
    ap.add_argument(
        "--wire",
        choices=("binary", "json"),
        default="binary",
        help="the consumers' fetch answer (client default: binary)",
    )
    ap.add_argument(
        "--ack",
        choices=("list", "each"),
        default="list",
        help="the consumers ack each poll's list at once (consumer.ack) or message by message",
    )
    ap.add_argument("--rate", type=int, default=5_000, help="offered messages/s in 'latency'")
    ap.add_argument("--linger-ms", type=int, default=5, help="the latency producer's linger_ms")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--profile", action="store_true", help="py-spy a consumer and the nodes in 'throughput'")
    add_worker_arguments(ap, "consumer", max_seconds=120.0)
    add_run_arguments(ap)
    # what a consumer process is started with besides WORKER_OPTIONS (internal)
    ap.add_argument("--urls", default="", help=argparse.SUPPRESS)
    ap.add_argument("--reset", default="earliest", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        consumer_main(args)
        return
    from raftmq.client._consumer_config import ConsumerConfig

    defaults = ConsumerConfig(group="g", topics=("t",))
    args.max_batch = args.max_batch or defaults.max_batch
    args.max_backlog = args.max_backlog or max(defaults.max_backlog, args.max_batch)

    base, kind = data_folder(args)
    phases = args.phases.split(",")
    with (
        recorded_run(
            "consume",
            args,
            notes="3 nodes, the consumer processes and the producer on one machine",
            data_fs=kind,
            report=print_report,
            internal=(*WORKER_OPTIONS, "urls", "stop_file"),
        ) as result,
        three_node_cluster(base, "consume-bench-", 'durability = "fsync"') as cluster,
    ):
        result["results"] = {}
        settle_leaders(cluster)
        if "throughput" in phases:
            print("phase throughput", flush=True)
            result["results"]["throughput"] = phase_throughput(cluster, args)
        if "latency" in phases:
            print("phase latency", flush=True)
            result["results"]["latency"] = phase_latency(cluster, args)


if __name__ == "__main__":
    main()
