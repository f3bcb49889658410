"""The deadline of a request's body (cluster/api/slow_clients.py, ``body_deadline_middleware``):
a real aiohttp server with the node's error middleware and a real socket.

The deadline was a fixed ``limits.request_timeout_ms`` whatever the body's size: a 4 MiB body had
to come at 3.4 Mbit/s or more, so a slow but steady upload of a large body never completed. It
stretches with the declared ``Content-Length`` at ``MIN_BODY_BYTES_PER_S``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.api.slow_clients import MIN_BODY_BYTES_PER_S, body_deadline_middleware, body_deadline_s

WITHIN_S = 0.5
MAX_BYTES = 4 * 1024 * 1024
BODY = 256 * 1024  # deadline 0.5 + 4 s; sent in about 2 s (128 KiB/s, twice the minimum rate)


async def _steady_upload() -> bytes:
    async def take(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    app = web.Application(middlewares=[error_middleware, body_deadline_middleware(WITHIN_S, MAX_BYTES)])
    app.router.add_post("/", take)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\nConnection: close\r\n\r\n"
    try:
        writer.write(head.encode())
        try:
            for _ in range(BODY // 8192):
                writer.write(b"a" * 8192)
                await writer.drain()
                await asyncio.sleep(1 / 16)  # 8 KiB each 1/16 s: 128 KiB/s
        except ConnectionError:
            pass  # answered and closed before the body was all sent: cut
        answer = b""
        try:
            while part := await asyncio.wait_for(reader.read(65536), 5):
                answer += part
        except ConnectionError:
            pass  # the connection was reset under a late body: what was answered is kept
        return answer
    finally:
        writer.close()
        await runner.cleanup()


def test_a_large_body_sent_slowly_but_steadily_is_read_whole() -> None:
    answer = asyncio.run(_steady_upload())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert answer.endswith(str(BODY).encode())


def test_the_deadline_stretches_with_the_declared_size_up_to_the_largest_body() -> None:
    assert body_deadline_s(10.0, None, MAX_BYTES) == 10.0  # chunked: no size declared
    assert body_deadline_s(10.0, 0, MAX_BYTES) == 10.0
    assert body_deadline_s(10.0, MAX_BYTES, MAX_BYTES) == 10.0 + MAX_BYTES / MIN_BODY_BYTES_PER_S
    # a size over the largest body a node takes (413 once read) does not buy more time
    assert body_deadline_s(10.0, 10**12, MAX_BYTES) == body_deadline_s(10.0, MAX_BYTES, MAX_BYTES)
