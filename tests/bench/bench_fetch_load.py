"""Does a node keep answering while large JSON fetches run? ``/healthz`` latency on one node while
``--fetchers`` concurrent fetches of ``--fetch-mib`` MiB each run over and over.

One ``raftmq serve`` node (1 queue group, replication 1) from tests/integration/harness.Cluster;
the load generator is this process (aiohttp) ON THE SAME MACHINE. A topic with one queue is
filled with ``--fetch-mib`` MiB of ``--message-kib`` KiB text messages; then:

- ``idle``  ``/healthz`` every ``--probe-ms`` ms for ``--idle-s`` s, nothing else running (the anchor);
- ``load``  the same probe while ``--fetchers`` tasks each fetch the whole queue
            (``max_bytes`` = ``--fetch-mib`` MiB) in a loop, for ``--duration`` s.

It prints p50/p99/max of the probe's latency per phase and the fetches' figures, and writes JSON
to bench-results/. ``--tree DIR`` runs the node from another checkout (DIR holds ``raftmq/`` with
that tree's packages; it goes first on the node's PYTHONPATH): the same load on an older commit.

    .venv/bin/python tests/bench/bench_fetch_load.py                 # ~1.5 min
    .venv/bin/python tests/bench/bench_fetch_load.py --tree /tmp/old/pkg --tag "old 63fc050"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import add_run_arguments, data_folder, percentile, recorded_run, table  # noqa: E402

from tests.integration.harness import Cluster  # noqa: E402

TOPIC = "big"
MIB = 1024 * 1024


def fill(cluster: Cluster, fetch_mib: int, message_kib: int) -> int:
    """Produce ``fetch_mib`` MiB of ``message_kib`` KiB messages to queue 0; returns their count."""
    cluster.create_topic(TOPIC, queues=1)
    count = fetch_mib * 1024 // message_kib
    per_request = max(1, (3 * MIB) // (message_kib * 1024))
    value = "v" * (message_kib * 1024 - 16)
    sent = 0
    while sent < count:
        n = min(per_request, count - sent)
        msgs = [{"value": f"{sent + i:015d}{value}", "queue": 0} for i in range(n)]
        r = cluster.produce(TOPIC, msgs)
        assert r.status_code == 200, r.text
        sent += n
    return count


def probe(url: str, every_s: float, seconds: float) -> list[float]:
    """``GET /healthz`` every ``every_s`` for ``seconds``, in a process of its own (so that the
    fetchers' reading in this one does not delay it); each answer's latency in ms."""
    code = (
        "import http.client, json, sys, time\n"
        "host, port = sys.argv[1].split(':')\n"
        "c = http.client.HTTPConnection(host, int(port), timeout=60)\n"
        "out, end = [], time.monotonic() + float(sys.argv[3])\n"
        "while time.monotonic() < end:\n"
        "    t0 = time.perf_counter()\n"
        "    c.request('GET', '/healthz')\n"
        "    r = c.getresponse(); r.read(); assert r.status == 200\n"
        "    out.append((time.perf_counter() - t0) * 1000)\n"
        "    time.sleep(float(sys.argv[2]))\n"
        "print(json.dumps(out))\n"
    )
    address = url.split("://", 1)[1]
    done = subprocess.run(
        [sys.executable, "-c", code, address, str(every_s), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    latencies: list[float] = json.loads(done.stdout)
    return latencies


async def fetcher(
    session: aiohttp.ClientSession, url: str, fetch_mib: int, expect: int, stop: asyncio.Event
) -> tuple[int, int, list[float]]:
    """Fetch the whole queue until ``stop``: (fetches, bytes received, seconds per fetch)."""
    path = f"{url}/v1/topics/{TOPIC}/queues/0/messages"
    params = {"offset": "0", "max": "10000", "max_bytes": str(fetch_mib * MIB)}
    fetches, received, seconds = 0, 0, []
    while not stop.is_set():
        t0 = time.perf_counter()
        async with session.get(path, params=params) as r:
            body = await r.read()
            assert r.status == 200, body[:200]
        seconds.append(time.perf_counter() - t0)
        got = body.count(b'"offset":')
        assert got == expect, f"a fetch returned {got} messages, expected {expect}"
        fetches, received = fetches + 1, received + len(body)
    return fetches, received, seconds


async def measure(url: str, args: argparse.Namespace, expect: int) -> dict[str, Any]:
    every_s = args.probe_ms / 1000
    idle = await asyncio.to_thread(probe, url, every_s, args.idle_s)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        stop = asyncio.Event()
        fetch_tasks = [
            asyncio.create_task(fetcher(session, url, args.fetch_mib, expect, stop))
            for _ in range(args.fetchers)
        ]
        await asyncio.sleep(1.0)  # every fetcher has a fetch under way
        loaded = await asyncio.to_thread(probe, url, every_s, args.duration)
        stop.set()
        fetched = await asyncio.gather(*fetch_tasks)
    seconds = [s for _, _, ss in fetched for s in ss]
    return {
        "healthz_idle_ms": summary(idle),
        "healthz_load_ms": summary(loaded),
        "fetches": sum(f for f, _, _ in fetched),
        "fetched_mib": round(sum(b for _, b, _ in fetched) / MIB, 1),
        "fetch_s_p50": round(percentile(seconds, 50), 3),
        "fetch_s_max": round(max(seconds, default=float("nan")), 3),
    }


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(max(ms, default=float("nan")), 2),
        "over_100ms": sum(1 for v in ms if v >= 100),
    }


def report(result: dict[str, Any]) -> None:
    r = result["figures"]
    rows = [
        [phase, s["n"], s["p50"], s["p99"], s["max"], s["over_100ms"]]
        for phase, s in (("idle", r["healthz_idle_ms"]), ("load", r["healthz_load_ms"]))
    ]
    print(table(rows, ["healthz", "probes", "p50 ms", "p99 ms", "max ms", ">= 100 ms"]))
    print(
        f"\nfetches under load: {r['fetches']} ({r['fetched_mib']} MiB), "
        f"p50 {r['fetch_s_p50']} s, max {r['fetch_s_max']} s per fetch"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fetchers", type=int, default=4)
    ap.add_argument("--fetch-mib", type=int, default=64)
    ap.add_argument("--message-kib", type=int, default=256)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of the load phase")
    ap.add_argument("--idle-s", type=float, default=5.0, help="seconds of the idle phase")
    ap.add_argument("--probe-ms", type=float, default=20.0)
    ap.add_argument("--tree", default="", help="run the node from this package dir (an older commit)")
    add_run_arguments(ap)
    args = ap.parse_args()
    base, kind = data_folder(args)
    notes = f"node from {args.tree or 'this checkout'}; load generator on the same machine"
    with recorded_run("fetch_load", args, notes=notes, data_fs=kind, report=report) as result:
        tmp = Path(tempfile.mkdtemp(prefix="fetchload-", dir=base))
        cluster = Cluster(tmp, nodes=1, queue_groups=1, replication=1)
        try:
            cluster.start(env={"PYTHONPATH": args.tree} if args.tree else None)
            cluster.wait_ready(timeout_s=60)
            print("filling...", flush=True)
            count = fill(cluster, args.fetch_mib, args.message_kib)
            url = cluster.url("n1")
            result["figures"] = asyncio.run(measure(url, args, count))
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
