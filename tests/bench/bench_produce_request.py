"""One produce request's CPU at the node that takes it (issue 23): the binary path the ``Producer``
uses (``POST /v1/topics/{topic}/messages``, ``application/vnd.raftmq.batch``, one frame of one
100 B keyed message, an idempotent producer id and sequence), closed loop at low concurrency,
against a real 3-node cluster (3 queue groups, replication 3, ``durability = "fsync"``).

Two entries, one after the other on the same cluster:

- ``leader``  every request to the leader of the queue's group (the Producer's normal case);
- ``hop``     every request to a node that does not lead it, which forwards it to the leader.

For each, the CPU per request of every node by kind of thread (``loop``: the asyncio thread that
runs the HTTP request; ``tick``: the Raft threads), user and system apart, from
``/proc/<pid>/task/*/stat``, and the client's round trip. ``--profile``: then the ``leader`` entry
again under py-spy (``--gil``, idle samples left out) on the leader, its loop thread's GIL time per
request split by what it was doing (:data:`PARTS`: the middlewares, the handler's parsing and
checks, the proposal hand-over, the answer, aiohttp itself): each part's share of the loop's
samples times the loop's CPU per request measured without the profiler, in µs per request (py-spy
pauses the process to sample it, so sampled times run long). Prints tables and writes JSON to
bench-results/.

    .venv/bin/python tests/bench/bench_produce_request.py --requests 3000 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    IDLE_LEAVES,
    RESULTS,
    add_run_arguments,
    data_folder,
    node_pids,
    percentile,
    recorded_run,
    settle_leaders,
    start_py_spy,
    table,
    thread_cpu,
    thread_cpu_delta,
    thread_kinds,
    three_node_cluster,
)

from raftmq.batch import BATCH_MEDIA_TYPE, BatchBuilder, frame_prefix  # noqa: E402

# What the leader's loop thread was doing, by the innermost frame of a sample that matches (frame
# substrings, first part whose needle is found walking from the leaf to the root).
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("proposal: wake the tick thread (PipeNotifier.notify)", ("PipeNotifier.notify",)),
    ("proposal: committer and submit", ("GroupCommitter", "group_commit.py", "RaftGroup.submit")),
    (
        "outcome back from the tick thread (LoopCalls, self-pipe)",
        ("LoopCalls", "_read_from_self", "set_if_pending", "_process_self_data"),
    ),
    ("handler: split and check the batch", ("split_frames", "_validate.py", "_small.py", "_frames.py")),
    ("handler: topic lookup", ("ApiCore.topic (",)),
    ("handler: batch limits", ("_batch_limits",)),
    ("routing to the leader's action", ("group_call", "LeaderActions", "reads_here", "serves_reads")),
    ("handler: the answer (JSON, Response)", ("json_response", "ProduceHandlers._answer")),
    ("handler: its own lines", ("ProduceHandlers", "ProduceHandlers.produce")),
    ("auth middleware", ("api/auth.py:", "config/keys.py:", "config/tokens.py:")),
    ("metrics middleware", ("metrics_middleware", "prometheus_client/")),
    ("error middleware", ("error_middleware (",)),
    ("on_response_prepare (metadata index header)", ("metadata_index (app.py)",)),
    ("aiohttp: answer written", ("finish_response", "StreamResponse.prepare", "write_eof", "web_response")),
    ("aiohttp: request read and parsed", ("data_received", "feed_data", "HttpRequestParser", "Request.read")),
    ("aiohttp: request dispatch (router, middleware chain)", ("_handle (aiohttp", "resolve (aiohttp")),
    ("aiohttp: connection handler", ("_handle_request", "RequestHandler.start", "web_protocol")),
]
# Work on the loop that no request asked for (the reconciler, the delivery ticks, the sealer...):
# a sample under one of these frames, below no part above, is counted apart.
BACKGROUND = ("Reconciler.", "TickLoops.", "Sealer.", "Coordinator.", "Compactor.", "LagHistory")
BACKGROUND_PART = "background work (not per request)"
ASYNCIO = "asyncio: the loop itself (run_once, handles, selector, transports)"
OTHER = "other on the loop"


def frame_body(producer_id: str, sequence: int, value: bytes, key: str) -> bytes:
    """One frame (queue 0) of one keyed message, as the Producer sends it."""
    b = BatchBuilder(producer_id, sequence, timestamps=False)
    b.append(value, key)
    return frame_prefix(0) + b.finish()


async def closed_loop(
    url: str, topic: str, requests: int, concurrency: int, value: bytes, until: float = float("inf")
) -> list[float]:
    """``requests`` produce requests to ``url`` (fewer if ``perf_counter()`` reaches ``until``),
    ``concurrency`` at a time, each sender with its own producer id; the round trip of each (s).
    Raises on any answer that is not a 200."""
    import aiohttp

    latencies: list[float] = []
    per_sender = requests // concurrency
    target = f"{url}/v1/topics/{topic}/messages"
    headers = {"Content-Type": BATCH_MEDIA_TYPE}

    async def sender(session: aiohttp.ClientSession) -> None:
        producer_id = f"bench-{uuid.uuid4().hex}"
        for seq in range(per_sender):
            if time.perf_counter() >= until:
                return
            body = frame_body(producer_id, seq, value, f"k{seq % 97}")
            t0 = time.perf_counter()
            async with session.post(target, data=body, headers=headers) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"produce answered {r.status}: {raw[:300]!r}")
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    return latencies


def measure(cluster: Any, entry: str, url: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    value = b"v" * args.value_size
    asyncio.run(closed_loop(url, topic, args.warmup, args.concurrency, value))
    pids = node_pids(cluster)
    kinds = {k: thread_kinds(p) for k, p in pids.items()}
    before = {k: thread_cpu(p) for k, p in pids.items()}
    t0 = time.perf_counter()
    latencies = asyncio.run(closed_loop(url, topic, args.requests, args.concurrency, value))
    wall = time.perf_counter() - t0
    n = len(latencies)
    cpu = {k: thread_cpu_delta(before[k], thread_cpu(p), kinds[k]) for k, p in pids.items()}
    per_request = {
        node: {
            kind: {part: round(s / n * 1e6, 1) for part, s in parts.items()}
            for kind, parts in sorted(by_kind.items())
            if sum(parts.values()) > 0
        }
        for node, by_kind in cpu.items()
    }
    ms = [x * 1000 for x in latencies]
    return {
        "entry": entry,
        "requests": n,
        "requests_per_s": round(n / wall, 1),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "cpu_us_per_request": per_request,
    }


def profile_leader(
    cluster: Any, leader: str, url: str, topic: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The ``leader`` entry again under py-spy ``--gil`` on the leader; its loop thread's samples
    counted by :data:`PARTS` (their shares; :func:`scale_profile` turns them into µs)."""
    pid = node_pids(cluster)[leader]
    out = RESULTS / f"profile-produce_request-{leader}.raw.txt"
    value = b"v" * args.value_size
    seconds = args.profile_s
    spy = start_py_spy(pid, seconds, out, rate=args.profile_rate, gil=True)
    if spy is None:
        return {}
    time.sleep(1.0)  # py-spy attached
    t0 = time.perf_counter()

    done = len(asyncio.run(closed_loop(url, topic, 10**9, args.concurrency, value, until=t0 + seconds - 2.0)))
    spy.wait(seconds + 30)
    parts = split_loop_samples(out)
    background = parts.pop(BACKGROUND_PART, 0)
    loop_total = sum(parts.values())
    return {
        "requests": done,
        "rate_hz": args.profile_rate,
        "loop_samples": loop_total,
        "background_samples": background,  # left out of the shares: no request asked for it
        "share": {part: round(count / max(loop_total, 1), 4) for part, count in parts.most_common()},
        "raw": out.name,
    }


