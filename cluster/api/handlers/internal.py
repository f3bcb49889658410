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

import structlog
from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.common import ResponseAborted, json_response
from raftmq.cluster.api.handlers.produce import refuse_reserved_headers
from raftmq.cluster.api.validation import bad, parse_json, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.base.groups import META
from raftmq.cluster.node.checkpoints import CheckpointBehind, CheckpointStream
from raftmq.cluster.node.node import Node
from raftmq.storage.queues import committed_offsets, topic_bounds

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore
    from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi

__all__ = ["add_internal_routes", "send_checkpoint"]

log = structlog.get_logger(__name__)


def _close_opened(opened: asyncio.Future[CheckpointStream]) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


async def send_checkpoint(
    request: web.Request, name: str, stream: CheckpointStream, timeout_s: float
) -> web.StreamResponse:
    """Send ``stream``'s archive as it is made (chunked: no length, so its first bytes leave at once
    however large the state; a download cut short lacks the chunked body's end and fails), then
    close it. A receiver that goes away, or takes no bytes for ``timeout_s`` (then dropped), ends
    the transfer quietly (aiohttp closes the connection). Any other failure once the answer has
    begun drops the connection (:class:`ResponseAborted`): no error answer can follow a body's first
    bytes. The checkpoint is deleted in every case, once no thread reads it."""
    loop = asyncio.get_running_loop()
    chunks = stream.chunks()
    reading: asyncio.Future[bytes | None] | None = None

    def close() -> None:
        chunks.close()
        stream.close()

    response = web.StreamResponse(headers={"Content-Type": "application/x-tar"})
    try:
        await response.prepare(request)
        while True:
            reading = loop.run_in_executor(None, next, chunks, None)
            chunk = await asyncio.shield(reading)
            reading = None
            if chunk is None:
                break
            async with asyncio.timeout(timeout_s):
                await response.write(chunk)
        await response.write_eof()
        return response
    except (ConnectionError, TimeoutError) as e:  # the receiver went away, or stopped reading
        log.warning("checkpoint_send_aborted", group=name, error=repr(e))
        if request.transport is not None:
            request.transport.abort()  # no end of the body can follow: aiohttp's own is refused
        return response
    except Exception as e:
        log.warning("checkpoint_send_aborted", group=name, error=repr(e))
        raise ResponseAborted(f"checkpoint of group {name} cut short: {e!r}") from e
    finally:
        if reading is not None and not reading.done():  # cancelled while a thread reads: after it
            reading.add_done_callback(lambda _f: loop.run_in_executor(None, close))
        else:
            await loop.run_in_executor(None, close)


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
        group, topic_id = request.query.get("group"), query_int(request.query, "topic_id", None, 0, 2**32 - 1)
        if not group:
            raise bad("query parameter 'group' is required")  # refused before the barrier: no entry
        await api.router.actions.run(name, "barrier", {})
        store = local.machine.store
        committed = committed_offsets(store, group, topic_id)
        queues = sorted(set(topic_bounds(store, topic_id)) | set(committed))
        return json_response({"offsets": {str(q): committed.get(q) for q in queues}})

    async def checkpoint(request: web.Request) -> web.StreamResponse:
        name = request.match_info["group"]
        local_group(request)
        # A replica installing a snapshot asks for a state covering it: a lagging one refuses.
        min_index = query_int(request.query, "min_index", 0, 0, 2**63 - 1)
        opening = asyncio.get_running_loop().run_in_executor(
            None, node.checkpoints.open_stream, name, min_index
        )
        try:
            stream = await asyncio.shield(opening)
        except CheckpointBehind as e:
            raise ApiError(errors.UNAVAILABLE, str(e)) from None
        except asyncio.CancelledError:  # the stream still opens in its thread: close it then
            opening.add_done_callback(_close_opened)
            raise
        return await send_checkpoint(request, name, stream, node.config.raft.checkpoint_io_timeout_ms / 1000)

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
