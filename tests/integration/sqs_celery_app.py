"""The Celery app of tests/integration/test_sqs_celery.py: a real worker runs these tasks through
raftmq's SQS API (kombu's SQS transport). Each run appends a line to the file named by
$SQS_CELERY_LOG; the broker URL is $SQS_CELERY_BROKER, the queue's visibility timeout
$SQS_CELERY_VISIBILITY_S (default 30)."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("sqs_celery_app", broker=os.environ.get("SQS_CELERY_BROKER", "sqs://any:any@127.0.0.1:1"))
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": int(os.environ.get("SQS_CELERY_VISIBILITY_S", "30")),
        "wait_time_seconds": 2,
        "polling_interval": 0.2,
        "queue_name_prefix": "celery-",
    },
    task_default_queue="tasks",
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


def _record(line: str) -> None:
    # One write to a file opened for appending: whole lines from the threads of a threads pool.
    fd = os.open(os.environ["SQS_CELERY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task
def add(x: int, y: int) -> int:
    _record(f"add {x} {y}")
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self, key: str) -> str:  # type: ignore[no-untyped-def]
    """Fails on its first two runs, then succeeds: retried by Celery with a countdown."""
    _record(f"flaky {key} {self.request.retries}")
    if self.request.retries < 2:
        raise self.retry(countdown=1)
    return key


@app.task(bind=True, max_retries=5)
def job(self, n: int, fail_first: bool) -> int:  # type: ignore[no-untyped-def]
    """Records ``run n <retries>``; with ``fail_first`` its first run fails and Celery retries it
    with a countdown (a new message, sent from the worker)."""
    _record(f"run {n} {self.request.retries}")
    if fail_first and self.request.retries == 0:
        raise self.retry(countdown=1)
    return n
