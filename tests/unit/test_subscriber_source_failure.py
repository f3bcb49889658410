"""A subscriber whose source meets an answer that is not raftmq's stops with an error instead of
waiting forever (against a real aiohttp server that speaks the routes wrongly)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from raftmq.client import AsyncSubscriber, UnexpectedResponse

PATH = "/v1/topics/t/subscriptions/g"


async def topic(request: web.Request) -> web.Response:
    return web.json_response({"name": "t", "queues": 1})


async def broken_receive(request: web.Request) -> web.Response:
    return web.json_response({"not": "messages"})  # 200, but no "messages"


async def broken_stream(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await ws.send_str("this is not a JSON frame")
    async for _ in ws:  # keep the stream open: the client must stop on its own
        pass
    return ws


@pytest.mark.parametrize("mode", ["poll", "push"])
def test_a_broken_answer_stops_the_subscriber_with_an_error(mode: str) -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/topics/t", topic)
        app.router.add_post(PATH + "/receive", broken_receive)
        app.router.add_get(PATH + "/stream", broken_stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with AsyncSubscriber(f"127.0.0.1:{port}", topic="t", group="g", mode=mode) as sub:  # type: ignore[arg-type]
                with pytest.raises(UnexpectedResponse):
                    await sub.receive(timeout_ms=5_000)
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))
