"""The public HTTP API v1 (aiohttp + orjson). Any node answers any request.

Writes go to the leader of the group concerned: served here when this node leads it, otherwise
forwarded to the leader (one hop; a forwarded request is never forwarded again). Every error has
the stable body ``{"error": {"code", "message", "retriable", "definite", ...}}``.

This module builds the application (:func:`create_app`) and its handler object :class:`Api`,
which mixes in the handlers by concern:

- ``api/core.py``: ``ApiCore``, what they share (topic lookup, forwarding to a leader through the
  node's ``LeaderRouter``, whose ``LeaderActions`` are the writes at a group's leader);
- ``api/handlers/topics.py``: topics; ``api/handlers/produce.py``: produce and :func:`key_queue`;
  ``api/handlers/fetch.py``: fetch (through the fetch core, ``fetch_core.py``, and its three
  encoders) and consumer-group offsets;
- ``api/common.py``: JSON answers, the error middleware, peer and Raft errors.

The other route families register themselves from their own modules (``add_*_routes``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL, auth_middleware
from raftmq.cluster.api.common import error_middleware, json_response
from raftmq.cluster.api.connections import (
    IDLE_KEY,
    WRITES_KEY,
    IdleConnections,
    WriteDeadline,
    idle_middleware,
)
from raftmq.cluster.api.console import add_console_routes
from raftmq.cluster.api.handlers.cluster import add_cluster_routes
from raftmq.cluster.api.handlers.consumers import add_consumer_routes
from raftmq.cluster.api.handlers.fetch import FetchHandlers
from raftmq.cluster.api.handlers.groups import add_group_routes
from raftmq.cluster.api.handlers.internal import add_internal_routes
from raftmq.cluster.api.handlers.produce import ProduceHandlers, key_queue
from raftmq.cluster.api.handlers.push import add_push_routes
from raftmq.cluster.api.handlers.segments import SegmentsApi, add_segment_routes
from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi, add_subscription_routes
from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.metrics import (
    METRICS_KEY,
    BarrierCollector,
    ReadAheadCollector,
    WaitingReceiversCollector,
    metrics_handler,
    metrics_middleware,
)
from raftmq.cluster.api.openapi.spec import openapi_spec
from raftmq.cluster.api.server_log import server_logger
from raftmq.cluster.api.slow_clients import body_deadline_middleware, request_cap_middleware
from raftmq.cluster.api.sqs.refusals import sqs_refusal_middleware
from raftmq.cluster.api.sqs.routes import add_sqs_routes
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import error_body
from raftmq.cluster.base.groups import META, group_sort_key
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.node.actions import METADATA_INDEX_HEADER
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.router import FORWARDED

__all__ = ["create_app", "create_runner", "key_queue"]

NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)
API_KEY: web.AppKey[Api] = web.AppKey("api", object)  # type: ignore[arg-type]


class Api(TopicHandlers, ProduceHandlers, FetchHandlers):
    """Request handlers. One instance per node."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        # Receive/ack and subscriptions (their routes, push streams and the SQS API use it); the
        # offset API keeps consumer groups through its records as receives do.
        self.subscriptions = SubscriptionsApi(node, self)
        self.group_records = self.subscriptions

    # -- health and cluster -----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "node_id": self.node.me.id})

    async def readyz(self, request: web.Request) -> web.Response:
        missing = [name for name, g in self.node.groups.items() if g.raft.leader() is None]
        if missing:
            return json_response(
                error_body(
                    errors.UNAVAILABLE,
                    "groups without a leader: " + ", ".join(sorted(missing)),
                    groups=missing,
                ),
                status=503,
            )
        return json_response({"status": "ready", "node_id": self.node.me.id})

    async def cluster(self, request: web.Request) -> web.Response:
        """``GET /v1/cluster``: all of it to a cluster admin (and without tokens); to any other
        token what a client routes by (:func:`routing_view`)."""
        view = await self.cluster_view()
        grant = request.get(PRINCIPAL)
        return json_response(view if grant is None or grant.cluster_admin else routing_view(view))

    async def cluster_view(self) -> dict[str, Any]:
        """``GET /v1/cluster``'s answer: the nodes, and every group with its replicas' indexes."""
        peers = await self.node.refresh_peer_status()
        statuses = {self.node.me.id: self.node.local_status(), **peers}
        nodes = [
            {"id": n.id, "http": n.http, "raft": n.raft, "reachable": n.id in statuses}
            for n in self.node.config.nodes
        ]
        config = self.node.config
        # Every group of the placement, with the nodes that should hold it (reachable or not): a
        # group whose replicas all stay silent is still listed, and a dead replica is still named.
        placement = [(META, config.metadata_voters)]
        placement += [(str(g), config.group_replicas(g)) for g in range(config.queue_groups)]

        def group(name: str, holders: list[str]) -> dict[str, Any]:
            return {"group_id": name, "leader": None, "term": 0, "replicas": [], "placement": holders}

        groups = {name: group(name, [n.id for n in of]) for name, of in placement}
        for node_id, status in statuses.items():
            for name, g in status["groups"].items():
                entry = groups.setdefault(name, group(name, []))
                entry["replicas"].append({"node_id": node_id, **{k: g[k] for k in g if k != "replicas"}})
                if g["is_leader"] and g["term"] >= entry["term"]:
                    entry["leader"], entry["term"] = node_id, g["term"]
        ordered = sorted(groups.values(), key=lambda g: group_sort_key(g["group_id"]))
        for g in ordered:
            g["replicas"].sort(key=lambda r: r["node_id"])
        return {
            "node_id": self.node.me.id,
            "nodes": nodes,
            "groups": ordered,
            "tokens_required": config.security.enabled,
        }

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_spec(self.limits))


