"""Topic handlers of the HTTP API v1: create, list, describe, change attributes or retention and delete
(``POST/GET /v1/topics``, ``GET/PATCH/DELETE /v1/topics/{topic}``); topics live in the metadata
group. The list shows dead-letter topics under their source (:func:`topic_list`).

``POST /v1/topics`` creates one topic (``{"name", ...}``) or many (``{"topics": [{"name", ...},
...]}``: one ``create_topics`` entry, one result per topic; ``raftmq topic create`` with many names).
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.common import json_response
from raftmq.cluster.api.core import ApiCore
from raftmq.cluster.api.validation import (
    parse_create_topic,
    parse_create_topics,
    parse_json,
    parse_topic_patch,
)
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import CatalogError, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.metadata import Topic

__all__ = ["TopicHandlers"]

log = structlog.get_logger(__name__)


def dead_letter_sources(topics: list[Topic]) -> dict[str, tuple[str, str]]:
    """``{dead-letter topic: (source topic, consumer group)}``: the topics whose record
    (``Topic.dead_letter_of``) names a source that exists, never guessed from a name."""
    by_id = {t.id: t for t in topics}
    found: dict[str, tuple[str, str]] = {}
    for t in topics:
        if t.dead_letter_of is None:
            continue
        source_id, group = t.dead_letter_of
        source = by_id.get(source_id)
        if source is not None:
            found[t.name] = (source.name, group)
    return found


def topic_list(topics: list[Topic]) -> list[dict[str, Any]]:
    """The ``GET /v1/topics`` answer's topics: each dead-letter topic right after its source (and
    its source's other dead-letter topics), marked ``dead_letter_of``; the rest by name."""
    sources = dead_letter_sources(topics)
    out = []
    for t in sorted(topics, key=lambda t: (sources.get(t.name, (t.name, ""))[0], t.name in sources, t.name)):
        item = t.to_json()
        item.pop("dead_letter_of", None)  # ids; the answer names the source
        if t.name in sources:
            source, group = sources[t.name]
            item["dead_letter_of"] = {"topic": source, "group": group}
        out.append(item)
    return out


class TopicHandlers(ApiCore):
    """Topic handlers, mixed into ``Api`` (``cluster/api/app.py``)."""

    async def create_topic(self, request: web.Request) -> web.Response:
        body = await request.read()
        parsed = parse_json(body)
        if isinstance(parsed, dict) and "topics" in parsed:
            return await self._create_topics(request, body, parse_create_topics(parsed, self.limits))
        spec = parse_create_topic(parsed, self.limits)
        if not self.router.leads(META):
            return await self.forward(request, META, body)
        result = await self._propose_create("create_topic", spec)
        topic = Topic.from_json(result["topic"])
        return json_response(await self._describe(topic), status=201)

    async def _create_topics(
        self, request: web.Request, body: bytes, specs: list[dict[str, Any]]
    ) -> web.Response:
        """Create the topics ``specs`` in one metadata entry: ``200 {"results": [...]}`` in their
        order, ``{"name", "topic"}`` (the topic as the list shows it) or ``{"name", "error"}`` (e.g.
        ``topic_exists``: that topic alone is not created). A voter that does not apply
        ``create_topics`` yet makes it 503 ``upgrade_in_progress``, nothing created (the CLI then
        creates them one by one)."""
        if not self.router.leads(META):
            return await self.forward(request, META, body)
        result = await self._propose_create("create_topics", {"topics": specs})
        results: list[dict[str, Any]] = []
        for spec, item in zip(specs, result["results"], strict=True):
            if "topic" in item:
                results.append({"name": spec["name"], "topic": item["topic"]})
            else:
                results.append({"name": spec["name"], **CatalogError.from_body(item["error"]).body()})
        return json_response({"results": results})

    async def _propose_create(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Propose ``create_topic`` or ``create_topics`` (this node leads the metadata group), with
        the time and the group count the leader gives every topic it makes."""
        command = {"v": 1, "op": op, "now_ms": now_ms(), "group_count": self.node.config.queue_groups}
        return await self.router.propose_checked(META, orjson.dumps({**command, **fields}))

    async def list_topics(self, request: web.Request) -> web.Response:
        if self.router.leads(META):
            await self.router.barrier(META)
            assert self.node.metadata is not None
            return json_response({"topics": topic_list(self.node.metadata.topics())})
        return await self.forward(request, META)

    async def get_topic(self, request: web.Request) -> web.Response:
        topic = await self.topic(request.match_info["topic"])
        return json_response(await self._describe(topic))

    async def patch_topic(self, request: web.Request) -> web.Response:
        """``PATCH /v1/topics/{topic}``: its attributes (``set_topic_attributes``) or its retention
        bounds (``set_topic_retention``), one metadata entry."""
        change = parse_topic_patch(parse_json(await request.read()))
        topic = await self.topic(request.match_info["topic"])
        command = {**change, "name": topic.name}
        result = await self.router.group_call(META, "topic_command", command)
        return json_response(await self._describe(Topic.from_json(result["topic"])))

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not self.router.leads(META):
            return await self.forward(request, META)
        await self.remove_topic(name)
        return json_response({"deleted": name})

    async def remove_topic(self, name: str) -> Topic:
        """Delete topic ``name`` (at the metadata leader, wherever it is) and free its data.

        Raises:
            ApiError: ``topic_not_found``, or the metadata group's failure.
        """
        result = await self.router.group_call(META, "topic_command", {"op": "delete_topic", "name": name})
        topic = Topic.from_json(result["deleted"])
        # Free the data; topic ids are never reused, so a failure here only leaves garbage.
        for g in sorted(set(topic.queue_groups)):
            try:
                await self.router.group_call(g, "drop", {"topic_id": topic.id})
            except RaftmqError as e:
                log.warning("drop_topic_failed", group=g, topic_id=topic.id, error=e.message)
        return topic
