"""Prometheus metrics of a node (``GET /metrics``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

__all__ = ["metrics_handler", "metrics_middleware"]

REGISTRY = CollectorRegistry()
REQUESTS = Counter(
    "raftmq_http_requests",
    "HTTP requests by route and status",
    ["method", "route", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "raftmq_http_request_seconds",
    "HTTP request latency by route",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15),
    registry=REGISTRY,
)


@web.middleware
async def metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    start = time.perf_counter()
    response = await handler(request)
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "unmatched"
    REQUESTS.labels(request.method, route, str(response.status)).inc()
    LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
    return response


async def metrics_handler(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
