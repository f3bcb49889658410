"""The SQS actions of this slice, each turned into the node actions the REST API uses.

What maps to what (docs/sqs.md):

- a queue is a topic of the same name (marked and configured by topic attributes ``sqs.*``,
  ``queues.py``), consumed by the receive/ack subscription of the consumer group ``sqs``, stored
  with ``max_deliveries`` 2^32-1 and no backoff (SQS redelivers right after the visibility timeout,
  and has no dead letters without a RedrivePolicy);
- SendMessage(Batch): one record batch appended to one queue of the topic at its queue group's
  leader (``append``, as the binary produce path; a queue whose group this node leads when there
  is one: no forwarding hop), answered once committed on a majority; the
  message's DelaySeconds is a raftmq delayed message, MessageRetentionPeriod its ``ttl_ms``;
- ReceiveMessage: ``take`` in a line of waiters (a standard queue: this node's own, with no hop to
  the receive coordinator; a FIFO queue: the subscription's receive coordinator, the REST receive's
  line), long-polled in slices so that a leader change during the wait answers what there is
  (possibly nothing) instead of an error;
- DeleteMessage(Batch): ``ack``; ChangeMessageVisibility: ``extend`` (0 s: ``nack`` with no delay);
- PurgeQueue: the group's committed offsets moved to each queue's end;
- TagQueue, UntagQueue: ``set_topic_tags`` in the metadata group (the topic's tags, a map apart
  from its attributes); AddPermission, RemovePermission: refused (``UnsupportedOperation``).

A receipt handle is the REST receipt ``topic_id.queue.offset.token``: it names one delivery.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.handlers.consumers import not_due_counts
from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi
from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.sqs import queues as qs
from raftmq.cluster.api.sqs.access import queue_name_of
from raftmq.cluster.api.sqs.errors import SqsError, quoted
from raftmq.cluster.api.sqs.redrive_rights import current_policy_repeated
from raftmq.cluster.api.visibility import grant_owns, grant_sees, visible_attributes
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.delivery import NEVER_DEAD_LETTERED
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.machines.views import consumer_queues
from raftmq.cluster.node.node import Node
from raftmq.cluster.replication.upgrade import everywhere
from raftmq.storage.store import StoreError

__all__ = ["GROUP", "MAX_BATCH", "MAX_BATCH_BYTES", "Action", "QueueActions", "int_param"]

GROUP = "sqs"  # the consumer group of every SQS queue's subscription
MAX_BATCH = 10
MAX_BATCH_BYTES = 1_048_576  # the sum of a batch's bodies and attributes
MAX_DELIVERIES = NEVER_DEAD_LETTERED  # no dead letters but a RedrivePolicy's (and read-ahead)
_QUEUE_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
_QUEUE_ATTRIBUTES = (
    "QueueArn",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    *_QUEUE_COUNTS,
    *qs.SETTABLE,
    *qs.REDRIVE,
    *sorted(qs.STORED),
    "FifoQueue",
    *qs.FIFO_SETTINGS,
)
Action = Callable[[web.Request, dict[str, Any]], Awaitable[dict[str, Any]]]


def int_param(params: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    """The integer parameter ``name`` (a number, or its digits on the query wire) in [low, high]."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,10}", value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {quoted(value)[:200]} for parameter {name} is invalid. "
            f"Reason: Must be between {low} and {high}.",
        )
    return value


