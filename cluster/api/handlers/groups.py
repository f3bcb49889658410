"""Consumer-group membership routes: join/heartbeat, leave, and the members of a group on a topic
(all served by the metadata leader, the coordinator, which keeps membership in memory).

Leaving (removing a member) needs ``consume`` on every topic the member consumes, checked at the
coordinator, which knows them (``api/auth.py`` checks ``consume`` on some topic first).

The heartbeat body is ``{"member_id", "topics", "generation"?}``; ``generation`` (optional, for
older clients) is the generation of the last assignment the member has applied, 0 before its
first. It drives the revoke barrier of :mod:`raftmq.cluster.machines.membership`.

``GET /v1/topics/{topic}/groups/{group}/members`` is the console's view of a group: its members on
the topic (at most ``MEMBERS_MAX``, by member id, with ``member_count`` and ``truncated``), the
queues each holds and when it was last heard from, and the group's state. It needs what reading the
group's lag needs (``consume`` or ``admin`` on the topic).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.common import group_name, json_response
from raftmq.cluster.api.validation import bad, parse_json
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.tokens import CONSUME, TokenGrant
from raftmq.cluster.machines.membership import GroupMembership
from raftmq.cluster.node.node import Node

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["add_group_routes"]

MAX_MEMBER_ID_BYTES = 255
MAX_SUBSCRIBED_TOPICS = 100
U64 = 2**64 - 1  # the largest integer a request body can carry
MEMBERS_MAX = 100  # members listed by GET .../groups/{group}/members (the count says how many more)


def _check_member_id(member_id: str) -> None:
    try:
        size = len(member_id.encode())
    except UnicodeEncodeError:  # a lone surrogate
        size = 0
    if not 1 <= size <= MAX_MEMBER_ID_BYTES:
        raise bad(f"'member_id' must be 1-{MAX_MEMBER_ID_BYTES} UTF-8 bytes")


def _forwarded_grant(node: Node, body: bytes) -> TokenGrant | None:
    """The token a forwarding entry node checked the caller's request with (by name), or None
    when the body names none (a peer's own request)."""
    try:
        name = orjson.loads(body).get("token") if body else None
    except (orjson.JSONDecodeError, AttributeError):
        name = None
    if not isinstance(name, str):
        return None
    for grant in node.config.security.tokens:
        if grant.name == name:
            return grant
    raise ApiError(errors.FORBIDDEN, f"no token {name!r} in this node's cluster file")


def add_group_routes(app: web.Application, node: Node, api: ApiCore) -> None:

    membership = GroupMembership()

    def coordinator_term() -> int:
        return node.groups[META].raft.status().term

    async def join(request: web.Request) -> web.Response:
        group = group_name(request)
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
        if not api.router.leads(META):
            return await api.router.forward(request, META, body_bytes)
        counts = {}
        for name in topics:
            counts[name] = (await api.topic(name)).queues
        membership.set_term(coordinator_term())
        membership.heartbeat(group, member_id, topics, now_ms(), generation)
        return json_response(membership.view(group, member_id, counts))

    async def leave(request: web.Request) -> web.Response:
        """Remove a member: the caller's token needs ``consume`` on every topic the member
        consumes. Only the coordinator knows those, so the entry node forwards the token's name
        (a forwarded request carries the peer key, so the name is trusted there) and the
        coordinator checks it against the same token table (the cluster file)."""
        group = group_name(request)
        member_id = request.match_info["member_id"]
        _check_member_id(member_id)
        grant = request.get(PRINCIPAL)  # None: no tokens, or a request a peer forwarded
        if not api.router.leads(META):
            on_behalf = None if grant is None else orjson.dumps({"token": grant.name})
            return await api.router.forward(request, META, on_behalf)
        if grant is None and node.config.security.enabled:
            grant = _forwarded_grant(node, await request.read())
        membership.set_term(coordinator_term())
        topics = membership.member_topics(group, member_id) or ()
        if grant is not None:
            for topic in topics:
                if not grant.allows(CONSUME, topic):
                    raise ApiError(
                        errors.FORBIDDEN,
                        f"token {grant.name!r} lacks consume permission on topic {topic!r}, "
                        f"which member {member_id!r} of group {group!r} consumes",
                    )
        left = membership.leave(group, member_id)
        return json_response({"group": group, "member_id": member_id, "left": left})

    async def members(request: web.Request) -> web.Response:
        if request.query:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(request.query))}")
        group = group_name(request)
        topic = await api.topic(request.match_info["topic"])
        if not api.router.leads(META):
            return await api.router.forward(request, META)
        membership.set_term(coordinator_term())
        now = now_ms()
        membership.expire(now)  # what the next heartbeat would drop anyway
        return json_response(membership.describe(group, topic.name, topic.queues, now, MEMBERS_MAX))

    app.router.add_post("/v1/groups/{group}/members", join)
    app.router.add_get("/v1/topics/{topic}/groups/{group}/members", members)
    app.router.add_delete("/v1/groups/{group}/members/{member_id}", leave)
