"""Receive/ack benchmark: 4 receiver processes of one consumer group on a real 3-node cluster
(3 queue groups, replication 3, ``durability = "fsync"``), every message acked (acks batched).

Everything runs ON THE SAME MACHINE (3 nodes, 4 receiver processes): they share the cores, so the
figures are a floor for separate machines.

``--messages`` messages of 100 bytes are produced first (raw HTTP, 1,000 per request, to each
queue's leader) over ``--queues`` queues of one topic (spread over the 3 queue groups). Then the
receivers start; once all are ready they are told "go" and each receives and acks until it has
seen nothing for ``--idle-s``. Receivers (``--client``):

- ``subscriber``: ``raftmq.client.Subscriber`` (long polls), ``max_in_flight`` = ``--batch``,
  every message acked with ``msg.ack()`` (batched by the client: ``--ack-batch``,
  ``--ack-interval-ms``);
- ``push``: the same over the push stream (``mode="push"``; credit = ``--batch``);
- ``raw``: plain aiohttp: ``receive`` (``max`` = ``--batch``), then one ``ack`` of the whole
  batch sent while the next receive is under way (at most 2 acks outstanding). The client's own
  cost is small here, so it shows the server's.

Each receiver talks to one node (``--connect``): ``spread`` (receiver i -> node i mod 3, as
clients spread over a cluster; 2 in 3 receives are forwarded to the topic's receive
coordinator), or ``coordinator`` (all to the coordinator: no forwarding hop).

Figures:

- ``steady msgs/s``: acked messages per second of the group from 0.5 s after "go" until the first
  receiver runs dry;
- ``drain msgs/s``: messages / (last message - "go");
- every message acked at least once: distinct (queue, offset) over the receivers = ``--messages``,
  and on the server the group's lag and in-flight count are 0 (committed offset = high offset);
  duplicates (deliveries - distinct) and settlements refused (stale) or failed;
- balance: messages per receiver;
- CPU per message of the nodes and of the receivers (from "go" until the receivers exit).

    .venv/bin/python tests/bench/bench_receive.py                       # Subscriber, 200k messages
    .venv/bin/python tests/bench/bench_receive.py --client raw          # the server without the client
    .venv/bin/python tests/bench/bench_receive.py --client push
    .venv/bin/python tests/bench/bench_receive.py --profile             # py-spy: nodes + receiver 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

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
    loadavg,
    node_pids,
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

from tests.integration.harness import Cluster, wait_until  # noqa: E402

TARGET_MSGS = 30_000
RECEIVERS = 4
TOPIC = "bench-receive"
GROUP = "bench"


# -- the receiver processes (this script run with --role) -----------------------------------------


class Tally:
    """What one receiver saw; printed as a sample every 50 ms and as a summary at the end."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: Counter[tuple[int, int]] = Counter()
        self.first_at = self.last_at = 0.0
        self.idle_since = time.monotonic()
        self._last_sample = 0.0

    def add(self, pairs: list[tuple[int, int]]) -> None:
        now = time.time()
        if pairs:
            self.first_at = self.first_at or now
            self.last_at = now
            self.idle_since = time.monotonic()
            self.seen.update(pairs)
            self.count += len(pairs)
        if now - self._last_sample >= 0.05:
            self._last_sample = now
            print(json.dumps({"t": now, "n": self.count}), flush=True)

    def idle_for(self) -> float:
        return time.monotonic() - self.idle_since if self.count else 0.0

    def summary(self, cpu_s: float, **extra: Any) -> dict[str, Any]:
        return {
            "done": True,
            "count": self.count,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "cpu_s": cpu_s,
            "distinct": [[q, o] for q, o in self.seen],
            "duplicates": sum(n - 1 for n in self.seen.values()),
            **extra,
        }


