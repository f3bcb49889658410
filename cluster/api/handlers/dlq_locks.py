"""Dead letters and queue locks over HTTP (``docs/delivery.md``); the routes are registered by
``add_subscription_routes`` (``cluster/api/handlers/subscriptions.py``)::

    GET    /v1/topics/{topic}/subscriptions/{group}/dlq       ?max=&queue=
    POST   /v1/topics/{topic}/subscriptions/{group}/dlq/redrive  {"max"?, "queue"?}
    POST   /v1/topics/{topic}/queues/{queue}/locks/{group}    {"consumer", "lease_ms"}
    DELETE /v1/topics/{topic}/queues/{queue}/locks/{group}    ?consumer=&epoch=

Their internal actions at a queue group's leader (``dlq_list``, ``lock``, ``unlock``, ``redrive``)
are the node's (``cluster/node/delivery_actions.py``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.common import group_name, json_response
from raftmq.cluster.api.handlers.subscription_bodies import int_field, json_object
from raftmq.cluster.api.validation import bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.machines.delivery import dlq_topic_name
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.receive_coordinator import queues_by_group

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["DeadLettersAndLocks", "SubscriptionsView"]

DEFAULT_REDRIVE = 1000
MAX_CONSUMER_BYTES = commands.MAX_NAME_BYTES


class SubscriptionsView(Protocol):
    """What these handlers use of ``SubscriptionsApi`` (``handlers/subscriptions.py``)."""

    @property
    def api(self) -> ApiCore: ...

    @property
    def limits(self) -> Any: ...

    def consumer_group(self, request: web.Request, topic: Topic | None = None) -> str: ...

    async def dead_letter_topic(self, topic: Topic, group: str, *, fresh: bool = False) -> Topic | None: ...

    async def ensure_subscription(self, topic: Topic, group: str, request: web.Request | None) -> None: ...


class DeadLettersAndLocks:
    """The dead-letter and queue-lock handlers; one instance per node, next to its
    ``SubscriptionsApi`` (seen as a :class:`SubscriptionsView`), whose topic lookups, consumer-group
    check and limits they share."""

    def __init__(self, subs: SubscriptionsView) -> None:
        self.subs = subs
        self.api = subs.api

    @property
    def limits(self) -> Any:
        return self.subs.limits

    def _group(self, request: web.Request, topic: Topic | None = None) -> str:
        return self.subs.consumer_group(request, topic)

    def _queue(self, request: web.Request, topic: Topic) -> int:
        q = query_int({"queue": request.match_info["queue"]}, "queue", None, 0, 2**31)
        if q >= topic.queues:
            raise ApiError(
                errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {q}"
            )
        return q

    # -- dead letters -----------------------------------------------------------------------------

    async def _dlq(self, topic: Topic, group: str) -> Topic | None:
        """The group's dead-letter topic by its record of (topic id, group), never by its name
        alone (``SubscriptionsApi.dead_letter_topic``)."""
        return await self.subs.dead_letter_topic(topic, group)

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
            "dead_letter_topic": dlq_topic_name(topic.name, group) if dlq is None else dlq.name,
            "queues": [],
            "messages": [],
        }
        if dlq is None:
            return json_response(out)
        parts = await asyncio.gather(
            *(
                self.api.router.group_call(
                    g, "dlq_list", {"topic_id": dlq.id, "queues": qs, "max": max_messages}
                )
                for g, qs in queues_by_group(dlq, queues).items()
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
        body = json_object(await request.read(), {"max", "queue"})
        max_messages = int_field(body, "max", DEFAULT_REDRIVE, 1, commands.MAX_RECEIVE)
        queue = int_field(body, "queue", None, 0, 2**31) if "queue" in body else None
        queues = self._queues_param(topic, queue)
        dlq = await self._dlq(topic, group)
        out: dict[str, Any] = {
            "dead_letter_topic": dlq_topic_name(topic.name, group) if dlq is None else dlq.name,
            "redriven": 0,
            "queues": [],
            "more": False,
        }
        if dlq is None:
            return json_response(out)
        parts = await asyncio.gather(
            *(
                self.api.router.group_call(
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
                for g, qs in queues_by_group(topic, queues).items()
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
        group = group_name(request)  # as the offset API's: an ordered consumer commits there
        queue = self._queue(request, topic)
        body = json_object(await request.read(), {"consumer", "lease_ms"})
        consumer = body.get("consumer")
        if (
            not isinstance(consumer, str)
            or not 1 <= len(consumer.encode(errors="replace")) <= MAX_CONSUMER_BYTES
        ):
            raise bad(f"'consumer' must be a string of 1 to {MAX_CONSUMER_BYTES} UTF-8 bytes")
        _utf8(consumer, "consumer")
        lease_ms = int_field(body, "lease_ms", None, 1, self.limits.max_visibility_ms)
        # A lock is kept under its group's subscription, as a receive's state is: a new group
        # counts against the group caps (409 too_many_groups), and an unconfigured one expires
        # with its lock after limits.subscription_idle_ms unused (a renewal uses it).
        await self.subs.ensure_subscription(topic, group, request)
        result = await self.api.router.group_call(
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
        group = group_name(request)
        queue = self._queue(request, topic)
        query = request.query
        unknown = set(query) - {"consumer", "epoch"}
        if unknown:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        consumer = query.get("consumer", "")
        if not 1 <= len(_utf8(consumer, "consumer")) <= MAX_CONSUMER_BYTES:
            raise bad(f"query parameter 'consumer' must be 1 to {MAX_CONSUMER_BYTES} UTF-8 bytes")
        epoch = query_int(query, "epoch", None, 0, 2**63 - 1)
        result = await self.api.router.group_call(
            topic.queue_groups[queue],
            "unlock",
            {"group": group, "topic_id": topic.id, "queue": queue, "consumer": consumer, "epoch": epoch},
        )
        return json_response(result)


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise bad(f"'{name}' is not valid Unicode (lone surrogate)") from None
