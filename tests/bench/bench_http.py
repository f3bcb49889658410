"""End-to-end benchmark over HTTP against a real 3-node cluster (3 queue groups, replication 3).

The nodes are real ``raftmq serve`` processes started by tests/integration/harness.Cluster; the
load generator is this process (aiohttp client) ON THE SAME MACHINE: it competes with the three
nodes for the cores, so the figures are a floor for what a cluster of separate machines does.

Workload: a topic with 6 queues (2 per queue group); every request carries 100 messages of
100-byte values, all for one queue (``"queue": q`` on each message); requests are spread over
the three nodes, so about 2 of 3 are forwarded by a non-leader to the group's leader.

Phases:
- ``max``       closed loop, ``--producers`` concurrent requests: acknowledged messages/s and
                request latency, over ``--duration`` s after ``--warmup`` s.
- ``latency``   open loop at ``--rate`` messages/s (100 requests/s for 10,000 msgs/s) scheduled at
                fixed times, latency measured from the scheduled time (no coordinated omission).
- ``failover``  ``--kills`` times: probe the queues of group g (g = i mod 3) with a produce every
                ``--probe-ms`` ms to each surviving node, kill -9 g's leader, and measure the time
                from the kill to the first successful produce *sent after the kill*; then restart
                the node and wait until it is ready and leaders are back on their preferred nodes.
                ``--failover-load`` messages/s in all (round robin over the queues, requests of
                100 messages, open loop) go through the live nodes meanwhile: a failover under load.

    .venv/bin/python tests/bench/bench_http.py                     # ~2.5 min, all phases
    .venv/bin/python tests/bench/bench_http.py --phases max --profile   # py-spy on every node
    .venv/bin/python tests/bench/bench_http.py --raft group_commit_inflight=4   # experiment
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    CLIENT_THREADS,
    CpuMeter,
    Spy,
    add_run_arguments,
    collect_profiles,
    data_folder,
    leaders_settled,
    node_pids,
    percentile,
    profile_nodes,
    recorded_run,
    settle_leaders,
    table,
    three_node_cluster,
)

import tests.integration.harness as harness  # noqa: E402
from tests.integration.harness import Cluster, wait_until  # noqa: E402


def _port_block_below_ephemeral(count: int) -> int:
    """Like harness.free_port_block, but below Linux's ephemeral range (32768+): a node restarted
    by the failover phase must get its ports back, and an outgoing connection's local port in that
    range can take one (seen once: "address already in use" on restart)."""
    import random

    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        if all(harness._port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free port block")


harness.free_port_block = _port_block_below_ephemeral

BATCH = 100
VALUE = "x" * 100
QUEUES = 6
TARGET_MSGS = 50_000
TARGET_P99_MS = 30.0
TARGET_FAILOVER_S = 3.0
THREADS = {"_autoTickThread": "tick", **CLIENT_THREADS}  # a node's threads (first match wins)


def body_for(queue: int) -> bytes:
    return orjson.dumps({"messages": [{"value": VALUE, "queue": queue}] * BATCH})


class Load:
    """Targets and request bookkeeping shared by the phases."""

    def __init__(self, cluster: Cluster, queues_by_group: dict[int, list[int]], timeout_s: float) -> None:
        self.cluster = cluster
        self.queues_by_group = queues_by_group
        self.bodies = {q: body_for(q) for q in range(QUEUES)}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.error_codes: dict[str, int] = {}
        self.route = "spread"
        self.leaders: dict[int, str] = {}

    def node_for(self, queue: int, i: int) -> str:
        """Spread: node i mod 3 (a client that does not know leaders); leader: the queue's leader."""
        if self.route == "leader":
            g = next(g for g, qs in self.queues_by_group.items() if queue in qs)
            return self.leaders[g]
        nodes = list(self.cluster.nodes)
        return nodes[i % len(nodes)]

    def url(self, node: str) -> str:
        return f"{self.cluster.nodes[node].url}/v1/topics/bench/messages"

    async def post(self, session: aiohttp.ClientSession, node: str, queue: int) -> tuple[int, float]:
        status, dt, _ = await self.post_code(session, node, queue)
        return status, dt

    async def post_code(
        self, session: aiohttp.ClientSession, node: str, queue: int
    ) -> tuple[int, float, str]:
        """(status, seconds); status 0 = connection error, -1 = client timeout. The error code of
        every failed request is counted in ``self.error_codes``."""
        t0 = time.perf_counter()
        code = ""
        try:
            async with session.post(
                self.url(node),
                data=self.bodies[queue],
                headers={"Content-Type": "application/json"},
                timeout=self.timeout,
            ) as resp:
                data = await resp.read()
                status = resp.status
                if status != 200:
                    try:
                        code = f"{status}:{orjson.loads(data)['error']['code']}"
                    except (ValueError, KeyError, TypeError):
                        code = str(status)
        except TimeoutError:
            status, code = -1, "client_timeout"
        except aiohttp.ClientError as e:
            status, code = 0, f"client:{type(e).__name__}"
        if code:
            self.error_codes[code] = self.error_codes.get(code, 0) + 1
        return status, time.perf_counter() - t0, code


