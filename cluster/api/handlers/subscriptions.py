"""Receive/ack, dead letters, queue locks and subscription settings over HTTP (``docs/delivery.md``).

Public routes (any node answers; the state lives in the queue groups, see
``cluster/machines/delivery/__init__.py``)::

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
forward to it. The coordinator's line of waiting receivers, served round robin, is in
``cluster/node/receive_coordinator.py``. Acks, nacks and extends go straight to the queue groups of
their receipts. The dead-letter and lock handlers are in ``cluster/api/handlers/dlq_locks.py``.

The writes at a queue group's leader (``subscribe``, ``receive``, ``ack``, ...) are the node's
(``cluster/node/delivery_actions.py``), reached through the node's ``LeaderRouter``. One action is
the API's own: ``take`` at a receive coordinator (wait in its line, as a push stream does:
``cluster/api/handlers/push.py``), run by :meth:`SubscriptionsApi.take_call`.

Consume rights create nothing lasting: a receive's subscription creates no topic, counts against
the group caps and expires when idle; only an admin's (``PUT``, or its receive) creates the
dead-letter topic, found by its record of (topic id, group) alone (``docs/delivery.md``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.common import json_response
from raftmq.cluster.api.handlers.dlq_locks import DeadLettersAndLocks
from raftmq.cluster.api.handlers.subscription_bodies import (
    int_field,
    json_object,
    parse_receipt,
)
from raftmq.cluster.api.validation import bad
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, RaftmqError, answerable
from raftmq.cluster.base.groups import META
from raftmq.cluster.base.recent_keys import RecentKeys
from raftmq.cluster.config.tokens import ADMIN
from raftmq.cluster.machines.delivery import dlq_topic_name, read_subscription
from raftmq.cluster.machines.metadata import Topic, validate_topic_name
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.parked import Parked
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, Waiter, local_key
from raftmq.cluster.node.router import FORWARDED
from raftmq.cluster.node.upgrade_gate import after_upgrade

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["SubscriptionsApi", "add_subscription_routes"]

log = structlog.get_logger(__name__)

SUBSCRIPTION_REFRESH_S = 60.0  # how long a coordinator trusts that a subscription is in place
SUBSCRIBED_MAX = 4096  # the most (topic, group) pairs a node remembers as subscribed


class SubscriptionsApi:
    """The delivery handlers and the ``take`` action; one instance per node."""

    def __init__(self, node: Node, api: ApiCore) -> None:
        self.node = node
        self.api = api
        self.coordinator = ReceiveCoordinator(node, api.router, self.settle)
        idle_s = node.config.limits.subscription_idle_ms / 1000  # a used one is refreshed well within
        self._subscribed = RecentKeys(SUBSCRIBED_MAX, min(SUBSCRIPTION_REFRESH_S, idle_s / 4 or 1e9))
        self._creating_dlq: set[tuple[int, str]] = set()  # on_parked's tasks under way
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def limits(self) -> Any:
        return self.node.config.limits

    # -- helpers ----------------------------------------------------------------------------------

    def consumer_group(self, request: web.Request, topic: Topic | None = None) -> str:
        """The consumer group of a subscription route; it must fit a topic name, since it names
        the dead-letter topic ``<topic>.<group>.dlq``. Dots stay legal (``svc.billing``): the
        dead-letter topic is found by its record of (topic id, group), never by its name, so a
        group name that spells another topic's dead-letter topic reaches nothing of it."""
        group = request.match_info["group"]
        problem = validate_topic_name(group)
        if problem is None and topic is not None:
            problem = validate_topic_name(dlq_topic_name(topic.name, group))
        if problem:
            raise bad(f"consumer group {group!r} cannot name a dead-letter topic: {problem}")
        return group

    async def dead_letter_topic(self, topic: Topic, group: str, *, fresh: bool = False) -> Topic | None:
        """The dead-letter topic of ``group`` on ``topic``: the one whose record names exactly
        (``topic.id``, ``group``) as its source, or None. The name ``<topic>.<group>.dlq`` only says
        where to look; a topic of that name with another record, or none, is not this group's.
        ``fresh``: read at the metadata leader (after a barrier), not the local replica."""
        try:
            dlq = await self.api.topic(dlq_topic_name(topic.name, group), fresh=fresh)
        except RaftmqError as e:
            if e.error is not errors.TOPIC_NOT_FOUND:
                raise
            return None
        return dlq if dlq.dead_letter_of == (topic.id, group) else None

    async def _ensure_dlq(self, topic: Topic, group: str) -> Topic | None:
        """The dead-letter topic, created by the metadata group if the group has none
        (``dead_letter_topic_conflict`` when another topic holds its name; None during an upgrade)."""
        dlq = await self.dead_letter_topic(topic, group)
        if dlq is not None:
            return dlq
        result = await after_upgrade(
            self.api.router.group_call(META, "ensure_dlq", {"source": topic.name, "group": group})
        )
        return None if result is None else Topic.from_json(result["topic"])

    async def _made_by(self, request: web.Request | None, topic: Topic) -> tuple[bool, str | None]:
        """``(configured, creator)`` of a subscription a receive or push stream makes: configured
        without tokens or for a token with ``admin`` on the topic; else made by the token. A request
        a peer forwarded carries no token: the entry node stored the subscription before forwarding."""
        if not self.node.config.security.enabled:
            return True, None
        grant = None if request is None else request.get(PRINCIPAL)
        if grant is None:
            return False, None
        if all(grant.allows(ADMIN, n) for n in await self.api.permission_names(topic.name)):
            return True, None  # as the routes check it: a dead-letter topic by its source's name
        return False, grant.name

    def known(self, topic: Topic, group: str) -> bool:
        """Whether this node stored or refreshed the subscription of ``group`` on ``topic`` lately
        (:meth:`ensure_subscription` would write nothing)."""
        return self._subscribed.fresh((topic.id, group), time.monotonic())

    async def ensure_subscription(self, topic: Topic, group: str, request: web.Request | None) -> None:
        """Store the subscription in every queue group of the topic (the cluster's defaults; an
        existing one keeps its settings) before a receive or an offset commit, and mark it used.
        It names the dead-letter topic only if that exists: a receive creates no topic. A new
        unconfigured one counts against ``limits.max_groups_per_topic`` / ``_per_token`` (409
        ``too_many_groups``). ``request`` None: the caller's token is not known here (a push
        stream's later takes, an offset read): an existing record keeps its creator and mark."""
        key = (topic.id, group)
        if self._subscribed.fresh(key, time.monotonic()):
            return
        configured, creator = await self._made_by(request, topic)
        await self._subscribe(
            topic, group, None, None, create_dlq=False, configured=configured, creator=creator
        )
        self._subscribed.add(key, time.monotonic())

    async def _subscribe(
        self,
        topic: Topic,
        group: str,
        max_deliveries: int | None,
        backoff_ms: list[int] | None,
        *,
        create_dlq: bool,
        configured: bool = False,
        creator: str | None = None,
        fresh: bool = False,
    ) -> dict[str, Any]:
        if create_dlq:
            dlq: Topic | None = await self._ensure_dlq(topic, group)
        else:
            dlq = await self.dead_letter_topic(topic, group, fresh=fresh)
        settings, limits = self.node.config.delivery, self.limits
        body = {
            "group": group,
            "topic_id": topic.id,
            "topic": topic.name,
            "dlq_topic_id": None if dlq is None else dlq.id,
            "checked": True,  # dlq_topic_id is the metadata group's record (None: there is none)
            "max_deliveries": max_deliveries or settings.max_deliveries,
            "backoff_ms": backoff_ms or list(settings.backoff_ms),
            "overwrite": max_deliveries is not None or backoff_ms is not None,
            "configured": configured or None,
            "creator": creator,
            "max_topic_groups": None if configured else limits.max_groups_per_topic or None,
            "max_token_groups": None
            if configured or creator is None
            else limits.max_groups_per_token or None,
        }
        results = await asyncio.gather(
            *(self.api.router.group_call(g, "subscribe", body) for g in sorted(set(topic.queue_groups)))
        )
        stored: dict[str, Any] = results[0]["subscription"]
        return {
            "topic": topic.name,
            "group": group,
            "dead_letter_topic": dlq_topic_name(topic.name, group) if dlq is None else dlq.name,
            "max_deliveries": stored["max_deliveries"],
            "backoff_ms": stored["backoff_ms"],
        }

    async def take_parked(self) -> None:
        """Take the node's reports of parked dead letters (``Node.parked``) as they come, for as
        long as the application runs."""
        while True:
            self.on_parked(await self.node.parked.get())

    def on_parked(self, parked: Parked) -> None:
        """Applies parked dead letters of these ``(topic_id, topic, group)`` (``Node.parked``,
        on the event loop, on every replica): where this node leads the queue group, record the
        group's dead-letter topic in the subscription of every queue group of the topic, as the
        metadata group's record has it; for a configured subscription (an admin's), have the
        metadata group create it first if there is none. The parked messages move there when their
        retry is due. An unconfigured group's dead letters stay parked (``docs/delivery.md``). If
        this fails (a leader change, the topic deleted), the message is delivered again when due
        and parked again at its next failure, which asks again."""
        for topic_id, topic_name, group in parked:
            key = (topic_id, group)
            if key in self._creating_dlq:
                continue
            self._creating_dlq.add(key)
            task = asyncio.create_task(self._create_dlq_for(topic_id, topic_name, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _create_dlq_for(self, topic_id: int, topic_name: str, group: str) -> None:
        try:
            topic = await self.api.topic(topic_name)
            led = [g for g in sorted(set(topic.queue_groups)) if await self.api.router.reads_here(str(g))]
            if topic.id != topic_id or not led:
                return  # deleted, or a follower's replica: the leader's does this
            stored = read_subscription(self.node.groups[str(led[0])].machine.store, topic.id, group)
            configured = stored is not None and stored.configured
            if not configured and stored is not None and stored.dlq_checked and stored.dlq_topic_id is None:
                return  # checked already: nothing to record, nothing may be created
            await self._subscribe(topic, group, None, None, create_dlq=configured, fresh=True)
            if configured:
                log.info("dead_letter_topic_recorded", topic=topic.name, group=group)
        except RaftmqError as e:
            log.warning("dead_letter_topic_not_created", topic=topic_name, group=group, error=e.message)
        except Exception:
            log.exception("dead_letter_topic_not_created", topic=topic_name, group=group)
        finally:
            self._creating_dlq.discard((topic_id, group))

    # -- receive ----------------------------------------------------------------------------------

    async def receive(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self.consumer_group(request, topic)
        raw = await request.read()
        body = json_object(raw, {"max", "wait_ms", "visibility_ms", "queue", "epoch"})
        limits = self.limits
        max_messages = int_field(
            body,
            "max",
            limits.default_fetch_messages,
            1,
            min(limits.max_fetch_messages, commands.MAX_RECEIVE),
        )
        wait_ms = int_field(body, "wait_ms", 0, 0, limits.max_wait_ms)
        visibility_ms = int_field(
            body, "visibility_ms", limits.default_visibility_ms, 1, limits.max_visibility_ms
        )
        if ("queue" in body) != ("epoch" in body):
            raise bad("'queue' and 'epoch' go together (a receive under a queue lock)")
        queue = int_field(body, "queue", None, 0, 2**31) if "queue" in body else None
        epoch = int_field(body, "epoch", None, 0, 2**63 - 1) if "epoch" in body else None
        if queue is not None and queue >= topic.queues:
            raise ApiError(
                errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {queue}"
            )
        coordinator = str(topic.queue_groups[queue or 0])
        # Before any forwarding: here the token is known (caps and creator); a peer's forwarded
        # request carries none, and finds the subscription stored already.
        await self.ensure_subscription(topic, group, request)
        key = (topic.id, group, queue, epoch, False, False)
        deadline = time.monotonic() + wait_ms / 1000
        give_up = deadline + self.api.leader_wait_s
        while True:  # the coordinator can move (a leader change) while the receiver waits
            if not self.api.router.leads(coordinator):
                await self.coordinator.new_leader_known(coordinator)
                if self.api.router.leads(coordinator):
                    continue
                remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    return await self.api.forward(
                        request, coordinator, orjson.dumps({**body, "wait_ms": remaining_ms})
                    )
                except RaftmqError as e:
                    # "electing": the leadership came here while forwarding; look again.
                    if e.error is not errors.UNAVAILABLE or time.monotonic() > give_up:
                        raise
                    await asyncio.sleep(0.1)  # (or the leader is unreachable: do not spin)
                    self.node.forget_peer_status()
                    continue
            await self.ensure_subscription(topic, group, request)
            waiter = Waiter(max_messages, visibility_ms, deadline, asyncio.get_running_loop().create_future())
            self.coordinator.enqueue(
                key, waiter, lambda: self.coordinator.target(topic, group, queue, epoch, coordinator)
            )
            try:
                return json_response({"messages": await waiter.future})
            except RaftmqError as e:
                if e.error is not errors.NOT_LEADER or request.headers.get(FORWARDED):
                    raise  # a forwarding node retries a not_leader answer at the new leader itself
            await self.coordinator.new_leader_known(coordinator)

    async def take(
        self,
        topic: Topic,
        group: str,
        max_messages: int,
        visibility_ms: int,
        wait_ms: int,
        ordered: bool = False,
        delay_ms: int = 0,
    ) -> list[dict[str, Any]]:
        """Wait in this coordinator's line like an HTTP receive (same round robin, deadlines and
        receipts) and return what was handed out (the push stream's source, ``cluster/api/handlers/push.py``).
        ``ordered``: in a line of its own, by ``receive_ordered`` (the SQS API's FIFO queues), a
        message handed out first no earlier than its timestamp plus ``delay_ms``.

        Raises:
            ApiError: ``not_leader`` when this node does not coordinate (topic, group) (nothing
                was handed out); any error of the receive.
        """
        coordinator = str(topic.queue_groups[0])
        if not self.api.router.leads(coordinator):
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not coordinate {topic.name}/{group}")
        await self.ensure_subscription(topic, group, None)
        deadline = time.monotonic() + wait_ms / 1000
        future = asyncio.get_running_loop().create_future()
        waiter = Waiter(max_messages, visibility_ms, deadline, future, delay_ms if ordered else 0)
        key = (topic.id, group, None, None, ordered, False)
        self.coordinator.enqueue(
            key, waiter, lambda: self.coordinator.target(topic, group, None, None, coordinator, ordered)
        )
        return await waiter.future

    async def take_here(
        self, topic: Topic, group: str, max_messages: int, visibility_ms: int, wait_ms: int
    ) -> list[dict[str, Any]]:
        """As :meth:`take`, in a line of this node's own, whatever it leads (no forwarding hop to
        the receive coordinator): the messages come from the queue groups' leaders as the
        coordinator's do, but the round robin is among the receivers waiting here only (the SQS
        API's standard queues, ``docs/sqs.md``). Not for ordered receives: a FIFO queue's
        message groups need its one coordinator.

        Raises:
            RaftmqError: any error of the receive (nothing was handed out).
        """
        await self.ensure_subscription(topic, group, None)
        deadline = time.monotonic() + wait_ms / 1000
        waiter = Waiter(max_messages, visibility_ms, deadline, asyncio.get_running_loop().create_future())
        key = local_key(topic.id, group)
        self.coordinator.enqueue(key, waiter, lambda: self.coordinator.target(topic, group, None, None, None))
        return await waiter.future

    async def ack(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "ack", set())

    async def nack(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "nack", {"delay_ms"})

    async def extend(self, request: web.Request) -> web.Response:
        return await self._receipts(request, "extend", {"visibility_ms"})

    async def _receipts(self, request: web.Request, op: str, extra: set[str]) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self.consumer_group(request, topic)
        body = json_object(await request.read(), {"receipts", "epoch", *extra})
        receipts = body.get("receipts")
        if not isinstance(receipts, list) or not 1 <= len(receipts) <= commands.MAX_RECEIPTS:
            raise bad(f"'receipts' must be a list of 1 to {commands.MAX_RECEIPTS} receipts")
        fields: dict[str, Any] = {}
        if "epoch" in body:
            fields["epoch"] = int_field(body, "epoch", None, 0, 2**63 - 1)
        if op == "nack" and "delay_ms" in body:
            fields["delay_ms"] = int_field(body, "delay_ms", None, 0, self.limits.max_delay_ms)
        if op == "extend":
            limits = self.limits
            fields["visibility_ms"] = int_field(
                body, "visibility_ms", limits.default_visibility_ms, 1, limits.max_visibility_ms
            )
        results = await self.settle(topic, group, op, receipts, fields)
        return json_response({"results": results})

    async def settle(
        self,
        topic: Topic,
        group: str,
        op: str,
        receipts: list[str],
        fields: dict[str, Any],
        *,
        read_ahead: bool = False,
    ) -> list[dict[str, Any]]:
        """Apply ``op`` (``ack``, ``nack``, ``extend`` or ``release``) to each receipt at its queue
        group, with ``fields`` checked as the HTTP routes check them (the push stream's FIN, REQ
        and TOUCH, the SQS API's deletes); one result per receipt, in order. Every receipt is
        parsed before anything is sent (one that is not a receipt: 400). ``read_ahead`` (an ack of
        the SQS API's standard queues): a queue group of the receipts whose voters all apply
        ``ack_receive`` takes the next messages of this node's own line (:meth:`take_here`) along
        in its entry, for its next receive (``ReceiveCoordinator.read_ahead_wanted``)."""
        results: list[dict[str, Any] | None] = [None] * len(receipts)
        # Per queue group: the receipts' positions, and the receipts as the command has them.
        by_group: dict[int, tuple[list[int], list[list[int]]]] = {}
        for i, text in enumerate(receipts):
            topic_id, queue, offset, token = parse_receipt(text, i)
            if topic_id != topic.id or queue >= topic.queues:
                results[i] = errors.error_body(errors.STALE_RECEIPT, "the receipt is not of this topic")
                continue
            g = topic.queue_groups[queue]
            if g not in by_group:
                by_group[g] = ([], [])
            positions, wire = by_group[g]
            positions.append(i)
            wire.append([queue, offset, token])

        key = local_key(topic.id, group)
        plan = None
        if read_ahead and op == "ack" and not fields:
            candidates = [g for g in by_group if self.node.group_supports(str(g), "ack_receive")]
            plan = self.coordinator.read_ahead_wanted(key, topic, candidates)
        started = time.monotonic()
        taken: list[dict[str, Any]] = []

        async def call(g: int, items: tuple[list[int], list[list[int]]]) -> RaftmqError | None:
            positions, wire = items
            body = {"group": group, "topic_id": topic.id, "receipts": wire, **fields}
            action = op
            if plan is not None and g == plan.group:
                action = "ack_receive"
                body["queues"], body["max"], body["visibility_ms"] = plan.queues, plan.max, plan.taken_ms
                body["max_age_ms"] = topic.retention_ms
            try:
                answer = await self.api.router.group_call(g, action, body)
                got = answer["results"]
                taken.extend(answer.get("messages") or ())
            except RaftmqError as caught:
                e = answerable(caught, write=True)
                for i in positions:
                    results[i] = e.body()
                return e
            for i, r in zip(positions, got, strict=True):
                results[i] = r
            return None

        try:
            failed = await asyncio.gather(*(call(g, items) for g, items in by_group.items()))
        finally:
            if plan is not None:
                self.coordinator.put_ahead(key, topic, group, taken, plan, started)
        if by_group and all(failed):  # nothing was applied anywhere: answer with the error
            first = failed[0]
            assert first is not None
            raise first
        return [{"receipt": text, **(r or {})} for text, r in zip(receipts, results, strict=True)]

    # -- subscription settings --------------------------------------------------------------------

    async def put_subscription(self, request: web.Request) -> web.Response:
        topic = await self.api.topic(request.match_info["topic"])
        group = self.consumer_group(request, topic)
        body = json_object(await request.read(), {"max_deliveries", "backoff_ms"})
        max_deliveries = int_field(body, "max_deliveries", 0, 1, 2**31) if "max_deliveries" in body else None
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
        subscription = await self._subscribe(
            topic, group, max_deliveries, backoff, create_dlq=True, configured=True
        )
        return json_response(subscription)

    # -- the take action (at the receive coordinator) ---------------------------------------------

    async def take_call(self, g: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``take`` (``body``: topic, topic_id, group, max, visibility_ms, wait_ms) at the receive
        coordinator of a topic, the leader of its queue 0's group ``g``: here, or at that leader's
        ``/internal/groups/{g}/take``. The messages handed out."""
        here = lambda: self.take_action(str(g), body)  # noqa: E731
        result = await self.api.router.group_call(g, "take", body, here=here)
        messages: list[dict[str, Any]] = result["messages"]
        return messages

    async def take_action(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """The ``take`` action at this node, the leader of group ``name``: wait in the line of
        the topic's receive coordinator (:meth:`take`)."""
        topic = await self.api.topic(body["topic"])
        if topic.id != body["topic_id"] or str(topic.queue_groups[0]) != name:
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {body['topic']!r} was deleted")
        got = await self.take(
            topic,
            body["group"],
            body["max"],
            body["visibility_ms"],
            body["wait_ms"],
            body.get("ordered") is True,
            _delay_ms(body),
        )
        return {"messages": got}


def _delay_ms(body: dict[str, Any]) -> int:
    """A ``take``'s ``delay_ms`` (an SQS FIFO queue's DelaySeconds; 0: none)."""
    value = body.get("delay_ms")
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= commands.MAX_DURATION_MS:
        raise bad("'delay_ms' must be a duration in milliseconds")
    return value


def add_subscription_routes(app: web.Application, handlers: SubscriptionsApi) -> None:
    """Register the routes of ``handlers`` (the node's one :class:`SubscriptionsApi`, which push
    streams, the offset API and the SQS API use too)."""
    r = app.router
    sub = "/v1/topics/{topic}/subscriptions/{group}"
    r.add_post(sub + "/receive", handlers.receive)
    r.add_post(sub + "/ack", handlers.ack)
    r.add_post(sub + "/nack", handlers.nack)
    r.add_post(sub + "/extend", handlers.extend)
    r.add_put(sub, handlers.put_subscription)
    dlq_locks = DeadLettersAndLocks(handlers)
    r.add_get(sub + "/dlq", dlq_locks.list_dlq)
    r.add_post(sub + "/dlq/redrive", dlq_locks.redrive)
    lock = "/v1/topics/{topic}/queues/{queue}/locks/{group}"
    r.add_post(lock, dlq_locks.lock)
    r.add_delete(lock, dlq_locks.unlock)

    async def release_read_ahead(app: web.Application) -> None:
        # A graceful stop gives back what the node read ahead (docs/sqs.md, Read-ahead): at the
        # shutdown, and once more after the requests under way ended (a delete among them may
        # have taken some along); the queue groups are still served until node.stop().
        await handlers.coordinator.read_ahead.stop()

    app.on_shutdown.append(release_read_ahead)
    app.on_cleanup.append(release_read_ahead)

    async def take_parked(app: web.Application) -> None:
        task = asyncio.create_task(handlers.take_parked())

        async def stop(app: web.Application) -> None:
            task.cancel()

        app.on_cleanup.append(stop)

    app.on_startup.append(take_parked)
