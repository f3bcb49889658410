"""Benchmark of the replicated core WITHOUT HTTP: one queue group, three replicas, three processes.

Each replica is ``tests/bench/core_replica.py`` (RocksStores + QueueGroupMachine + RaftGroup, Raft on
127.0.0.1). The load runs inside the leader's process; this script only orchestrates over pipes.

Workload: produce commands of 100-message batches of 100-byte values (``commands.produce``),
topic 1, spread over 4 queues. Phases, for each durability (fsync, os), on a fresh cluster:

- ``latency``    one 100-message batch per entry, one in flight, N samples: p50/p99 commit latency.
- ``single``     one batch (100 messages) per entry, ``--inflight`` entries in flight (pipelining).
- ``coalesced``  as many batches per entry as the node's GroupCommitter packs into 256 KiB
                 (19 batches = 1,900 messages), ``--coalesced-inflight`` entries in flight (the
                 node's group_commit_inflight default is 2).
- ``groupcommit`` the node's real GroupCommitter (asyncio) fed by ``--producers`` concurrent
                 producers of one 100-message batch each (what HTTP handlers do), max_inflight 2.

Throughput is committed (applied on the leader) messages/s over ``--duration`` s after
``--warmup`` s. Results: a table on stdout and JSON in bench-results/.

    .venv/bin/python tests/bench/bench_core.py                 # ~2.5 min, both durabilities
    .venv/bin/python tests/bench/bench_core.py --durability fsync --phases latency,coalesced
    .venv/bin/python tests/bench/bench_core.py --profile coalesced   # py-spy on leader + follower
    .venv/bin/python tests/bench/bench_core.py --pso appendEntriesUseBatch=true   # experiment
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    PYTHON,
    RESULTS,
    CpuMeter,
    Spy,
    add_run_arguments,
    collect_profiles,
    data_folder,
    free_ports,
    recorded_run,
    start_py_spy,
    table,
)

HERE = Path(__file__).resolve().parent
REPLICA = HERE / "core_replica.py"
COALESCE_BYTES = 256 * 1024
BATCH_SIZE_ESTIMATE = 100 * (100 + 32)  # as in core_replica / api.app
TARGET_MSGS = 100_000
THREADS = {
    "_autoTickThread": "tick",
    "Replica.throughput": "load",
    "Replica.groupcommit": "load",
    "Replica.latency": "load",
}
TARGET_P99_MS = 25.0


class ReplicaProc:
    def __init__(
        self, index: int, ports: list[int], data_dir: Path, args: argparse.Namespace, durability: str
    ):
        cmd = [
            PYTHON,
            str(REPLICA),
            "--index",
            str(index),
            "--ports",
            ",".join(map(str, ports)),
            "--dir",
            str(data_dir),
            "--durability",
            durability,
            "--heartbeat-ms",
            str(args.heartbeat_ms),
            "--tick-ms",
            str(args.tick_ms),
        ]
        for p in args.pso:
            cmd += ["--pso", p]
        self.index = index
        self.log_path = data_dir / f"replica{index}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self._next(30)
        self.pid = int(hello["pid"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"replica {self.index}: no answer in {timeout}s") from None
        if not line:
            raise RuntimeError(f"replica {self.index} exited; see {self.log_path}")
        result: dict[str, Any] = orjson.loads(line)
        return result

    def request(self, timeout: float = 30, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(req) + b"\n")
        self.proc.stdin.flush()
        answer = self._next(timeout)
        if not answer.get("ok"):
            raise RuntimeError(f"replica {self.index}: {answer.get('error')}")
        return answer

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.request(timeout=10, op="quit")
                self.proc.wait(10)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def meter_window(pids: dict[str, int], delay: float, duration: float, out: dict[str, Any]) -> None:
    time.sleep(delay)
    meter = CpuMeter(pids).start()
    time.sleep(duration)
    out.update(meter.stop())


def wait_leader(replicas: list[ReplicaProc], timeout: float = 30) -> ReplicaProc:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = [r.request(op="status") for r in replicas]
        leaders = [r for r, s in zip(replicas, statuses, strict=True) if s["is_leader"]]
        if len(leaders) == 1:
            s = statuses[replicas.index(leaders[0])]
            agreed = all(st["leader"] == s["leader"] for st in statuses)
            if agreed and s["applied_index"] >= 1 and s["commit_index"] >= 1:
                return leaders[0]
        time.sleep(0.2)
    raise TimeoutError("no leader elected")


def run_durability(durability: str, args: argparse.Namespace, base_dir: Path) -> dict[str, Any]:
    print(f"durability={durability}", flush=True)
    data_dir = Path(tempfile.mkdtemp(prefix=f"core-{durability}-", dir=base_dir))
    ports = free_ports(3)
    replicas = [ReplicaProc(i, ports, data_dir, args, durability) for i in range(3)]
    out: dict[str, Any] = {"durability": durability, "phases": {}}
    try:
        leader = wait_leader(replicas)
        time.sleep(1.0)  # let connections and the first heartbeats settle
        followers = [r for r in replicas if r is not leader]
        out["leader_index"] = leader.index
        phases = args.phases.split(",")
        coalesced_batches = max(1, COALESCE_BYTES // BATCH_SIZE_ESTIMATE)
        for phase in phases:
            profiling = args.profile == phase
            spies: list[Spy] = []
            if profiling:
                # py-spy attaches after the warm-up and samples for the measured duration.
                def spy_later(spies: list[Spy] = spies, phase: str = phase) -> None:
                    time.sleep(args.warmup)
                    for role, r in (("leader", leader), ("follower", followers[0])):
                        path = RESULTS / f"profile-core-{durability}-{phase}-{role}.raw.txt"
                        spies.append((role, path, start_py_spy(r.pid, args.duration, path)))

                threading.Thread(target=spy_later, daemon=True).start()
            pids = {f"r{r.index}{'(leader)' if r is leader else ''}": r.pid for r in replicas}
            pids["orchestrator"] = os.getpid()
            cpu: dict[str, Any] = {}
            if phase != "latency":
                threading.Thread(
                    target=meter_window, args=(pids, args.warmup, args.duration, cpu), daemon=True
                ).start()
            else:
                meter = CpuMeter(pids).start()
            timeout = args.warmup + args.duration + 60
            print(f"  [{durability}] {phase} ...", flush=True)
            if phase == "latency":
                res = leader.request(
                    timeout=timeout + args.latency_samples,
                    op="latency",
                    samples=args.latency_samples,
                    batches=1,
                )
            elif phase == "single":
                res = leader.request(
                    timeout=timeout,
                    op="throughput",
                    inflight=args.inflight,
                    batches=1,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                )
            elif phase == "coalesced":
                res = leader.request(
                    timeout=timeout,
                    op="throughput",
                    inflight=args.coalesced_inflight,
                    batches=coalesced_batches,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                )
            elif phase == "groupcommit":
                res = leader.request(
                    timeout=timeout,
                    op="groupcommit",
                    producers=args.producers,
                    max_inflight=args.coalesced_inflight,
                    max_entry_bytes=COALESCE_BYTES,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                )
            else:
                raise SystemExit(f"unknown phase {phase}")
            res.pop("ok", None)
            if phase == "latency":
                cpu.update(meter.stop())
            for _ in range(50):
                if cpu:
                    break
                time.sleep(0.1)
            res["cpu_cores"] = cpu
            ours = sum(v for k, v in cpu.items() if k.startswith("r"))
            if res.get("msgs_per_s"):
                res["cpu_us_per_msg"] = round(ours / res["msgs_per_s"] * 1e6, 2)
            if profiling:
                res["profile"] = collect_profiles(spies, THREADS, args.duration, 30)
            out["phases"][phase] = res
        out["final_status"] = [r.request(op="status") for r in replicas]
    finally:
        for r in replicas:
            r.stop()
        if args.keep:
            print(f"  data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return out


def print_report(result: dict[str, Any]) -> None:
    rows = []
    for d in result["runs"]:
        ph = d["phases"]
        lat = ph.get("latency")
        if lat:
            rows.append(
                [
                    d["durability"],
                    "latency (1 batch, 1 in flight)",
                    "-",
                    f"p50 {lat['p50_ms']:.2f} / p99 {lat['p99_ms']:.2f} / max {lat['max_ms']:.2f} ms",
                    sum(lat["errors"].values()),
                    "-",
                    lat.get("cpu_cores", {}).get("other", "-"),
                ]
            )
        for name in ("single", "coalesced"):
            r = ph.get(name)
            if r:
                rows.append(
                    [
                        d["durability"],
                        f"{name}: {r['batches_per_entry']} batch/entry, {r['inflight']} in flight",
                        r["msgs_per_s"],
                        f"{r['entries_per_s']:.0f} entries/s, {r['entry_bytes'] // 1024} KiB/entry, "
                        f"entry p50 {r['entry_p50_ms']:.1f} p99 {r['entry_p99_ms']:.1f} ms",
                        sum(r["errors"].values()),
                        r.get("cpu_us_per_msg", "-"),
                        r.get("cpu_cores", {}).get("other", "-"),
                    ]
                )
        g = ph.get("groupcommit")
        if g:
            rows.append(
                [
                    d["durability"],
                    f"groupcommit: {g['producers']} producers, inflight {g['max_inflight']}",
                    g["msgs_per_s"],
                    f"{g['entries_per_s']:.0f} entries/s, {g['avg_batches_per_entry']:.1f} batch/entry, "
                    f"request p50 {g['request_p50_ms']:.1f} p99 {g['request_p99_ms']:.1f} ms",
                    g["errors"],
                    g.get("cpu_us_per_msg", "-"),
                    g.get("cpu_cores", {}).get("other", "-"),
                ]
            )
    print()
    print(
        f"bench_core  commit {result['commit']}  {result['date']}  nproc {result['machine']['nproc']}  "
        f"data on {result['params']['data_fs']}"
    )
    print(table(rows, ["durability", "phase", "msgs/s", "details", "errors", "CPU us/msg", "other load"]))
    print("  CPU us/msg: CPU time of the 3 replica processes per committed message (robust to other load)")
    print(
        "  other load: CPU cores used by processes outside this benchmark during the phase "
        f"(the machine has {result['machine']['nproc']}); high values make the figures pessimistic"
    )
    by = {d["durability"]: d["phases"] for d in result["runs"]}
    checks = []
    if "fsync" in by:
        best = max(
            (by["fsync"].get(p, {}).get("msgs_per_s", 0) for p in ("coalesced", "groupcommit", "single")),
            default=0,
        )
        checks.append(
            f"fsync throughput {best:,.0f} msgs/s (target >= {TARGET_MSGS:,}): "
            f"{'MET' if best >= TARGET_MSGS else 'MISSED'}"
        )
        if "latency" in by["fsync"]:
            p99 = by["fsync"]["latency"]["p99_ms"]
            checks.append(
                f"fsync p99 single batch {p99:.2f} ms (target <= {TARGET_P99_MS} ms): "
                f"{'MET' if p99 <= TARGET_P99_MS else 'MISSED'}"
            )
    if "fsync" in by and "os" in by:
        for p in ("single", "coalesced", "groupcommit"):
            if p in by["fsync"] and p in by["os"] and by["os"][p]["msgs_per_s"]:
                f, o = by["fsync"][p]["msgs_per_s"], by["os"][p]["msgs_per_s"]
                checks.append(
                    f"fsync vs os, {p}: {f:,.0f} vs {o:,.0f} msgs/s (fsync costs {100 * (o - f) / o:.0f}%)"
                )
        if "latency" in by["fsync"] and "latency" in by["os"]:
            checks.append(
                f"fsync vs os, latency p50: {by['fsync']['latency']['p50_ms']:.2f} vs "
                f"{by['os']['latency']['p50_ms']:.2f} ms"
            )
    for c in checks:
        print("  " + c)
    for d in result["runs"]:
        for phase, r in d["phases"].items():
            for role, prof in r.get("profile", {}).items():
                print(
                    f"\n  profile [{d['durability']} {phase} {role}] busy cores {prof.get('busy_cores')}; "
                    f"top self:"
                )
                for name, pct in prof["self"][:12]:
                    print(f"    {pct:5.1f}%  {name}")
                print("  top inclusive:")
                for name, pct in prof["inclusive"][:15]:
                    print(f"    {pct:5.1f}%  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--durability", default="fsync,os", help="fsync, os or both (comma-separated)")
    ap.add_argument("--phases", default="latency,single,coalesced,groupcommit")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per throughput phase")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--latency-samples", type=int, default=200)
    ap.add_argument("--inflight", type=int, default=8, help="entries in flight in the 'single' phase")
    ap.add_argument(
        "--coalesced-inflight",
        type=int,
        default=2,
        help="entries in flight in 'coalesced'/'groupcommit' (node default group_commit_inflight=2)",
    )
    ap.add_argument("--producers", type=int, default=64, help="concurrent producers in 'groupcommit'")
    ap.add_argument("--heartbeat-ms", type=float, default=50)
    ap.add_argument("--tick-ms", type=float, default=50)
    ap.add_argument("--pso", action="append", default=[], help="SyncObjConf override KEY=VALUE (experiments)")
    ap.add_argument("--profile", default="", help="phase to profile with py-spy (leader and one follower)")
    add_run_arguments(ap, keep="keep the replicas' data and logs")
    args = ap.parse_args()

    base_dir, kind = data_folder(args)
    with recorded_run(
        "core",
        args,
        notes="3 replica processes + the load generator (inside the leader process) share the cores",
        data_fs=kind,
        report=print_report,
    ) as result:
        result["runs"] = [run_durability(d, args, base_dir) for d in args.durability.split(",")]


if __name__ == "__main__":
    main()
