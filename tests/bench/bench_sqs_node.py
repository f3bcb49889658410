"""The CPU the entry node spends per SQS call it answers (issue 24): the request path of
``bench_sqs.py``'s calls (aiohttp, the SQS wire, the action, MD5s and ids, the answer), its
replica's apply and the leader's Raft work, with one client making one call at a time (no
second client competing for the cores), so that a change of a few per cent shows.

3 nodes, 1 queue group (replication 3, ``durability = "fsync"``); one boto3 client in this
process, on the group's leader, runs the receiver's cycle with a sender's call before it:
SendMessageBatch of 10 bodies of ``--value-size`` bytes, ReceiveMessage of 10 (``WaitTimeSeconds``
0), and DeleteMessageBatch of what it got. That is 3 Raft entries per cycle, not 2: the delete
empties the queue, so its read-ahead (docs/sqs.md) takes nothing and the next ReceiveMessage is a
``receive`` entry of its own. Each node's CPU (user + system, /proc) over ``--seconds`` is divided
by the calls made: the entry node's, and the two followers' (their applies and Raft work) apart;
``--rounds`` windows, the median printed. ``--profile``: py-spy on the entry node (or on
``--profile-node``) during one more window, split as ``split_sqs_profile.py`` splits
``bench_sqs.py``'s (``split_sqs_stages.py`` splits its raw file by the stage of a call).

    .venv/bin/python tests/bench/bench_sqs_node.py                        # ~40 s
    PYTHONPATH=/tmp/base .venv/bin/python tests/bench/bench_sqs_node.py   # another tree's code
    .venv/bin/python tests/bench/bench_sqs_node.py --profile --gil
    .venv/bin/python tests/bench/bench_sqs_node.py --waiting   # the receive waits: a send's take-along

``--waiting``: the ReceiveMessage is a long poll (``WaitTimeSeconds`` 2) of a second client, sent
20 ms before the send, as a receiver waiting on the node; a send's take-along (``append.take``,
docs/sqs.md) then serves it in the send's entry. Each window also counts the queue group's entries
per cycle (its commit index at the entry node).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    RESULTS,
    CpuMeter,
    add_run_arguments,
    data_folder,
    node_pids,
    recorded_run,
    require_py_spy,
    start_py_spy,
    table,
)
from split_sqs_profile import split  # noqa: E402

ACTIONS = ("SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch")
WAITING_LEAD_S = 0.02  # --waiting: the long poll is sent this long before the send


def _client(endpoint: str) -> Any:
    import boto3

    return boto3.session.Session().client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="bench", aws_secret_access_key="bench",
    )  # fmt: skip


def cycles(
    sqs: Any, url: str, body: str, seconds: float, waiting: tuple[Any, ThreadPoolExecutor] | None = None
) -> dict[str, list[float]]:
    """Send, receive and delete for ``seconds``; each call's wall time (s) by action (``waiting``:
    a second client's ReceiveMessage long polls from ``WAITING_LEAD_S`` before the send, and its
    time is from the send's answer to its own)."""
    entries = [{"Id": str(i), "MessageBody": body} for i in range(10)]
    times: dict[str, list[float]] = {a: [] for a in ACTIONS}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if waiting is not None:
            receiver, pool = waiting
            polled = pool.submit(
                receiver.receive_message, QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2
            )
            time.sleep(WAITING_LEAD_S)  # (the receive reaches the node and waits there)
        t0 = time.perf_counter()
        sent = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        t1 = time.perf_counter()
        if waiting is not None:
            got = polled.result()
        else:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        t2 = time.perf_counter()
        messages = got.get("Messages", [])
        assert len(sent["Successful"]) == 10, sent
        times["SendMessageBatch"].append(t1 - t0)
        times["ReceiveMessage"].append(t2 - t1)
        if messages:
            handles = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            done = sqs.delete_message_batch(QueueUrl=url, Entries=handles)
            times["DeleteMessageBatch"].append(time.perf_counter() - t2)
            assert not done.get("Failed"), done
    return times


