"""Topic handlers of the HTTP API v1: create, list, describe and delete (``POST/GET
/v1/topics``, ``GET/DELETE /v1/topics/{topic}``); topics live in the metadata group.
"""

from __future__ import annotations

import orjson
import structlog
from aiohttp import web

from . import commands
from .api_core import ApiCore
from .http_common import json_response
from .metadata import Topic
from .node import META, now_ms
from .validation import ApiError, parse_create_topic, parse_json

__all__ = ["TopicHandlers"]

log = structlog.get_logger(__name__)


class TopicHandlers(ApiCore):
    """Topic handlers, mixed into ``Api`` (``cluster/http_api.py``)."""

    async def create_topic(self, request: web.Request) -> web.Response:
        body = await request.read()
        spec = parse_create_topic(parse_json(body), self.limits)
        if not self._leads(META):
            return await self._forward(request, META, body)
        command = orjson.dumps(
            {
                "v": 1,
                "op": "create_topic",
                "now_ms": now_ms(),
                "group_count": self.node.config.queue_groups,
                **spec,
            }
        )
        result = await self._propose_checked(META, command)
        topic = Topic.from_json(result["topic"])
        return json_response(await self._describe(topic), status=201)

    async def list_topics(self, request: web.Request) -> web.Response:
        if self._leads(META):
            await self._propose_checked(META, commands.noop())
            assert self.node.metadata is not None
            topics = [t.to_json() for t in self.node.metadata.topics()]
            return json_response({"topics": topics})
        return await self._forward(request, META)

    async def get_topic(self, request: web.Request) -> web.Response:
        topic = await self.topic(request.match_info["topic"])
        return json_response(await self._describe(topic))

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not self._leads(META):
            return await self._forward(request, META)
        result = await self._propose_checked(META, orjson.dumps({"v": 1, "op": "delete_topic", "name": name}))
        topic = Topic.from_json(result["deleted"])
        # Free the data; topic ids are never reused, so a failure here only leaves garbage.
        for g in sorted(set(topic.queue_groups)):
            try:
                await self._group_call(g, "drop", {"topic_id": topic.id})
            except ApiError as e:
                log.warning("drop_topic_failed", group=g, topic_id=topic.id, error=e.message)
        return json_response({"deleted": name})
