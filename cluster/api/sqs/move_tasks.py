"""The SQS message move tasks (StartMessageMoveTask, CancelMessageMoveTask, ListMessageMoveTasks):
dead letters moved back from a dead-letter queue, to one destination queue or each to the queue it
was dead-lettered from (the header ``sqs-dead-letter-source`` the RedrivePolicy's move recorded).

The task's records (``move_task_records.py``) are replicated in the metadata group with the queue;
the task itself runs on the node that started it, as this loop:

1. take up to a batch of messages from the dead-letter queue's ``sqs`` subscription, held in flight
   for ``sqs.move_task_lease_ms`` (30 s by default; a take that finds nothing completes the task);
2. append them to their destination queue (with their MessageId, body and message attributes) and
   only then ack them in the dead-letter queue.

Invariant: a message leaves the dead-letter queue only after its append to the destination was
committed on a majority, so no step loses one: a move that fails releases what it took (visible
again at once), and a node that dies mid-batch leaves its messages in flight, visible again after
``sqs.move_task_lease_ms`` (30 s by default). A message appended whose ack did not happen is
delivered from both queues: at least once, as everything in SQS. A task whose node stops is FAILED (that lease
after its last heartbeat, or at once when its node restarts); a new task moves what is left.

MaxNumberOfMessagesPerSecond paces the takes: the batch that would move the n-th message starts no
earlier than n / rate seconds after the task did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.sqs import move_task_records as records
from raftmq.cluster.api.sqs import queues as qs
from raftmq.cluster.api.sqs.actions import GROUP, Action, int_param
from raftmq.cluster.api.sqs.errors import SQS_ERRORS, SqsError, from_raftmq_error, quoted
from raftmq.cluster.api.sqs.message_actions import SqsActions
from raftmq.cluster.api.sqs.messages import SOURCE_HEADER, moved_fifo, moved_headers
from raftmq.cluster.api.visibility import grant_sees, visible_attributes
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.tokens import PRODUCE, TokenGrant
from raftmq.cluster.machines.metadata import Topic

__all__ = ["MoveTasks"]

log = structlog.get_logger(__name__)

MAX_RATE = 500  # MaxNumberOfMessagesPerSecond, as AWS
BATCH = 10  # messages per take (at most the rate)
TAKE_WAIT_MS = 500  # a take that finds nothing in this long: the queue is drained
RETRY_S = 0.5  # after a retriable failure (a leader change)
_CAS_ROUNDS = 20
_NO_QUEUE = SQS_ERRORS["QueueDoesNotExist"].code
_NO_SOURCE = (
    "a message in the dead-letter queue names no source queue (it was sent there, not moved by a "
    "RedrivePolicy): give a DestinationArn"
)
_NOT_A_SOURCE = (
    "a message in the dead-letter queue names a source queue whose RedrivePolicy does not name this "
    "dead-letter queue: give a DestinationArn"
)


class _Failed(RaftmqError):
    """The task cannot go on: FAILED with ``reason`` (never an answer: status 0)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Gone(RaftmqError):
    """The source queue, or the task's record, is gone (deleted, or taken over): stop, write nothing
    (never an answer: status 0)."""