def count_calls(cls: Any, name: str, counter: Counter[str]) -> None:
    """Count the calls of ``cls.name`` (how many receives and settle requests a subscriber makes)."""
    original = getattr(cls, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter[name] += 1
        return original(self, *args, **kwargs)

    setattr(cls, name, counted)


def run_subscriber(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    from raftmq.client import Subscriber
    from raftmq.client._subscriber_core import SubscriberCore

    calls: Counter[str] = Counter()
    count_calls(SubscriberCore, "deliver", calls)  # one per receive answer or push frame
    count_calls(SubscriberCore, "_send", calls)  # one per settle request

    with Subscriber(
        [args.url],
        topic=args.topic,
        group=args.group,
        mode="push" if args.role == "push" else "poll",
        max_in_flight=args.batch,
        ack_batch_size=args.ack_batch,
        ack_interval_ms=args.ack_interval_ms,
        wait_ms=1_000,
    ) as sub:
        while tally.idle_for() < args.idle_s:
            batch = sub.receive(10_000, timeout_ms=50)
            for m in batch:
                m.ack()
            tally.add([(m.queue, m.offset) for m in batch])
        sub.flush()
        stats = sub.stats
    return {
        "acked": stats.acked,
        "stale": stats.stale,
        "failed": stats.failed,
        "receives": calls["deliver"],
        "settle_requests": calls["_send"],
    }


async def run_raw(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    import aiohttp

    base = f"{args.url}/v1/topics/{args.topic}/subscriptions/{args.group}"
    receive_body = orjson.dumps({"max": args.batch, "wait_ms": 1_000})
    headers = {"Content-Type": "application/json"}
    outcome: Counter[str] = Counter()  # acked, stale, failed; receives, settle_requests
    acks: set[asyncio.Task[None]] = set()

    async def ack(session: aiohttp.ClientSession, receipts: list[str]) -> None:
        outcome["settle_requests"] += 1
        async with session.post(
            base + "/ack", data=orjson.dumps({"receipts": receipts}), headers=headers
        ) as r:
            body = orjson.loads(await r.read())
        if r.status != 200:
            outcome["failed"] += len(receipts)
            return
        for res in body["results"]:
            outcome["acked" if res.get("ok") else "stale"] += 1

    async with aiohttp.ClientSession() as session:
        while tally.idle_for() < args.idle_s:
            async with session.post(base + "/receive", data=receive_body, headers=headers) as r:
                raw = await r.read()
            if r.status != 200:
                raise RuntimeError(f"receive answered {r.status}: {raw[:500]!r}")
            messages = orjson.loads(raw)["messages"]
            outcome["receives"] += 1
            tally.add([(m["queue"], m["offset"]) for m in messages])
            if messages:
                while len(acks) >= 2:
                    await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.create_task(ack(session, [m["receipt"] for m in messages]))
                acks.add(task)
                task.add_done_callback(acks.discard)
        if acks:
            await asyncio.gather(*acks)
    return dict(outcome)


def receiver_main(args: argparse.Namespace) -> None:
    """Wait for "go" on stdin, then receive and ack; samples every 50 ms, a summary at the end."""
    import raftmq.client  # noqa: F401  (imported before "go": start-up is not measured)

    print(json.dumps({"ready": time.time()}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"go": time.time()}), flush=True)
    if args.spy_out:  # profile this process from now on (not its start-up)
        start_py_spy(os.getpid(), args.profile_s, Path(args.spy_out))
    cpu_start = sum(os.times()[:2])
    tally = Tally()
    settled = asyncio.run(run_raw(args, tally)) if args.role == "raw" else run_subscriber(args, tally)
    cpu_s = sum(os.times()[:2]) - cpu_start
    print(json.dumps(tally.summary(cpu_s, **settled)), flush=True)


def receiver_command(url: str, args: argparse.Namespace, spy_out: str) -> list[str]:
    return worker_command(
        __file__,
        args.client,
        url=url,
        topic=TOPIC,
        group=GROUP,
        batch=args.batch,
        ack_batch=args.ack_batch,
        ack_interval_ms=args.ack_interval_ms,
        idle_s=args.idle_s,
        spy_out=spy_out,
        profile_s=args.profile_s,
    )


# -- the run ---------------------------------------------------------------------------------------


def receiver_urls(cluster: Cluster, connect: str) -> list[str]:
    desc = cluster.get(f"/v1/topics/{TOPIC}").json()
    coordinator = cluster.nodes[desc["queues"][0]["leader"]].url
    nodes = [n.url for n in cluster.nodes.values()]
    if connect == "coordinator":
        return [coordinator] * RECEIVERS
    return [nodes[i % len(nodes)] for i in range(RECEIVERS)]


def server_check(cluster: Cluster) -> dict[str, Any]:
    """The group's lag and in-flight count on the server (0 and 0: every message was acked)."""
    groups = cluster.get(f"/v1/topics/{TOPIC}/groups").json()["groups"]
    mine = next((g for g in groups if g["group"] == GROUP), None)
    if mine is None:
        return {"lag": None, "in_flight": None, "retrying": None}
    return {k: mine[k] for k in ("lag", "in_flight", "retrying", "dead_letters")}


def commit_indexes(cluster: Cluster) -> dict[str, int]:
    """The commit index of every queue group (from its leader's status)."""
    out: dict[str, int] = {}
    for n in cluster.nodes:
        for name, g in cluster.status(n)["groups"].items():
            if name != "meta" and g["is_leader"]:
                out[name] = g["commit_index"]
    return out


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    total, produce_s = fill_topic(cluster, TOPIC, args.queues, args.messages)
    # The subscription and its dead-letter topic exist before "go" (as after any first receive).
    r = cluster.session.put(f"{cluster.url()}/v1/topics/{TOPIC}/subscriptions/{GROUP}", json={})
    assert r.status_code == 200, r.text
    time.sleep(1.0)  # let followers apply, so the nodes are idle when receiving starts
    spy0 = RESULTS / "profile-receive-receiver0.raw.txt"
    if args.profile:
        spy0.unlink(missing_ok=True)
    urls = receiver_urls(cluster, args.connect)
    workers = Workers(
        [receiver_command(u, args, str(spy0) if i == 0 and args.profile else "") for i, u in enumerate(urls)]
    )
    wait_until(
        lambda: all(any("ready" in x for x in o) for o in workers.outputs), 60, 0.05, "receivers ready"
    )
    load_at_go = loadavg()
    index_at_go = commit_indexes(cluster)
    meter = CpuMeter(node_pids(cluster)).start()
    t_go = workers.go()
    spies = profile_nodes(cluster, "receive", args.profile_s, gil=args.profile_gil) if args.profile else []
    workers.wait(args.max_seconds + 60, "receiver", "receive-receiver")
    cpu = meter.stop()
    wall = time.time() - t_go
    index_at_end = commit_indexes(cluster)
    entries = sum(index_at_end.get(g, i) - i for g, i in index_at_go.items())
    summaries = workers.summaries()
    samples = workers.samples(t_go)
    distinct = {(q, o) for s in summaries for q, o in s["distinct"]}
    received = sum(s["count"] for s in summaries)
    last_msg = max(s["last_at"] for s in summaries)
    dry_at = min(s["last_at"] for s in summaries)
    drain_s = last_msg - t_go
    receivers_cpu_s = sum(s["cpu_s"] for s in summaries)
    per_receiver = [s["count"] for s in summaries]
    profiles = collect_profiles(spies, CLIENT_THREADS, args.profile_s, args.profile_s + 30)
    if args.profile:
        profiles["receiver0"] = worker_profile(spy0, CLIENT_THREADS, args.profile_s)
    nodes_cpu_s = sum(v for k, v in cpu.items() if k in cluster.nodes) * wall
    return {
        "messages": total,
        "value_bytes": 100,
        "queues": args.queues,
        "receivers": RECEIVERS,
        "client": args.client,
        "connect": args.connect,
        "batch": args.batch,
        "ack_batch": args.ack_batch,
        "ack_interval_ms": args.ack_interval_ms,
        "produce_s": round(produce_s, 2),
        "received": received,
        "distinct": len(distinct),
        "lost": total - len(distinct),
        "duplicates": received - len(distinct),
        "settled": {k: sum(s.get(k, 0) for s in summaries) for k in ("acked", "stale", "failed")},
        "receives": sum(s.get("receives", 0) for s in summaries),  # answers, empty ones included
        "settle_requests": sum(s.get("settle_requests", 0) for s in summaries),
        "server": server_check(cluster),
        "per_receiver": per_receiver,
        "balance_spread": max(per_receiver) - min(per_receiver),
        "raft_entries": entries,  # in the queue groups, from "go" until the receivers exited
        "msgs_per_entry": round(total / entries, 1) if entries else None,
        "drain_s": round(drain_s, 3),
        "drain_msgs_per_s": total / drain_s if drain_s > 0 else float("nan"),
        "steady_window_s": round(dry_at - t_go - 0.5, 2),
        "steady_msgs_per_s": steady_rate(samples, t_go + 0.5, dry_at),
        "timeline": [[[round(x["t"] - t_go, 2), x["n"]] for x in s[::5]] for s in samples],
        "cpu_cores": {**cpu, "receivers": round(receivers_cpu_s / wall, 2)},
        "other_load_cores": round(max(0.0, cpu["other"] - receivers_cpu_s / wall), 2),
        "loadavg_at_go": load_at_go,
        "cpu_us_per_msg": {
            "nodes": round(nodes_cpu_s / total * 1e6, 2),
            "receivers": round(receivers_cpu_s / total * 1e6, 2),
        },
        "profiles": profiles,
    }


def print_report(result: dict[str, Any]) -> None:
    t = result["results"]
    print(f"\ncommit {result['commit']}  machine {result['machine']['nproc']} cores")
    rows = [
        [f"steady msgs/s ({RECEIVERS} receivers)", t["steady_msgs_per_s"], f"target >= {TARGET_MSGS:,}"],
        ["drain msgs/s (from go)", t["drain_msgs_per_s"], f"{t['drain_s']} s"],
        ["lost / duplicates", f"{t['lost']} / {t['duplicates']}", f"of {t['messages']:,}"],
        ["settled acked / stale / failed", " / ".join(str(v) for v in t["settled"].values()), ""],
        ["server lag / in flight", f"{t['server']['lag']} / {t['server']['in_flight']}", "0 / 0: all acked"],
        ["per receiver", str(t["per_receiver"]), f"spread {t['balance_spread']}"],
        ["raft entries (queue groups)", t["raft_entries"], f"{t['msgs_per_entry']} msgs per entry"],
        ["receives / settle requests", f"{t['receives']} / {t['settle_requests']}", "from the receivers"],
        ["CPU us/msg nodes / receivers", str(list(t["cpu_us_per_msg"].values())), ""],
        ["other load (cores), load avg", t["other_load_cores"], f"{t['loadavg_at_go']:.2f} at go"],
    ]
    print(table(rows, ["figure", "value", f"{t['client']}, batch {t['batch']}, {t['connect']}"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", choices=("subscriber", "push", "raw"), default="subscriber")
    ap.add_argument("--connect", choices=("spread", "coordinator"), default="spread")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=6, help="queues of the topic (2 per queue group)")
    ap.add_argument(
        "--batch", type=int, default=0, help="max_in_flight (subscriber, push), max (raw); 0: the client's"
    )
    ap.add_argument("--ack-batch", type=int, default=256, help="the subscriber's ack_batch_size")
    ap.add_argument("--ack-interval-ms", type=int, default=50, help="the subscriber's ack_interval_ms")
    ap.add_argument("--profile", action="store_true", help="py-spy the nodes and receiver 0")
    ap.add_argument(
        "--profile-gil", action="store_true", help="nodes: sample the thread holding the GIL only (--gil)"
    )
    add_worker_arguments(ap, "receiver", max_seconds=150.0)
    add_run_arguments(ap)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)  # a receiver's node (internal)
    args = ap.parse_args()
    if args.role:
        receiver_main(args)
        return
    from raftmq.client._subscriber_config import SubscriberConfig

    args.batch = args.batch or SubscriberConfig(topic="t", group="g").max_in_flight
    base, kind = data_folder(args)
    with (
        recorded_run(
            "receive",
            args,
            notes="3 nodes and the 4 receiver processes on one machine",
            data_fs=kind,
            report=print_report,
            internal=(*WORKER_OPTIONS, "url"),
        ) as result,
        three_node_cluster(base, "receive-bench-", 'durability = "fsync"') as cluster,
    ):
        settle_leaders(cluster)
        result["results"] = run(cluster, args)


if __name__ == "__main__":
    main()
