"""The Celery app of tests/integration/test_sqs_celery.py: a real worker runs these tasks through
raftmq's SQS API (kombu's SQS transport). Each run appends a line to the file named by
$SQS_CELERY_LOG; the broker URL is $SQS_CELERY_BROKER."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

app = Celery("sqs_celery_app", broker=os.environ.get("SQS_CELERY_BROKER", "sqs://any:any@127.0.0.1:1"))
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": 30,
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
    with Path(os.environ["SQS_CELERY_LOG"]).open("a") as f:
        f.write(line + "\n")


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
