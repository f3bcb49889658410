"""Receive/ack, dead letters, queue locks and subscription settings over HTTP (``docs/delivery.md``).

Public routes (any node answers; the state lives in the queue groups, see ``cluster/delivery.py``)::

    POST   /v1/topics/{topic}/subscriptions/{group}/receive   {"max", "wait_ms", "visibility_ms",
                                                                "queue"?, "epoch"?}
    POST   /v1/topics/{topic}/subscriptions/{group}/ack       {"receipts", "epoch"?}
    POST   /v1/topics/{topic}/subscriptions/{group}/nack      {"receipts", "delay_ms"?, "epoch"?}
    POST   /v1/topics/{topic}/subscriptions/{group}/extend    {"receipts", "visibility_ms"?, "epoch"?}
    PUT    /v1/topics/{topic}/subscriptions/{group}           {"max_deliveries"?, "backoff_ms"?}
    GET    /v1/topics/{topic}/subscriptions/{group}/dlq       ?max=&queue=
    POST   /v1/topics/{topic}/subscriptions/{group}/dlq/redrive  {"max"?, "queue"?}
    POST   /v1/topics/{topic}/queues/{queue}/locks/{group}    {"consumer", "lease_ms"}
    DELETE /v1/topics/{topic}/queues/{queue}/locks/{group}    ?consumer=&epoch=

Receives of one (topic, consumer group) are coordinated by one node: the leader of the queue group
holding the topic's queue 0 (a locked receive: the leader of its queue's group); other nodes
forward to it. The coordinator keeps its waiting receivers in arrival order and serves them from
the queue groups' leaders (internal action ``receive``, which proposes a ``receive`` command only
when something is available), the head of the line first: waiting receivers are served round
robin. Acks, nacks and extends go straight to the queue groups of their receipts.

Internal actions (``Api.internal_action``) at a queue group's leader: ``subscribe``, ``receive``,
``await`` (wait until something is available, hand out nothing), ``ack``, ``nack``, ``extend``,
``lock``, ``unlock``, ``commit_fenced``, ``redrive``, ``dlq_list``; at the metadata leader:
``ensure_dlq``; at a receive coordinator: ``take`` (wait in its line, as a push stream does:
``cluster/push_api.py``).
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web

from raftmq.storage.queues import OffsetOutOfRange, lock_state, read_messages
from raftmq.storage.records import Message
from raftmq.storage.store import Store

from . import commands, errors
from .delivery import available, dlq_topic_name
from .http_api import FORWARDED, _group_name, json_response
from .metadata import Topic, validate_topic_name
from .node import META, Node, now_ms
from .settle_commit import SettleCommitter
from .validation import ApiError, bad, parse_json, query_int

if TYPE_CHECKING:
    from .http_api import Api

__all__ = ["INTERNAL_ACTIONS", "SubscriptionsApi", "add_subscription_routes", "format_receipt"]

log = structlog.get_logger(__name__)

INTERNAL_ACTIONS = frozenset(
    {
        "subscribe",
        "receive",
        "await",
        "ack",
        "nack",
        "extend",
        "lock",
        "unlock",
        "commit_fenced",
        "redrive",
        "dlq_list",
        "ensure_dlq",
        "take",
    }
)
_STAMPED_ACTIONS = frozenset({"ack", "nack", "extend", "lock", "redrive"})
_SETTLE_ACTIONS = frozenset({"ack", "nack", "extend"})
_COMMAND_ACTIONS = _STAMPED_ACTIONS | {"subscribe", "unlock", "commit_fenced"}
MAX_REMOTE_AWAIT_S = 5.0  # a remote ``await`` is re-armed at least this often
LEADERSHIP_CHECK_S = 1.0  # a waiting coordinator checks at least this often that it still leads
SUBSCRIPTION_REFRESH_S = 60.0  # how long a coordinator trusts that a subscription is in place
DEFAULT_REDRIVE = 1000
MAX_CONSUMER_BYTES = commands.MAX_NAME_BYTES


def format_receipt(topic_id: int, queue: int, offset: int, token: int) -> str:
    """A receipt: opaque to clients; ``topic_id.queue.offset.token`` (the token is the raft index
    of the delivering ``receive``, so a receipt names one delivery)."""
    return f"{topic_id}.{queue}.{offset}.{token}"


_NUMBER = "(0|[1-9][0-9]{0,19})"  # no sign, no leading zero, ASCII digits only
_RECEIPT = re.compile(r"\.".join([_NUMBER] * 4))


def _parse_receipt(text: Any, i: int) -> tuple[int, int, int, int]:
    match = _RECEIPT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise bad(f"receipts[{i}] is not a receipt")
    topic_id, queue, offset, token = map(int, match.groups())
    if topic_id >= 2**32 or queue >= 2**32 or offset >= 2**64 or token >= 2**64:
        raise bad(f"receipts[{i}] is not a receipt")
    return topic_id, queue, offset, token


def _int_field(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    if name not in body:
        if default is None:
            raise bad(f"'{name}' is required")
        return default
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad(f"'{name}' must be an integer from {lo} to {hi}")
    return value


def _object(raw: bytes, allowed: set[str]) -> dict[str, Any]:
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"body: unknown field(s) {', '.join(map(repr, unknown))}")
    return body


def _message_json(m: Message) -> dict[str, Any]:
    item: dict[str, Any] = {
        "offset": m.offset,
        "key": m.key,
        "timestamp_ms": m.timestamp_ms,
        "headers": m.headers or {},
    }
    if m.binary:
        item["value_b64"] = base64.b64encode(m.value).decode()
    else:
        item["value"] = m.value.decode()
    return item


def _read(store: Store, topic_id: int, queue: int, offsets: list[int]) -> dict[int, Message]:
    """The messages at ``offsets`` of one queue, reading runs of consecutive offsets together."""
    found: dict[int, Message] = {}
    ordered = sorted(set(offsets))
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        try:
            count = end - start + 1
            for m in read_messages(store, topic_id, queue, ordered[start], count, first_chunk=1):
                found[m.offset] = m
        except OffsetOutOfRange:
            pass  # retention removed it after it was handed out; it will expire and be finished
        start = end + 1
    return found


@dataclass
class _Waiter:
    max: int
    visibility_ms: int
    deadline: float  # time.monotonic()
    future: asyncio.Future[list[dict[str, Any]]]


@dataclass
class _Target:
    """What one coordinator serves: a topic, a consumer group, the queues by queue group, and the
    epoch of a locked receive (None: any unlocked queue)."""

    topic: Topic
    group: str
    by_group: dict[int, list[int]]
    coordinator: str  # the group whose leader serves this target
    epoch: int | None = None
    waiters: deque[_Waiter] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    rotation: int = 0


class SubscriptionsApi:
    """Handlers and internal actions; one instance per node (``Api.delivery``)."""

    actions = INTERNAL_ACTIONS

    def __init__(self, node: Node, api: Api) -> None:
        self.node = node
        self.api = api
        self._targets: dict[tuple[int, str, int | None, int | None], _Target] = {}
        self._subscribed: dict[tuple[int, str], float] = {}
        self._settlers: dict[str, SettleCommitter] = {}  # per queue group led here

    @property
    def limits(self) -> Any:
        return self.node.config.limits

    # -- helpers ----------------------------------------------------------------------------------

    def _group(self, request: web.Request, topic: Topic | None = None) -> str:
        """The consumer group of a subscription route; it must fit a topic name, since it names
        the dead-letter topic ``<topic>.<group>.dlq``."""
        group = request.match_info["group"]
        problem = validate_topic_name(group)
        if problem is None and topic is not None:
            problem = validate_topic_name(dlq_topic_name(topic.name, group))
        if problem:
            raise bad(f"consumer group {group!r} cannot name a dead-letter topic: {problem}")
        return group

    async def _ensure_dlq(self, topic: Topic, group: str) -> Topic:
        try:
            dlq = await self.api.topic(dlq_topic_name(topic.name, group))
            if dlq.queue_groups == topic.queue_groups:
                return dlq
        except ApiError as e:
            if e.code is not errors.TOPIC_NOT_FOUND:
                raise
        result = await self.api._group_call(META, "ensure_dlq", {"source": topic.name, "group": group})
        return Topic.from_json(result["topic"])

    async def _ensure_subscription(self, topic: Topic, group: str) -> None:
        """Create the dead-letter topic and the subscription in every queue group of the topic
        (with the cluster's defaults; an existing subscription keeps its settings)."""
        key = (topic.id, group)
        if time.monotonic() - self._subscribed.get(key, -SUBSCRIPTION_REFRESH_S) < SUBSCRIPTION_REFRESH_S:
            return
        await self._subscribe(topic, group, None, None)
        self._subscribed[key] = time.monotonic()

    async def _subscribe(
        self, topic: Topic, group: str, max_deliveries: int | None, backoff_ms: list[int] | None
    ) -> dict[str, Any]:
        dlq = await self._ensure_dlq(topic, group)
        settings = self.node.config.delivery
        body = {
            "group": group,
            "topic_id": topic.id,
            "topic": topic.name,
            "dlq_topic_id": dlq.id,
            "max_deliveries": max_deliveries or settings.max_deliveries,
            "backoff_ms": backoff_ms or list(settings.backoff_ms),
            "overwrite": max_deliveries is not None or backoff_ms is not None,
        }
        results = await asyncio.gather(
            *(self.api._group_call(g, "subscribe", body) for g in sorted(set(topic.queue_groups)))
        )
        stored: dict[str, Any] = results[0]["subscription"]
        return {
            "topic": topic.name,
            "group": group,
            "dead_letter_topic": dlq.name,
            "max_deliveries": stored["max_deliveries"],
            "backoff_ms": stored["backoff_ms"],
        }

    def _by_group(self, topic: Topic, queues: list[int]) -> dict[int, list[int]]:
        by_group: dict[int, list[int]] = defaultdict(list)
        for q in queues:
            by_group[topic.queue_groups[q]].append(q)
        return dict(by_group)

    def _queue(self, request: web.Request, topic: Topic) -> int:
        q = query_int({"queue": request.match_info["queue"]}, "queue", None, 0, 2**31)
        if q >= topic.queues:
            raise ApiError(
                errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {q}"
            )
        return q

    # -- receive ----------------------------------------------------------------------------------

    async def receive(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self._group(request, topic)
        raw = await request.read()
        body = _object(raw, {"max", "wait_ms", "visibility_ms", "queue", "epoch"})
        limits = self.limits
        max_messages = _int_field(
            body,
            "max",
            limits.default_fetch_messages,
            1,
            min(limits.max_fetch_messages, commands.MAX_RECEIVE),
        )
        wait_ms = _int_field(body, "wait_ms", 0, 0, limits.max_wait_ms)
        visibility_ms = _int_field(
            body, "visibility_ms", limits.default_visibility_ms, 1, limits.max_visibility_ms
        )
        if ("queue" in body) != ("epoch" in body):
            raise bad("'queue' and 'epoch' go together (a receive under a queue lock)")
        queue = _int_field(body, "queue", None, 0, 2**31) if "queue" in body else None
        epoch = _int_field(body, "epoch", None, 0, 2**63 - 1) if "epoch" in body else None
        if queue is not None and queue >= topic.queues:
            raise ApiError(
                errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {queue}"
            )
        coordinator = str(topic.queue_groups[queue or 0])
        key = (topic.id, group, queue, epoch)
        deadline = time.monotonic() + wait_ms / 1000
        give_up = deadline + self.api.leader_wait_s
        while True:  # the coordinator can move (a leader change) while the receiver waits
            if not self.api._leads(coordinator):
                await self._new_leader_known(coordinator)
                if self.api._leads(coordinator):
                    continue
                remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    return await self.api._forward(
                        request, coordinator, orjson.dumps({**body, "wait_ms": remaining_ms})
                    )
                except ApiError as e:
                    # "electing": the leadership came here while forwarding; look again.
                    if e.code is not errors.UNAVAILABLE or time.monotonic() > give_up:
                        raise
                    await asyncio.sleep(0.1)  # (or the leader is unreachable: do not spin)
                    self.node.forget_peer_status()
                    continue
            await self._ensure_subscription(topic, group)
            waiter = _Waiter(
                max_messages, visibility_ms, deadline, asyncio.get_running_loop().create_future()
            )
            self._enqueue(key, waiter, lambda: self._target(topic, group, queue, epoch, coordinator))
            try:
                return json_response({"messages": await waiter.future})
            except ApiError as e:
                if e.code is not errors.NOT_LEADER or request.headers.get(FORWARDED):
                    raise  # a forwarding node retries a not_leader answer at the new leader itself
            await self._new_leader_known(coordinator)

    async def take(
        self, topic: Topic, group: str, max_messages: int, visibility_ms: int, wait_ms: int
    ) -> list[dict[str, Any]]:
        """Wait in this coordinator's line like an HTTP receive (same round robin, deadlines and
        receipts) and return what was handed out (the push stream's source, ``cluster/push_api.py``).

        Raises:
            ApiError: ``not_leader`` when this node does not coordinate (topic, group) (nothing
                was handed out); any error of the receive.
        """
        coordinator = str(topic.queue_groups[0])
        if not self.api._leads(coordinator):
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not coordinate {topic.name}/{group}")
        await self._ensure_subscription(topic, group)
        deadline = time.monotonic() + wait_ms / 1000
        waiter = _Waiter(max_messages, visibility_ms, deadline, asyncio.get_running_loop().create_future())
        key = (topic.id, group, None, None)
        self._enqueue(key, waiter, lambda: self._target(topic, group, None, None, coordinator))
        return await waiter.future

    async def settle(
        self, topic: Topic, group: str, op: str, receipts: list[str], fields: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """``ack``, ``nack`` or ``extend`` checked ``receipts`` and ``fields`` as the HTTP routes
        do (the push stream's FIN, REQ and TOUCH); one result per receipt."""
        return await self._receipts_call(topic, group, op, receipts, fields)

    def _target(
        self, topic: Topic, group: str, queue: int | None, epoch: int | None, coordinator: str
    ) -> _Target:
        queues = list(range(topic.queues)) if queue is None else [queue]
        return _Target(topic, group, self._by_group(topic, queues), coordinator, epoch)

    def _enqueue(
        self, key: tuple[int, str, int | None, int | None], waiter: _Waiter, make: Callable[[], _Target]
    ) -> None:
        """Put ``waiter`` at the end of its target's line and make sure the line is served."""
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = make()
        target.waiters.append(waiter)
        target.arrived.set()
        if target.task is None or target.task.done():
            target.task = asyncio.create_task(self._serve(key, target))

    async def _new_leader_known(self, name: str) -> None:
        """Until this node leads group ``name`` again or knows another leader (a leadership transfer
        takes a moment to be seen), at most ``leader_wait_s``."""
        deadline = time.monotonic() + self.api.leader_wait_s
        while time.monotonic() < deadline and not self.api._leads(name):
            leader = self.node.leader_of(name)
            if leader is not None and leader.id != self.node.me.id:
                return
            await asyncio.sleep(0.05)

    async def _serve(self, key: tuple[int, str, int | None, int | None], target: _Target) -> None:
        """Serve the waiting receivers of one target, the head of the line first."""
        try:
            while True:
                self._drop_done(target)
                if not target.waiters:
                    self._targets.pop(key, None)
                    return
                if not self.api._leads(target.coordinator):
                    # Leadership moved: the new leader coordinates, and the waiters move there
                    # (serving them here too would break the line).
                    self._targets.pop(key, None)
                    self._fail(target, ApiError(errors.NOT_LEADER, "the receive coordinator moved"))
                    return
                target.arrived.clear()
                head = target.waiters[0]
                line = [w for w in target.waiters if w.visibility_ms == head.visibility_ms]
                demand = min(sum(w.max for w in line), commands.MAX_RECEIVE)
                got = await self._take(target, demand, head.visibility_ms)
                self._hand_out(target, got)
                now = time.monotonic()
                for w in list(target.waiters):
                    if w.deadline <= now:
                        target.waiters.remove(w)
                        if not w.future.done():
                            w.future.set_result([])
                if got or not target.waiters:
                    continue
                await self._wait(target, min(w.deadline for w in target.waiters))
        except ApiError as e:
            self._fail(target, e)
        except Exception:
            log.exception("receive_dispatch_failed", topic=target.topic.name, group=target.group)
            self._fail(target, ApiError(errors.INTERNAL, "internal error; see the node's log"))
        finally:
            if self._targets.get(key) is target and not target.waiters:
                self._targets.pop(key, None)

    @staticmethod
    def _drop_done(target: _Target) -> None:
        for w in [w for w in target.waiters if w.future.done()]:  # the client went away
            target.waiters.remove(w)

    @staticmethod
    def _fail(target: _Target, e: ApiError) -> None:
        while target.waiters:
            w = target.waiters.popleft()
            if not w.future.done():
                w.future.set_exception(e)

    def _hand_out(self, target: _Target, got: list[dict[str, Any]]) -> None:
        """Give messages to the waiters in line order, each up to its ``max``."""
        rest = got
        while rest:
            self._drop_done(target)
            if not target.waiters:
                # Nobody left to take them (clients went away): give them back at once.
                receipts = [m["receipt"] for m in rest]
                task = asyncio.create_task(self._give_back(target, receipts))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                return
            w = target.waiters.popleft()
            part, rest = rest[: w.max], rest[w.max :]
            w.future.set_result(part)

    async def _give_back(self, target: _Target, receipts: list[str]) -> None:
        await self._receipts_call(target.topic, target.group, "nack", receipts, {"delay_ms": 0})

    async def _take(self, target: _Target, demand: int, visibility_ms: int) -> list[dict[str, Any]]:
        """Receive up to ``demand`` messages from the queue groups, one after the other (starting
        group and queue order rotate, so no queue is always served first)."""
        target.rotation += 1
        groups = sorted(target.by_group)
        start = target.rotation % len(groups)
        got: list[dict[str, Any]] = []
        failures = 0
        for g in groups[start:] + groups[:start]:
            if len(got) >= demand:
                break
            queues = target.by_group[g]
            turn = target.rotation % len(queues)
            body = {
                "group": target.group,
                "topic_id": target.topic.id,
                "queues": queues[turn:] + queues[:turn],
                "max": demand - len(got),
                "visibility_ms": visibility_ms,
                "epoch": target.epoch,
                "max_age_ms": target.topic.retention_ms,
            }
            try:
                got += (await self.api._group_call(g, "receive", body))["messages"]
            except ApiError as e:
                if not e.code.retriable:
                    raise
                failures += 1
                log.info("receive_group_unavailable", group_id=g, code=e.code.code)
        if failures == len(groups):
            await asyncio.sleep(0.2)  # every group is electing: do not spin
        return got

    async def _wait(self, target: _Target, until: float) -> None:
        """Until something may be available in one of the target's queue groups, a new receiver
        arrives, or ``until``."""
        timeout = min(until - time.monotonic(), LEADERSHIP_CHECK_S)
        if timeout <= 0:
            return
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(target.arrived.wait())]
        for g, queues in target.by_group.items():
            tasks.append(asyncio.create_task(self._await_group(g, target, queues, timeout)))
        try:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _await_group(self, g: int, target: _Target, queues: list[int], timeout: float) -> None:
        name = str(g)
        if self.api._leads(name):
            await self.await_available(name, target.topic.id, target.group, queues, target.epoch, timeout)
            return
        body = {
            "group": target.group,
            "topic_id": target.topic.id,
            "queues": queues,
            "epoch": target.epoch,
            "wait_ms": int(min(timeout, MAX_REMOTE_AWAIT_S) * 1000),
        }
        try:
            await self.api._group_call(g, "await", body)
        except ApiError:
            await asyncio.sleep(0.2)  # the group is electing; try again a little later

    async def await_available(
        self, name: str, topic_id: int, group: str, queues: list[int], epoch: int | None, timeout_s: float
    ) -> bool:
        """Wait (at most ``timeout_s``) until a receive from this replica's queues could hand out
        something: the queue grew, a retry is due, a lock was released or ran out."""
        deadline = time.monotonic() + timeout_s
        store = self.node.groups[name].machine.store
        while True:
            ok, wake_ms = available(store, group, topic_id, queues, now_ms(), epoch)
            remaining = deadline - time.monotonic()
            if ok or remaining <= 0:
                return ok
            if wake_ms is not None:
                remaining = min(remaining, max(0.001, (wake_ms - now_ms()) / 1000))
            waits = [asyncio.create_task(self.node.wait_for_messages(topic_id, q, remaining)) for q in queues]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                await asyncio.gather(*waits, return_exceptions=True)

    # -- ack, nack, extend ------------------------------------------------------------------------

    async def ack(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "ack", set())

    async def nack(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "nack", {"delay_ms"})

    async def extend(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "extend", {"visibility_ms"})

    async def _receipts(self, request: web.Request, op: str, extra: set[str]) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self._group(request, topic)
        body = _object(await request.read(), {"receipts", "epoch", *extra})
        receipts = body.get("receipts")
        if not isinstance(receipts, list) or not 1 <= len(receipts) <= commands.MAX_RECEIPTS:
            raise bad(f"'receipts' must be a list of 1 to {commands.MAX_RECEIPTS} receipts")
        fields: dict[str, Any] = {}
        if "epoch" in body:
            fields["epoch"] = _int_field(body, "epoch", None, 0, 2**63 - 1)
        if op == "nack" and "delay_ms" in body:
            fields["delay_ms"] = _int_field(body, "delay_ms", None, 0, self.limits.max_delay_ms)
        if op == "extend":
            limits = self.limits
            fields["visibility_ms"] = _int_field(
                body, "visibility_ms", limits.default_visibility_ms, 1, limits.max_visibility_ms
            )
        results = await self._receipts_call(topic, group, op, receipts, fields)
        return json_response({"results": results})

    async def _receipts_call(
        self, topic: Topic, group: str, op: str, receipts: list[str], fields: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Apply ``op`` to each receipt at its queue group; one result per receipt, in order.
        Every receipt is parsed before anything is sent (one that is not a receipt: 400)."""
        results: list[dict[str, Any] | None] = [None] * len(receipts)
        # Per queue group: the receipts' positions, and the receipts as the command has them.
        by_group: dict[int, tuple[list[int], list[list[int]]]] = {}
        for i, text in enumerate(receipts):
            topic_id, queue, offset, token = _parse_receipt(text, i)
            if topic_id != topic.id or queue >= topic.queues:
                results[i] = errors.error_body(errors.STALE_RECEIPT, "the receipt is not of this topic")
                continue
            g = topic.queue_groups[queue]
            if g not in by_group:
                by_group[g] = ([], [])
            positions, wire = by_group[g]
            positions.append(i)
            wire.append([queue, offset, token])

        async def call(g: int, items: tuple[list[int], list[list[int]]]) -> ApiError | None:
            positions, wire = items
            body = {"group": group, "topic_id": topic.id, "receipts": wire, **fields}
            try:
                got = (await self.api._group_call(g, op, body))["results"]
            except ApiError as e:
                for i in positions:
                    results[i] = errors.error_body(e.code, e.message, **e.extra)
                return e
            for i, r in zip(positions, got, strict=True):
                results[i] = r
            return None

        failed = await asyncio.gather(*(call(g, items) for g, items in by_group.items()))
        if by_group and all(failed):  # nothing was applied anywhere: answer with the error
            first = failed[0]
            assert first is not None
            raise first
        return [{"receipt": text, **(r or {})} for text, r in zip(receipts, results, strict=True)]

    # -- subscription settings --------------------------------------------------------------------

    async def put_subscription(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self._group(request, topic)
        body = _object(await request.read(), {"max_deliveries", "backoff_ms"})
        max_deliveries = _int_field(body, "max_deliveries", 0, 1, 2**31) if "max_deliveries" in body else None
        backoff = body.get("backoff_ms")
        if "backoff_ms" in body:
            ok = isinstance(backoff, list) and 1 <= len(backoff) <= commands.MAX_BACKOFF_LEVELS
            if not ok or not all(
                isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= self.limits.max_delay_ms
                for b in backoff or ()
            ):
                raise bad(
                    f"'backoff_ms' must be a list of 1 to {commands.MAX_BACKOFF_LEVELS} delays "
                    f"from 0 to {self.limits.max_delay_ms}"
                )
        if max_deliveries is None and backoff is None:
            max_deliveries = self.node.config.delivery.max_deliveries  # reset to the defaults
        return json_response(await self._subscribe(topic, group, max_deliveries, backoff))

    # -- dead letters -----------------------------------------------------------------------------

    async def _dlq(self, topic: Topic, group: str) -> Topic | None:
        try:
            return await self.api.topic(dlq_topic_name(topic.name, group))
        except ApiError as e:
            if e.code is errors.TOPIC_NOT_FOUND:
                return None
            raise

    async def list_dlq(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self._group(request, topic)
        query = request.query
        unknown = set(query) - {"max", "queue"}
        if unknown:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        max_messages = query_int(
            query, "max", self.limits.default_fetch_messages, 1, self.limits.max_fetch_messages
        )
        queues = self._queues_param(topic, query.get("queue"))
        dlq = await self._dlq(topic, group)
        out: dict[str, Any] = {
            "dead_letter_topic": dlq_topic_name(topic.name, group),
            "queues": [],
            "messages": [],
        }
        if dlq is None:
            return json_response(out)
        parts = await asyncio.gather(
            *(
                self.api._group_call(g, "dlq_list", {"topic_id": dlq.id, "queues": qs, "max": max_messages})
                for g, qs in self._by_group(dlq, queues).items()
            )
        )
        for part in parts:
            out["queues"] += part["queues"]
            out["messages"] += part["messages"]
        out["queues"].sort(key=lambda q: q["queue"])
        out["messages"] = sorted(out["messages"], key=lambda m: (m["queue"], m["offset"]))[:max_messages]
        return json_response(out)

    def _queues_param(self, topic: Topic, raw: str | int | None) -> list[int]:
        """All queues, or the one named (a query string or a validated body integer)."""
        if raw is None:
            return list(range(topic.queues))
        q = query_int({"queue": raw}, "queue", None, 0, 2**31) if isinstance(raw, str) else raw
        if q >= topic.queues:
            raise ApiError(
                errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {q}"
            )
        return [q]

    async def redrive(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self._group(request, topic)
        body = _object(await request.read(), {"max", "queue"})
        max_messages = _int_field(body, "max", DEFAULT_REDRIVE, 1, commands.MAX_RECEIVE)
        queue = _int_field(body, "queue", None, 0, 2**31) if "queue" in body else None
        queues = self._queues_param(topic, queue)
        dlq = await self._dlq(topic, group)
        out: dict[str, Any] = {
            "dead_letter_topic": dlq_topic_name(topic.name, group),
            "redriven": 0,
            "queues": [],
            "more": False,
        }
        if dlq is None:
            return json_response(out)
        parts = await asyncio.gather(
            *(
                self.api._group_call(
                    g,
                    "redrive",
                    {
                        "group": group,
                        "topic_id": topic.id,
                        "dlq_topic_id": dlq.id,
                        "queues": qs,
                        "max": max_messages,
                    },
                )
                for g, qs in self._by_group(topic, queues).items()
            )
        )
        for part in parts:
            out["queues"] += part["queues"]
            out["more"] = out["more"] or part["more"]
        out["queues"].sort(key=lambda q: q["queue"])
        out["redriven"] = sum(q["count"] for q in out["queues"])
        return json_response(out)

    # -- locks ------------------------------------------------------------------------------------

    async def lock(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = _group_name(request)
        queue = self._queue(request, topic)
        body = _object(await request.read(), {"consumer", "lease_ms"})
        consumer = body.get("consumer")
        if (
            not isinstance(consumer, str)
            or not 1 <= len(consumer.encode(errors="replace")) <= MAX_CONSUMER_BYTES
        ):
            raise bad(f"'consumer' must be a string of 1 to {MAX_CONSUMER_BYTES} UTF-8 bytes")
        _utf8(consumer, "consumer")
        lease_ms = _int_field(body, "lease_ms", None, 1, self.limits.max_visibility_ms)
        result = await self.api._group_call(
            topic.queue_groups[queue],
            "lock",
            {
                "group": group,
                "topic_id": topic.id,
                "queue": queue,
                "consumer": consumer,
                "lease_ms": lease_ms,
            },
        )
        return json_response({"topic": topic.name, "queue": queue, "group": group, **result})

    async def unlock(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = _group_name(request)
        queue = self._queue(request, topic)
        query = request.query
        unknown = set(query) - {"consumer", "epoch"}
        if unknown:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        consumer = query.get("consumer", "")
        if not 1 <= len(_utf8(consumer, "consumer")) <= MAX_CONSUMER_BYTES:
            raise bad(f"query parameter 'consumer' must be 1 to {MAX_CONSUMER_BYTES} UTF-8 bytes")
        epoch = query_int(query, "epoch", None, 0, 2**63 - 1)
        result = await self.api._group_call(
            topic.queue_groups[queue],
            "unlock",
            {"group": group, "topic_id": topic.id, "queue": queue, "consumer": consumer, "epoch": epoch},
        )
        return json_response(result)

    # -- internal actions (at the group's leader) -------------------------------------------------

    async def internal_action(self, name: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """An internal action at this node, which leads group ``name`` (checked by the caller)."""
        propose = self.api._propose_checked
        if action == "ensure_dlq":
            if name != META:
                raise ApiError(errors.BAD_REQUEST, "ensure_dlq runs at the metadata leader")
            ensure = {
                "v": 1,
                "op": "ensure_dlq_topic",
                "source": body["source"],
                "group": body["group"],
                "now_ms": now_ms(),
            }
            return await propose(META, orjson.dumps(ensure))
        if name == META:
            raise ApiError(errors.BAD_REQUEST, f"{action} runs at a queue group's leader")
        if action == "take":
            topic = await self.api.topic(body["topic"])
            if topic.id != body["topic_id"] or str(topic.queue_groups[0]) != name:
                raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {body['topic']!r} was deleted")
            got = await self.take(topic, body["group"], body["max"], body["visibility_ms"], body["wait_ms"])
            return {"messages": got}
        store = self.node.groups[name].machine.store
        if action == "receive":
            if body.get("epoch") is not None:  # refused now, even when there is nothing to hand out
                _check_lock(store, body["group"], body["topic_id"], body["queues"], body["epoch"])
            ok, _ = available(
                store, body["group"], body["topic_id"], body["queues"], now_ms(), body.get("epoch")
            )
            if not ok:
                return {"messages": []}
            command = commands.receive(
                now_ms(),
                body["group"],
                body["topic_id"],
                body["queues"],
                body["max"],
                body["visibility_ms"],
                epoch=body.get("epoch"),
                max_age_ms=body.get("max_age_ms"),
            )
            return {"messages": self._render(store, body["topic_id"], await propose(name, command))}
        if action == "await":
            ok = await self.await_available(
                name,
                body["topic_id"],
                body["group"],
                body["queues"],
                body.get("epoch"),
                body["wait_ms"] / 1000,
            )
            return {"available": ok}
        if action in _SETTLE_ACTIONS and body.get("epoch") is None:
            return {"results": await self._settle_here(name, action, body)}
        if action in _COMMAND_ACTIONS:
            # The body holds the command's fields; the leader stamps the time (for the ops that
            # take one) and checks the command before proposing it, so bad input costs no entry.
            fields = {k: v for k, v in body.items() if v is not None}
            if action in _STAMPED_ACTIONS:
                fields["now_ms"] = now_ms()
            command = orjson.dumps({"v": commands.VERSION, "op": action, **fields})
            try:
                commands.decode(command)
            except commands.BadCommand as e:
                raise ApiError(e.code, e.message) from None
            return await propose(name, command)
        if action == "dlq_list":
            return self._dlq_list(store, body["topic_id"], body["queues"], body["max"])
        raise ApiError(errors.NOT_FOUND, f"unknown action {action}")

    async def _settle_here(self, name: str, action: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """An ack, nack or extend through the group's :class:`SettleCommitter` (concurrent
        requests share entries). Checked first, so bad input costs no entry and fails no other
        request it would have been merged with."""
        fields = {k: v for k, v in body.items() if v is not None}
        try:
            commands.validate({"v": commands.VERSION, "op": action, "now_ms": 0, **fields})
        except commands.BadCommand as e:
            raise ApiError(e.code, e.message) from None
        settler = self._settlers.get(name)
        if settler is None:
            propose = self.api._propose_checked
            settler = self._settlers[name] = SettleCommitter(lambda c: propose(name, c), now_ms)
        return await settler.settle(action, body["topic_id"], body["group"], body["receipts"], fields)

    @staticmethod
    def _render(store: Store, topic_id: int, result: dict[str, Any]) -> list[dict[str, Any]]:
        token = result["token"]
        delivered = result["messages"]
        by_queue: dict[int, list[int]] = defaultdict(list)
        for d in delivered:
            by_queue[d["queue"]].append(d["offset"])
        found = {q: _read(store, topic_id, q, offsets) for q, offsets in by_queue.items()}
        out = []
        for d in delivered:
            queue, offset = d["queue"], d["offset"]
            m = found[queue].get(offset)
            if m is None:
                continue
            item = {  # the fields of _message_json, built in one go (this runs per message)
                "receipt": f"{topic_id}.{queue}.{offset}.{token}",  # format_receipt
                "attempt": d["attempt"],
                "queue": queue,
                "deadline_ms": d["deadline_ms"],
                "offset": offset,
                "key": m.key,
                "timestamp_ms": m.timestamp_ms,
                "headers": m.headers or {},
            }
            if m.binary:
                item["value_b64"] = base64.b64encode(m.value).decode()
            else:
                item["value"] = m.value.decode()
            out.append(item)
        return out

    @staticmethod
    def _dlq_list(store: Store, topic_id: int, queues: list[int], max_messages: int) -> dict[str, Any]:
        from raftmq.storage.queues import queue_bounds, redrive_offset

        out_queues: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = []
        for q in queues:
            low, high = queue_bounds(store, topic_id, q)
            start = max(low, redrive_offset(store, topic_id, q) or 0)
            out_queues.append({"queue": q, "redrive_offset": start, "high_offset": high})
            room = max_messages - len(messages)
            if room > 0 and start < high:
                messages += [
                    {"queue": q, **_message_json(m)} for m in read_messages(store, topic_id, q, start, room)
                ]
        return {"queues": out_queues, "messages": messages}


def _check_lock(store: Store, group: str, topic_id: int, queues: list[int], epoch: int) -> None:
    """``stale_epoch`` unless each queue is locked with ``epoch`` by a live lease (as the state
    machine's receive would refuse it)."""
    for q in queues:
        state = lock_state(store, group, topic_id, q)
        if state is None or state.epoch != epoch or not state.live(now_ms()):
            raise ApiError(
                errors.STALE_EPOCH,
                f"queue {q} is not locked with epoch {epoch} now",
                queue=q,
                epoch=None if state is None else state.epoch,
            )


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise bad(f"'{name}' is not valid Unicode (lone surrogate)") from None


def add_subscription_routes(app: web.Application, node: Node, api: Api) -> SubscriptionsApi:
    """Register the routes; returns the handler object (``Api.delivery`` refers to it)."""
    handlers = SubscriptionsApi(node, api)
    r = app.router
    sub = "/v1/topics/{topic}/subscriptions/{group}"
    r.add_post(sub + "/receive", handlers.receive)
    r.add_post(sub + "/ack", handlers.ack)
    r.add_post(sub + "/nack", handlers.nack)
    r.add_post(sub + "/extend", handlers.extend)
    r.add_put(sub, handlers.put_subscription)
    r.add_get(sub + "/dlq", handlers.list_dlq)
    r.add_post(sub + "/dlq/redrive", handlers.redrive)
    lock = "/v1/topics/{topic}/queues/{queue}/locks/{group}"
    r.add_post(lock, handlers.lock)
    r.add_delete(lock, handlers.unlock)
    return handlers
