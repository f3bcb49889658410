"""A node's py-spy profile (``bench_sqs_node.py --profile --gil``: the entry node's, or a
follower's with ``--profile-node``) split by the stage of an SQS call its busy samples are in, in
µs of CPU per call (the second argument: that node's CPU per call, from the same run's unprofiled
window, since py-spy's sampling inflates the profiled window's): what ``bench_sqs_floor.py``'s floors
also spend (aiohttp and the loop), raftmq's middlewares, the SQS wire, auth, the actions, the
leader actions and committers (``group_call``), the receive coordinator, the store's reads on the
loop, the Raft submit, the wake-ups between the threads, and the Raft tick thread (its applies,
its journal, and the rest: pysyncobj's transport).

A tick thread's sample (under ``_autoTickThread``) goes to the first of its stages it names; a
loop sample to the stage of its innermost frame that names one (walking from the leaf up), as
``split_sqs_profile.py`` does, so a RocksDB read under a receive's answer is a store read, and a
frame of aiohttp under none of ours is the floor's. Idle samples and fsync waits are left out.
It also prints the tick thread's share of the busy samples (with ``--gil``: of the GIL's time).

    .venv/bin/python tests/bench/split_sqs_stages.py bench-results/profile-sqs_node-entry.raw.txt 1133
    .venv/bin/python tests/bench/split_sqs_stages.py bench-results/profile-sqs_node-n2.raw.txt 436
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import IDLE_LEAVES, IO_LEAVES, _frame_name

FLOOR = "aiohttp and the loop (what the floors spend)"
TICK: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tick thread: applies (state machines, their RocksDB)", ("(cluster/machines/",)),
    ("tick thread: journal", ("(cluster/replication/journal.py",)),
    ("wake-ups between threads", ("PipeNotifier", "call_soon_threadsafe", "(cluster/base/loop_calls.py")),
    ("tick thread: Raft transport and the rest (pysyncobj)", ("",)),
)
COMMITTERS = (
    "(cluster/node/router.py",
    "(cluster/node/actions.py",
    "(cluster/node/delivery_actions.py",
    "(cluster/api/handlers/subscription",
    "(cluster/replication/group_commit.py",
    "(cluster/replication/settle_commit.py",
)
MIDDLEWARES = (
    "middleware (cluster/",
    "(cluster/api/connections.py",
    "(cluster/api/metrics.py",
    "prometheus_client",
)
LOOP: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("wake-ups between threads", ("_read_from_self", "_write_to_self", "(cluster/base/loop_calls.py")),
    ("Raft submit (loop)", ("Node.propose", "(cluster/replication/raft.py", "pysyncobj/")),
    ("store reads on the loop", ("(storage/", "(batch/", "rocksdict", "(cluster/machines/")),
    (
        "receive coordinator, read-ahead",
        ("(cluster/node/receive_coordinator.py", "(cluster/node/read_ahead.py"),
    ),
    ("group_call, leader actions, committers", COMMITTERS),
    ("raftmq middlewares", MIDDLEWARES),
    ("auth (SigV4, rights)", ("(cluster/api/sqs/sigv4.py", "(cluster/api/sqs/access.py")),
    ("SQS wire (body read, JSON, answer)", ("(cluster/api/sqs/wire.py", "(cluster/api/sqs/routes.py")),
    ("SQS actions (MD5s, ids, checks)", ("(cluster/api/sqs/",)),
    ("other raftmq", ("(cluster/api", "(cluster/node", "(cluster/base", "(cluster/config")),
)
PASSED_OVER = ("_Counted.data_received",)  # the listener's wrapper around aiohttp's parser: aiohttp's


def stage_of(frames: list[str]) -> str:
    """The stage of one busy sample's stack (root first)."""
    if any("_autoTickThread" in f for f in frames):
        return next(name for name, subs in TICK if any(s in f for f in frames for s in subs))
    for f in reversed(frames):
        if any(p in f for p in PASSED_OVER):
            continue
        for name, subs in LOOP:
            if any(s in f for s in subs):
                return name
    return FLOOR


def split(raw: Path) -> tuple[Counter[str], int, int]:
    """Busy samples per stage, all busy samples, and the tick thread's, of one raw py-spy profile."""
    counts: Counter[str] = Counter()
    tick = 0
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f]
        if not count_s.isdigit() or not frames:
            continue
        leaf = _frame_name(frames[-1])
        if any(leaf.startswith(w) or w in leaf for w in IDLE_LEAVES) or any(
            leaf.startswith(w) for w in IO_LEAVES
        ):
            continue
        counts[stage_of(frames)] += int(count_s)
        tick += int(count_s) if any("_autoTickThread" in f for f in frames) else 0
    return counts, sum(counts.values()), tick


def main() -> None:
    raw, us_per_call = Path(sys.argv[1]), float(sys.argv[2])
    counts, busy, tick = split(raw)
    print(f"{busy} busy samples, {100 * tick / busy:.1f} % in the Raft tick thread")
    print(f"µs per call as shares of {us_per_call:g}")
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / busy:.1f} % | {us_per_call * n / busy:.0f} |")


if __name__ == "__main__":
    main()