async def phase_max(load: Load, session: aiohttp.ClientSession, args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    t_measure, t_end = t_start + args.warmup, t_start + args.warmup + args.duration
    acked = 0
    lat: list[float] = []
    statuses: dict[int, int] = {}

    async def producer(i: int) -> None:
        nonlocal acked
        queue = i % QUEUES
        node = load.node_for(queue, i)
        while time.perf_counter() < t_end:
            status, dt = await load.post(session, node, queue)
            now = time.perf_counter()
            if t_measure <= now <= t_end:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    acked += BATCH
                    lat.append(dt)

    await asyncio.gather(*(producer(i) for i in range(args.producers)))
    return {
        "producers": args.producers,
        "duration_s": args.duration,
        "acked_messages": acked,
        "msgs_per_s": acked / args.duration,
        "requests_per_s": len(lat) / args.duration,
        "statuses": {str(k): v for k, v in statuses.items()},
        "p50_ms": percentile(lat, 50) * 1e3,
        "p99_ms": percentile(lat, 99) * 1e3,
    }


async def phase_latency(
    load: Load, session: aiohttp.ClientSession, args: argparse.Namespace
) -> dict[str, Any]:
    rps = args.rate / BATCH
    total = int((args.warmup + args.duration) * rps)
    warm = int(args.warmup * rps)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    t0 = time.perf_counter() + 0.05
    late = 0

    async def one(k: int, scheduled: float) -> None:
        status, _ = await load.post(session, load.node_for(k % QUEUES, k), k % QUEUES)
        done = time.perf_counter()
        if k >= warm:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                lat.append(done - scheduled)

    tasks = []
    for k in range(total):
        scheduled = t0 + k / rps
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.005:
            late += 1
        tasks.append(asyncio.create_task(one(k, scheduled)))
    await asyncio.gather(*tasks)
    return {
        "offered_msgs_per_s": args.rate,
        "requests": total - warm,
        "statuses": {str(k): v for k, v in statuses.items()},
        "sent_late_over_5ms": late,
        "p50_ms": percentile(lat, 50) * 1e3,
        "p90_ms": percentile(lat, 90) * 1e3,
        "p99_ms": percentile(lat, 99) * 1e3,
        "max_ms": max(lat) * 1e3 if lat else float("nan"),
    }


class Prober:
    """Open-loop produces to ``queues``: one request to each of ``nodes`` every ``interval`` s."""

    def __init__(
        self, load: Load, session: aiohttp.ClientSession, queues: list[int], interval: float
    ) -> None:
        self.load, self.session, self.queues, self.interval = load, session, queues, interval
        self.events: list[tuple[float, float, int, str, str]] = []  # (start, end, status, node, code)
        self.stop = asyncio.Event()
        self._k = 0

    async def _one(self, node: str, queue: int) -> None:
        started = time.perf_counter()
        status, dt, code = await self.load.post_code(self.session, node, queue)
        self.events.append((started, started + dt, status, node, code))

    async def run(self, nodes: list[str], seconds: float) -> None:
        self.stop.clear()
        end = time.perf_counter() + seconds
        tasks = []
        while not self.stop.is_set() and time.perf_counter() < end:
            for node in nodes:
                tasks.append(asyncio.create_task(self._one(node, self.queues[self._k % len(self.queues)])))
                self._k += 1
            await asyncio.sleep(self.interval)
        await asyncio.gather(*tasks)


class Background:
    """Open-loop load through a failover: ``rate`` messages/s in all, in requests of ``BATCH``
    round robin over the queues and the nodes in ``nodes`` (the caller takes a killed node out)."""

    def __init__(self, load: Load, session: aiohttp.ClientSession, rate: float, nodes: list[str]) -> None:
        self.load, self.session, self.nodes = load, session, nodes
        self.interval = BATCH / rate
        self.statuses: dict[int, int] = {}
        self._task = asyncio.create_task(self._run())

    async def _one(self, node: str, queue: int) -> None:
        status, _ = await self.load.post(self.session, node, queue)
        self.statuses[status] = self.statuses.get(status, 0) + 1

    async def _run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        start, k = time.perf_counter(), 0
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                nodes = list(self.nodes)
                task = asyncio.create_task(self._one(nodes[k % len(nodes)], k % QUEUES))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                k += 1
                await asyncio.sleep(max(0.0, start + k * self.interval - time.perf_counter()))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> dict[str, int]:
        self._task.cancel()
        await self._task
        return {str(k): v for k, v in sorted(self.statuses.items())}


def caught_up(cluster: Cluster, node: str) -> bool:
    mine = cluster.status(node)["groups"]
    for name, g in mine.items():
        leader = cluster.leader(name)
        if leader is None:
            return False
        lead = cluster.status(leader)["groups"][name]
        if g["applied_index"] < lead["commit_index"] - 5:
            return False
    return True


async def watch_election(
    cluster: Cluster, group: str, victim: str, alive: list[str], t_kill: float
) -> float | None:
    """Seconds from the kill until a surviving node reports itself leader of ``group``."""
    while time.perf_counter() < t_kill + 15:
        leader = await asyncio.to_thread(cluster.leader, group, alive)
        if leader is not None and leader != victim:
            return time.perf_counter() - t_kill
        await asyncio.sleep(0.02)
    return None


def terms(cluster: Cluster) -> dict[str, int]:
    """The highest term each group's replicas report (a change during a phase = an election)."""
    out: dict[str, int] = {}
    for nid in cluster.nodes:
        if not cluster.alive(nid):
            continue
        try:
            for name, g in cluster.status(nid)["groups"].items():
                out[name] = max(out.get(name, 0), g["term"])
        except Exception:
            continue
    return out


async def phase_failover(
    load: Load, session: aiohttp.ClientSession, args: argparse.Namespace
) -> dict[str, Any]:
    cluster = load.cluster
    kills: list[dict[str, Any]] = []
    live = list(cluster.nodes)
    background = Background(load, session, args.failover_load, live) if args.failover_load else None
    for i in range(args.kills):
        g = i % 3
        queues = load.queues_by_group[g]
        victim = await asyncio.to_thread(cluster.wait_leader, str(g), 20)
        alive = [n for n in cluster.nodes if n != victim]
        prober = Prober(load, session, queues, args.probe_ms / 1000)
        # produce to g's queues through every node for a moment, then kill the leader
        await prober.run(list(cluster.nodes), 1.0)
        after = asyncio.create_task(prober.run(alive, args.failover_timeout + 1))
        await asyncio.sleep(0.2)
        t_kill = time.perf_counter()
        live[:] = alive
        await asyncio.to_thread(cluster.kill, victim)
        watcher = asyncio.create_task(watch_election(cluster, str(g), victim, alive, t_kill))
        deadline = t_kill + args.failover_timeout
        recovered: float | None = None
        while time.perf_counter() < deadline:
            ok = [e for e in prober.events if e[0] >= t_kill and e[2] == 200]
            if ok:
                recovered = min(e[1] for e in ok) - t_kill
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        prober.stop.set()
        await after
        events = prober.events
        ok_before = [e[1] for e in events if e[2] == 200 and e[1] < t_kill]
        failed_after = [e for e in events if e[0] >= t_kill and e[2] != 200]
        new_leader = await asyncio.to_thread(cluster.leader, str(g))
        elected_s = await watcher
        kills.append(
            {
                "kill": i + 1,
                "group": g,
                "victim": victim,
                "new_leader": new_leader,
                "recovery_s": recovered,
                "elected_s": elected_s,
                "gap_s": (min(e[1] for e in events if e[0] >= t_kill and e[2] == 200) - max(ok_before))
                if recovered is not None and ok_before
                else None,
                "failed_requests_after_kill": len(failed_after),
                "failed_statuses": sorted({e[2] for e in failed_after}),
                "failed_detail": [
                    {
                        "sent_after_kill_s": round(e[0] - t_kill, 3),
                        "took_s": round(e[1] - e[0], 3),
                        "node": e[3],
                        "code": e[4],
                    }
                    for e in failed_after
                ],
            }
        )
        shown = "none" if recovered is None else f"{recovered:.2f}s"
        print(
            f"    kill {i + 1}: group {g} leader {victim} -> {new_leader}; produce ok again after {shown}",
            flush=True,
        )
        # restart and wait until the cluster is whole again
        t_restart = time.perf_counter()
        for attempt in range(3):
            if not cluster.alive(victim):
                await asyncio.to_thread(cluster.start, victim)
            try:
                await asyncio.to_thread(cluster.wait_ready, [victim], 30)
                break
            except AssertionError:
                print(f"    restart of {victim} failed (attempt {attempt + 1}); see its log", flush=True)
                if cluster.alive(victim):
                    await asyncio.to_thread(cluster.kill, victim)
                await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"{victim} did not come back")
        await asyncio.to_thread(wait_until, lambda v=victim: caught_up(cluster, v), 60, 0.2, "caught up")
        with contextlib.suppress(AssertionError):  # the next kill takes whatever leader there is
            await asyncio.to_thread(wait_until, lambda: leaders_settled(cluster, 3), 15, 0.25, "leaders")
        kills[-1]["restart_ready_s"] = round(time.perf_counter() - t_restart, 2)
        live[:] = list(cluster.nodes)
    rec = [k["recovery_s"] for k in kills if k["recovery_s"] is not None]
    return {
        "background_msgs_per_s": args.failover_load,
        "background_statuses": await background.stop() if background else {},
        "kills": kills,
        "recovered": len(rec),
        "p50_s": percentile(rec, 50),
        "max_s": max(rec) if rec else float("nan"),
        "probe_ms": args.probe_ms,
        "elected_p50_s": percentile([k["elected_s"] for k in kills if k["elected_s"] is not None], 50),
        "elected_max_s": max(
            (k["elected_s"] for k in kills if k["elected_s"] is not None), default=float("nan")
        ),
        "all_recovered": len(rec) == len(kills),
    }


