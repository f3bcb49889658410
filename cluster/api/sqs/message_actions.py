"""The SQS message actions (SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch),
ChangeMessageVisibility(Batch)) on top of the queue actions (``actions.py``, which says what maps to
what). A receipt handle is the REST receipt ``topic_id.queue.offset.token``: it names one delivery.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import time
from collections import defaultdict
from typing import Any

import structlog
from aiohttp import web

from raftmq import batch as rb
from raftmq.cluster.api.handlers.subscription_bodies import receipt_numbers
from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi
from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.sqs import queues as qs
from raftmq.cluster.api.sqs.actions import GROUP, MAX_BATCH, MAX_BATCH_BYTES, Action, QueueActions, int_param
from raftmq.cluster.api.sqs.errors import SqsError, quoted
from raftmq.cluster.api.sqs.messages import (
    ATTRIBUTES_HEADER,
    DEDUP_HEADER,
    ID_HEADER,
    SOURCE_HEADER,
    attributes_from_header,
    attributes_md5,
    attributes_size,
    body_md5,
    check_body,
    message_ids,
    moved_fifo,
    moved_headers,
    parse_message_attributes,
    stored_attributes,
)
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.node import Node

__all__ = ["DEDUP_HEADER", "SOURCE_HEADER", "SqsActions", "sequence_number", "sqs_message"]

log = structlog.get_logger(__name__)

RECEIVE_SLICE_S = 5.0  # one take's long poll; a longer wait takes again
DEAD_LETTER_HOLD_MS = 30_000  # a receive on a queue with a RedrivePolicy takes for at least this
# MessageGroupId and MessageDeduplicationId: 1-128 of alphanumerics and punctuation, as AWS.
_FIFO_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}\Z")
_NOT_FOR_QUEUE_TYPE = "The request include parameter that is not valid for this queue type"
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}\Z")


def _entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a batch action, checked as AWS checks them before any is done."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of structures.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest", f"Maximum number of entries per request are {MAX_BATCH}."
        )
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
            )
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries have the same Id.")
    return entries


def _failed(entry_id: str, e: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": e.aws.sender, "Code": e.aws.code, "Message": e.message}


class SqsActions(QueueActions):
    """Every action of this slice (``actions``: by name); one instance per node."""

    def __init__(self, node: Node, api: TopicHandlers, delivery: SubscriptionsApi) -> None:
        super().__init__(node, api, delivery)
        self.actions: dict[str, Action] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "DeleteQueue": self.delete_queue,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "PurgeQueue": self.purge_queue,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "AddPermission": self.refuse_permission,
            "RemovePermission": self.refuse_permission,
        }

    # -- sending ----------------------------------------------------------------------------------

    def _message(
        self, topic: Topic, entry: dict[str, Any], max_bytes: int, message_id: str
    ) -> tuple[dict[str, Any], Any]:
        """One message to send, checked: (its answer fields, its append arguments)."""
        body = check_body(entry.get("MessageBody"))
        attributes = parse_message_attributes(entry.get("MessageAttributes"))
        size = len(body.encode()) + attributes_size(attributes)
        if size > max_bytes:
            raise SqsError(
                "InvalidParameterValue",
                "One or more parameters are invalid. "
                f"Reason: Message must be shorter than {max_bytes} bytes.",
            )
        fifo = qs.is_fifo(topic)
        if fifo and entry.get("DelaySeconds") is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {quoted(entry['DelaySeconds'])[:20]} for parameter DelaySeconds is invalid. "
                f"Reason: {_NOT_FOR_QUEUE_TYPE}.",
            )
        if not fifo and entry.get("MessageDeduplicationId") is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"Value for parameter MessageDeduplicationId is invalid. Reason: {_NOT_FOR_QUEUE_TYPE}.",
            )
        delay_s = int_param(entry, "DelaySeconds", 0, 900, qs.queue_setting(topic, "DelaySeconds"))
        headers = {ID_HEADER: message_id}
        answer = {"MessageId": message_id, "MD5OfMessageBody": body_md5(body)}
        if attributes:
            headers[ATTRIBUTES_HEADER] = stored_attributes(attributes)
            answer["MD5OfMessageAttributes"] = attributes_md5(attributes)
        retention_ms = qs.queue_setting(topic, "MessageRetentionPeriod") * 1000
        if fifo:
            return answer, _fifo_message(topic, entry, body, headers, retention_ms)
        return answer, (body, None, headers, delay_s * 1000, retention_ms)

    def _send_queue(self, topic: Topic) -> int:
        """The queue of a standard queue's topic a send goes to: one whose queue group this node
        leads when there is one (the append is proposed here, with no forwarding hop to another
        node: a standard queue promises no order, so any queue will do), round robin over them;
        else round robin over all. Receives take from every queue group in turn, so no queue is
        left behind when clients send through only some of the nodes."""
        spread = next(self._spread)
        router = self.api.router
        led = [q for q, g in enumerate(topic.queue_groups) if router.leads(str(g))]
        return led[spread % len(led)] if led else spread % topic.queues

    async def _append(self, topic: Topic, messages: list[Any]) -> None:
        """Append the messages to one queue of the topic as one batch; returns once committed on a
        majority (raises what the queue group answered otherwise)."""
        now = now_ms()
        builder = rb.BatchBuilder(None, 0, base_timestamp_ms=now, timestamps=False)
        for args in messages:
            builder.append(*args)
        data = builder.finish()
        q = self._send_queue(topic)  # a receive waiting here may take them along (docs/sqs.md)
        result = await self.delivery.coordinator.append(topic, GROUP, q, data, qs.reads_ahead(topic))
        outcome = result["results"][0]
        if "error" in outcome:
            raise ApiError.from_body(outcome["error"])

    async def _append_fifo(self, topic: Topic, messages: list[Any]) -> list[dict[str, Any]]:
        """Append FIFO messages to the queue's one queue, deduplicated by its leader against the
        replicated window (``dedup_produce``); per message ``{"offset", "id", "duplicate"?}``,
        the original's for a duplicate."""
        group = topic.queue_groups[0]
        # A leader of the release before dedup_produce would not know the action: checked here.
        if not await self.node.await_group_supports(str(group), "dedup_produce"):
            raise SqsError(
                "ServiceUnavailable", "A replica of the queue runs an older release (a rolling upgrade)."
            )
        result = await self.api.router.group_call(
            group, "dedup_produce", {"topic_id": topic.id, "queue": 0, "messages": messages}
        )
        outcomes: list[dict[str, Any]] = result["results"]
        for outcome in outcomes:
            if "error" in outcome:
                raise ApiError.from_body(outcome["error"])
        return outcomes

    async def send_message(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        answer, args = self._message(topic, params, self._max_size(topic), message_ids(1)[0])
        if qs.is_fifo(topic):
            (sent,) = await self._append_fifo(topic, [args])
            return {**answer, "MessageId": sent["id"], "SequenceNumber": sequence_number(sent["offset"])}
        await self._append(topic, [args])
        return answer

    async def send_message_batch(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        entries = _entries(params)
        total = sum(len(quoted(e.get("MessageBody", "")).encode("utf-8", "replace")) for e in entries)
        if total > MAX_BATCH_BYTES:
            raise SqsError(
                "BatchRequestTooLong", f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes."
            )
        max_bytes = self._max_size(topic)
        successful, failed, sending = [], [], []
        for entry, message_id in zip(entries, message_ids(len(entries)), strict=True):
            try:
                answer, args = self._message(topic, entry, max_bytes, message_id)
            except SqsError as e:
                failed.append(_failed(entry["Id"], e))
                continue
            successful.append({"Id": entry["Id"], **answer})
            sending.append(args)
        if sending and qs.is_fifo(topic):
            for ok, sent in zip(successful, await self._append_fifo(topic, sending), strict=True):
                ok["MessageId"], ok["SequenceNumber"] = sent["id"], sequence_number(sent["offset"])
        elif sending:
            await self._append(topic, sending)
        return {"Successful": successful, "Failed": failed}

    # -- receiving --------------------------------------------------------------------------------

    async def receive_message(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        max_messages = int_param(params, "MaxNumberOfMessages", 1, 10, 1)
        visibility_s = int_param(
            params, "VisibilityTimeout", 0, 43_200, qs.queue_setting(topic, "VisibilityTimeout")
        )
        wait_s = int_param(
            params, "WaitTimeSeconds", 0, 20, qs.queue_setting(topic, "ReceiveMessageWaitTimeSeconds")
        )
        system = set()
        for member in ("AttributeNames", "MessageSystemAttributeNames"):
            names = params.get(member) or []
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SqsError("InvalidAttributeName", f"{member} must be a list of names.")
            system.update(names)
        selectors = params.get("MessageAttributeNames") or []
        if not isinstance(selectors, list) or not all(isinstance(n, str) for n in selectors):
            raise SqsError("InvalidParameterValue", "MessageAttributeNames must be a list of names.")
        await self._ensure_subscription(topic)
        policy = qs.redrive_policy(topic)
        held_ms = max(1, visibility_s * 1000)
        if policy is not None:
            # A message the RedrivePolicy moves is acked here after its append to the dead-letter
            # queue: it is taken in flight long enough for that, whatever visibility was asked (with
            # 0 s the ack came too late, the message stayed, and each receive moved it once more).
            held_ms = max(held_ms, DEAD_LETTER_HOLD_MS)
        deadline = time.monotonic() + wait_s
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            got = await self._take(topic, max_messages, held_ms, remaining, qs.is_fifo(topic))
            if policy is not None:
                got = await self._move_dead_letters(topic, policy, got)
                if got and held_ms != visibility_s * 1000:  # handed out with the visibility asked
                    await self._hand_out(topic, got, visibility_s)
            if got or time.monotonic() >= deadline:
                break
        return {"Messages": [sqs_message(m, system, selectors, held_ms) for m in got]} if got else {}

    async def _hand_out(self, topic: Topic, got: list[dict[str, Any]], visibility_s: int) -> None:
        """Set the visibility of messages taken for longer than asked to ``visibility_s`` from now
        (0: visible again at once). If that fails they stay in flight as taken (at least once)."""
        try:
            await self._change(topic, [m["receipt"] for m in got], [visibility_s] * len(got))
        except RaftmqError as e:
            log.warning("sqs_visibility_not_set", queue=topic.name, code=e.code)

    async def _move_dead_letters(
        self, topic: Topic, policy: qs.RedrivePolicy, got: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The messages of ``got`` to hand out: those received more than the RedrivePolicy's
        maxReceiveCount times are moved instead (as AWS moves them, at the receive that would
        exceed it): sent to the dead-letter queue with their MessageId and attributes (a FIFO
        queue's: also their message group and MessageDeduplicationId), then deleted here. A move
        that fails leaves them in flight (moved at a later receive); a delete that fails after the
        send may move one twice to a standard queue (at least once; a FIFO dead-letter queue's
        window stores it once). A dead-letter queue deleted since, of the other type, or whose
        RedriveAllowPolicy no longer allows this queue: delivered as usual."""
        over = [m for m in got if m["attempt"] > policy.max_receive_count]
        if not over:
            return got
        rest = [m for m in got if m["attempt"] <= policy.max_receive_count]
        try:
            target = await self._queue_named(policy.target)
        except SqsError:
            return got
        fifo = qs.is_fifo(topic)
        if qs.is_fifo(target) != fifo or not qs.allows_redrive_from(target, self.queue_arn(topic.name)):
            return got
        retention_ms = qs.queue_setting(target, "MessageRetentionPeriod") * 1000
        moving: list[Any] = []
        for m in over:
            headers = moved_headers(m, fifo)
            headers[SOURCE_HEADER] = topic.name
            moving.append(
                moved_fifo(m, topic.id, headers, retention_ms)
                if fifo
                else (m["value"] if "value" in m else m["value_b64"], None, headers, 0, retention_ms)
            )
        try:
            if fifo:
                await self._append_fifo(target, moving)
            else:
                await self._append(target, moving)
            await self._settle(topic, "ack", [m["receipt"] for m in over], {})
        except RaftmqError as e:
            log.warning("sqs_dead_letter_move_failed", queue=topic.name, target=target.name, code=e.code)
            if fifo:  # the group's later messages wait for the one still in flight here
                return await self._hold_back(topic, {m["key"] for m in over}, rest)
        return rest

    async def _hold_back(
        self, topic: Topic, groups: set[str | None], got: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The messages of ``got`` not of the message ``groups``; those of them are made visible
        again at once (their group holds them behind its message in flight)."""
        held = [m for m in got if m["key"] in groups]
        if held:
            try:
                await self._settle(topic, "nack", [m["receipt"] for m in held], {"delay_ms": 0})
            except RaftmqError as e:
                log.warning("sqs_visibility_not_set", queue=topic.name, code=e.code)
        return [m for m in got if m["key"] not in groups]

    async def _take(
        self, topic: Topic, n: int, visibility_ms: int, wait_s: float, ordered: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``n`` messages from the subscription's receive coordinator, waiting up to
        ``wait_s`` (``ordered``: by message group, a FIFO queue's ``receive_ordered``). Retriable
        failures (a leader change) are waited out until the deadline, then the answer is empty: a
        receive that is up never fails only because leaders move."""
        deadline = time.monotonic() + wait_s
        body = {
            "topic": topic.name,
            "topic_id": topic.id,
            "group": GROUP,
            "max": n,
            "visibility_ms": visibility_ms,
        }
        if ordered:
            body["ordered"] = True
            # A FIFO queue's delay applies to the messages in it at each receive, as AWS's
            # (retroactive): a message is handed out first DelaySeconds after its send.
            delay_ms = qs.queue_setting(topic, "DelaySeconds") * 1000
            needs = ["receive_ordered"]
            if delay_ms:
                body["delay_ms"] = delay_ms
                needs.append("receive_ordered.delay")
            # A coordinator or leader of the release before receive_ordered (or its delay) would
            # receive without the group rule (or too early): until every replica of the queue's
            # group has it, nothing is handed out.
            for capability in needs:
                if not await self.node.await_group_supports(str(topic.queue_groups[0]), capability):
                    await asyncio.sleep(wait_s)
                    return []
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            wait_ms = int(min(remaining, RECEIVE_SLICE_S) * 1000)
            try:
                if ordered:
                    got = await self.delivery.take_call(topic.queue_groups[0], {**body, "wait_ms": wait_ms})
                else:  # a line of this node's own: no hop to the coordinator (docs/sqs.md)
                    got = await self.delivery.take_here(topic, GROUP, n, visibility_ms, wait_ms)
            except RaftmqError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    if e.retriable:
                        return []
                    raise
                await asyncio.sleep(0.2)
                continue
            if got or time.monotonic() >= deadline:
                return got

    async def _settle(
        self, topic: Topic, op: str, handles: list[str], fields: dict[str, Any], read_ahead: bool = False
    ) -> list[SqsError | None]:
        """``op`` on each receipt handle: None where done, else why not (per handle).
        ``read_ahead``: a standard queue's delete (``SubscriptionsApi.settle``)."""
        out: list[SqsError | None] = [None] * len(handles)
        good: list[int] = []
        for i, handle in enumerate(handles):
            numbers = receipt_numbers(handle)  # an offset past 2^64 too: not the whole batch's 400
            if numbers is None or numbers[0] != topic.id or numbers[1] >= topic.queues:
                out[i] = SqsError(
                    "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not valid.'
                )
            else:
                good.append(i)
        if good:
            results = await self.delivery.settle(
                topic, GROUP, op, [handles[i] for i in good], fields, read_ahead=read_ahead
            )
            for i, r in zip(good, results, strict=True):
                error = r.get("error")
                if error is None:
                    continue
                if error.get("code") == errors.STALE_RECEIPT.code:
                    if op != "ack":  # an old handle: AWS deletes nothing and says nothing
                        out[i] = SqsError("MessageNotInflight", "The message referred to is not in flight.")
                    continue
                raise ApiError.from_body(error)
        return out

    async def delete_message(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        handle = params.get("ReceiptHandle")
        if not isinstance(handle, str) or not handle:
            raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
        (failure,) = await self._settle(topic, "ack", [handle], {}, read_ahead=qs.reads_ahead(topic))
        if failure is not None:
            raise failure
        return {}

    async def delete_message_batch(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        entries = _entries(params)
        handles = [quoted(e.get("ReceiptHandle", ""))[:200] for e in entries]
        outcome = await self._settle(topic, "ack", handles, {}, read_ahead=qs.reads_ahead(topic))
        return _batch_answer(entries, outcome)

    async def _change(self, topic: Topic, handles: list[str], timeouts: list[int]) -> list[SqsError | None]:
        """ChangeMessageVisibility of each handle: 0 s makes it visible now (a nack without delay),
        more keeps it in flight that long from now (extend)."""
        out: list[SqsError | None] = [None] * len(handles)
        by_timeout: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(timeouts):
            by_timeout[t].append(i)
        for t, positions in by_timeout.items():
            op, fields = ("nack", {"delay_ms": 0}) if t == 0 else ("extend", {"visibility_ms": t * 1000})
            got = await self._settle(topic, op, [handles[i] for i in positions], fields)
            for i, r in zip(positions, got, strict=True):
                out[i] = r
        return out

    async def change_message_visibility(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        handle = params.get("ReceiptHandle")
        if not isinstance(handle, str) or not handle:
            raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
        if params.get("VisibilityTimeout") is None:
            raise SqsError("MissingParameter", "The request must contain the parameter VisibilityTimeout.")
        timeout = int_param(params, "VisibilityTimeout", 0, 43_200, 0)
        (failure,) = await self._change(topic, [handle], [timeout])
        if failure is not None:
            raise failure
        return {}

    async def change_message_visibility_batch(
        self, request: web.Request, params: dict[str, Any]
    ) -> dict[str, Any]:
        topic = await self._queue(params)
        entries = _entries(params)
        outcome: list[SqsError | None] = [None] * len(entries)
        handles, timeouts, positions = [], [], []
        for i, e in enumerate(entries):
            try:
                if e.get("VisibilityTimeout") is None:
                    raise SqsError("MissingParameter", "The entry must contain VisibilityTimeout.")
                timeouts.append(int_param(e, "VisibilityTimeout", 0, 43_200, 0))
            except SqsError as err:
                outcome[i] = err
                continue
            handles.append(quoted(e.get("ReceiptHandle", ""))[:200])
            positions.append(i)
        for i, r in zip(positions, await self._change(topic, handles, timeouts), strict=True):
            outcome[i] = r
        return _batch_answer(entries, outcome)


def _batch_answer(entries: list[dict[str, Any]], outcome: list[SqsError | None]) -> dict[str, Any]:
    return {
        "Successful": [{"Id": e["Id"]} for e, r in zip(entries, outcome, strict=True) if r is None],
        "Failed": [_failed(e["Id"], r) for e, r in zip(entries, outcome, strict=True) if r is not None],
    }


def _selected(name: str, selectors: list[str]) -> bool:
    for s in selectors:
        if s in ("All", ".*") or s == name or (s.endswith(".*") and name.startswith(s[:-1])):
            return True
    return False


def _first_receive_ms(m: dict[str, Any], held_ms: int) -> int | None:
    """When the message was first received: the first delivery time its pending record keeps
    (replicated with it, so the same after a failover), or, from a queue group leader of the
    release before that answer field, this receive's time when this is the first (the take's
    deadline less what it was taken for). None: a redelivery of such a leader (not known here)."""
    first = m.get("first_delivery_ms")
    if isinstance(first, int):
        return first
    return int(m["deadline_ms"]) - held_ms if m["attempt"] == 1 else None


def sqs_message(m: dict[str, Any], system: set[str], selectors: list[str], held_ms: int) -> dict[str, Any]:
    """A message as ReceiveMessage answers it, from what ``take`` handed out (taken in flight for
    ``held_ms``)."""
    headers = m.get("headers") or {}
    body = m["value"] if "value" in m else m["value_b64"]  # a binary raftmq message: its base64
    out: dict[str, Any] = {
        "MessageId": headers.get(ID_HEADER) or f"{m['queue']}-{m['offset']}",
        "ReceiptHandle": m["receipt"],
        "MD5OfBody": body_md5(body),
        "Body": body,
    }
    everything = "All" in system
    values = {
        "SentTimestamp": str(m["timestamp_ms"]),
        "ApproximateReceiveCount": str(m["attempt"]),
        "SenderId": qs.ACCOUNT,
    }
    first_ms = _first_receive_ms(m, held_ms)
    if first_ms is not None:
        values["ApproximateFirstReceiveTimestamp"] = str(first_ms)
    if DEDUP_HEADER in headers:  # a FIFO queue's message
        values["MessageGroupId"] = str(m.get("key") or "")
        values["MessageDeduplicationId"] = headers[DEDUP_HEADER]
        values["SequenceNumber"] = sequence_number(int(m["offset"]))
    chosen = {k: v for k, v in values.items() if everything or k in system}
    if chosen:
        out["Attributes"] = chosen
    attributes = attributes_from_header(headers.get(ATTRIBUTES_HEADER))
    picked = {n: v for n, v in attributes.items() if _selected(n, selectors)}
    if picked:
        out["MD5OfMessageAttributes"] = attributes_md5(picked)
        out["MessageAttributes"] = {
            n: (
                {"DataType": t, "BinaryValue": base64.b64encode(v).decode()}
                if isinstance(v, bytes)
                else {"DataType": t, "StringValue": v}
            )
            for n, (t, v) in picked.items()
        }
    return out


def sequence_number(offset: int) -> str:
    """A FIFO message's SequenceNumber: its offset in the queue's one queue, as the 20-digit
    decimal string AWS's look like; it grows with every message stored, never reused."""
    return f"{offset:020d}"


def _fifo_id(entry: dict[str, Any], name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not _FIFO_ID.match(value):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {quoted(value)[:200]} for parameter {name} is invalid. Reason: it must be 1 to 128 "
            "alphanumeric or punctuation characters.",
        )
    return value


def _fifo_message(
    topic: Topic, entry: dict[str, Any], body: str, headers: dict[str, str], retention_ms: int
) -> dict[str, Any]:
    """A FIFO message as ``dedup_produce`` takes it: its MessageGroupId is its key (one message
    group, one key: ``receive_ordered`` keeps it in order), its deduplication key is the
    MessageDeduplicationId (or the body's SHA-256 with ContentBasedDeduplication), within the
    message group when DeduplicationScope is messageGroup."""
    group = _fifo_id(entry, "MessageGroupId")
    if group is None:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageGroupId.")
    dedup = _fifo_id(entry, "MessageDeduplicationId")
    if dedup is None:
        if qs.fifo_setting(topic.attributes, "ContentBasedDeduplication") != "true":
            raise SqsError(
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly",
            )
        dedup = hashlib.sha256(body.encode()).hexdigest()
    scope = qs.fifo_setting(topic.attributes, "DeduplicationScope")
    key = f"g{len(group)}:{group}:{dedup}" if scope == "messageGroup" else f"q:{dedup}"
    return {
        "value": body,
        "key": group,
        "headers": {**headers, DEDUP_HEADER: dedup},
        "ttl_ms": retention_ms,
        "dedup": key,
        "id": headers[ID_HEADER],
    }
