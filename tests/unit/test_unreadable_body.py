"""A body aiohttp cannot read (``Content-Encoding: gzip`` over bytes that are no gzip stream) is
the client's error: 400 ``bad_request`` through the real error middleware, with no traceback in
the log, over a real aiohttp server and client. Before, ``RequestPayloadError`` was neither a
connection error nor a client error and came out as a 500 with ``request_failed`` logged: on the
routes that read a body before any credential (the SQS API, ``/internal/proof``), an
unauthenticated line in the log per request."""

from __future__ import annotations

import asyncio

import aiohttp
import structlog
from aiohttp import web

from raftmq.cluster.api.common import error_middleware


async def _status_and_logs() -> tuple[int, dict[str, object], list[str]]:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/b", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with structlog.testing.capture_logs() as logs:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"http://127.0.0.1:{port}/b",
                    data=b"this is no gzip stream" * 10,
                    headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                ) as r,
            ):
                return r.status, await r.json(), [str(e.get("event")) for e in logs]
    finally:
        await runner.cleanup()


def test_a_body_that_cannot_be_decoded_is_a_400_and_logs_nothing() -> None:
    status, body, events = asyncio.run(_status_and_logs())
    assert status == 400, body
    assert body["error"]["code"] == "bad_request"  # type: ignore[index]
    assert "request_failed" not in events, events