def scale_profile(result: dict[str, Any]) -> None:
    """Each part's µs per request: its share of the profiled loop's samples times the leader's
    loop CPU per request measured without the profiler (the ``leader`` entry, user + system)."""
    prof, rows = result.get("profile"), [r for r in result["rows"] if r["entry"] == "leader"]
    if not prof or not rows:
        return
    loop = rows[0]["cpu_us_per_request"].get(result["leader"], {}).get("loop")
    if loop is None:
        return
    total = loop["user"] + loop["system"]
    prof["loop_us_per_request"] = round(total, 1)
    prof["us_per_request"] = {part: round(share * total, 1) for part, share in prof["share"].items()}


def split_loop_samples(path: Path) -> Counter[str]:
    """Busy samples of the node's asyncio thread (stacks without a ``threading`` bootstrap) by part."""
    parts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        if not frames or any("_bootstrap (threading.py" in f for f in frames):
            continue  # a tick thread, an executor, RocksDB's
        leaf = frames[-1]
        if any(w in leaf for w in IDLE_LEAVES) or "select (" in leaf or "poll (" in leaf:
            continue
        parts[_part(frames)] += int(count_s)
    return parts


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in PARTS:
            if any(n in frame for n in needles):
                return name
    if any(b in f for f in frames for b in BACKGROUND):
        return BACKGROUND_PART
    return ASYNCIO if "asyncio/" in frames[-1] or "selectors.py" in frames[-1] else OTHER


