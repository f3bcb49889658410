"""The records of the SQS message move tasks (``move_tasks.py``; docs/sqs.md, "Moving dead letters
back"): what a task is, how its records are kept and what ListMessageMoveTasks shows of them.

The records of a queue's tasks live in its topic attribute ``sqs.MessageMoveTasks``, a JSON list,
newest first, of at most :data:`KEEP` records: the metadata group replicates them with the queue, so
every node lists the same tasks and a node's restart loses none. They are changed only by a
compare-and-set (``set_topic_attributes`` with ``expect``), so a cancel on one node and the progress
the running node writes never overwrite each other.

A task runs on the node that started it (its ``owner``), which writes its progress and a heartbeat
at least every :data:`PROGRESS_MS`. Invariant: a task is active (RUNNING or CANCELLING) only while
its owner runs it: a record whose heartbeat is older than the lease (the cluster's
``sqs.move_task_lease_ms``, which callers pass), or that its owner no longer runs (the node
restarted), is shown and kept as FAILED (a CANCELLING one as CANCELLED), and no longer counts as the
source's one active task. No clock is read here: callers pass ``now_ms``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from raftmq.cluster.api.sqs.queues import PREFIX, QUEUE_NAME, read_json
from raftmq.cluster.machines.metadata import MAX_ATTRIBUTE_VALUE_BYTES

__all__ = [
    "ACTIVE",
    "ATTRIBUTE",
    "KEEP",
    "NODE_STOPPED",
    "PROGRESS_MS",
    "MoveTask",
    "dump",
    "effective",
    "entry",
    "handle",
    "load",
    "parse_handle",
]

ATTRIBUTE = PREFIX + "MessageMoveTasks"
KEEP = 10  # records per queue, newest first (ListMessageMoveTasks shows up to 10, as AWS)
PROGRESS_MS = 1_000  # the running node writes progress and its heartbeat at least this often
ACTIVE = ("RUNNING", "CANCELLING")
NODE_STOPPED = "the node running the task stopped; start a new task to move what is left"
_STATUSES = frozenset({*ACTIVE, "COMPLETED", "CANCELLED", "FAILED"})
_TASK_ID = re.compile(r"^[0-9a-f]{32}\Z")
_MAX_REASON = 200


@dataclass(frozen=True)
class MoveTask:
    id: str  # 32 hex digits
    status: str  # RUNNING, CANCELLING, COMPLETED, CANCELLED, FAILED
    owner: str  # the node running it
    started_ms: int
    heartbeat_ms: int  # the owner's clock at its last write
    destination: str | None = None  # an ARN; None: each message back to its source queue
    rate: int | None = None  # MaxNumberOfMessagesPerSecond as given
    moved: int = 0
    to_move: int = 0
    reason: str | None = None  # FAILED: why


def _task(d: Any) -> MoveTask | None:
    """A record as stored, or None when it is not one (an admin may set any topic attribute)."""
    if not isinstance(d, dict):
        return None
    try:
        task = MoveTask(**d)
    except TypeError:
        return None
    ints = (task.started_ms, task.heartbeat_ms, task.moved, task.to_move)
    if (
        not isinstance(task.id, str)
        or not _TASK_ID.match(task.id)
        or task.status not in _STATUSES
        or not isinstance(task.owner, str)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ints)
        or not (task.destination is None or isinstance(task.destination, str))
        or not (task.rate is None or (isinstance(task.rate, int) and not isinstance(task.rate, bool)))
        or not (task.reason is None or isinstance(task.reason, str))
    ):
        return None
    return task


def load(raw: str | None) -> list[MoveTask]:
    """The records of a queue's attribute (newest first); what is not a record is left out."""
    if not raw:
        return []
    parsed = read_json(raw)
    if not isinstance(parsed, list):
        return []
    return [t for t in (_task(d) for d in parsed[:KEEP]) if t is not None]


def dump(tasks: list[MoveTask]) -> str:
    """The attribute value of ``tasks`` (newest first): the newest :data:`KEEP` that fit in an
    attribute value."""
    kept = [
        dataclasses.replace(t, reason=None if t.reason is None else t.reason[:_MAX_REASON])
        for t in tasks[:KEEP]
    ]
    while True:
        text = json.dumps([dataclasses.asdict(t) for t in kept], separators=(",", ":"))
        if len(text.encode()) <= MAX_ATTRIBUTE_VALUE_BYTES or len(kept) <= 1:
            return text
        kept = kept[:-1]


def effective(task: MoveTask, now_ms: int, orphaned: bool, lease_ms: int) -> MoveTask:
    """``task`` as it is: an active task whose owner no longer runs it (``orphaned``: the owner is
    the caller's node, which does not run it) or whose heartbeat is older than ``lease_ms`` is
    FAILED (a CANCELLING one CANCELLED)."""
    if task.status not in ACTIVE or not (orphaned or now_ms - task.heartbeat_ms > lease_ms):
        return task
    if task.status == "CANCELLING":
        return dataclasses.replace(task, status="CANCELLED")
    return dataclasses.replace(task, status="FAILED", reason=NODE_STOPPED)


def handle(queue: str, task_id: str) -> str:
    """A task's TaskHandle: ``<source queue>:<task id>`` (``access.py`` reads the queue from it)."""
    return f"{queue}:{task_id}"


def parse_handle(value: Any) -> tuple[str, str] | None:
    """(source queue, task id) of a TaskHandle, or None when it is not one."""
    if not isinstance(value, str):
        return None
    queue, _, task_id = value.partition(":")
    if not QUEUE_NAME.match(queue) or not _TASK_ID.match(task_id):
        return None
    return queue, task_id


def entry(task: MoveTask, queue: str, source_arn: str) -> dict[str, Any]:
    """A ListMessageMoveTasksResultEntry, as AWS answers it: the TaskHandle only while RUNNING,
    DestinationArn and MaxNumberOfMessagesPerSecond only when given, FailureReason only when
    FAILED."""
    out: dict[str, Any] = {
        "Status": task.status,
        "SourceArn": source_arn,
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move,
        "StartedTimestamp": task.started_ms,
    }
    if task.status == "RUNNING":
        out["TaskHandle"] = handle(queue, task.id)
    if task.destination is not None:
        out["DestinationArn"] = task.destination
    if task.rate is not None:
        out["MaxNumberOfMessagesPerSecond"] = task.rate
    if task.status == "FAILED" and task.reason:
        out["FailureReason"] = task.reason
    return out
