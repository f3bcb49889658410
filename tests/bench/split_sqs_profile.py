"""Each node's py-spy profile of ``bench_sqs.py --profile`` split by what its busy samples do, in
µs of CPU per SQS call: the HTTP server (aiohttp parsing and answering), the SQS wire and
actions, auth, the hops between nodes (the caller's client side and the leader's internal
endpoint), the receive lines and read-ahead, Raft (submit on the loop, the tick thread's
pysyncobj work), wake-ups between the two threads, the apply (state machines), RocksDB, the batch
codec, metrics and logging, and the event loop's own work.

A sample counts in the category of its innermost frame that names one (walking from the leaf up),
so a socket write under an aiohttp client request is a hop's, under a web answer the HTTP
server's, and a RocksDB write under an apply RocksDB's. Idle samples and fsync waits are left
out as ``bench_sqs.py`` does (the fsync wait is printed apart, as a share of the busy samples).
The µs per call are each node's CPU in the window (``server_cpu_by_process_s``) divided by all the
SQS calls, split by the sample shares: py-spy slows the run, so the shares matter more than the
µs.

    .venv/bin/python tests/bench/split_sqs_profile.py bench-results/sqs-<commit>-<time>.json [RAW_DIR]

``RAW_DIR`` holds ``profile-sqs-<node>.raw.txt`` (default: the JSON file's folder; a later
profiled run overwrites them, so copy them next to a result you keep).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import IDLE_LEAVES, IO_LEAVES, _frame_name

# (category, substrings of a raw frame "func (package/file.py:line)"); the first category a frame
# matches names it; frames matching none (asyncio's transports, aiohttp's shared writer and
# streams, json) are passed over on the way up.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "wake-ups between threads",
        ("PipeNotifier", "_read_from_self", "_write_to_self", "call_soon_threadsafe"),
    ),
    ("RocksDB writes", ("RocksStore.write (",)),
    ("RocksDB reads and other", ("(storage/rocks.py", "(storage/rocks_cursor.py", "rocksdict")),
    ("batch codec (raftmq.batch)", ("(batch/_",)),
    ("storage (records, queues, keys)", ("(storage/",)),
    ("apply (state machines)", ("(cluster/machines/",)),
    ("auth (SigV4, tokens, rights)", ("(cluster/api/sqs/sigv4.py", "sqs/access.py", "(cluster/api/auth.py")),
    ("SQS wire (JSON/query in, answers out)", ("(cluster/api/sqs/wire.py", "(cluster/api/sqs/routes.py")),
    ("SQS actions (MD5s, ids, messages)", ("(cluster/api/sqs/",)),
    (
        "hop: caller (router, aiohttp client)",
        ("(cluster/node/router.py", "aiohttp/client", "aiohttp/connector"),
    ),
    ("hop: leader's internal endpoint", ("(cluster/api/handlers/internal.py",)),
    (
        "receive lines, read-ahead, settle",
        (
            "(cluster/node/receive_coordinator.py",
            "(cluster/node/read_ahead.py",
            "(cluster/node/delivery_actions.py",
            "(cluster/api/handlers/subscriptions.py",
        ),
    ),
    ("Raft submit and commit (loop)", ("(cluster/node/actions.py", "(cluster/replication/raft.py")),
    ("Raft (tick thread: pysyncobj, replication)", ("pysyncobj/", "(cluster/replication/")),
    ("metrics and middlewares", ("(cluster/api/metrics.py", "(cluster/api/app.py", "prometheus_client")),
    ("logging", ("structlog", "(logging/")),
    ("HTTP server (aiohttp: parse, answer)", ("aiohttp/web", "aiohttp/http_parser", "aiohttp/_http")),
    ("other raftmq code", ("(cluster/",)),
    ("event loop and sockets (asyncio)", ("asyncio/", "selectors.py")),
)


def split(raw: Path) -> tuple[Counter[str], int]:
    """Busy samples per category, and the fsync-wait samples, of one raw py-spy profile."""
    counts: Counter[str] = Counter()
    fsync = 0
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        leaf = _frame_name(frames[-1])
        if any(leaf.startswith(w) or w in leaf for w in IDLE_LEAVES):
            continue
        if leaf.startswith(IO_LEAVES):
            fsync += int(count_s)
            continue
        counts[_category(frames)] += int(count_s)
    return counts, fsync


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other"


def main() -> None:
    result_file = Path(sys.argv[1])
    raw_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else result_file.parent
    result = json.loads(result_file.read_text())
    target = next(r for r in result["runs"] if r["target"] == "raftmq")
    calls = target["calls_per_s"] * target["seconds"]
    names = [name for name, _ in CATEGORIES] + ["other"]
    per_node: dict[str, dict[str, float]] = {}
    for node, cpu_s in sorted(target["server_cpu_by_process_s"].items()):
        raw = raw_dir / f"profile-sqs-{node}.raw.txt"
        if not raw.exists():
            continue
        counts, fsync = split(raw)
        busy = max(1, sum(counts.values()))
        us = 1e6 * cpu_s / max(1, calls)
        per_node[node] = {name: us * counts[name] / busy for name in names}
        print(f"{node}: {us:.0f} µs CPU per SQS call; fsync waits {100 * fsync / busy:.0f} % of busy samples")
    if not per_node:
        sys.exit(f"no profile-sqs-<node>.raw.txt in {raw_dir}")
    nodes = list(per_node)
    print(f"\n{'µs per SQS call':44}" + "".join(f"{n:>8}" for n in nodes) + f"{'sum':>8}{'share':>7}")
    total = sum(sum(v.values()) for v in per_node.values())
    for name in sorted(names, key=lambda n: -sum(per_node[x][n] for x in nodes)):
        row = [per_node[x][name] for x in nodes]
        print(
            f"{name:44}"
            + "".join(f"{v:8.0f}" for v in row)
            + f"{sum(row):8.0f}{100 * sum(row) / total:6.1f}%"
        )


if __name__ == "__main__":
    main()