def report(result: dict[str, Any]) -> None:
    for row in result["rows"]:
        print(
            f"\n{row['entry']}: {row['requests']:,} requests, {row['requests_per_s']:,.0f}/s,"
            f" round trip p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms"
        )
        rows = []
        for node, by_kind in row["cpu_us_per_request"].items():
            for kind, c in by_kind.items():
                rows.append([node, kind, c["user"], c["system"], c["user"] + c["system"]])
        print(table(rows, ["node", "thread", "user µs/req", "system µs/req", "µs/req"]))
    prof = result.get("profile")
    if prof and "us_per_request" in prof:
        print(
            f"\nthe leader's loop thread by part: share of its GIL samples (py-spy --gil, "
            f"{prof['requests']:,} requests) times its CPU per request unprofiled "
            f"({prof['loop_us_per_request']} µs)"
        )
        shares = prof["share"]
        rows = [[part, f"{100 * shares[part]:.1f}%", us] for part, us in prof["us_per_request"].items()]
        print(table(rows, ["part", "share", "µs/req"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="timed requests per entry")
    ap.add_argument("--warmup", type=int, default=300, help="requests first, not timed")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--entries", nargs="+", choices=["leader", "hop"], default=["leader", "hop"])
    ap.add_argument("--profile", action="store_true", help="then the leader entry under py-spy --gil")
    ap.add_argument("--profile-s", type=float, default=15.0)
    ap.add_argument("--profile-rate", type=int, default=500)
    add_run_arguments(ap, keep="keep the cluster's data and logs")
    args = ap.parse_args()
    base, fs = data_folder(args)
    notes = "CPU per produce request at each node, binary path, closed loop; µs per request"
    with (
        recorded_run("produce_request", args, notes=notes, data_fs=fs, report=report) as result,
        three_node_cluster(base, "prodreq-", 'durability = "fsync"', keep=args.keep) as cluster,
    ):
        settle_leaders(cluster)
        topic = "prodreq"
        r = cluster.post("/v1/topics", {"name": topic, "queues": 3})
        assert r.status_code == 201, r.text
        leader = cluster.get(f"/v1/topics/{topic}").json()["queues"][0]["leader"]
        other = next(nid for nid in cluster.nodes if nid != leader)
        result["leader"], result["hop_from"] = leader, other
        urls = {"leader": cluster.nodes[leader].url, "hop": cluster.nodes[other].url}
        result["rows"] = [measure(cluster, e, urls[e], topic, args) for e in args.entries]
        if args.profile:
            result["profile"] = profile_leader(cluster, leader, urls["leader"], topic, args)
            scale_profile(result)


if __name__ == "__main__":
    main()
