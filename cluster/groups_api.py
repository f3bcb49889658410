"""Consumer-group membership routes: join/heartbeat and leave (served by the metadata leader).

The heartbeat body is ``{"member_id", "topics", "generation"?}``; ``generation`` (optional, for
older clients) is the generation of the last assignment the member has applied, 0 before its
first. It drives the revoke barrier of :mod:`raftmq.cluster.membership`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from .membership import GroupMembership
from .node import META, Node, now_ms
from .validation import bad, parse_json

if TYPE_CHECKING:
    from .http_api import Api

__all__ = ["add_group_routes"]

MAX_MEMBER_ID_BYTES = 255
MAX_SUBSCRIBED_TOPICS = 100
U64 = 2**64 - 1  # the largest integer a request body can carry


def _check_member_id(member_id: str) -> None:
    try:
        size = len(member_id.encode())
    except UnicodeEncodeError:  # a lone surrogate
        size = 0
    if not 1 <= size <= MAX_MEMBER_ID_BYTES:
        raise bad(f"'member_id' must be 1-{MAX_MEMBER_ID_BYTES} UTF-8 bytes")


def add_group_routes(app: web.Application, node: Node, api: Api) -> None:
    from .http_api import _group_name, json_response

    membership = GroupMembership()

    def coordinator_term() -> int:
        return node.groups[META].raft.status().term

    async def join(request: web.Request) -> web.Response:
        group = _group_name(request)
        body_bytes = await request.read()
        body: Any = parse_json(body_bytes)
        if not isinstance(body, dict) or set(body) - {"member_id", "topics", "generation"}:
            raise bad('body must be {"member_id": str, "topics": [str, ...], "generation"?: int}')
        member_id, topics = body.get("member_id"), body.get("topics")
        generation = body.get("generation")
        if "generation" in body and (
            not isinstance(generation, int) or isinstance(generation, bool) or not 0 <= generation <= U64
        ):
            raise bad("'generation' must be a non-negative integer (the last applied assignment's)")
        if not isinstance(member_id, str):
            raise bad("'member_id' must be a string")
        _check_member_id(member_id)
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
        membership.heartbeat(group, member_id, topics, now_ms(), generation)
        return json_response(membership.view(group, member_id, counts))

    async def leave(request: web.Request) -> web.Response:
        group = _group_name(request)
        member_id = request.match_info["member_id"]
        _check_member_id(member_id)
        if not api._leads(META):
            return await api._forward(request, META)
        membership.set_term(coordinator_term())
        left = membership.leave(group, member_id)
        return json_response({"group": group, "member_id": member_id, "left": left})

    app.router.add_post("/v1/groups/{group}/members", join)
    app.router.add_delete("/v1/groups/{group}/members/{member_id}", leave)
