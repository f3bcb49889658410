"""A real Celery worker (kombu's SQS transport) against a real 3-node raftmq cluster's SQS API,
unchanged but for the broker URL: tasks run and are acknowledged (deleted), a failing task is
retried with a countdown until it succeeds, and nothing stays in the queue."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .harness import Cluster
from .sqs_clients import sqs_client

HERE = Path(__file__).resolve().parent


def test_a_celery_worker_runs_acknowledges_and_retries_tasks(cluster: Cluster, tmp_path: Path) -> None:
    host = cluster.nodes["n1"].http
    log = tmp_path / "runs.log"
    env = {
        **os.environ,
        "SQS_CELERY_BROKER": f"sqs://any:any@{host}",
        "SQS_CELERY_LOG": str(log),
        "PYTHONPATH": str(HERE),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sqs_celery_app", "worker", "--pool=solo", "--loglevel=INFO"],
        env=env,
        cwd=str(HERE),
        stdout=(tmp_path / "worker.out").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        sender = subprocess.run(
            [
                sys.executable,
                "-c",
                "from sqs_celery_app import add, flaky\n"
                "for i in range(20): add.delay(i, 1)\n"
                "flaky.delay('k1')\n",
            ],
            env=env,
            cwd=str(HERE),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sender.returncode == 0, sender.stderr
        wanted = {f"add {i} 1" for i in range(20)} | {"flaky k1 0", "flaky k1 1", "flaky k1 2"}
        deadline = time.monotonic() + 90
        lines: list[str] = []
        while time.monotonic() < deadline:
            lines = log.read_text().splitlines() if log.exists() else []
            if wanted <= set(lines):
                break
            time.sleep(0.5)
        out = (tmp_path / "worker.out").read_text(errors="replace")
        assert wanted <= set(lines), (sorted(wanted - set(lines)), out[-3000:])
        assert "succeeded" in out and "Retry in 1s" in out
        sqs = sqs_client(cluster.url("n2"))
        url = sqs.get_queue_url(QueueName="celery-tasks")["QueueUrl"]
        for _ in range(40):  # every task acknowledged: nothing visible or in flight
            counts = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
            if counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}:
                break
            time.sleep(0.5)
        assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
        assert sorted(lines).count("add 3 1") == 1  # acknowledged: not run again
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