async def run(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    describe = cluster.create_topic("bench", queues=QUEUES)
    queues_by_group: dict[int, list[int]] = {}
    for q in describe["queues"]:
        queues_by_group.setdefault(q["group_id"], []).append(q["queue"])
    settle_leaders(cluster, 15)
    load = Load(cluster, queues_by_group, timeout_s=30)
    load.route = args.route
    load.leaders = {g: cluster.wait_leader(str(g)) for g in queues_by_group}
    out: dict[str, Any] = {"queues_by_group": {str(k): v for k, v in queues_by_group.items()}}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        # a short warm-up so that every node has its connections and topic cache
        await asyncio.gather(*(load.post(session, n, q) for n in cluster.nodes for q in range(QUEUES)))
        load.error_codes.clear()
        for phase in args.phases.split(","):
            print(f"  {phase} ...", flush=True)
            pids = {**node_pids(cluster), "loadgen": os.getpid()}
            meter: CpuMeter | None = None
            spies: list[Spy] = []

            async def start_meters(
                delay: float, pids: dict[str, int] = pids, phase: str = phase, spies: list[Spy] = spies
            ) -> CpuMeter:
                await asyncio.sleep(delay)
                if args.profile and phase == "max":
                    spies.extend(profile_nodes(cluster, f"http-{phase}", args.duration))
                return CpuMeter(pids).start()

            terms_before = await asyncio.to_thread(terms, cluster)
            if phase == "max":
                meter_task = asyncio.create_task(start_meters(args.warmup))
                res = await phase_max(load, session, args)
                meter = await meter_task
            elif phase == "latency":
                meter_task = asyncio.create_task(start_meters(args.warmup))
                res = await phase_latency(load, session, args)
                meter = await meter_task
            elif phase == "failover":
                meter = CpuMeter({}).start()  # node processes are replaced: machine-wide figure only
                res = await phase_failover(load, session, args)
            else:
                raise SystemExit(f"unknown phase {phase}")
            res["cpu_cores"] = meter.stop() if meter else {}
            if phase != "failover":
                after = await asyncio.to_thread(terms, cluster)
                res["elections_during_phase"] = {
                    g: after[g] - t for g, t in terms_before.items() if after.get(g, t) != t
                }
            if phase == "failover":
                res["cpu_cores"].pop("other", None)
            nodes_cpu = sum(v for k, v in res["cpu_cores"].items() if k.startswith("n"))
            rate = res.get("msgs_per_s") or (res.get("offered_msgs_per_s") if phase == "latency" else None)
            if rate:
                res["node_cpu_us_per_msg"] = round(nodes_cpu / rate * 1e6, 2)
                res["loadgen_cpu_us_per_msg"] = round(res["cpu_cores"].get("loadgen", 0) / rate * 1e6, 2)
            res["error_codes"] = dict(load.error_codes)
            load.error_codes.clear()
            if spies:
                res["profile"] = await asyncio.to_thread(collect_profiles, spies, THREADS, args.duration, 30)
            out[phase] = res
    return out


def print_report(result: dict[str, Any]) -> None:
    r = result["results"]
    rows = []
    if "max" in r:
        m = r["max"]
        rows.append(
            [
                "max throughput (closed loop)",
                f"{m['producers']} producers",
                m["msgs_per_s"],
                f"p50 {m['p50_ms']:.1f} / p99 {m['p99_ms']:.1f} ms, statuses {m['statuses']}",
                m["cpu_cores"].get("other", "-"),
            ]
        )
    if "latency" in r:
        lat = r["latency"]
        rows.append(
            [
                "latency (open loop)",
                f"{lat['offered_msgs_per_s']:,} msgs/s offered",
                "-",
                f"p50 {lat['p50_ms']:.1f} / p90 {lat['p90_ms']:.1f} / p99 {lat['p99_ms']:.1f} / "
                f"max {lat['max_ms']:.0f} ms, statuses {lat['statuses']}",
                lat["cpu_cores"].get("other", "-"),
            ]
        )
    if "failover" in r:
        f = r["failover"]
        rows.append(
            [
                "failover (kill -9 leader)",
                f"{len(f['kills'])} kills",
                "-",
                f"p50 {f['p50_s']:.2f} s / max {f['max_s']:.2f} s, recovered {f['recovered']}",
                f["cpu_cores"].get("other", "-"),
            ]
        )
    print()
    print(
        f"bench_http  commit {result['commit']}  {result['date']}  nproc {result['machine']['nproc']}  "
        f"durability {result['params']['durability']}  data on {result['params']['data_fs']}"
    )
    print(table(rows, ["phase", "load", "msgs/s", "details", "other load"]))
    print(
        "  The load generator runs on the same machine as the three nodes and competes with them for the "
        "cores.\n  other load: cores used by processes outside the benchmark (nodes + load generator)."
    )
    for phase in ("max", "latency", "failover"):
        if phase in r:
            print(
                f"  {phase}: cpu cores {r[phase]['cpu_cores']}; errors {r[phase].get('error_codes')}; "
                f"term changes {r[phase].get('elections_during_phase', '-')}"
            )
    checks = []
    if "max" in r:
        v = r["max"]["msgs_per_s"]
        checks.append(
            f"max {v:,.0f} msgs/s (target >= {TARGET_MSGS:,}): {'MET' if v >= TARGET_MSGS else 'MISSED'}"
        )
    if "latency" in r:
        v = r["latency"]["p99_ms"]
        checks.append(
            f"p99 at {r['latency']['offered_msgs_per_s']:,} msgs/s {v:.1f} ms (target <= "
            f"{TARGET_P99_MS} ms): {'MET' if v <= TARGET_P99_MS else 'MISSED'}"
        )
    if "failover" in r:
        f = r["failover"]
        ok = f["all_recovered"] and f["max_s"] <= TARGET_FAILOVER_S
        checks.append(
            f"failover p50 {f['p50_s']:.2f} s, max {f['max_s']:.2f} s (target <= "
            f"{TARGET_FAILOVER_S} s): {'MET' if ok else 'MISSED'}"
        )
        for k in f["kills"]:
            rec = "none" if k["recovery_s"] is None else f"{k['recovery_s']:.2f}"
            print(
                f"    kill {k['kill']}: group {k['group']} {k['victim']}->{k['new_leader']} "
                f"elected {k['elected_s'] if k['elected_s'] is None else round(k['elected_s'], 2)} s, "
                f"recovery {rec} s, "
                f"failed after kill {k['failed_requests_after_kill']} {k['failed_statuses']}, "
                f"restart+ready {k.get('restart_ready_s')} s"
            )
    for c in checks:
        print("  " + c)
    prof = r.get("max", {}).get("profile", {})
    for nid, p in prof.items():
        print(f"\n  profile [max {nid}] busy cores {p.get('busy_cores')}; top self:")
        for name, pct in p["self"][:15]:
            print(f"    {pct:5.1f}%  {name}")
        print("  top inclusive:")
        for name, pct in p["inclusive"][:20]:
            print(f"    {pct:5.1f}%  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="max,latency,failover")
    ap.add_argument("--durability", default="fsync", choices=["fsync", "os"])
    ap.add_argument("--producers", type=int, default=48, help="concurrent requests in 'max'")
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument(
        "--route",
        default="spread",
        choices=["spread", "leader"],
        help="send each request to node i mod 3 (spread) or to its queue's leader",
    )
    ap.add_argument("--rate", type=int, default=10_000, help="offered messages/s in 'latency'")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--probe-ms", type=float, default=50.0)
    ap.add_argument("--failover-timeout", type=float, default=15.0)
    ap.add_argument(
        "--failover-load",
        type=float,
        default=0.0,
        help="messages/s in all, round robin over the queues, through the live nodes during 'failover'",
    )
    ap.add_argument("--raft", action="append", default=[], help="[raft] setting KEY=VALUE (experiments)")
    ap.add_argument("--profile", action="store_true", help="py-spy every node during 'max'")
    add_run_arguments(ap, keep="keep the cluster's data and logs")
    args = ap.parse_args()

    base, kind = data_folder(args)
    extra = f'durability = "{args.durability}"'
    if args.raft:
        extra += "\n[raft]\n" + "\n".join(args.raft)
    with (
        recorded_run(
            "http",
            args,
            notes="load generator (1 process, aiohttp) on the same machine as the 3 nodes",
            data_fs=kind,
            report=print_report,
        ) as result,
        three_node_cluster(base, "http-bench-", extra, keep=args.keep) as cluster,
    ):
        result["results"] = asyncio.run(run(args, cluster))


if __name__ == "__main__":
    main()