_NODE_FIELDS = ("id", "http", "reachable")
_GROUP_FIELDS = ("group_id", "leader", "term", "placement")
_REPLICA_FIELDS = ("node_id", "is_leader", "term", "commit_index", "applied_index", "has_quorum")


def routing_view(view: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/cluster`` as a token without cluster admin sees it: the nodes' ids and HTTP
    addresses (a client routes by them), each group's leader, term, replicas' indexes and
    placement (node ids); never a Raft address (``nodes[].raft``, a replica's ``members`` and the
    peers of its ``term_rises``), which only the Raft network needs (docs/security.md, "What a
    token can see")."""
    return {
        "node_id": view["node_id"],
        "nodes": [{k: n[k] for k in _NODE_FIELDS} for n in view["nodes"]],
        "groups": [
            {
                **{k: g[k] for k in _GROUP_FIELDS},
                "replicas": [{k: r[k] for k in _REPLICA_FIELDS if k in r} for r in g["replicas"]],
            }
            for g in view["groups"]
        ],
        "tokens_required": view["tokens_required"],
    }


def create_app(node: Node) -> web.Application:
    """The node's aiohttp application: public API v1 plus the internal peer API."""

    api = Api(node)
    limits = node.config.limits
    idle = IdleConnections(limits.http_max_idle_connections, api.metrics.idle_closed.inc)
    writes = WriteDeadline(limits.http_write_timeout_ms / 1000, api.metrics.write_timeouts.inc)
    app = web.Application(
        client_max_size=node.config.limits.max_request_bytes,
        middlewares=[
            idle_middleware(idle, writes),  # first: a request served in any middleware is one under way
            metrics_middleware,
            error_middleware,
            sqs_refusal_middleware,  # the refusals below, to an SQS request, in its wire
            request_cap_middleware(limits.http_max_requests, node.keys),  # clients' (not peers') requests
            # a body read (the handlers', and auth's of a body-scoped permission) past the deadline: 408
            body_deadline_middleware(limits.request_timeout_ms / 1000, limits.max_request_bytes),
            auth_middleware(
                node.keys,
                node.config.security,
                api.permission_names,
                api.topic_table,
                max_topics=node.config.limits.max_topics_per_request,
            ),
        ],
    )
    app[METRICS_KEY] = api.metrics
    app[IDLE_KEY] = idle  # the listener counts connections in it (connections.listen)
    app[WRITES_KEY] = writes  # and holds their writes to its deadline

    async def metadata_index(request: web.Request, response: web.StreamResponse) -> None:
        # A write a peer passed on: the metadata applied here after it, for the peer to wait for
        # before it answers (LeaderRouter.forward), so its reads follow the write.
        if request.headers.get(FORWARDED) and request.method not in ("GET", "HEAD") and node.metadata:
            response.headers[METADATA_INDEX_HEADER] = str(node.metadata.applied_index)

    app.on_response_prepare.append(metadata_index)
    app[NODE_KEY] = node
    app[API_KEY] = api
    r = app.router
    r.add_get("/healthz", api.healthz)
    r.add_get("/readyz", api.readyz)
    r.add_get("/v1/cluster", api.cluster)
    r.add_post("/v1/topics", api.create_topic)
    r.add_get("/v1/topics", api.list_topics)
    r.add_get("/v1/topics/{topic}", api.get_topic)
    r.add_patch("/v1/topics/{topic}", api.patch_topic)
    r.add_delete("/v1/topics/{topic}", api.delete_topic)
    r.add_post("/v1/topics/{topic}/messages", api.produce)
    r.add_get("/v1/topics/{topic}/queues/{queue}/messages", api.fetch)
    r.add_put("/v1/groups/{group}/offsets", api.put_offsets)
    r.add_get("/v1/groups/{group}/offsets", api.get_offsets)
    r.add_get("/openapi.json", api.openapi)
    r.add_get("/metrics", metrics_handler)
    delivery = api.subscriptions
    api.metrics.registry.register(BarrierCollector(node, api.router.actions.barriers.counts))
    api.metrics.registry.register(ReadAheadCollector(node, delivery.coordinator.read_ahead.counts))
    api.metrics.registry.register(WaitingReceiversCollector(node, delivery.coordinator.waiting))
    add_subscription_routes(app, delivery)
    add_internal_routes(app, node, api, delivery)
    add_group_routes(app, node, api)
    add_push_routes(app, node, api, delivery)
    add_segment_routes(app, SegmentsApi(node, api))
    add_cluster_routes(app, node, api)
    add_consumer_routes(app, node, api)  # GET /v1/topics/{topic}/groups (cluster/api/handlers/consumers.py)
    # the web console: /ui (cluster/api/console.py), its first view written into the page
    add_console_routes(app, api.cluster_view, tokens_required=node.config.security.enabled)
    add_sqs_routes(app, node, api, delivery)  # the Amazon SQS API: POST / (cluster/api/sqs/)
    return app


def create_runner(app: web.Application, limits: Limits) -> web.AppRunner:
    """The runner that serves ``app``: no access log; aiohttp's 400s for malformed HTTP counted, not
    logged each (cluster/api/server_log.py); a connection with no request under way for
    ``limits.http_idle_timeout_ms`` closed, from its accept on (an idle one, headers trickled) as
    between requests (aiohttp's default here is an hour: a descriptor an hour per connection for
    anyone who reaches the port, before any credential)."""
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        logger=server_logger(app),
        keepalive_timeout=limits.http_idle_timeout_ms / 1000,
    )
