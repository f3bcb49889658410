"""What every HTTP handler builds on (``cluster/api/app.py``): reading a topic, and forwarding a
request to a group's leader. Routing to leaders, and the writes this node runs as one, are the
node's (:class:`~raftmq.cluster.node.router.LeaderRouter`, ``api.router``;
``cluster/node/actions.py``): the API turns HTTP into calls on them and their results and errors
into answers.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from collections import defaultdict
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from raftmq.cluster.api.common import ResponseAborted
from raftmq.cluster.api.delayed_counts import DelayedCounts
from raftmq.cluster.api.metrics import Metrics
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.cluster_file import NodeConfig
from raftmq.cluster.machines.metadata import Topic, validate_topic_name
from raftmq.cluster.machines.topics import permission_names
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.router import (
    FORWARDED,
    PEER_FAILURES,
    Forwarded,
    LeaderRouter,
    body_error,
    peer_call,
)
from raftmq.storage.queues import queue_bounds


class GroupRecords(Protocol):
    """The subscription records of consumer groups (``handlers/subscriptions.py``), which the
    offset API keeps as receives do: a commit under a new group counts against the same caps."""

    def known(self, topic: Topic, group: str) -> bool: ...

    async def ensure_subscription(self, topic: Topic, group: str, request: web.Request | None) -> None: ...


__all__ = ["ApiCore", "GroupRecords"]

PASS_PART_BYTES = 1 << 20  # a file passed on from another node, at most this much at a time


class ApiCore:
    """What the request handlers share (``Api`` mixes the handlers in). One instance per node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.config.limits
        self._sticky = itertools.count()
        self.router = LeaderRouter(node)
        self.leader_wait_s = self.router.leader_wait_s
        self.metrics = Metrics(node)
        self.delayed_counts = DelayedCounts()  # the SQS delayed figure, one scan per group at a time

    # -- forwarding -------------------------------------------------------------------------------

    async def forward(
        self,
        request: web.Request,
        name: str,
        body: bytes | None = None,
        *,
        accept: str | None = None,
        keep_headers: tuple[str, ...] = (),
        timeout_s: float | None = None,
    ) -> web.Response:
        """Proxy ``request`` to the leader of group ``name`` (:meth:`LeaderRouter.forward`) and
        answer with the leader's answer unchanged."""
        answer = await self.router.forward(
            request.method,
            request.path_qs,
            name,
            body,
            forwarded=bool(request.headers.get(FORWARDED)),
            accept=accept,
            keep_headers=keep_headers,
            timeout_s=timeout_s,
        )
        return _response(answer)

    async def forward_to(
        self,
        request: web.Request,
        peer: NodeConfig,
        what: str,
        keep_headers: tuple[str, ...],
        read_timeout_s: float,
    ) -> web.StreamResponse:
        """Proxy ``request`` (a ``GET`` or ``HEAD`` of a file) to node ``peer`` itself and answer
        with its answer: an error as it came; a success passed on a part at a time as it arrives
        (:meth:`LeaderRouter.open_at`; ``read_timeout_s`` for each part), so a large file to a
        slow client is never held whole here, its ``Content-Length`` (a ``HEAD``'s too: the
        peer's) and ``keep_headers`` kept. The write deadline of this node's clients applies as to
        any answer (``limits.http_write_timeout_ms``). A peer that fails once the body has begun
        (it stopped sending for ``read_timeout_s``, or went away) drops the client's connection:
        the body ends short of its length (:class:`ResponseAborted`)."""
        method = request.method
        async with self.router.open_at(
            peer, what, method, request.path_qs, read_timeout_s=read_timeout_s
        ) as resp:
            kept = {k: v for k, v in resp.headers.items() if k in keep_headers}
            if resp.status != 200:
                with peer_call(method, what):
                    body = await resp.read()
                    if resp.status >= 500 and resp.content_type != "application/json":
                        raise ValueError(f"HTTP {resp.status} without an error body")  # a broken answer
                return _response(Forwarded(resp.status, body, resp.content_type, kept))
            response = web.StreamResponse(headers=kept)
            response.content_type = resp.content_type
            if resp.content_length is not None:
                response.content_length = resp.content_length
            try:
                await response.prepare(request)
                if method != "HEAD":
                    await _pass_body(resp, response, what)
                await response.write_eof()
            except ConnectionError:  # the client left, or was cut: the rest has nowhere to go
                pass
            return response

    # -- topics -----------------------------------------------------------------------------------

    async def topic(self, name: str, *, fresh: bool = False) -> Topic:
        """The topic, from the local metadata replica; a miss is re-checked at the leader."""
        machine = self.node.metadata
        if machine is not None and not fresh:
            t = machine.topic(name)  # a found name is valid: the metadata machine checked it
            if t is not None:
                return t
        if validate_topic_name(name):  # no such topic can exist; and never put it into a URL
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        t = await self.topic_linearizable(name)
        if t is None:
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return t

    async def permission_names(self, name: str, creating: bool = False) -> list[str]:
        """The topic names a token's permissions on topic ``name`` are checked against: on every
        road (``cluster/api/auth.py``, the SQS API's ``access.py``, the handlers that weigh a token
        themselves), :func:`~raftmq.cluster.machines.topics.permission_names` over every topic
        (a dead-letter topic answers for its first source). ``creating``: ``name`` is to be made."""
        if not name.endswith(".dlq") or validate_topic_name(name):
            return [name]
        return permission_names(name, await self._topic_table(None if creating else name), creating=creating)

    def permission_names_here(self, name: str) -> list[str]:
        """:meth:`permission_names` from this node's metadata replica alone: for the checks of the
        metadata leader (the group coordinator's), which holds the replica and must not wait."""
        machine = self.node.metadata
        assert machine is not None, "only a node with a metadata replica checks here"
        return permission_names(name, {t.name: t for t in machine.topics()})

    async def topic_table(self) -> dict[str, Topic]:
        """Every topic by name (a copy), as :meth:`permission_names` reads it: for a caller weighing
        many names at once (``/metrics``), one table for all, never one per name."""
        return await self._topic_table(None)

    async def _topic_table(self, wanted: str | None) -> dict[str, Topic]:
        """Every topic by name, from this node's metadata replica; from the metadata leader's where
        this node holds none (a node beyond the metadata group's five, or added later) or its
        replica does not know ``wanted`` yet (a lagging replica). Never an empty table for want of
        a replica: a dead-letter topic would then go by its own name on this node."""
        machine = self.node.metadata
        if machine is not None:
            table = {t.name: t for t in machine.topics()}
            if wanted is None or wanted in table:
                return table
            if await self.topic_linearizable(wanted) is None:
                return table  # no such topic at the leader either: no list fetched for a made-up name
        table = {t.name: t for t in await self.topics_at_leader()}
        if wanted is not None and wanted not in table:
            # The list is any replica's at the leader's node, which may not have applied the
            # topic yet: the topic itself read after a barrier, so a new one goes by its source.
            found = await self.topic_linearizable(wanted)
            if found is not None:
                table[found.name] = found
        return table

    async def topics_at_leader(self) -> list[Topic]:
        """Every topic in the metadata leader's replica (here: after a barrier)."""
        if self.router.leads(META):
            await self._metadata_barrier()
            assert self.node.metadata is not None
            return self.node.metadata.topics()
        data = await self._at_metadata_leader("/internal/topics", "the topic list")
        assert data is not None
        return [Topic.from_json(t) for t in orjson.loads(data)["topics"]]

    async def topic_linearizable(self, name: str) -> Topic | None:
        if self.router.leads(META):
            await self._metadata_barrier()
            assert self.node.metadata is not None
            return self.node.metadata.topic(name)
        path = f"/internal/topics/{urllib.parse.quote(name, safe='')}"
        data = await self._at_metadata_leader(path, f"topic {name!r}")
        return None if data is None else Topic.from_json(orjson.loads(data))

    async def _metadata_barrier(self) -> None:
        """See every earlier metadata write (one ``noop`` shared by the lookups waiting at once:
        ``cluster/node/barriers.py``; a client's lookups cost no entry each)."""
        await self.router.barrier(META)

    async def _at_metadata_leader(self, path: str, what: str) -> bytes | None:
        """The answer of the metadata leader's ``GET path`` (None: 404)."""
        leader = await self.router.wait_leader(META, 3.0)
        try:
            status, data, _ = await self.node.peer_request("GET", leader, path, timeout_s=5.0)
        except (aiohttp.ClientError, TimeoutError, OSError):
            # The leader known here is gone (killed, or cut off): a read, so nothing was done.
            self.node.forget_peer_status()
            raise ApiError(
                errors.UNAVAILABLE, f"cannot reach the metadata leader {leader.id} to look up {what}"
            ) from None
        if status == 404:
            return None
        if status != 200:
            raise body_error(status, data)
        return data

    async def describe(self, topic: Topic) -> dict[str, Any]:
        """The topic and its queues (leader, replicas, low and high offsets), as ``GET
        /v1/topics/{topic}`` answers; a queue whose leader did not answer has null offsets."""
        return await self._describe(topic)

    async def _describe(self, topic: Topic) -> dict[str, Any]:
        by_group: dict[int, list[int]] = defaultdict(list)
        for q, g in enumerate(topic.queue_groups):
            by_group[g].append(q)
        bounds: dict[int, tuple[int, int] | None] = {}

        async def fetch(g: int) -> None:
            # Only a leader that serves reads answers (leader_reads.py): a follower's replica, or
            # a new leader's before it applied its term's first entry, may lack acknowledged
            # messages. No such leader in time: null offsets, never a smaller figure.
            name = str(g)
            try:
                if await self.router.reads_here(name):
                    store = self.node.groups[name].machine.store
                    for q in by_group[g]:
                        bounds[q] = queue_bounds(store, topic.id, q)
                    return
                path = f"/internal/groups/{g}/bounds?topic_id={topic.id}"
                got = (await self.router.read_at_leader(name, path, timeout_s=2.0))["queues"]
            except RaftmqError:
                return
            for q in by_group[g]:
                low, high = got.get(str(q), (0, 0))  # no stored bounds: never written
                bounds[q] = (low, high)

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
        described = {**topic.to_json(), "queues": queues}
        described.pop("dead_letter_of", None)  # ids; the topic list names a dead-letter topic's source
        return described


async def _pass_body(resp: aiohttp.ClientResponse, response: web.StreamResponse, what: str) -> None:
    """The peer's body to the prepared ``response``, up to ``PASS_PART_BYTES`` at a time, each
    written before the next is read (the peer's sending waits meanwhile)."""
    while True:
        try:
            part = await resp.content.read(PASS_PART_BYTES)
        except PEER_FAILURES as e:
            raise ResponseAborted(f"{what} stopped sending: {e!r}") from e
        if not part:
            return
        await response.write(part)


def _response(answer: Forwarded) -> web.Response:
    """A forwarded request's answer, as it came."""
    return web.Response(
        body=answer.body, status=answer.status, content_type=answer.content_type, headers=answer.headers
    )
