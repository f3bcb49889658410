"""Consumer-group membership routes: join/heartbeat, leave, and the members of a group on a topic
(all served by the metadata leader, the coordinator, which keeps membership in memory).

**Owners.** With API tokens, a member belongs to the token that created it (its name is kept with
the member, :mod:`raftmq.cluster.machines.membership`). A heartbeat, re-join or leave under a member
id another token created is refused with 403 ``member_not_owned``, unless the caller is ``admin`` on
every topic the member consumes; the member keeps its owner either way. Only the coordinator knows
a member's owner, so an entry node that forwards a join or leave sends the caller's token name with
it (``"token"`` in the body; a forwarded request carries the peer key, so the name is trusted
there, and a client's body may not carry the field) and the coordinator looks it up in the same
token table (the cluster file). Without tokens, members have no owner and anyone may act on any.

Leaving (removing a member) also needs ``consume`` on every topic the member consumes, checked at
the coordinator (``api/auth.py`` checks ``consume`` on some topic first).

Members count against ``limits.max_members_per_token`` and ``limits.max_members_per_topic``: a join
beyond either is 409 ``too_many_members``.

The heartbeat body is ``{"member_id", "topics", "generation"?}``; ``generation`` (optional, for
older clients) is the generation of the last assignment the member has applied, 0 before its
first. It drives the revoke barrier of :mod:`raftmq.cluster.machines.membership`.

**Members keep their group's offsets.** A member that is connected but gets no new message
commits nothing; as in Kafka, its group's offsets must not expire while it has members. The
coordinator names the groups with a live member on each topic to the topic's queue groups every
quarter of ``limits.offset_retention_ms`` (or of ``subscription_idle_ms`` when shorter; at most a
minute): one ``touch_subscriptions`` entry per queue group, not one per heartbeat or fetch
(``cluster/machines/delivery/expiry.py``). Until every voter of a queue group applies the op (a
rolling upgrade) it is not written there, and idle members' offsets expire as before.

``GET /v1/topics/{topic}/groups/{group}/members`` is the console's view of a group: its members on
the topic (at most ``MEMBERS_MAX``, by member id, with ``member_count`` and ``truncated``), the
queues each holds and when it was last heard from, and the state and generation *of that topic*
(its generation moves only when the topic's subscribers change, so a token that may read one topic
sees nothing of the group's other topics, not even when they rebalance). It needs what reading the
group's lag needs (``consume`` or ``admin`` on the topic). Member ids are listed: they are no
credential, since acting on a member needs its owner's token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.common import group_name, json_response
from raftmq.cluster.api.validation import bad, parse_json
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.commands import MAX_TOUCH_GROUPS
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.config.keys import PEER_HEADER
from raftmq.cluster.config.tokens import ADMIN, CONSUME, TokenGrant
from raftmq.cluster.machines.membership import GroupMembership, Member
from raftmq.cluster.node.node import Node

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["add_group_routes"]

MAX_MEMBER_ID_BYTES = 255
MAX_SUBSCRIBED_TOPICS = 100
U64 = 2**64 - 1  # the largest integer a request body can carry
MEMBERS_MAX = 100  # members listed by GET .../groups/{group}/members (the count says how many more)
TOUCH_MAX_INTERVAL_MS = 60_000

log = structlog.get_logger(__name__)


def touch_interval_ms(limits: Limits) -> int | None:
    """How often the coordinator marks its live members' groups used: a quarter of the shorter of
    ``offset_retention_ms`` and ``subscription_idle_ms`` (0: never), at most a minute, at least a
    second; None when neither expires anything."""
    bounds = [ms for ms in (limits.offset_retention_ms, limits.subscription_idle_ms) if ms]
    if not bounds:
        return None
    return max(1000, min(TOUCH_MAX_INTERVAL_MS, min(bounds) // 4))


async def touch_live_groups(api: ApiCore, membership: GroupMembership) -> int:
    """Propose ``touch_subscriptions`` for the groups with a live member, in every queue group of
    their topics (a topic that is gone is passed over); how many entries were written. A queue
    group that refuses (a leader change, a voter of an older release) is logged and asked again
    at the next round."""
    by_queue_group: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for group, name in membership.subscribed(now_ms()):
        try:
            topic = await api.topic(name)
        except RaftmqError:
            continue
        for g in sorted(set(topic.queue_groups)):
            by_queue_group[g].append((topic.id, group))
    written = 0
    for g, pairs in sorted(by_queue_group.items()):
        for start in range(0, len(pairs), MAX_TOUCH_GROUPS):
            chunk = pairs[start : start + MAX_TOUCH_GROUPS]
            try:
                await api.router.group_call(g, "touch_subscriptions", {"groups": [list(p) for p in chunk]})
                written += 1
            except RaftmqError as e:
                log.info("live_groups_not_touched", queue_group=g, error=e.error.code)
    return written


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


def _caller(node: Node, request: web.Request, forwarded_body: bytes) -> TokenGrant | None:
    """The token a request acts for at the coordinator: the caller's own, or the one the entry node
    named in a forwarded body; None without tokens (or a peer's own request)."""
    grant = request.get(PRINCIPAL)
    if grant is None and node.config.security.enabled:
        grant = _forwarded_grant(node, forwarded_body)
    return grant


def _allows(api: ApiCore, grant: TokenGrant, permission: str, topics: Iterable[str]) -> bool:
    """``grant`` has ``permission`` on every topic of ``topics`` as the routes check it (a
    dead-letter topic by its source's name: ``ApiCore.permission_names``). At the coordinator,
    which holds the metadata replica."""
    return all(grant.allows(permission, n) for t in topics for n in api.permission_names_here(t))


def _check_owner(api: ApiCore, grant: TokenGrant | None, member: Member | None, group: str) -> None:
    """Refuse ``grant`` acting on another token's ``member`` unless it is admin on all its topics."""
    if grant is None or member is None or member.owner is None or member.owner == grant.name:
        return
    if member.topics and _allows(api, grant, ADMIN, member.topics):
        return
    raise ApiError(
        errors.MEMBER_NOT_OWNED,
        f"member {member.member_id!r} of group {group!r} was created by another token; only that "
        "token, or one with admin on every topic the member consumes, may act on it",
    )


def add_group_routes(app: web.Application, node: Node, api: ApiCore) -> None:
    limits = node.config.limits
    membership = GroupMembership(
        max_members_per_token=limits.max_members_per_token, max_members_per_topic=limits.max_members_per_topic
    )

    def coordinator_term() -> int:
        return node.groups[META].raft.status().term

    async def join(request: web.Request) -> web.Response:
        group = group_name(request)
        body_bytes = await request.read()
        body: Any = parse_json(body_bytes)
        # "token": the caller's token name, sent by an entry node (with the peer key, which the
        # auth middleware has checked) only.
        fields = {"member_id", "topics", "generation"} | (
            {"token"} if PEER_HEADER in request.headers else set()
        )
        if not isinstance(body, dict) or set(body) - fields:
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
            grant = request.get(PRINCIPAL)
            if grant is not None:
                body_bytes = orjson.dumps({**body, "token": grant.name})
            return await api.forward(request, META, body_bytes)
        grant = _caller(node, request, body_bytes)
        counts = {}
        for name in topics:
            counts[name] = (await api.topic(name)).queues
        # No await from here on: the owner and cap checks hold for the heartbeat they guard.
        membership.set_term(coordinator_term())
        now = now_ms()
        _check_owner(api, grant, membership.member(group, member_id, now), group)
        owner = None if grant is None else grant.name
        over = membership.admit(group, member_id, topics, owner, now)
        if over is not None:
            raise ApiError(errors.TOO_MANY_MEMBERS, over)
        membership.heartbeat(group, member_id, topics, now, generation, owner)
        return json_response(membership.view(group, member_id, counts))

    async def leave(request: web.Request) -> web.Response:
        """Remove a member: the caller's token must own it (or be admin on all its topics) and
        have ``consume`` on every topic it consumes. Only the coordinator knows those, so the entry
        node forwards the token's name (see the module's docstring)."""
        group = group_name(request)
        member_id = request.match_info["member_id"]
        _check_member_id(member_id)
        grant = request.get(PRINCIPAL)  # None: no tokens, or a request a peer forwarded
        if not api.router.leads(META):
            on_behalf = None if grant is None else orjson.dumps({"token": grant.name})
            return await api.forward(request, META, on_behalf)
        grant = _caller(node, request, await request.read())
        membership.set_term(coordinator_term())
        member = membership.member(group, member_id, now_ms())
        _check_owner(api, grant, member, group)
        topics = member.topics if member is not None else ()
        if grant is not None:
            for topic in topics:
                if not _allows(api, grant, CONSUME, [topic]):
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
            return await api.forward(request, META)
        membership.set_term(coordinator_term())
        now = now_ms()
        membership.expire(now)  # what the next heartbeat would drop anyway
        return json_response(membership.describe(group, topic.name, topic.queues, now, MEMBERS_MAX))

    async def touch_loop(interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if not api.router.leads(META):
                continue
            membership.set_term(coordinator_term())
            try:
                await touch_live_groups(api, membership)
            except Exception:
                log.exception("live_groups_not_touched")

    async def touching(app: web.Application) -> AsyncIterator[None]:
        interval_ms = touch_interval_ms(limits)
        task = None if interval_ms is None else asyncio.create_task(touch_loop(interval_ms / 1000))
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.cleanup_ctx.append(touching)
    app.router.add_post("/v1/groups/{group}/members", join)
    app.router.add_get("/v1/topics/{topic}/groups/{group}/members", members)
    app.router.add_delete("/v1/groups/{group}/members/{member_id}", leave)
