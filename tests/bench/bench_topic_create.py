"""Topic creation: ``--topics`` topics one by one against the same number in bulk (issue 25;
figures in docs/benchmarks.md, "Creating topics in bulk").

One fresh 3-node cluster (tests/integration/harness.Cluster: 3 queue groups, replication 3). Three
steps, each creating ``--topics`` new topics of ``--queues`` queues through n1, timed, with the
metadata group's entries they took:

- ``one by one``: a ``POST /v1/topics`` per topic, ``--workers`` at a time (what ``raftmq topic
  create`` with many names did before bulk creation, and still does during a rolling upgrade);
- ``bulk``: ``POST /v1/topics {"topics": [...]}``, 1,000 a request (one metadata entry each;
  ``bench_idle.create_in_bulk``);
- ``cli``: ``raftmq topic create --from-file`` (bulk, process start included).

The later steps run next to the earlier steps' topics (2x and 3x ``--topics`` in all): if anything,
against the bulk steps.

    .venv/bin/python tests/bench/bench_topic_create.py                 # 3,000 topics of 4 queues

Run it under the heavy lock on a shared machine (``flock /tmp/raftmq-heavy.lock ...``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import header, table, write_result  # noqa: E402
from bench_idle import create_in_bulk, create_topics  # noqa: E402

from tests.integration.harness import Cluster  # noqa: E402


def meta_entries(c: Cluster) -> int:
    return int(c.status(c.wait_leader("meta"))["groups"]["meta"]["commit_index"])


def create_with_cli(c: Cluster, names: list[str], queues: int, tmp: Path) -> float:
    listed = tmp / "names.txt"
    listed.write_text("".join(f"{n}\n" for n in names))
    started = time.monotonic()
    command = [sys.executable, "-m", "raftmq.cluster.cli.main", "topic", "create", "--from-file", str(listed)]
    r = subprocess.run(
        [*command, "--queues", str(queues), "--url", c.url("n1")], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--queues", type=int, default=4, help="queues per topic")
    parser.add_argument("--workers", type=int, default=8, help="requests at once, one by one")
    args = parser.parse_args()
    result = header("topic_create", vars(args))
    steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="raftmq-create-") as tmp, Cluster(Path(tmp), nodes=3) as c:
        c.start()
        c.wait_ready(timeout_s=60)
        c.wait_leader("meta")
        for step in ("one by one", "bulk", "cli"):
            names = [f"{step.replace(' ', '')}-{i:05d}" for i in range(args.topics)]
            entries = meta_entries(c)
            if step == "one by one":
                seconds = create_topics(c, names, args.queues, args.workers)
            elif step == "bulk":
                seconds = create_in_bulk(c, names, args.queues)
            else:
                seconds = create_with_cli(c, names, args.queues, Path(tmp))
            steps.append(
                {
                    "step": step,
                    "topics": args.topics,
                    "seconds": round(seconds, 2),
                    "topics_per_second": round(args.topics / seconds),
                    "metadata_entries": meta_entries(c) - entries,
                }
            )
            print(f"{step}: {seconds:.2f} s", flush=True)
        listed = len(c.get("/v1/topics", "n2").json()["topics"])
        assert listed == 3 * args.topics, listed
    result["steps"] = steps
    headers = ["step", "topics", "seconds", "topics/s", "metadata entries"]
    print(
        table(
            [
                [s["step"], s["topics"], s["seconds"], s["topics_per_second"], s["metadata_entries"]]
                for s in steps
            ],
            headers,
        )
    )
    print(f"written to {write_result('topic_create', result)}")


if __name__ == "__main__":
    main()
