"""``raftmq produce`` memory: the CLI process's peak resident memory by input size.

A real 3-node cluster (tests/integration/harness.Cluster: 3 queue groups, replication 3) gets
``seq 1 N | raftmq produce bench`` (one small unkeyed message per line, a 4-queue topic) for each
``--lines`` N, each run a fresh CLI process. For each run: the CLI's peak RSS (``ru_maxrss`` of
that process, from ``wait4``), its time and rate, its summary line (stderr), and the messages the
cluster stored (the topic's high offsets, which must grow by N) and how they spread over the
queues. The input streams: the peak must not grow with N (issue 15: 1.27 GB for 1,000,000 lines
before the producer's buffer counted the futures of its messages).

    .venv/bin/python tests/bench/bench_cli_produce.py                       # 1, 300,000, 3,000,000
    .venv/bin/python tests/bench/bench_cli_produce.py --lines 1000 --lines 300000
"""

from __future__ import annotations

import argparse
import os
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

from tests.integration.harness import Cluster  # noqa: E402


def high_offsets(cluster: Cluster, topic: str) -> list[int]:
    r = cluster.get(f"/v1/topics/{topic}")
    r.raise_for_status()
    return [q["high_offset"] for q in r.json()["queues"]]


def produce_run(cluster: Cluster, topic: str, lines: int) -> dict[str, Any]:
    """``seq 1 lines | raftmq produce topic --json``: its peak RSS, time, summary and what was stored."""
    before = high_offsets(cluster, topic)
    urls = ",".join(n.url for n in cluster.nodes.values())
    env = {**os.environ, "RAFTMQ_URL": urls}
    seq = subprocess.Popen(["seq", "1", str(lines)], stdout=subprocess.PIPE)
    started = time.monotonic()
    cli = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "produce", topic, "--json"],
        stdin=seq.stdout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert seq.stdout is not None and cli.stderr is not None
    seq.stdout.close()  # the CLI holds the pipe now
    stderr = cli.stderr.read().decode()
    _, status, usage = os.wait4(cli.pid, 0)
    cli.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    seq.wait()
    if cli.returncode != 0:
        raise SystemExit(f"raftmq produce failed ({cli.returncode}): {stderr}")
    after = high_offsets(cluster, topic)
    added = [a - b for a, b in zip(after, before, strict=True)]
    return {
        "lines": lines,
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
        "seconds": round(seconds, 2),
        "messages_per_s": round(lines / seconds),
        "stored": sum(added),
        "per_queue": added,
        "max_queue_share": round(max(added) / max(1, sum(added)), 4),
        "summary": stderr.strip().splitlines()[-1] if stderr.strip() else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, action="append", help="input sizes (repeat; default 1, 300k, 3M)")
    args = ap.parse_args()
    sizes = args.lines or [1, 300_000, 3_000_000]
    result = header("cli_produce", {"lines": sizes, "queues": 4})
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cli-produce-") as tmp:
        cluster = Cluster(Path(tmp), nodes=3, queue_groups=3, replication=3)
        try:
            cluster.start()
            cluster.wait_ready(timeout_s=60)
            r = cluster.post("/v1/topics", json={"name": "bench", "queues": 4})
            r.raise_for_status()
            for lines in sizes:
                run = produce_run(cluster, "bench", lines)
                print(f"  {lines:>10,} lines: peak {run['peak_rss_mb']} MB, {run['seconds']} s", flush=True)
                if run["stored"] != lines:
                    raise SystemExit(f"{lines} lines but {run['stored']} messages stored")
                runs.append(run)
        finally:
            cluster.stop()
    result["runs"] = runs
    print(
        table(
            [
                [
                    r["lines"],
                    r["peak_rss_mb"],
                    r["seconds"],
                    r["messages_per_s"],
                    r["stored"],
                    r["max_queue_share"],
                ]
                for r in runs
            ],
            ["lines", "peak RSS (MB)", "s", "messages/s", "stored", "max queue share"],
        )
    )
    print(f"wrote {write_result('cli_produce', result)}")


if __name__ == "__main__":
    main()
