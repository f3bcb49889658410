"""The timed phases of a round (produce at full speed and in an open loop, catch-up from offset
0, restart, wiped replica) and the round that runs them in turn."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import requests

from tests.bench._common import collect_profiles, percentile, profile_nodes, settle_leaders
from tests.bench.backlog.common import POOL, caught_up, commit_goals, create_topic, groups_of
from tests.bench.backlog.timeline import Timeline, meminfo_mb, per_second, snapshot_installs
from tests.bench.backlog.usage import Usage, node_disks, segment_disks, storage_work
from tests.integration.harness import Cluster, wait_until

# -- produce ---------------------------------------------------------------------------------------


def produce_max(urls: list[str], topic: str, values: list[str], messages: int) -> dict[str, Any]:
    """``messages`` as fast as one sync Producer sends them; msgs/s to the end of flush."""
    from raftmq.client import Producer

    with Producer(urls) as producer:
        for i in range(1000):  # warm-up: metadata, connections
            producer.send(topic, values[i % POOL])
        if not producer.flush(60):
            raise RuntimeError("the warm-up did not flush in 60 s")
        t0 = time.perf_counter()
        for i in range(messages):
            producer.send(topic, values[i % POOL])
        if not producer.flush(600):
            raise RuntimeError("flush did not finish in 600 s")
        seconds = time.perf_counter() - t0
    return {"messages": messages, "seconds": round(seconds, 2), "msgs_per_s": round(messages / seconds)}


class OpenLoop:
    """One sync Producer offering ``rate`` msgs/s to ``topic`` in a thread from :meth:`start` until
    :meth:`stop`; latency from each message's scheduled send to its acknowledgement (a send that
    ran late counts its lateness). Messages scheduled before ``warmup_s`` are not timed."""

    def __init__(self, urls: list[str], topic: str, values: list[str], rate: float, warmup_s: float = 1.0):
        self.urls, self.topic, self.values, self.rate, self.warmup_s = urls, topic, values, rate, warmup_s
        self.latencies_ms: list[float] = []
        self.sends: list[tuple[float, float]] = []  # (scheduled perf_counter, ms) of the timed sends
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0
        self.error: BaseException | None = None

    def start(self) -> OpenLoop:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(300)
        if self.error is not None:
            raise RuntimeError(f"open loop failed: {self.error!r}")
        lat = self.latencies_ms
        return {
            "offered_per_s": self.rate,
            "timed": len(lat),
            "failures": len(self.failures),
            "p50_ms": round(percentile(lat, 50), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else float("nan"),
        }

    def _run(self) -> None:
        from raftmq.client import Producer

        try:
            with Producer(self.urls) as producer:
                start = time.perf_counter() + 0.2
                i = 0
                while not self._stop.is_set():
                    scheduled = start + i / self.rate
                    wait = scheduled - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    producer.send(
                        self.topic,
                        self.values[i % POOL],
                        callback=self._callback(scheduled, scheduled - start >= self.warmup_s),
                    )
                    i += 1
                self.sent = i
                if not producer.flush(120):
                    raise RuntimeError("the open loop's messages were not acknowledged in 120 s")
        except BaseException as e:  # reported by stop()
            self.error = e

    def _callback(self, scheduled: float, timed: bool) -> Callable[[Any, Any], None]:
        def callback(_metadata: Any, error: Any) -> None:
            now = time.perf_counter()
            with self._lock:
                if error is not None:
                    self.failures.append(str(error))
                elif timed:
                    self.latencies_ms.append((now - scheduled) * 1000)
                    self.sends.append((scheduled, (now - scheduled) * 1000))

        return callback


def open_loop_for(
    cluster: Cluster, urls: list[str], topic: str, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """The open loop for ``args.probe_seconds``, with what the nodes did in each of its seconds."""
    timeline = Timeline(cluster).start()
    loop = OpenLoop(urls, topic, values, args.rate).start()
    time.sleep(args.probe_seconds + loop.warmup_s)
    out = loop.stop()
    out["timeline"] = timeline.stop()
    out["per_second"] = per_second(loop.sends, out["timeline"], timeline.t0)
    return out


# -- consume ---------------------------------------------------------------------------------------


def catch_up(cluster: Cluster, topic: str, limit: int, args: argparse.Namespace) -> dict[str, Any]:
    """Read ``topic`` from offset 0 of every queue (JSON fetches of ``args.fetch_max`` from the
    queues' leaders, ``args.readers`` threads) until ``limit`` messages, split evenly over the
    queues, were read; msgs/s and MB/s."""
    desc = cluster.get(f"/v1/topics/{topic}").json()
    queues = [(q["queue"], cluster.nodes[q["leader"]].url) for q in desc["queues"]]
    per_queue = -(-limit // len(queues))
    counts = [0] * len(queues)
    bytes_read = [0] * len(queues)
    failures: list[str] = []

    def read(indexes: list[int]) -> None:
        with requests.Session() as session:
            for i in indexes:
                q, url = queues[i]
                offset = 0
                while counts[i] < per_queue:
                    r = session.get(
                        f"{url}/v1/topics/{topic}/queues/{q}/messages",
                        params={"offset": offset, "max": min(args.fetch_max, per_queue - counts[i])},
                        timeout=60,
                    )
                    if r.status_code != 200:
                        failures.append(f"queue {q}: {r.status_code} {r.text[:200]}")
                        return
                    body = orjson.loads(r.content)
                    if not body["messages"]:
                        break  # the queue holds fewer than its share
                    counts[i] += len(body["messages"])
                    bytes_read[i] += len(r.content)
                    offset = body["next_offset"]

    threads = [
        threading.Thread(target=read, args=(list(range(k, len(queues), args.readers)),))
        for k in range(args.readers)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"catch-up failed: {failures[:3]}")
    n = sum(counts)
    return {
        "messages": n,
        "seconds": round(seconds, 2),
        "msgs_per_s": round(n / seconds),
        "mb_per_s": round(sum(bytes_read) / seconds / 1e6, 1),
    }


# -- restart and wipe ------------------------------------------------------------------------------


def restart(cluster: Cluster, nid: str, timeout_s: float) -> dict[str, Any]:
    """Kill ``nid`` (SIGKILL), start it again: seconds to ready and to caught up."""
    groups = groups_of(cluster, nid)
    cluster.kill(nid)
    goals = commit_goals(cluster, groups, exclude=nid)
    t0 = time.monotonic()
    cluster.start(nid)
    wait_until(lambda: cluster._answers_ready(nid), timeout_s, 0.05, f"{nid} ready")
    ready_s = time.monotonic() - t0
    wait_until(lambda: caught_up(cluster, nid, goals), timeout_s, 0.1, f"{nid} caught up")
    return {"node": nid, "ready_s": round(ready_s, 2), "caught_up_s": round(time.monotonic() - t0, 2)}


def wipe_and_catch_up(
    cluster: Cluster, nid: str, urls: list[str], topic: str, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Wipe ``nid`` and start it again while the open loop offers ``args.rate``: seconds until its
    groups applied what their leaders had committed at the wipe, and the producers' latency."""
    groups = groups_of(cluster, nid)
    live = [u for n, u in zip(cluster.nodes, urls, strict=True) if n != nid]
    cluster.kill(nid)
    cluster.wipe(nid)
    loop = OpenLoop(live, topic, values, args.rate, warmup_s=0.0).start()
    time.sleep(1.0)  # the producers' figures cover the start and the whole catch-up
    goals = commit_goals(cluster, groups, exclude=nid)
    t0 = time.monotonic()
    cluster.start(nid)
    try:
        wait_until(lambda: caught_up(cluster, nid, goals), args.wipe_timeout, 0.2, f"wiped {nid} caught up")
        seconds: float | None = round(time.monotonic() - t0, 2)
    except AssertionError as e:
        print(f"  {e}", flush=True)
        seconds = None
    latency = loop.stop()
    return {"node": nid, "caught_up_s": seconds, "producers": latency}


# -- one round -------------------------------------------------------------------------------------


def measure_round(
    cluster: Cluster, name: str, catchup_topic: str | None, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """produce (max and open loop), catch-up, restart and wipe, as ``name`` ("empty"/"backlog")."""
    urls = [n.url for n in cluster.nodes.values()]
    probe = f"probe-{name}"
    # As many queues as the backlog: the empty round's catch-up then reads as many queues, with as
    # many fetches each, as the backlog round's (the run at 27000a7 read 8 against 64).
    create_topic(cluster, probe, args.queues)
    out: dict[str, Any] = {"round": name, "work_at_start": storage_work(cluster)}
    out["segments_bytes_at_start"] = segment_disks(cluster)
    out["meminfo_at_start"] = meminfo_mb()
    installs = snapshot_installs(cluster)
    spies = profile_nodes(cluster, f"backlog-{name}", args.profile_s) if args.profile_s else []
    print(f"[{name}] produce at full speed ...", flush=True)
    usage = Usage(cluster).start()
    out["produce_max"] = produce_max(urls, probe, values, args.probe_messages)
    out["produce_max"]["usage"] = usage.stop()
    print(f"[{name}] produce at {args.rate:,.0f} msgs/s offered ...", flush=True)
    usage = Usage(cluster).start()
    out["produce_open_loop"] = open_loop_for(cluster, urls, probe, values, args)
    out["produce_open_loop"]["usage"] = usage.stop()
    print(f"[{name}] catch-up from offset 0 ...", flush=True)
    usage = Usage(cluster).start()
    out["catch_up"] = catch_up(cluster, catchup_topic or probe, args.catchup_messages, args)
    out["catch_up"]["usage"] = usage.stop()
    if spies:
        out["profiles"] = collect_profiles(spies, PROFILE_THREADS, args.profile_s, wait_s=args.profile_s + 30)
    # Before the restart and the wipe: a restarted node's counters start again from 0.
    out["snapshot_installs"] = snapshot_installs(cluster) - installs
    print(f"[{name}] restart of {args.restart_node} ...", flush=True)
    out["restart"] = restart(cluster, args.restart_node, args.restart_timeout)
    settle_leaders(cluster)
    print(
        f"[{name}] wiped {args.wipe_node} catching up, producers at {args.rate:,.0f} msgs/s ...", flush=True
    )
    out["wipe"] = wipe_and_catch_up(cluster, args.wipe_node, urls, probe, values, args)
    settle_leaders(cluster)
    out["disk"] = node_disks(cluster)
    print(f"[{name}] {summary_line(out)}", flush=True)
    return out


# py-spy's threads of a node (first match wins)
PROFILE_THREADS = {
    "raftmq-checkpoint": "checkpoint",
    "_run_once": "asyncio",
    "run_forever": "asyncio",
    "_worker": "executor",
    "_autoTickThread": "raft",
}


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"produce {r['produce_max']['msgs_per_s']:,} msgs/s, p99 {r['produce_open_loop']['p99_ms']} ms; "
        f"catch-up {r['catch_up']['msgs_per_s']:,} msgs/s; restart ready {r['restart']['ready_s']} s "
        f"(caught up {r['restart']['caught_up_s']} s); wiped replica {r['wipe']['caught_up_s']} s "
        f"(p99 {r['wipe']['producers']['p99_ms']} ms)"
    )