class MoveTasks:
    """The three actions and the tasks this node runs (one instance per node)."""

    def __init__(self, sqs: SqsActions) -> None:
        self.sqs = sqs
        self.node = sqs.node
        # Task ids this node runs (None: being started). Invariant: an active record owned by this
        # node whose id is not here is no longer run by anyone (the node restarted).
        self._running: dict[str, asyncio.Task[None] | None] = {}

    def register(self, actions: dict[str, Action]) -> None:
        actions.update(
            StartMessageMoveTask=self.start,
            CancelMessageMoveTask=self.cancel,
            ListMessageMoveTasks=self.list_tasks,
        )

    # -- records ----------------------------------------------------------------------------------

    def _effective(self, task: records.MoveTask, now: int) -> records.MoveTask:
        orphaned = task.owner == self.node.me.id and task.id not in self._running
        return records.effective(task, now, orphaned, self.node.config.sqs.move_task_lease_ms)

    async def _change(
        self, source: Topic, change: Callable[[list[records.MoveTask]], list[records.MoveTask] | None]
    ) -> None:
        """Write ``change`` of the source queue's records back by a compare-and-set, again on the
        records as they are when another write came first. ``change`` returns None: nothing to
        write; it may raise to refuse, which counts only on the records as the metadata leader has
        them (``source`` may come from a replica a moment behind: a task started elsewhere)."""
        topic, fresh = self._local(source), False
        for _ in range(_CAS_ROUNDS):
            raw = topic.attributes.get(records.ATTRIBUTE)
            try:
                changed = change(records.load(raw))
            except (SqsError, _Gone):
                if fresh:
                    raise
                topic, fresh = await self.sqs.api.topic(source.name, fresh=True), True
                if topic.id != source.id:
                    raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None
                continue
            if changed is None:
                return
            command = {
                "op": "set_topic_attributes",
                "name": topic.name,
                "attributes": {records.ATTRIBUTE: records.dump(changed)},
                "expect": {records.ATTRIBUTE: raw},
            }
            result = await self.sqs.api.router.group_call(META, "topic_command", command)
            if "changed" not in result:  # a leader that knows no compare-and-set merged blindly
                raise SqsError("ServiceUnavailable", "The cluster is being upgraded; try again.")
            if result["changed"]:
                return
            topic, fresh = Topic.from_json(result["topic"]), True
            if topic.id != source.id:  # deleted and made again meanwhile
                raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        raise SqsError("ServiceUnavailable", "The queue's move tasks changed too often; try again.")

    def _local(self, source: Topic) -> Topic:
        """The source queue as this node's replica of the metadata group has it now."""
        machine = self.node.metadata
        topic = None if machine is None else machine.topic(source.name)
        return topic if topic is not None and topic.id == source.id else source

    # -- the actions ------------------------------------------------------------------------------

    async def _queue_of_arn(self, params: dict[str, Any], name: str) -> Topic:
        arn = params.get(name)
        if arn is None or arn == "":
            raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
        parts = arn.split(":") if isinstance(arn, str) else []
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"]:
            shown = quoted(arn)[:200]
            raise SqsError("InvalidParameterValue", f"Value {shown} for parameter {name} is invalid.")
        queue = qs.arn_queue(arn, self.sqs.region)
        missing = SqsError(
            "ResourceNotFoundException",
            f"The resource that you specified for the {name} parameter doesn't exist.",
        )
        if queue is None:
            raise missing
        try:
            return await self.sqs._queue_named(queue)
        except SqsError:
            raise missing from None

    async def _may_produce(self, grant: TokenGrant, queue: str) -> bool:
        names = await self.sqs.api.permission_names(queue)
        return all(grant.allows(PRODUCE, n) for n in names)

    async def start(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        source = await self._queue_of_arn(params, "SourceArn")
        sources = [
            t.name
            for t in await self.sqs._all_topics()
            if qs.is_queue(t) and (p := qs.redrive_policy(t)) is not None and p.target == source.name
        ]
        if not sources:
            raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")
        destination = None
        if params.get("DestinationArn") is not None:
            destination = await self._queue_of_arn(params, "DestinationArn")
            if destination.id == source.id:
                raise SqsError(
                    "InvalidParameterValue", "The destination queue must be another queue than the source."
                )
            if qs.is_fifo(destination) != qs.is_fifo(source):  # as a RedrivePolicy's target
                kind = "a FIFO" if qs.is_fifo(source) else "a standard"
                raise SqsError(
                    "InvalidParameterValue",
                    f"The destination of {kind} dead-letter queue must be {kind} queue.",
                )
        # A node of the release before would run it unordered (qs.FIFO_RELEASE).
        if qs.is_fifo(source) and not await self.sqs.cluster_applies(qs.FIFO_RELEASE):
            raise SqsError(
                "ServiceUnavailable",
                "A node of the cluster runs an older release (a rolling upgrade): a FIFO queue's "
                "move tasks can start once every node is upgraded.",
            )
        rate = None
        if params.get("MaxNumberOfMessagesPerSecond") is not None:
            rate = int_param(params, "MaxNumberOfMessagesPerSecond", 1, MAX_RATE, 1)
        grant = request.get(PRINCIPAL)
        if grant is not None:  # access.py checked consume on the source and produce on a destination
            sees = grant_sees(grant, self.sqs.api.permission_names)
            for name in [] if destination is not None else sources:
                if not await self._may_produce(grant, name):
                    # A source the token has no right on stays unnamed (visibility.py).
                    named = f"{name!r}, " if await sees(name) else ""
                    raise SqsError(
                        "AccessDenied",
                        f"Access to the resource is denied: token {grant.name!r} lacks produce "
                        f"permission on {named}a source queue the messages would go back to.",
                    )
        await self.sqs._ensure_subscription(source)  # the takes' (SQS's redelivery, no dead letters)
        visible, _, _ = await self.sqs._counts(source, with_delayed=False)
        now = now_ms()
        task = records.MoveTask(
            id=uuid.uuid4().hex,
            status="RUNNING",
            owner=self.node.me.id,
            started_ms=now,
            heartbeat_ms=now,
            destination=None if destination is None else self.sqs.queue_arn(destination.name),
            rate=rate,
            to_move=visible,
        )

        def started(tasks: list[records.MoveTask]) -> list[records.MoveTask]:
            now = now_ms()
            kept = [self._effective(t, now) for t in tasks]
            if any(t.status in records.ACTIVE for t in kept):
                raise SqsError(
                    "InvalidParameterValue",
                    "There is already a task running. Only one active task is allowed for a source "
                    "queue arn at a given time.",
                )
            return [task, *kept]

        self._running[task.id] = None  # before the write: this node's lists see it as run here
        try:
            await self._change(source, started)
        except BaseException:
            self._running.pop(task.id, None)
            raise
        self._running[task.id] = asyncio.create_task(self._run(source, task, grant))
        log.info("sqs_move_task_started", queue=source.name, task=task.id, destination=task.destination)
        return {"TaskHandle": records.handle(source.name, task.id)}

    async def cancel(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        raw = params.get("TaskHandle")
        if not isinstance(raw, str) or not raw:
            raise SqsError("MissingParameter", "The request must contain the parameter TaskHandle.")
        parsed = records.parse_handle(raw)
        if parsed is None:
            raise SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
        queue, task_id = parsed
        try:
            source = await self.sqs._queue_named(queue)
        except SqsError:
            raise SqsError(
                "ResourceNotFoundException",
                "The resource that you specified for the SourceArn parameter doesn't exist.",
            ) from None
        moved = 0

        def cancelled(tasks: list[records.MoveTask]) -> list[records.MoveTask]:
            nonlocal moved
            found = next((t for t in tasks if t.id == task_id), None)
            if found is None:
                raise SqsError("ResourceNotFoundException", "Task does not exist.")
            status = self._effective(found, now_ms()).status
            if status != "RUNNING":
                raise SqsError(
                    "InvalidParameterValue", f"Only a RUNNING task can be cancelled; this one is {status}."
                )
            moved = found.moved
            return [dataclasses.replace(t, status="CANCELLING") if t.id == task_id else t for t in tasks]

        await self._change(source, cancelled)
        return {"ApproximateNumberOfMessagesMoved": moved}

    async def list_tasks(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        """The newest tasks of a queue from this node's replica of the metadata group (a change a
        moment ago elsewhere shows a moment later; AWS's answer is eventually consistent too)."""
        source = await self._queue_of_arn(params, "SourceArn")
        count = int_param(params, "MaxResults", 1, records.KEEP, 1)
        now = now_ms()
        arn = self.sqs.queue_arn(source.name)
        # A task to a queue the token has no right on is not shown: it would name that queue.
        sees = grant_sees(request.get(PRINCIPAL), self.sqs.api.permission_names)
        shown = await visible_attributes(source.attributes, sees)
        tasks = records.load(shown.get(records.ATTRIBUTE))[:count]
        return {"Results": [records.entry(self._effective(t, now), source.name, arn) for t in tasks]}

    # -- running a task ---------------------------------------------------------------------------

    async def _run(self, source: Topic, task: records.MoveTask, grant: TokenGrant | None) -> None:
        moved = [0]
        try:
            status, reason = await self._move(source, task, grant, moved)
        except _Gone:
            status, reason = "", None
        except _Failed as e:
            status, reason = "FAILED", e.reason
        except Exception:
            log.exception("sqs_move_task_failed", queue=source.name, task=task.id)
            status, reason = "FAILED", "InternalError"
        try:
            if status:
                await self._finish(source, task.id, status, reason, moved[0])
        finally:
            self._running.pop(task.id, None)
        log.info("sqs_move_task_ended", queue=source.name, task=task.id, status=status, moved=moved[0])

    async def _finish(self, source: Topic, task_id: str, status: str, reason: str | None, moved: int) -> None:
        """Write the task's end (a few tries; else its lease makes it FAILED)."""

        def finished(tasks: list[records.MoveTask]) -> list[records.MoveTask] | None:
            found = next((t for t in tasks if t.id == task_id), None)
            if found is None or found.status not in records.ACTIVE:
                raise _Gone()
            final = "CANCELLED" if found.status == "CANCELLING" and status != "FAILED" else status
            end = dataclasses.replace(found, status=final, reason=reason, moved=moved, heartbeat_ms=now_ms())
            return [end if t.id == task_id else t for t in tasks]

        for _ in range(5):
            try:
                await self._change(source, finished)
                return
            except _Gone:
                return
            except SqsError as e:
                if e.aws.code == _NO_QUEUE:
                    return
                log.warning("sqs_move_task_end_not_written", task=task_id, code=e.aws.code)
            except RaftmqError as e:
                if e.error is errors.TOPIC_NOT_FOUND:
                    return
                log.warning("sqs_move_task_end_not_written", task=task_id, code=e.code)
            await asyncio.sleep(RETRY_S)

    async def _progress(self, source: Topic, task_id: str, moved: int) -> bool:
        """Write the progress and heartbeat; whether the task was cancelled meanwhile. Raises
        _Gone when the record is gone or no longer active (another node declared it FAILED)."""
        state = {"cancelling": False}

        def progressed(tasks: list[records.MoveTask]) -> list[records.MoveTask] | None:
            found = next((t for t in tasks if t.id == task_id), None)
            if found is None or found.status not in records.ACTIVE:
                raise _Gone()
            state["cancelling"] = found.status == "CANCELLING"
            now = dataclasses.replace(found, moved=moved, heartbeat_ms=now_ms())
            return [now if t.id == task_id else t for t in tasks]

        try:
            await self._change(source, progressed)
        except _Gone:
            raise
        except SqsError as e:
            if e.aws.code == _NO_QUEUE:
                raise _Gone() from None
            log.warning("sqs_move_task_progress_not_written", task=task_id, code=e.aws.code)
        except RaftmqError as e:
            if e.error is errors.TOPIC_NOT_FOUND:
                raise _Gone() from None
            log.warning("sqs_move_task_progress_not_written", task=task_id, code=e.code)
        return state["cancelling"]

    def _cancelled_here(self, source: Topic, task_id: str) -> bool:
        """Whether this node's replica of the metadata group already shows the task CANCELLING."""
        machine = self.node.metadata
        topic = None if machine is None else machine.topic(source.name)
        if topic is None or topic.id != source.id:
            return False
        tasks = records.load(topic.attributes.get(records.ATTRIBUTE))
        found = next((t for t in tasks if t.id == task_id), None)
        return found is not None and found.status == "CANCELLING"

    async def _move(
        self, source: Topic, task: records.MoveTask, grant: TokenGrant | None, moved: list[int]
    ) -> tuple[str, str | None]:
        """Move until the queue is drained or the task is cancelled: (final status, reason)."""
        started = time.monotonic()
        written = started
        size = min(BATCH, task.rate or BATCH)
        take: dict[str, Any] = {
            "topic": source.name,
            "topic_id": source.id,
            "group": GROUP,
            "visibility_ms": self.node.config.sqs.move_task_lease_ms,
        }
        if qs.is_fifo(source):
            # By message group, as a receive: a group's messages in order, none of a group that a
            # consumer holds in flight (they stay; a later task moves them).
            needs = ["receive_ordered"]
            delay_ms = qs.queue_setting(source, "DelaySeconds") * 1000
            if delay_ms:  # a message still delayed in the dead-letter queue is not moved yet
                take["delay_ms"] = delay_ms
                needs.append("receive_ordered.delay")
            for capability in needs:
                if not await self.node.await_group_supports(str(source.queue_groups[0]), capability):
                    raise _Failed("ServiceUnavailable")
            take["ordered"] = True
        while True:
            if time.monotonic() - written >= records.PROGRESS_MS / 1000:
                written = time.monotonic()
                if await self._progress(source, task.id, moved[0]):
                    return "CANCELLED", None
            if self._cancelled_here(source, task.id):
                return "CANCELLED", None
            if task.rate is not None:
                wait_s = started + moved[0] / task.rate - time.monotonic()
                if wait_s > 0:
                    await asyncio.sleep(min(wait_s, records.PROGRESS_MS / 1000))
                    continue
            try:
                got = await self.sqs.delivery.take_call(
                    source.queue_groups[0], {**take, "max": size, "wait_ms": TAKE_WAIT_MS}
                )
            except RaftmqError as e:
                if e.error is errors.TOPIC_NOT_FOUND:
                    raise _Gone() from None
                if not e.retriable:
                    raise _Failed(from_raftmq_error(e).aws.code) from None
                await asyncio.sleep(RETRY_S)
                continue
            if not got:
                return "COMPLETED", None
            moved[0] += await self._move_batch(source, task, grant, got)

    async def _move_batch(
        self, source: Topic, task: records.MoveTask, grant: TokenGrant | None, got: list[dict[str, Any]]
    ) -> int:
        """Append the taken messages to their destinations, then ack them here; how many moved.
        What cannot be moved is released (visible again at once) before the task fails."""
        by_queue: dict[str, list[dict[str, Any]]] = {}
        for m in got:
            target = task.destination or (m.get("headers") or {}).get(SOURCE_HEADER)
            name = None if target is None else target.rsplit(":", 1)[-1]
            if name is None:
                await self._release(source, got)
                raise _Failed(_NO_SOURCE)
            by_queue.setdefault(name, []).append(m)
        moved = 0
        pending = list(got)
        for name, messages in by_queue.items():
            try:
                target = await self.sqs._queue_named(name)
                if task.destination is None and not _redrives_to(target, source):
                    raise _Failed(_NOT_A_SOURCE)
                if grant is not None and not await self._may_produce(grant, name):
                    raise SqsError("AccessDenied", f"{grant.name!r} lacks produce permission on {name!r}")
                if qs.is_fifo(target) != qs.is_fifo(source):  # a source queue made again since
                    raise SqsError(
                        "InvalidParameterValue", f"{name!r} is not of the dead-letter queue's type"
                    )
                if qs.is_fifo(target):  # in their message groups, in the order taken
                    await self.sqs._append_fifo(target, [_moved_fifo(m, source, target) for m in messages])
                else:
                    await self.sqs._append(target, [_moved(m, target) for m in messages])
            except _Failed:
                await self._release(source, pending)
                raise
            except SqsError as e:
                await self._release(source, pending)
                raise _Failed(e.aws.code) from None
            except RaftmqError as e:
                await self._release(source, pending)
                if e.retriable:  # a leader change: moved again (an unknown outcome: maybe twice)
                    await asyncio.sleep(RETRY_S)
                    return moved
                raise _Failed(from_raftmq_error(e).aws.code) from None
            pending = [m for m in pending if m not in messages]
            try:  # a receipt not acked (an error, or stale): delivered from both queues (at least once)
                receipts = [m["receipt"] for m in messages]
                acked = await self.sqs.delivery.settle(source, GROUP, "ack", receipts, {})
                not_acked = [r["error"]["code"] for r in acked if "error" in r]
                if not_acked:
                    log.warning("sqs_move_task_ack_failed", queue=source.name, task=task.id, codes=not_acked)
            except RaftmqError as e:
                log.warning("sqs_move_task_ack_failed", queue=source.name, task=task.id, code=e.code)
            moved += len(messages)
        return moved

    async def _release(self, source: Topic, messages: list[dict[str, Any]]) -> None:
        """Make taken messages visible again at once (else after their visibility timeout)."""
        if not messages:
            return
        try:
            await self.sqs._settle(source, "nack", [m["receipt"] for m in messages], {"delay_ms": 0})
        except RaftmqError as e:
            log.warning("sqs_move_task_release_failed", queue=source.name, code=e.code)


def _moved(m: dict[str, Any], target: Topic) -> tuple[Any, None, dict[str, str], int, int]:
    """The append arguments of message ``m`` moved to ``target``: its MessageId, body and message
    attributes (not the dead-letter source: in ``target`` it is a new message)."""
    headers = moved_headers(m, fifo=False)
    retention_ms = qs.queue_setting(target, "MessageRetentionPeriod") * 1000
    return (m["value"] if "value" in m else m["value_b64"], None, headers, 0, retention_ms)


def _moved_fifo(m: dict[str, Any], source: Topic, target: Topic) -> dict[str, Any]:
    """Message ``m`` of the FIFO dead-letter queue ``source`` as ``dedup_produce`` appends it to
    the FIFO queue ``target``: also its message group and MessageDeduplicationId; deduplicated by
    its place in ``source``, so a batch moved again after a failed delete is stored once."""
    retention_ms = qs.queue_setting(target, "MessageRetentionPeriod") * 1000
    return moved_fifo(m, source.id, moved_headers(m, fifo=True), retention_ms)


def _redrives_to(queue: Topic, dead_letter_queue: Topic) -> bool:
    """Whether ``queue``'s RedrivePolicy names ``dead_letter_queue``. A message goes back to the
    queue its header ``sqs-dead-letter-source`` names only then: any producer on the dead-letter
    queue can write that header (``sqs-`` headers are not reserved on the REST API), and the task's
    starter was checked for ``produce`` on those queues alone (``access.authorize``)."""
    policy = qs.redrive_policy(queue)
    return policy is not None and policy.target == dead_letter_queue.name
