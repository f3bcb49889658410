"""Elections under our own load: leader changes while a 3-node cluster is saturated (issue 23).

A leader change that no fault caused (no kill, no partition) means a follower's election timer
ran out while the leader was busy with payload work: its heartbeats starved. This benchmark offers
as much as the cluster takes for ``--minutes`` (default 10) and counts, per queue group:

- ``leader_changes``: the increase of ``raftmq_raft_became_leader_total`` summed over the group's
  replicas (an election someone won), from each node's ``/metrics``;
- ``term_increase``: the increase of the group's highest ``raftmq_raft_term`` (every election
  started, won or not);

and reports them with elections per hour, beside what the load achieved (messages acknowledged
and consumed a second). The target: 0 leader changes in 10 minutes of saturating produce and
consume.

Load: ``--producers`` processes, each a sync ``Producer`` with default settings sending
``--value-size`` byte values (half keyed, half not) as fast as its buffer takes them, and one
consumer group of ``--consumers`` processes consuming from offset 0 and acking (the group's
offsets are committed by the consumers as they go). Metrics are read every ``--sample-s``.

    .venv/bin/python tests/bench/bench_elections.py                        # 10 minutes
    .venv/bin/python tests/bench/bench_elections.py --minutes 2 --value-size 1024

Group ids are the ``group_id`` labels as the nodes write them (``meta`` and the queue groups'
numbers). The leaders are left to settle on their preferred nodes before the first sample (the
balancer moves them in a cluster's first seconds: those moves are not the load's). ``--keep``
keeps the cluster's folder (node logs, data) to find out which replica timed out and why.

Run it under the heavy lock on a shared machine (``flock /tmp/raftmq-heavy.lock ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    PYTHON,
    CpuMeter,
    add_quiet_argument,
    quiet_header,
    settle_leaders,
    table,
    write_result,
)

from tests.integration.harness import Cluster  # noqa: E402

BENCH = "elections"
TOPIC = "load"
GROUP = "elections"
_SAMPLE = re.compile(r"^(raftmq_raft_became_leader_total|raftmq_raft_term)\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# -- the load processes ----------------------------------------------------------------------------


def producer_main(args: argparse.Namespace) -> None:
    """Send as fast as the buffer takes values until the deadline; print the outcome as JSON."""
    from raftmq.client import Producer

    outcome = {"acked": 0, "failed": 0}

    def done(_meta: Any, error: Exception | None) -> None:
        outcome["failed" if error is not None else "acked"] += 1

    producer = Producer(args.urls.split(","))
    value = os.urandom(args.value_size // 2).hex().encode()[: args.value_size]
    deadline = time.monotonic() + args.seconds
    i = 0
    while time.monotonic() < deadline:
        for _ in range(1000):
            key = f"k{i % 997}" if i % 2 else None
            producer.send(TOPIC, value, key=key, callback=done)
            i += 1
    producer.flush(60)
    producer.close(10)
    print(json.dumps({"sent": i, **outcome}), flush=True)


def consumer_main(args: argparse.Namespace) -> None:
    """Consume and ack until the deadline; print the count as JSON."""
    from raftmq.client import Consumer

    consumer = Consumer(args.urls.split(","), group=GROUP, topics=TOPIC, reset="earliest")
    count = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        for m in consumer.poll(timeout_ms=100, max_messages=10_000):
            m.ack()
            count += 1
    consumer.close()
    print(json.dumps({"consumed": count}), flush=True)


# -- the parent ------------------------------------------------------------------------------------


def raft_counters(url: str) -> dict[str, dict[str, float]]:
    """This node's ``became_leader`` and ``term`` per group, from its ``/metrics``."""
    return parse_counters(requests.get(f"{url}/metrics", timeout=10).text)


def parse_counters(text: str) -> dict[str, dict[str, float]]:
    """``became_leader`` and ``term`` per group id (``meta``, ``0``, ...) of a ``/metrics`` text."""
    out: dict[str, dict[str, float]] = {"became_leader": {}, "term": {}}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        name = "became_leader" if m.group(1).endswith("_total") else "term"
        out[name][labels["group_id"]] = float(m.group(3))
    return out


def sample(c: Cluster) -> dict[str, dict[str, dict[str, float]]]:
    """Every reachable node's counters (a node that does not answer is left out)."""
    out = {}
    for nid in c.nodes:
        try:
            out[nid] = raft_counters(c.url(nid))
        except requests.RequestException:
            continue
    return out


