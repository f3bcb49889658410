"""Idle cost benchmark: CPU per node of a 3-node cluster doing nothing, against the number of queues
and of consumer groups and subscriptions (issue 25; figures in docs/benchmarks.md).

For each ``--queues`` figure (topics of ``--queues-per-topic`` queues), a fresh cluster
(tests/integration/harness.Cluster: 3 nodes, 3 queue groups, replication 3) gets its topics (in
bulk, 1,000 a request, as ``raftmq topic create`` with many names; ``--create one``: one request
each, ``--workers`` at a time, as before bulk creation), then
``--groups`` consumer groups commit an offset on one queue each and ``--subscriptions``
subscriptions receive once (both on the first topics, at most one per topic). After ``--settle``
seconds each node's CPU (utime + stime from /proc, every thread) is measured over ``--seconds`` of
idleness, and the machine's other load beside it ("other": the run's figures are only as good as
the quiet it had).

    .venv/bin/python tests/bench/bench_idle.py                                    # 0, 4k, 12k, 20k
    .venv/bin/python tests/bench/bench_idle.py --queues 12000 --groups 1000 --subscriptions 1000
    .venv/bin/python tests/bench/bench_idle.py --queues 12000 --profile n1        # py-spy, 20 s

Run it under the heavy lock on a shared machine (``flock /tmp/raftmq-heavy.lock ...``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    CpuMeter,
    cpu_seconds,
    header,
    start_py_spy,
    summarize_raw_profile,
    table,
    write_result,
)

from tests.integration.harness import Cluster  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _post(url: str, body: Any, ok: tuple[int, ...] = (200, 201)) -> requests.Response:
    for attempt in range(30):  # a leader change answers 421/503: try again
        r = requests.post(url, json=body, timeout=120)
        if r.status_code in ok or r.status_code not in (421, 503, 504):
            return r
        time.sleep(0.2 * (attempt + 1))
    return r


def create_topics(c: Cluster, names: list[str], queues: int, workers: int) -> float:
    """Create ``names``, ``workers`` requests at a time (as ``raftmq topic create`` does with
    several names); returns the seconds taken."""
    url = c.url("n1")
    started = time.monotonic()

    def one(name: str) -> None:
        r = _post(f"{url}/v1/topics", {"name": name, "queues": queues}, ok=(201, 409))
        assert r.status_code in (201, 409), r.text[:500]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, names))
    return time.monotonic() - started


BULK_CHUNK = 1000  # topics per request (limits.max_topics_per_request's default)


def create_in_bulk(c: Cluster, names: list[str], queues: int) -> float:
    """Create ``names`` with ``POST /v1/topics {"topics": [...]}``, ``BULK_CHUNK`` a request;
    returns the seconds taken."""
    url = c.url("n1")
    started = time.monotonic()
    for i in range(0, len(names), BULK_CHUNK):
        specs = [{"name": name, "queues": queues} for name in names[i : i + BULK_CHUNK]]
        r = _post(f"{url}/v1/topics", {"topics": specs})
        assert r.status_code == 200, r.text[:500]
        failed = [x for x in r.json()["results"] if "topic" not in x]
        assert all(x["error"]["code"] == "topic_exists" for x in failed), failed[:3]
    return time.monotonic() - started


def make_groups(c: Cluster, topics: list[str], groups: int, subscriptions: int, workers: int) -> float:
    """``groups`` offset commits (group ``g<i>`` on topic i's queue 0) and ``subscriptions``
    receives (group ``s<i>`` on topic i); returns the seconds taken."""
    url = c.url("n1")
    started = time.monotonic()

    def commit(i: int) -> None:
        topic = topics[i % len(topics)]
        r = requests.put(
            f"{url}/v1/groups/g{i}/offsets", json={"topic": topic, "offsets": {"0": 0}}, timeout=60
        )
        assert r.status_code == 200, r.text[:300]

    def receive(i: int) -> None:
        topic = topics[i % len(topics)]
        r = _post(f"{url}/v1/topics/{topic}/subscriptions/s{i}/receive", {"max": 1, "wait_ms": 0})
        assert r.status_code == 200, r.text[:300]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(commit, range(groups)))
        list(pool.map(receive, range(subscriptions)))
    return time.monotonic() - started


def run_one(tmp: Path, queues: int, args: argparse.Namespace, profile_dir: Path | None) -> dict[str, Any]:
    per_topic = args.queues_per_topic
    names = [f"t{i:05d}" for i in range(queues // per_topic)]
    with Cluster(tmp, nodes=3) as c:
        c.start()
        c.wait_ready(timeout_s=60)
        if args.create == "bulk":
            create_s = create_in_bulk(c, names, per_topic)
        else:
            create_s = create_topics(c, names, per_topic, args.workers)
        groups, subs = (
            (min(args.groups, len(names)), min(args.subscriptions, len(names))) if names else (0, 0)
        )
        groups_s = make_groups(c, names, groups, subs, args.workers) if names else 0.0
        time.sleep(args.settle)
        pids = {nid: n.proc.pid for nid, n in c.nodes.items() if n.proc is not None}
        spy = None
        if profile_dir is not None and args.profile in pids:
            out = profile_dir / f"idle-{queues}-{args.profile}.txt"
            spy = (out, start_py_spy(pids[args.profile], args.seconds, out, rate=100))
        meter = CpuMeter(pids).start()
        cpu0, t0 = {nid: cpu_seconds(pid) for nid, pid in pids.items()}, time.monotonic()
        time.sleep(args.seconds)
        used = {nid: cpu_seconds(pid) - cpu0[nid] for nid, pid in pids.items()}
        wall = time.monotonic() - t0
        cpu = meter.stop()
        profile: dict[str, Any] | None = None
        if spy is not None and spy[1] is not None:
            spy[1].wait(60)
            profile = summarize_raw_profile(spy[0], top=25, seconds=args.seconds, rate=100)
        rss = {nid: rss_mb(pid) for nid, pid in pids.items()}
    per_node = {nid: round(100 * used[nid] / wall, 2) for nid in pids}
    return {
        "queues": queues,
        "topics": len(names),
        "groups": groups,
        "subscriptions": subs,
        "create_seconds": round(create_s, 1),
        "groups_seconds": round(groups_s, 1),
        "cpu_percent_per_node": per_node,
        "cpu_percent_max": max(per_node.values()),
        "other_cores": cpu["other"],
        "rss_mb": {k: round(v) for k, v in rss.items()},
        "profile": profile,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", default="0,4000,12000,20000", help="queue counts, comma-separated")
    parser.add_argument("--queues-per-topic", type=int, default=4)
    parser.add_argument("--groups", type=int, default=1000, help="consumer groups (offset commits)")
    parser.add_argument("--subscriptions", type=int, default=1000, help="subscriptions (one receive each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time measured")
    parser.add_argument("--settle", type=float, default=12.0, help="idle time before measuring")
    parser.add_argument(
        "--create", choices=("bulk", "one"), default="bulk", help="topics in bulk or one by one"
    )
    parser.add_argument("--workers", type=int, default=8, help="connections creating topics one by one")
    parser.add_argument("--profile", default="", help="py-spy this node (e.g. n1) while measuring")
    args = parser.parse_args()
    result = header("idle", vars(args))
    result["runs"] = []
    rows = []
    for queues in [int(q) for q in args.queues.split(",")]:
        with tempfile.TemporaryDirectory(prefix="raftmq-idle-") as tmp:
            profile_dir = Path(tmp) / "profiles" if args.profile else None
            if profile_dir is not None:
                profile_dir.mkdir()
            run = run_one(Path(tmp), queues, args, profile_dir)
        result["runs"].append(run)
        if run["profile"]:
            for name, share in run["profile"].get("inclusive", [])[:25]:
                print(f"  {share:5.1f}%  {name}")
        n = run["cpu_percent_per_node"]
        rows.append(
            [
                run["queues"],
                run["topics"],
                run["groups"],
                run["subscriptions"],
                run["create_seconds"],
                n.get("n1", float("nan")),
                n.get("n2", float("nan")),
                n.get("n3", float("nan")),
                run["other_cores"],
                max(run["rss_mb"].values()),
            ]
        )
        print(table(rows[-1:], HEADERS), flush=True)
    print(table(rows, HEADERS))
    print(f"written to {write_result('idle', result)}")


HEADERS = [
    "queues",
    "topics",
    "groups",
    "subs",
    "create s",
    "n1 CPU %",
    "n2 CPU %",
    "n3 CPU %",
    "other cores",
    "RSS MB",
]

if __name__ == "__main__":
    main()