def window(
    sqs: Any,
    url: str,
    body: str,
    pids: dict[str, int],
    entry: str,
    seconds: float,
    commit_index: Callable[[], int],
    waiting: tuple[Any, ThreadPoolExecutor] | None = None,
) -> dict[str, Any]:
    index = commit_index()
    meter = CpuMeter(pids).start()
    times = cycles(sqs, url, body, seconds, waiting)
    cores = meter.stop()
    entries = commit_index() - index
    calls = max(1, sum(len(t) for t in times.values()))
    followers = sum(cores[n] for n in pids if n != entry)
    return {
        "calls": calls,
        "entries_per_cycle": round(entries / max(1, len(times["SendMessageBatch"])), 2),
        "node_cpu_us_per_call": round(1e6 * cores[entry] * seconds / calls, 1),
        "followers_cpu_us_per_call": round(1e6 * followers * seconds / calls, 1),
        "node_cores": cores[entry],
        "cores_by_node": {n: cores[n] for n in pids},
        "other_cores": cores["other"],
        "p50_ms": {a: round(1e3 * statistics.median(t), 2) for a, t in times.items() if t},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="one measured window")
    ap.add_argument("--rounds", type=int, default=3, help="measured windows (the median is printed)")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--profile", action="store_true", help="py-spy a node during one more window")
    ap.add_argument("--profile-rate", type=int, default=200, help="py-spy's samples a second")
    ap.add_argument("--gil", action="store_true", help="py-spy --gil: the thread holding the GIL only")
    ap.add_argument("--profile-node", default="", help="profile this node (n2, n3: a follower)")
    ap.add_argument(
        "--waiting", action="store_true", help="the receive long polls (a second client) before the send"
    )
    add_run_arguments(ap)
    args = ap.parse_args()
    if args.profile:
        require_py_spy(ap)
    from tests.integration.harness import Cluster, wait_until

    base, fs = data_folder(args)
    notes = "3 nodes, 1 queue group; 1 boto3 client on its leader: send 10, receive 10, delete them"
    if args.waiting:
        notes += "; the receive a long poll of a second client, sent 20 ms before the send"
    with recorded_run("sqs_node", args, notes=notes, data_fs=fs, report=report) as result:
        from raftmq.cluster.api.sqs import message_actions

        result["tree"] = str(Path(message_actions.__file__).parents[3])  # the nodes run this code
        folder = Path(tempfile.mkdtemp(prefix="sqs-node-", dir=base))
        cluster = Cluster(folder, nodes=3, queue_groups=1, replication=3, extra_toml='durability = "fsync"')
        try:
            cluster.start()
            cluster.wait_ready(timeout_s=60)
            wait_until(lambda: cluster.leader("0") == "n1", 30, 0.25, "n1 leads group 0 (its balancer)")
            entry = cluster.leader("0")
            assert entry is not None, "no leader of queue group 0"
            result["entry_node"] = entry
            sqs = _client(cluster.url(entry))
            url = sqs.create_queue(QueueName="bench")["QueueUrl"]
            body, pids = "x" * args.value_size, node_pids(cluster)
            waiting = (_client(cluster.url(entry)), ThreadPoolExecutor(1)) if args.waiting else None
            result["waiting"] = args.waiting

            def commit_index() -> int:
                for line in cluster.get("/metrics", entry).text.splitlines():
                    if line.startswith("raftmq_raft_commit_index") and 'group_id="0"' in line:
                        return int(float(line.rsplit(" ", 1)[1]))
                return 0

            cycles(sqs, url, body, args.warmup_s, waiting)
            windows = [
                window(sqs, url, body, pids, entry, args.seconds, commit_index, waiting)
                for _ in range(args.rounds)
            ]
            result["windows"] = windows
            result["node_cpu_us_per_call"] = statistics.median(w["node_cpu_us_per_call"] for w in windows)
            if args.profile:
                who = args.profile_node or entry
                out = RESULTS / f"profile-sqs_node-{'entry' if who == entry else who}.raw.txt"
                spy = start_py_spy(pids[who], args.seconds, out, rate=args.profile_rate, gil=args.gil)
                profiled = result["profiled_window"] = window(
                    sqs, url, body, pids, entry, args.seconds, commit_index, waiting
                )
                if spy is not None:
                    spy.wait(30)
                counts, fsync = split(out)
                busy = max(1, sum(counts.values()))
                us = round(1e6 * profiled["cores_by_node"][who] * args.seconds / profiled["calls"], 1)
                result["profile_us_per_call"] = {k: round(us * n / busy, 1) for k, n in counts.most_common()}
                result["profile_fsync_share"] = round(fsync / busy, 3)
        finally:
            cluster.stop()
            shutil.rmtree(folder, ignore_errors=True)


def _cells(w: dict[str, Any]) -> list[Any]:
    keys = ("calls", "entries_per_cycle", "node_cpu_us_per_call", "followers_cpu_us_per_call", "node_cores")
    return [w[k] for k in keys]


def report(result: dict[str, Any]) -> None:
    print(f"\nbench_sqs_node  commit {result['commit']}  {result['params']['tag']}  tree {result['tree']}")
    rows = [[*_cells(w), *(w["p50_ms"].get(a, "") for a in ACTIONS)] for w in result["windows"]]
    names = ["calls", "entries/cycle", "entry µs/call", "followers µs/call", "entry cores"]
    print(table(rows, names + [f"{a} p50 ms" for a in ACTIONS]))
    print(f"median: {result['node_cpu_us_per_call']} µs of the entry node's CPU per SQS call")
    for name, us in (result.get("profile_us_per_call") or {}).items():
        print(f"  {us:8.1f} µs  {name}")


if __name__ == "__main__":
    main()