def changes(first: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per group: leader changes (summed over replicas) and the increase of its highest term."""
    per_group: dict[str, dict[str, float]] = defaultdict(
        lambda: {"leader_changes": 0.0, "term_increase": 0.0}
    )
    for nid, counters in last.items():
        before = first.get(nid, {"became_leader": {}, "term": {}})
        for g, n in counters["became_leader"].items():
            per_group[g]["leader_changes"] += n - before["became_leader"].get(g, 0.0)
    groups = {g for c in [*first.values(), *last.values()] for g in c["term"]}
    for g in groups:
        t0 = max((c["term"].get(g, 0.0) for c in first.values()), default=0.0)
        t1 = max((c["term"].get(g, 0.0) for c in last.values()), default=0.0)
        per_group[g]["term_increase"] = t1 - t0
    return dict(sorted(per_group.items()))


def spawn(role: str, urls: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [PYTHON, __file__, "--role", role, "--urls", urls, "--seconds", str(args.minutes * 60),
           "--value-size", str(args.value_size)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def last_json(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=180)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}, no result"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["parent", "produce", "consume"], default="parent")
    ap.add_argument("--urls", default="")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--queues", type=int, default=6)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the cluster's folder (node logs)")
    add_quiet_argument(ap)
    args = ap.parse_args()
    if args.role == "produce":
        return producer_main(args)
    if args.role == "consume":
        return consumer_main(args)

    params = {k: getattr(args, k) for k in ("minutes", "producers", "consumers", "queues", "value_size")}
    result = quiet_header(BENCH, params, args.wait_quiet)
    tmp = tempfile.mkdtemp(prefix="bench-elections-")
    with Cluster(Path(tmp), nodes=3) as c:
        c.start()
        c.wait_ready(timeout_s=60)
        c.create_topic(TOPIC, queues=args.queues)
        settle_leaders(c)
        urls = ",".join(c.url(nid) for nid in c.nodes)
        first = sample(c)
        pids = {nid: n.proc.pid for nid, n in c.nodes.items() if n.proc is not None}
        meter = CpuMeter(pids).start()
        started = time.monotonic()
        procs = [spawn("produce", urls, args) for _ in range(args.producers)]
        procs += [spawn("consume", urls, args) for _ in range(args.consumers)]
        timeline = []
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(min(args.sample_s, max(0.0, args.minutes * 60 - (time.monotonic() - started))))
            now = sample(c)
            per_group = changes(first, now)
            elapsed = round(time.monotonic() - started, 1)
            total = sum(g["leader_changes"] for g in per_group.values())
            timeline.append({"s": elapsed, "leader_changes": total, "per_group": per_group})
            print(f"{elapsed:7.1f} s  leader changes so far: {total:.0f}", flush=True)
        outcomes = [last_json(p) for p in procs]
        seconds = time.monotonic() - started
        cpu = meter.stop()
        per_group = changes(first, sample(c))
    if args.keep:
        print(f"cluster folder (node logs) kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    acked = sum(o.get("acked", 0) for o in outcomes[: args.producers])
    failed = sum(o.get("failed", 0) for o in outcomes[: args.producers])
    consumed = sum(o.get("consumed", 0) for o in outcomes[args.producers :])
    leader_changes = sum(g["leader_changes"] for g in per_group.values())
    result.update(
        seconds=round(seconds, 1),
        acked=acked,
        failed=failed,
        acked_per_s=round(acked / seconds),
        consumed_per_s=round(consumed / seconds),
        leader_changes=leader_changes,
        elections_per_hour=round(leader_changes * 3600 / seconds, 2),
        term_increase=sum(g["term_increase"] for g in per_group.values()),
        per_group=per_group,
        node_cpu=cpu,
        timeline=timeline,
        outcomes=outcomes,
    )
    rows = [[g, f["leader_changes"], f["term_increase"]] for g, f in per_group.items()]
    print(table(rows, ["group", "leader changes", "term increase"]))
    print(f"acknowledged {acked:,} ({result['acked_per_s']:,}/s, {failed:,} failed), "
          f"consumed {consumed:,} ({result['consumed_per_s']:,}/s) in {seconds:.0f} s; "
          f"leader changes {leader_changes:.0f} ({result['elections_per_hour']}/hour); "
          f"target 0: {'met' if leader_changes == 0 else 'MISSED'}")  # fmt: skip
    print(f"wrote {write_result(BENCH, result)}")


if __name__ == "__main__":
    main()
