"""Consumer-group membership routes: join/heartbeat and leave (served by the metadata leader)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from .membership import GroupMembership
from .metadata import TOPIC_NAME
from .node import META, Node, now_ms
from .validation import bad, parse_json

if TYPE_CHECKING:
    from .http_api import Api

__all__ = ["add_group_routes"]

MAX_MEMBER_ID_BYTES = 255
MAX_SUBSCRIBED_TOPICS = 100


def _check_group(group: str) -> None:
    if not TOPIC_NAME.match(group):
        raise bad("consumer group names are 1-200 characters of A-Z a-z 0-9 . _ -")


def add_group_routes(app: web.Application, node: Node, api: Api) -> None:
    from .http_api import json_response

    membership = GroupMembership()

    def coordinator_term() -> int:
        return node.groups[META].raft.status().term

    async def join(request: web.Request) -> web.Response:
        group = request.match_info["group"]
        _check_group(group)
        body_bytes = await request.read()
        body: Any = parse_json(body_bytes)
        if not isinstance(body, dict) or set(body) - {"member_id", "topics"}:
            raise bad('body must be {"member_id": str, "topics": [str, ...]}')
        member_id, topics = body.get("member_id"), body.get("topics")
        if not isinstance(member_id, str) or not member_id or len(member_id.encode()) > MAX_MEMBER_ID_BYTES:
            raise bad(f"'member_id' must be a non-empty string of at most {MAX_MEMBER_ID_BYTES} bytes")
        if (
            not isinstance(topics, list)
            or not topics
            or len(topics) > MAX_SUBSCRIBED_TOPICS
            or not all(isinstance(t, str) for t in topics)
        ):
            raise bad(f"'topics' must be a list of 1 to {MAX_SUBSCRIBED_TOPICS} topic names")
        if not api._leads(META):
            return await api._forward(request, META, body_bytes)
        counts = {}
        for name in topics:
            counts[name] = (await api.topic(name)).queues
        membership.set_term(coordinator_term())
        membership.heartbeat(group, member_id, topics, now_ms())
        return json_response(membership.view(group, member_id, counts))

    async def leave(request: web.Request) -> web.Response:
        group = request.match_info["group"]
        _check_group(group)
        if not api._leads(META):
            return await api._forward(request, META)
        membership.set_term(coordinator_term())
        left = membership.leave(group, request.match_info["member_id"])
        return json_response({"group": group, "member_id": request.match_info["member_id"], "left": left})

    app.router.add_post("/v1/groups/{group}/members", join)
    app.router.add_delete("/v1/groups/{group}/members/{member_id}", leave)
