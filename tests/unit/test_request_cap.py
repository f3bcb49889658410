"""The cap on clients' requests in the application (cluster/api/slow_clients.py,
``request_cap_middleware``): a real aiohttp server with the node's error middleware and real HTTP.

A node holding ``limits.http_max_requests`` long polls answered 429 to its own health check
(``deploy/docker/healthcheck.py`` then restarted it). The scrape stays counted: it reads every led
group's store in the executor, and uncounted it would be unbounded (a review of the exemption).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.api.slow_clients import request_cap_middleware
from raftmq.cluster.config.keys import derive_keys

POLL = "/v1/topics/t/queues/0/messages"


async def _statuses_while_full() -> dict[str, int]:
    release = asyncio.Event()
    polling = asyncio.Event()

    async def long_poll(request: web.Request) -> web.Response:
        polling.set()
        await release.wait()
        return web.Response(text="[]")

    async def quick(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[error_middleware, request_cap_middleware(1, derive_keys("s"))])
    app.router.add_get("/v1/topics/{topic}/queues/{queue}/messages", long_poll)
    for path in ("/healthz", "/readyz", "/metrics", "/v1/cluster"):
        app.router.add_get(path, quick)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            held = asyncio.ensure_future(session.get(base + POLL))
            await asyncio.wait_for(polling.wait(), 5)  # the one request the cap allows is under way
            statuses = {}
            for path in ("/healthz", "/readyz", "/metrics", "/v1/cluster", POLL):
                async with session.get(base + path) as answer:
                    statuses[path] = answer.status
            release.set()
            async with await held as answer:
                statuses["held"] = answer.status
            return statuses
    finally:
        await runner.cleanup()


def test_health_checks_are_answered_at_the_cap() -> None:
    statuses = asyncio.run(_statuses_while_full())
    assert statuses["/healthz"] == 200 and statuses["/readyz"] == 200, statuses
    assert statuses["/metrics"] == 429, f"the scrape is counted: {statuses}"
    assert statuses["/v1/cluster"] == 429 and statuses[POLL] == 429, f"the cap held nothing: {statuses}"
    assert statuses["held"] == 200
