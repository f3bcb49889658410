"""Structured Streaming: a driver killed mid-batch and restarted writes every committed message
exactly once to a Parquet sink (offset ranges in the checkpoint + replay + Spark's file sink)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, wait_until

from .conftest import require_spark

require_spark()

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[2]
TOML = """
[segments]
max_messages = 400
check_ms = 200
"""


def driver(
    c: Cluster, topic: str, out: Path, ckpt: Path, mode: str, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    brokers = ",".join(c.url(n) for n in c.nodes)
    args = [brokers, topic, str(out), str(ckpt), mode, "300", *extra]
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.stream_driver", *args],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the JVM is its child: killed together below
        )


def batches(ckpt: Path, kind: str) -> set[int]:
    d = ckpt / kind
    return {int(n) for n in os.listdir(d) if n.isdigit()} if d.exists() else set()


def kill_mid_batch(proc: subprocess.Popen[bytes], ckpt: Path, after: int) -> tuple[list[int], list[int]]:
    """Wait for a batch committed after batch ``after``, then kill the driver while a later one is
    planned but not done; the checkpoint's offsets and commits (batch ids) after the kill."""
    try:
        wait_until(lambda: max(batches(ckpt, "commits") or {-1}) > after, 120, 0.05, what="a batch committed")
        wait_until(
            lambda: max(batches(ckpt, "offsets")) > max(batches(ckpt, "commits") or {-1}),
            60,
            0.01,
            what="a batch in flight",
        )
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return sorted(batches(ckpt, "offsets")), sorted(batches(ckpt, "commits"))


def test_driver_killed_mid_batch_and_restarted_writes_each_committed_message_once(tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    with Cluster(tmp_path / "cluster", nodes=1, extra_toml=TOML) as c:
        c.start()
        c.wait_ready()
        c.create_topic("sp-stream", queues=3)
        produced: list[int] = []

        def produce(rounds: int) -> None:
            for i in range(rounds):
                msgs = [{"value": f"m{i}-{j}", "queue": j % 3} for j in range(150)]
                assert c.produce("sp-stream", msgs).status_code == 200
                produced.append(len(msgs))
                time.sleep(0.05)

        produce(10)
        out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "driver.log"
        background = threading.Thread(target=produce, args=(30,))
        background.start()
        # Wait for a finished batch, then kill while a later one is planned but not done. On a
        # busy machine that batch may finish between the look at the checkpoint and the kill:
        # then the driver is restarted from its checkpoint and killed again (each run is one
        # more restart for the exactly-once check below), until one kill is mid-batch.
        for _ in range(3):
            committed = max(batches(ckpt, "commits") or {-1})
            running = driver(c, "sp-stream", out, ckpt, "continuous", log)
            killed_at = kill_mid_batch(running, ckpt, after=committed)
            if killed_at[0][-1] > (killed_at[1] or [-1])[-1]:
                break
        background.join()
        assert killed_at[0][-1] > (killed_at[1] or [-1])[-1], killed_at  # killed mid-batch
        # Restart from the checkpoint and drain everything committed now.
        dump = tmp_path / "sink.jsonl"
        second = driver(c, "sp-stream", out, ckpt, "available-now", log, str(dump))
        assert second.wait(300) == 0, log.read_text()[-5000:]
        expected = sorted((q, m["offset"], m["value"]) for q in range(3) for m in c.fetch_all("sp-stream", q))
        assert len(expected) == sum(produced) == 40 * 150
        rows = sorted(tuple(json.loads(line)) for line in dump.read_text().splitlines())
        assert rows == expected  # spark.read.parquet(sink): every committed message, once