class QueueActions:
    """The queue actions and what the message actions share (``message_actions.py``)."""

    def __init__(self, node: Node, api: TopicHandlers, delivery: SubscriptionsApi) -> None:
        self.node = node
        self.api = api
        self.delivery = delivery
        self.limits = node.config.limits
        self._spread = itertools.count()
        self._subscribed: set[int] = set()  # topic ids whose subscription this node stored

    # -- queues -----------------------------------------------------------------------------------

    @staticmethod
    def queue_url(request: web.Request, name: str) -> str:
        """The queue's URL at the node answering, as the client addressed it."""
        return f"{request.scheme}://{request.host}/{qs.ACCOUNT}/{name}"

    @property
    def region(self) -> str:
        return self.node.config.sqs.region

    def queue_arn(self, name: str) -> str:
        """The queue's ARN, in the cluster's region (``[sqs] region``)."""
        return f"arn:aws:sqs:{self.region}:{qs.ACCOUNT}:{name}"

    async def _check_redrive_target(self, source: str, attributes: dict[str, str], fifo: bool) -> None:
        """A RedrivePolicy being set names an existing queue other than ``source`` of the source's
        type (a FIFO queue's dead-letter queue is a FIFO queue, a standard queue's a standard queue)
        whose RedriveAllowPolicy lets ``source`` send it dead letters (as AWS checks it)."""
        raw = attributes.get(qs.REDRIVE_POLICY)
        if not raw:
            return
        policy = orjson.loads(raw)
        target = str(policy["deadLetterTargetArn"]).rsplit(":", 1)[-1]
        reason = None
        if target == source:
            reason = "a queue cannot be its own dead-letter queue"
        else:
            try:
                found = await self._queue_named(target)
            except SqsError:
                reason = "Dead letter target does not exist"
            else:
                if qs.is_fifo(found) != fifo:
                    reason = (
                        "The dead-letter queue of a FIFO queue must also be a FIFO queue"
                        if fifo
                        else "The dead-letter queue of a standard queue must also be a standard queue"
                    )
                elif not qs.allows_redrive_from(found, self.queue_arn(source)):
                    reason = "the dead-letter queue's RedriveAllowPolicy does not allow this source queue"
        if reason is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {raw} for parameter RedrivePolicy is invalid. Reason: {reason}.",
            )

    async def _queue(self, params: dict[str, Any]) -> Topic:
        url = params.get("QueueUrl")
        if not isinstance(url, str) or not url:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
        name = queue_name_of(url, "QueueUrl")  # as access.authorize read it: the queue it checked
        if name is None or not qs.QUEUE_NAME.match(name):
            raise SqsError("InvalidAddress", "The address is not valid for this endpoint.")
        return await self._queue_named(name)

    async def _queue_named(self, name: str) -> Topic:
        try:
            topic = await self.api.topic(name)
        except RaftmqError as e:
            if e.error is errors.TOPIC_NOT_FOUND:
                raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None
            raise
        if not qs.is_queue(topic):
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        return topic

    def _max_size(self, topic: Topic) -> int:
        return qs.queue_setting(topic, "MaximumMessageSize", self.limits.max_message_bytes)

    async def create_queue(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("QueueName")
        if not isinstance(name, str) or not name:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
        raw = params.get("Attributes")
        fifo = isinstance(raw, dict) and raw.get("FifoQueue") == "true"
        if fifo and (not name.endswith(qs.FIFO_SUFFIX) or not qs.QUEUE_NAME.match(name)):
            raise SqsError(
                "InvalidParameterValue",
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                "underscores, must end with .fifo suffix and be 1 to 80 in length.",
            )
        if not fifo and (name.endswith(qs.FIFO_SUFFIX) or not qs.QUEUE_NAME.match(name)):
            raise SqsError(
                "InvalidParameterValue",
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
                + (
                    " (a FIFO queue's name ends with .fifo with the attribute FifoQueue true)"
                    if name.endswith(qs.FIFO_SUFFIX)
                    else ""
                ),
            )
        wanted = qs.check_attributes(
            raw, self.limits.max_message_bytes, self.region, fifo=fifo, creating=True
        )
        if fifo:
            qs.check_fifo_settings(wanted)
        tags = qs.check_tags(params["tags"], name) if params.get("tags") is not None else {}
        # The queue's current RedrivePolicy repeated by a token refused on its dead-letter queue:
        # the queue as read at the metadata leader, compared below, nothing created or written.
        repeated = await current_policy_repeated(
            "CreateQueue", request.get(PRINCIPAL), self.api, name, wanted
        )
        if repeated is None:
            topic = await self._existing_or_created(name, wanted, tags, fifo)
        else:
            topic = repeated
        if not qs.is_queue(topic):
            raise SqsError("QueueNameExists", f"A raftmq topic named {name} exists and is not an SQS queue.")
        if qs.is_fifo(topic) != fifo:
            raise SqsError(
                "QueueNameExists",
                "A queue already exists with the same name and a different value for FifoQueue.",
            )
        for key, value in wanted.items():
            bound = qs.SETTABLE.get(key[len(qs.PREFIX) :])
            default = None if bound is None else str(bound.default)
            if key[len(qs.PREFIX) :] in qs.FIFO_SETTINGS:
                default = qs.FIFO_SETTINGS[key[len(qs.PREFIX) :]][0]
            if topic.attributes.get(key, default) != value:
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and a different value for {key[4:]}.",
                )
        # Tags given for an existing queue must be its tags, as AWS answers (it does not re-tag it:
        # TagQueue and UntagQueue do).
        if tags and tags != topic.tags:
            raise SqsError("QueueNameExists", "A queue already exists with the same name and different tags.")
        await self._ensure_subscription(topic)
        return {"QueueUrl": self.queue_url(request, name)}

    async def _existing_or_created(
        self, name: str, wanted: dict[str, str], tags: dict[str, str], fifo: bool
    ) -> Topic:
        """The queue ``name`` (compared with ``wanted`` by the caller), created when missing, once
        the dead-letter queue of its RedrivePolicy is checked: a token with the right there (or no
        token) has a repeated policy checked as any other, as AWS does."""
        await self._check_redrive_target(name, wanted, fifo)
        try:
            return await self.api.topic(name)
        except RaftmqError as e:
            if e.error is not errors.TOPIC_NOT_FOUND:
                raise
        return await self._create_topic(name, wanted, tags)

    async def cluster_applies(self, capability: str) -> bool:
        """Whether every node of the cluster applies ``capability`` (each configured node, not only
        a group's voters: any node serves SQS), as each advertised last (``Node.peer_releases``);
        while one has not, the peers are asked again first (this gate refuses only during an
        upgrade, and only the few requests that set what it guards)."""
        node = self.node
        peers = [n.id for n in node.config.nodes if n.id != node.me.id]
        if not everywhere(capability, node.capabilities, peers, node.peer_releases.capable):
            await node.refresh_peer_status()
        return everywhere(capability, node.capabilities, peers, node.peer_releases.capable)

    async def _check_fifo_release(self, fifo: bool, changes: dict[str, str]) -> None:
        """A FIFO queue's DelaySeconds other than 0 or RedrivePolicy only once every node serves
        them (:data:`qs.FIFO_RELEASE`: a node of the release before would not)."""
        if fifo and qs.needs_fifo_release(changes) and not await self.cluster_applies(qs.FIFO_RELEASE):
            raise SqsError(
                "ServiceUnavailable",
                "A node of the cluster runs an older release (a rolling upgrade): a FIFO queue's "
                "DelaySeconds and RedrivePolicy can be set once every node is upgraded.",
            )

    async def _create_topic(self, name: str, attributes: dict[str, str], tags: dict[str, str]) -> Topic:
        await self._check_fifo_release(attributes.get(qs.FIFO) == "true", attributes)
        now_s = str(now_ms() // 1000)
        # A FIFO queue is one queue in one queue group: its order, deduplication window and
        # sequence numbers are one Raft log's (docs/sqs.md, FIFO queues).
        fifo = attributes.get(qs.FIFO) == "true"
        command: dict[str, Any] = {
            "op": "create_topic",
            "name": name,
            "queues": 1
            if fifo
            else max(1, min(self.node.config.queue_groups, 16, self.limits.max_queues_per_topic)),
            "attributes": {qs.CREATED: now_s, qs.MODIFIED: now_s, **attributes},
        }
        if tags:  # a field of its own level: without tags, no wait for it in a rolling upgrade
            command["tags"] = tags
        try:
            result = await self.api.router.group_call(META, "topic_command", command)
        except RaftmqError as e:
            if e.error is not errors.TOPIC_EXISTS:
                raise
            return await self.api.topic(name, fresh=True)  # created meanwhile: compare with it
        return Topic.from_json(result["topic"])

    async def _ensure_subscription(self, topic: Topic) -> None:
        """Store the ``sqs`` subscription in every queue group of the topic (SQS's redelivery:
        no backoff, no dead letters), once per topic on this node."""
        if topic.id in self._subscribed:
            return
        body = {
            "group": GROUP,
            "topic_id": topic.id,
            "topic": topic.name,
            "dlq_topic_id": None,
            "max_deliveries": MAX_DELIVERIES,
            "backoff_ms": [0],
            "overwrite": True,
        }
        await asyncio.gather(
            *(self.api.router.group_call(g, "subscribe", body) for g in sorted(set(topic.queue_groups)))
        )
        if len(self._subscribed) > 4096:
            self._subscribed.clear()
        self._subscribed.add(topic.id)

    async def get_queue_url(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("QueueName")
        if not isinstance(name, str) or not name:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
        if not qs.QUEUE_NAME.match(name):
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        await self._queue_named(name)
        return {"QueueUrl": self.queue_url(request, name)}

    async def _all_topics(self) -> list[Topic]:
        if self.node.metadata is not None:
            return self.node.metadata.topics()
        leader = await self.api.router.wait_leader(META, self.api.leader_wait_s)
        status, data, _ = await self.node.peer_request("GET", leader, "/v1/topics", timeout_s=5.0)
        if status != 200:
            raise SqsError("ServiceUnavailable", "The metadata group did not answer; try again.")
        return [Topic.from_json(t) for t in orjson.loads(data)["topics"]]

    async def list_queues(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        prefix = params.get("QueueNamePrefix") or ""
        if not isinstance(prefix, str):
            raise SqsError("InvalidParameterValue", "QueueNamePrefix must be a string.")
        return await self._queue_page(
            request, params, "QueueUrls", lambda t: qs.is_queue(t) and t.name.startswith(prefix)
        )

    async def list_dead_letter_source_queues(
        self, request: web.Request, params: dict[str, Any]
    ) -> dict[str, Any]:
        """The queues whose RedrivePolicy names this queue as their dead-letter queue."""
        target = await self._queue(params)

        def is_source(t: Topic) -> bool:
            policy = qs.redrive_policy(t) if qs.is_queue(t) else None
            return policy is not None and policy.target == target.name

        return await self._queue_page(request, params, "queueUrls", is_source)

    async def _queue_page(
        self, request: web.Request, params: dict[str, Any], member: str, wanted: Callable[[Topic], bool]
    ) -> dict[str, Any]:
        """One page of the queue URLs ``wanted`` picks (ListQueues, ListDeadLetterSourceQueues):
        ``MaxResults`` (1-1,000) and ``NextToken`` (by name); without ``MaxResults`` up to 1,000
        and no token, as AWS. On a cluster with tokens only the queues the token has a right on."""
        paged = params.get("MaxResults") is not None or params.get("NextToken") is not None
        max_results = int_param(params, "MaxResults", 1, 1000, 1000)
        after = ""
        token = params.get("NextToken")
        if token is not None:
            bad = SqsError("InvalidParameterValue", "Invalid NextToken value.")
            if not isinstance(token, str):
                raise bad
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
                raise bad from None
        grant = request.get(PRINCIPAL)
        names = sorted(
            t.name
            for t in await self._all_topics()
            if wanted(t) and t.name > after and (grant is None or grant.allows_any(t.name))
        )
        page = names[:max_results]
        result: dict[str, Any] = {member: [self.queue_url(request, n) for n in page]}
        if paged and len(names) > max_results:
            result["NextToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        return result

    async def delete_queue(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        try:
            await self.api.remove_topic(topic.name)
        except RaftmqError as e:
            if e.error is not errors.TOPIC_NOT_FOUND:
                raise
        self._subscribed.discard(topic.id)
        return {}

    async def set_queue_attributes(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        if not params.get("Attributes"):
            raise SqsError("MissingParameter", "The request must contain the parameter Attributes.")
        fifo = qs.is_fifo(topic)
        changes = qs.check_attributes(
            params["Attributes"], self.limits.max_message_bytes, self.region, fifo=fifo
        )
        if fifo:
            qs.check_fifo_settings({**topic.attributes, **changes})
        grant = request.get(PRINCIPAL)
        repeated = await current_policy_repeated("SetQueueAttributes", grant, self.api, topic.name, changes)
        if repeated is not None:  # the queue's current policy, for a token refused on its target
            changes = {k: v for k, v in changes.items() if k != qs.REDRIVE_POLICY}
        await self._check_redrive_target(topic.name, changes, fifo)
        await self._check_fifo_release(fifo, changes)
        command = {
            "op": "set_topic_attributes",
            "name": topic.name,
            "attributes": {**changes, qs.MODIFIED: str(now_ms() // 1000)},
        }
        await self.api.router.group_call(META, "topic_command", command)
        return {}

    async def get_queue_attributes(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        names = params.get("AttributeNames") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise SqsError("InvalidAttributeName", "AttributeNames must be a list of names.")
        wanted = set(_QUEUE_ATTRIBUTES) if "All" in names else set(names)
        unknown = wanted - set(_QUEUE_ATTRIBUTES)
        if unknown:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
        values: dict[str, str] = {}
        values["QueueArn"] = self.queue_arn(topic.name)
        values["CreatedTimestamp"] = topic.attributes.get(qs.CREATED, "0")
        values["LastModifiedTimestamp"] = topic.attributes.get(qs.MODIFIED, values["CreatedTimestamp"])
        for name in qs.SETTABLE:
            cap = self.limits.max_message_bytes if name == "MaximumMessageSize" else None
            values[name] = str(qs.queue_setting(topic, name, cap))
        # A redrive policy names other queues: only those the token has a right on (visibility.py).
        # Its own RedriveAllowPolicy whole to an admin of the queue (a tool writes it back).
        grant, names = request.get(PRINCIPAL), self.api.permission_names
        owner = await grant_owns(grant, names, topic.name)
        shown = await visible_attributes(topic.attributes, grant_sees(grant, names), owner=owner)
        for name in (*qs.REDRIVE, *qs.STORED):
            if shown.get(qs.PREFIX + name):  # "" : removed
                values[name] = shown[qs.PREFIX + name]
        if qs.is_fifo(topic):
            values["FifoQueue"] = "true"
            for name in qs.FIFO_SETTINGS:
                values[name] = qs.fifo_setting(topic.attributes, name)
        if wanted & set(_QUEUE_COUNTS):
            with_delayed = "ApproximateNumberOfMessagesDelayed" in wanted
            visible, in_flight, delayed = await self._counts(topic, with_delayed)
            values["ApproximateNumberOfMessages"] = str(visible)
            values["ApproximateNumberOfMessagesNotVisible"] = str(in_flight)
            values["ApproximateNumberOfMessagesDelayed"] = str(delayed)
        return {"Attributes": {k: v for k, v in values.items() if k in wanted}}

    async def _counts(self, topic: Topic, with_delayed: bool) -> tuple[int, int, int]:
        """(visible, in flight, delayed) of the queue, summed over its queue groups' leaders (a
        monitoring read, as AWS's approximate numbers are): the ``sqs`` subscription's lag less
        what is in flight, what is in flight, and (only ``with_delayed``: it reads the group's
        due-time index) the messages sent with a delay and not released yet."""
        visible = in_flight = delayed = 0
        # A FIFO queue's messages are appended at once and hidden for its delay at each receive
        # (``delivery/ordered.py``): those not due yet are part of the lag, counted apart.
        fifo_delay_ms = qs.queue_setting(topic, "DelaySeconds") * 1000 if qs.is_fifo(topic) else 0
        for g in sorted(set(topic.queue_groups)):
            rows, delayed_by_queue, not_due = await self._group_counts(
                str(g), topic, with_delayed, fifo_delay_ms
            )
            queues = {q for q, qg in enumerate(topic.queue_groups) if qg == g}
            for r in rows:
                if r["group"] == GROUP and r["queue"] in queues:
                    in_flight += r["in_flight"]
                    visible += max(0, r["lag"] - r["in_flight"] - not_due.get(r["queue"], 0))
            delayed += sum(n for q, n in [*delayed_by_queue.items(), *not_due.items()] if q in queues)
        return visible, in_flight, delayed

    async def _group_counts(
        self, name: str, topic: Topic, with_delayed: bool, fifo_delay_ms: int = 0
    ) -> tuple[list[dict[str, Any]], dict[int, int], dict[int, int]]:
        """The consumer rows of the topic in queue group ``name``, its delayed messages per
        queue (empty unless ``with_delayed``) and, with ``fifo_delay_ms``, its messages not due
        for that delay per queue, read at the group's leader: here, or at its
        ``/internal/groups/{name}/consumers`` (a leader of a release before a figure answers
        without it: none counted)."""
        local = self.node.groups.get(name)
        try:  # only a leader that serves reads answers: its state holds every acknowledged write
            here = local is not None and await self.api.router.reads_here(name)
        except RaftmqError:
            raise SqsError("ServiceUnavailable", f"queue group {name} is electing; try again.") from None
        if here:
            assert local is not None
            loop = asyncio.get_running_loop()
            store = local.machine.store
            try:  # scans of the group's keys: off the event loop, as the REST consumer view
                found = await loop.run_in_executor(None, consumer_queues, store, topic.id)
                counted = (
                    await self.api.delayed_counts.of(
                        name, store, lambda: local.machine.applied_index, topic.id
                    )
                    if with_delayed
                    else {}
                )
            except StoreError:  # the store is being swapped for a restored checkpoint
                raise SqsError("ServiceUnavailable", f"queue group {name} is restoring; try again.") from None
            not_due = await not_due_counts(store, GROUP, topic.id, fifo_delay_ms) if fifo_delay_ms else {}
            if not_due is None:
                raise SqsError("ServiceUnavailable", f"queue group {name} is restoring; try again.")
            return [dataclasses.asdict(r) for r in found], counted, not_due
        path = f"/internal/groups/{name}/consumers?topic_id={topic.id}"
        path += "&delayed=1" if with_delayed else ""
        path += f"&not_due_ms={fifo_delay_ms}&not_due_group={GROUP}" if fifo_delay_ms else ""
        try:
            answer = await self.api.router.read_at_leader(name, path, timeout_s=3.0)
        except RaftmqError:
            raise SqsError("ServiceUnavailable", f"queue group {name} did not answer; try again.") from None
        delayed = {int(q): int(n) for q, n in answer.get("delayed", {}).items()}
        return answer["rows"], delayed, {int(q): int(n) for q, n in answer.get("not_due", {}).items()}

    # -- tags and permissions ---------------------------------------------------------------------

    async def tag_queue(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        if not params.get("Tags"):
            raise SqsError("MissingParameter", "The request must contain the parameter Tags.")
        await self._set_tags(topic, qs.check_tags(params["Tags"], topic.name))
        return {}

    async def untag_queue(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        keys = qs.check_tag_keys(params.get("TagKeys"))
        await self._set_tags(topic, dict.fromkeys(keys))  # null: removed (a missing key: nothing)
        return {}

    async def list_queue_tags(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        return {"Tags": dict(topic.tags)} if topic.tags else {}  # AWS leaves Tags out when none

    async def _set_tags(self, topic: Topic, changes: Mapping[str, str | None]) -> None:
        """Merge ``changes`` into the queue's tags in the metadata group (the machine merges, so
        two TagQueue calls at once both land); more than 50 after the merge changes nothing."""
        command = {"op": "set_topic_tags", "name": topic.name, "tags": dict(changes)}
        try:
            await self.api.router.group_call(META, "topic_command", command)
        except RaftmqError as e:
            if e.error is not errors.BAD_REQUEST:
                raise
            raise SqsError(
                "InvalidParameterValue", f"Too many tags added for queue {topic.name}: {e.message}."
            ) from None

    async def refuse_permission(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        """AddPermission and RemovePermission: refused, as AWS policies do not map to raftmq's
        token rights (docs/sqs.md). The queue must exist, as AWS checks it first."""
        await self._queue(params)
        raise SqsError(
            "UnsupportedOperation",
            "raftmq does not keep SQS permission policies: access to a queue is given by the "
            "permissions of API tokens (admin, produce, consume; see docs/security.md).",
        )

    async def purge_queue(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        topic = await self._queue(params)
        described = await self.api.describe(topic)
        by_group: dict[int, dict[str, int]] = defaultdict(dict)
        for q in described["queues"]:
            if q["high_offset"] is None:
                raise SqsError("ServiceUnavailable", "A queue's leader did not answer; try again.")
            by_group[q["group_id"]][str(q["queue"])] = q["high_offset"]
        await asyncio.gather(
            *(
                self.api.router.group_call(
                    g, "commit", {"group": GROUP, "topic_id": topic.id, "offsets": offsets}
                )
                for g, offsets in by_group.items()
            )
        )
        return {}
