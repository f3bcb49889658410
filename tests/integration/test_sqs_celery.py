"""A real Celery worker (kombu's SQS transport) against a real 3-node raftmq cluster's SQS API,
unchanged but for the broker URL: tasks run and are acknowledged (deleted), a failing task is
retried with a countdown until it succeeds, and nothing stays in the queue; with a queue group's
leader killed in the middle of 1,000 tasks, every task runs at least once and none is stuck."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .harness import Cluster, wait_until
from .sqs_clients import sqs_client

HERE = Path(__file__).resolve().parent
TASKS = 1000
RETRIED_EVERY = 40  # job n with n % RETRIED_EVERY == 0 fails its first run: retried with a countdown


def _worker(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sqs_celery_app", "worker", "--loglevel=INFO", *args],
        env=env,
        cwd=str(HERE),
        stdout=(tmp_path / "worker.out").open("wb"),
        stderr=subprocess.STDOUT,
    )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=10)


def _queue_counts(sqs: Any, url: str) -> dict[str, str]:
    counts: dict[str, str] = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return counts


EMPTY = {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
# The sender: every task sent until its send is acknowledged (a send that raised is sent again: at
# least once), the count of acknowledged sends in $SENT after each (replaced whole: the test read
# it empty, between write_text's truncation and its write, in one CI run).
_SENDER = f"""
import os, sys, time
from pathlib import Path
from sqs_celery_app import job
sent = Path(os.environ["SENT"])
failures = 0
for n in range({TASKS}):
    while True:
        try:
            job.apply_async((n, n % {RETRIED_EVERY} == 0), retry=False)
            break
        except Exception as e:
            failures += 1
            print("send", n, "failed:", repr(e)[:300], file=sys.stderr, flush=True)
            time.sleep(0.2)
    Path(f"{{sent}}.new").write_text(str(n + 1))
    os.replace(f"{{sent}}.new", sent)  # whole: a reader never sees it truncated
print("send failures", failures, flush=True)
"""


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


def test_a_celery_worker_runs_every_task_when_a_queue_leader_is_killed(tmp_path: Path) -> None:
    """1,000 tasks (every 40th retried once with a countdown), acks_late, a worker of 8 threads
    against n1; the leader of a queue group holding one of the queue's queues (not n1) is killed
    after 300 sends. Every task runs at least once, each retried one runs again, and the queue ends
    empty: nothing visible, nothing in flight."""
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        log, sent = tmp_path / "runs.log", tmp_path / "sent"
        env = {
            **os.environ,
            "SQS_CELERY_BROKER": f"sqs://any:any@{c.nodes['n1'].http}",
            "SQS_CELERY_LOG": str(log),
            "SQS_CELERY_VISIBILITY_S": "10",  # a delivery whose delete was lost comes back after 10 s
            "SENT": str(sent),
            "PYTHONPATH": str(HERE),
        }
        worker = _worker(tmp_path, env, "--pool=threads", "--concurrency=8")
        sender: subprocess.Popen[str] | None = None
        try:
            # A queue's leader other than n1 (the worker's node); none while leaders are moving.
            victim = wait_until(
                lambda: next(
                    (
                        q["leader"]
                        for q in c.get("/v1/topics/celery-tasks", "n2").json()["queues"]
                        if q["leader"] not in (None, "n1")
                    ),
                    None,
                ),
                60,
                0.5,
                "the worker's queue, led by a node other than n1",
            )
            started = time.monotonic()
            sender = subprocess.Popen(
                [sys.executable, "-c", _SENDER],
                env=env,
                cwd=str(HERE),
                stdout=subprocess.PIPE,
                stderr=(tmp_path / "sender.err").open("w"),
                text=True,
            )
            wait_until(lambda: sent.exists() and int(sent.read_text() or 0) >= 300, 60, 0.1, "300 sends")
            c.kill(victim)
            killed_at = time.monotonic() - started
            sent_at_kill = int(sent.read_text())
            assert sent_at_kill < TASKS  # in the middle of the run: more sends and tasks after it
            out, _ = sender.communicate(timeout=120)
            assert sender.returncode == 0, (tmp_path / "sender.err").read_text()[-3000:]
            wanted = {f"run {n} 0" for n in range(TASKS)}
            wanted |= {f"run {n} 1" for n in range(0, TASKS, RETRIED_EVERY)}
            lines: list[str] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                lines = log.read_text().splitlines() if log.exists() else []
                if wanted <= set(lines):
                    break
                time.sleep(0.5)
            ran_at = time.monotonic() - started
            worker_out = (tmp_path / "worker.out").read_text(errors="replace")
            missing = sorted(wanted - set(lines))
            assert not missing, (len(missing), missing[:20], worker_out[-3000:])
            sqs = sqs_client(c.url("n1"))  # never the victim
            url = sqs.get_queue_url(QueueName="celery-tasks")["QueueUrl"]
            wait_until(lambda: _queue_counts(sqs, url) == EMPTY, 60, 0.5, "the queue empty (none stuck)")
            runs = Counter(lines)
            print(
                f"{TASKS} tasks, {len(range(0, TASKS, RETRIED_EVERY))} retried; {victim} killed at "
                f"{killed_at:.1f} s after {sent_at_kill} sends; all ran by {ran_at:.1f} s; "
                f"{len(lines)} runs, {sum(n - 1 for n in runs.values() if n > 1)} repeated; {out.strip()}"
            )
        finally:
            if sender is not None and sender.poll() is None:
                sender.kill()
            _stop(worker)
