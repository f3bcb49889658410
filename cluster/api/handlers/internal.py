"""Node-to-node HTTP endpoints under ``/internal/``, authenticated by the peer key
(``cluster/config/keys.py``; ``raftmq backup`` calls status, the barrier action and checkpoint
with the backup key). The authentication middleware (``cluster/api/auth.py``) checks the key for
every internal route before a handler runs; the handlers here do not check it again.

They carry forwarded writes, checkpoint transfers for snapshot installs, status for the cluster
view, and store digests that tests use to compare replicas.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.common import json_response
from raftmq.cluster.api.handlers.produce import refuse_reserved_headers
from raftmq.cluster.api.validation import bad, parse_json, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.base.groups import META
from raftmq.cluster.node.checkpoints import CheckpointBehind
from raftmq.cluster.node.node import Node
from raftmq.storage.queues import committed_offsets, topic_bounds

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore
    from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi

__all__ = ["add_internal_routes"]


def add_internal_routes(app: web.Application, node: Node, api: ApiCore, delivery: SubscriptionsApi) -> None:
    def local_group(request: web.Request) -> Any:
        name = request.match_info["group"]
        local = node.groups.get(name)
        if local is None:
            raise ApiError(errors.NOT_FOUND, f"node {node.me.id} hosts no replica of group {name}")
        return local

    async def status(request: web.Request) -> web.Response:
        return json_response(node.local_status())

    async def action(request: web.Request) -> web.Response:
        if request.match_info["action"] == "append":  # binary batches forwarded by a peer
            if node.config.faults.v1_only_node == node.me.id:  # TEST FAULT: as the version before
                raise ApiError(errors.INVALID_JSON, "the body is not valid JSON (a node without appends)")
            # Checked whole by the node the client sent them to (raftmq.batch.validate); this
            # node takes them from the authenticated peer as they are, framing checked only.
            try:
                _, items = commands.split_append(await request.read())
            except commands.BadCommand as e:
                raise ApiError(e.error, e.message) from None
            body = {"items": items}
        else:
            body = parse_json(await request.read())
            if request.match_info["action"] == "produce" and isinstance(body, dict):
                refuse_reserved_headers(body.get("batches"))
        name, action = request.match_info["group"], request.match_info["action"]
        if action == "take":  # the API's own action (a receive coordinator's line)
            return json_response(await delivery.take_action(name, body))
        return json_response(await api.router.actions.run(name, action, body))

    async def topic(request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not api.router.leads(META):
            raise ApiError(errors.NOT_LEADER, f"{node.me.id} does not lead the metadata group")
        t = await api.topic_linearizable(name)
        if t is None:
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return json_response(t.to_json())

    async def topics(request: web.Request) -> web.Response:
        """Every topic in this node's metadata replica (not linearizable: for retention ticks)."""
        if node.metadata is None:
            raise ApiError(errors.NOT_LEADER, f"{node.me.id} holds no metadata replica")
        return json_response({"topics": [t.to_json() for t in node.metadata.topics()]})

    async def bounds(request: web.Request) -> web.Response:
        """The topic's queue bounds in this leader's replica, once it serves reads (its state
        holds every acknowledged message: leader_reads.py); a follower answers ``not_leader``."""
        local = local_group(request)
        topic_id = query_int(request.query, "topic_id", None, 0, 2**32 - 1)
        name = request.match_info["group"]
        if not await api.router.reads_here(name):
            raise ApiError(errors.NOT_LEADER, f"{node.me.id} does not lead group {name}")
        bounds = topic_bounds(local.machine.store, topic_id)  # one scan, not a get per queue
        return json_response({"queues": {str(q): list(b) for q, b in sorted(bounds.items())}})

    async def offsets(request: web.Request) -> web.Response:
        local = local_group(request)
        name = request.match_info["group"]
        await api.router.actions.run(name, "barrier", {})
        group, topic_id = request.query.get("group"), query_int(request.query, "topic_id", None, 0, 2**32 - 1)
        if not group:
            raise bad("query parameter 'group' is required")
        store = local.machine.store
        committed = committed_offsets(store, group, topic_id)
        queues = sorted(set(topic_bounds(store, topic_id)) | set(committed))
        return json_response({"offsets": {str(q): committed.get(q) for q in queues}})

    async def checkpoint(request: web.Request) -> web.StreamResponse:
        name = request.match_info["group"]
        local_group(request)
        # A replica installing a snapshot asks for a state covering it: a lagging one refuses.
        min_index = query_int(request.query, "min_index", 0, 0, 2**63 - 1)
        loop = asyncio.get_running_loop()
        try:
            stream = await loop.run_in_executor(None, node.checkpoints.open_stream, name, min_index)
        except CheckpointBehind as e:
            raise ApiError(errors.UNAVAILABLE, str(e)) from None
        try:
            # No length: the archive is made as it is sent (chunked), so its first bytes leave at
            # once however large the state; a download cut short lacks the last chunk and fails.
            response = web.StreamResponse(headers={"Content-Type": "application/x-tar"})
            await response.prepare(request)
            chunks = stream.chunks()
            while (chunk := await loop.run_in_executor(None, next, chunks, None)) is not None:
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            await loop.run_in_executor(None, stream.close)

    async def digest(request: web.Request) -> web.Response:
        local_group(request)
        loop = asyncio.get_running_loop()
        return json_response(
            await loop.run_in_executor(None, node.checkpoints.store_digest, request.match_info["group"])
        )

    async def propose_raw(request: web.Request) -> web.Response:
        """Propose raw command bytes (operators and tests: the state machine must cope with any)."""
        local_group(request)
        name = request.match_info["group"]
        if not api.router.leads(name):
            raise ApiError(errors.NOT_LEADER, f"{node.me.id} does not lead group {name}")
        outcome = await node.propose(name, await request.read())
        return json_response({"error": outcome.error, "definite": outcome.definite, "result": outcome.result})

    async def compact(request: web.Request) -> web.Response:
        local_group(request).raft.force_compaction()
        return json_response({"ok": True})

    r = app.router
    r.add_get("/internal/status", status)
    r.add_get("/internal/topics", topics)
    r.add_get("/internal/topics/{topic}", topic)
    r.add_post("/internal/groups/{group}/propose", propose_raw)
    r.add_post("/internal/groups/{group}/compact", compact)
    r.add_post("/internal/groups/{group}/{action}", action)
    r.add_get("/internal/groups/{group}/bounds", bounds)
    r.add_get("/internal/groups/{group}/offsets", offsets)
    r.add_get("/internal/groups/{group}/checkpoint", checkpoint)
    r.add_get("/internal/groups/{group}/digest", digest)
