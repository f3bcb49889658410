"""The request routing every HTTP handler builds on (``cluster/api/app.py``): where a group's
leader is, forwarding a request to it, reading a topic, and writes at a group's leader.

Writes go to the leader of the group concerned: served here when this node leads it, otherwise
forwarded to the leader (one hop; a forwarded request is never forwarded again). Failures that
certainly did nothing are retried at the next leader until ``leader_wait_s`` has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.common import FORWARDED, NOT_SENT, body_error, raft_error
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, ProduceFailed
from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.metadata import Topic, validate_topic_name
from raftmq.cluster.node.node import Node
from raftmq.storage.queues import queue_bounds

if TYPE_CHECKING:
    from raftmq.cluster.api.handlers.cluster import ClusterApi
    from raftmq.cluster.api.handlers.segments import SegmentsApi
    from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi

__all__ = ["ApiCore"]


@contextlib.contextmanager
def _leader_call(leader_id: str, name: str) -> Iterator[None]:
    """A call to the leader of group ``name``: not connected is ``unavailable`` (definite: nothing
    was sent), any later failure ``unknown_outcome`` (the leader may have done it)."""
    try:
        yield
    except NOT_SENT:
        raise ApiError(errors.UNAVAILABLE, f"cannot reach the leader {leader_id} of group {name}") from None
    except (TimeoutError, aiohttp.ClientError):
        raise ApiError(errors.UNKNOWN_OUTCOME, f"lost the answer of the leader {leader_id}") from None


class ApiCore:
    """What the request handlers share (``Api`` mixes the handlers in). One instance per node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.config.limits
        self._sticky = itertools.count()
        self.metrics: Any = None  # set by create_app
        self.delivery: SubscriptionsApi | None = None  # set by create_app
        self.segments: SegmentsApi | None = None  # set by create_app
        self.changes: ClusterApi | None = None  # set by create_app (cluster changes)
        # How long a request may wait for a group to elect a leader: two election timeouts, and at
        # least 3 s (a split vote can take a second round).
        self.election_max_s = node.config.raft.election_max_ms / 1000
        self.leader_wait_s = max(3.0, 2 * self.election_max_s)

    # -- leaders and forwarding -------------------------------------------------------------------

    async def _wait_leader(self, name: str, timeout_s: float) -> Any:
        """The leader of group ``name``, waiting up to ``timeout_s`` for one to be known.

        A group not hosted here is looked up at the peers at once. A local replica that knows no
        leader is given one election timeout to learn of it (an election ends so); after that the
        peers are asked too, every half second: the replica may be cut off, or removed from the
        group without knowing it, while the group goes on under a leader elsewhere."""
        start = time.monotonic()
        deadline = start + timeout_s
        ask_peers_at = start if name not in self.node.groups else start + self.election_max_s
        while True:
            leader = self.node.leader_of(name)
            if leader is not None:
                return leader
            now = time.monotonic()
            if now >= deadline:
                raise ApiError(errors.UNAVAILABLE, f"group {name} has no leader right now")
            if now >= ask_peers_at:
                await self.node.refresh_peer_status()
                ask_peers_at = time.monotonic() + (0.5 if name in self.node.groups else 0.0)
            await asyncio.sleep(0.05)

    async def _leader_elsewhere(self, name: str) -> Any:
        """The leader of group ``name`` (waiting up to ``leader_wait_s``), which this node must not be:
        a call to it goes over the network."""
        leader = await self._wait_leader(name, self.leader_wait_s)
        if leader.id == self.node.me.id:
            raise ApiError(errors.UNAVAILABLE, f"group {name} is electing a leader")
        return leader

    def _leads(self, name: str) -> bool:
        local = self.node.groups.get(name)
        return local is not None and local.raft.is_leader()

    async def _forward(self, request: web.Request, name: str, body: bytes | None = None) -> web.Response:
        """Proxy ``request`` to the leader of group ``name`` and return its answer unchanged.

        A ``not_leader`` answer (leadership moved on; nothing was done) is retried against the
        newly known leader until ``leader_wait_s`` has passed, as ``_group_call`` does for writes.
        """
        if request.headers.get(FORWARDED):
            raise ApiError(errors.NOT_LEADER, f"this node ({self.node.me.id}) does not lead group {name}")
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            response = await self._forward_once(request, name, body)
            if response.status != errors.NOT_LEADER.status or time.monotonic() >= deadline:
                return response
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _forward_once(self, request: web.Request, name: str, body: bytes | None) -> web.Response:
        leader = await self._leader_elsewhere(name)
        session = self.node._session
        assert session is not None
        with _leader_call(leader.id, name):
            async with session.request(
                request.method,
                leader.http_url + request.path_qs,
                data=body,
                headers={FORWARDED: self.node.me.id, "Content-Type": "application/json"},
                allow_redirects=False,  # the peer key goes to the leader only
                timeout=aiohttp.ClientTimeout(
                    total=self.limits.request_timeout_ms / 1000 + 16, sock_connect=1.0
                ),
            ) as resp:
                data = await resp.read()
                return web.Response(body=data, status=resp.status, content_type=resp.content_type)

    # -- topics -----------------------------------------------------------------------------------

    async def topic(self, name: str, *, fresh: bool = False) -> Topic:
        """The topic, from the local metadata replica; a miss is re-checked at the leader."""
        if validate_topic_name(name):  # no such topic can exist; and never put it into a URL
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        machine = self.node.metadata
        if machine is not None and not fresh:
            t = machine.topic(name)
            if t is not None:
                return t
        t = await self._topic_linearizable(name)
        if t is None:
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return t

    async def _topic_linearizable(self, name: str) -> Topic | None:
        if self._leads(META):
            outcome = await self.node.propose(META, commands.noop())  # barrier: see all earlier writes
            if outcome.error:
                raise raft_error(outcome.error, "metadata barrier failed", outcome.definite)
            assert self.node.metadata is not None
            return self.node.metadata.topic(name)
        leader = await self._wait_leader(META, 3.0)
        status, data, _ = await self.node.peer_request(
            "GET", leader, f"/internal/topics/{urllib.parse.quote(name, safe='')}"
        )
        if status == 404:
            return None
        if status != 200:
            raise body_error(status, data)
        return Topic.from_json(orjson.loads(data))

    async def _describe(self, topic: Topic) -> dict[str, Any]:
        by_group: dict[int, list[int]] = defaultdict(list)
        for q, g in enumerate(topic.queue_groups):
            by_group[g].append(q)
        bounds: dict[int, tuple[int, int] | None] = {}

        async def fetch(g: int) -> None:
            local = self.node.queue_group(g)
            leader = self.node.leader_of(str(g))
            if local is not None and (leader is None or leader.id == self.node.me.id):
                for q in by_group[g]:
                    bounds[q] = queue_bounds(local.machine.store, topic.id, q)
                return
            target = leader or (self.node.config.group_replicas(g)[0])
            try:
                status, data, _ = await self.node.peer_request(
                    "GET", target, f"/internal/groups/{g}/bounds?topic_id={topic.id}", timeout_s=2.0
                )
                if status == 200:
                    got = orjson.loads(data)["queues"]
                    for q in by_group[g]:
                        low, high = got.get(str(q), (0, 0))
                        bounds[q] = (low, high)
            except (TimeoutError, aiohttp.ClientError, OSError):
                for q in by_group[g]:
                    bounds[q] = None

        await asyncio.gather(*(fetch(g) for g in by_group))
        queues = []
        for q, g in enumerate(topic.queue_groups):
            leader = self.node.leader_of(str(g))
            b = bounds.get(q)
            queues.append(
                {
                    "queue": q,
                    "group_id": g,
                    "leader": leader.id if leader else None,
                    "replicas": [r.id for r in self.node.config.group_replicas(g)],
                    "low_offset": b[0] if b else None,
                    "high_offset": b[1] if b else None,
                }
            )
        return {**topic.to_json(), "queues": queues}

    # -- writes at a group's leader ---------------------------------------------------------------

    async def _propose_checked(self, name: str, command: bytes) -> dict[str, Any]:
        outcome = await self.node.propose(name, command)
        if outcome.error:
            raise raft_error(outcome.error, f"group {name}: {outcome.error}", outcome.definite)
        result: dict[str, Any] = outcome.result
        if "error" in result:
            e = result["error"]
            extra = {k: v for k, v in e.items() if k not in ("code", "message", "retriable", "definite")}
            raise ApiError(errors.BY_CODE.get(e["code"], errors.INTERNAL), e["message"], **extra)
        return result

    async def _group_call(
        self, g: int | str, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        """Run an internal write ``action`` at the leader of queue group ``g`` (here or remote).

        Failures that certainly did nothing (the leader was unreachable, or is no longer the
        leader) are retried against the newly known leader until ``leader_wait_s`` has passed, so
        a client sees one slow answer across an election instead of an error.
        """
        name = str(g)
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            try:
                return await self._group_call_once(name, action, body, size_hint)
            except ApiError as e:
                if not (e.code.retriable and e.code.definite) or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _group_call_once(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None
    ) -> dict[str, Any]:
        if self._leads(name):
            return await self.internal_action(name, action, body, size_hint)
        leader = await self._leader_elsewhere(name)
        with _leader_call(leader.id, name):
            status, data, _ = await self.node.peer_request(
                "POST",
                leader,
                f"/internal/groups/{name}/{action}",
                body=body,
                timeout_s=self.limits.request_timeout_ms / 1000 + 5,
            )
        if status != 200:
            raise body_error(status, data)
        result: dict[str, Any] = orjson.loads(data)
        return result

    async def internal_action(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        """A write at this node as leader of queue group ``name``."""
        local = self.node.groups.get(name)
        if local is None or not local.raft.is_leader():
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not lead group {name}")
        if action == "produce":
            if local.committer is None:
                raise ApiError(errors.BAD_REQUEST, "not a queue group")
            size = size_hint if size_hint is not None else len(orjson.dumps(body["batches"]))
            try:
                results = await asyncio.wait_for(
                    local.committer.produce(body["batches"], size), self.limits.request_timeout_ms / 1000
                )
            except TimeoutError:
                raise ApiError(errors.TIMEOUT, f"queue group {name} did not commit in time") from None
            except ProduceFailed as e:
                raise ApiError(e.code, f"queue group {name}: {e}") from None
            return {"results": results}
        if action == "drop":
            return await self._propose_checked(name, commands.drop_topic(int(body["topic_id"])))
        if action == "commit":
            return await self._propose_checked(
                name,
                commands.commit_offsets(
                    body["group"], int(body["topic_id"]), {int(k): v for k, v in body["offsets"].items()}
                ),
            )
        if action == "barrier":
            return await self._propose_checked(name, commands.noop())
        if self.changes is not None and action in self.changes.actions:
            return await self.changes.internal_action(name, action, body)
        if self.delivery is not None and action in self.delivery.actions:
            return await self.delivery.internal_action(name, action, body)
        raise ApiError(errors.NOT_FOUND, f"unknown action {action}")
