"""An answer left unsent in a connection's buffer after its request (cluster/api/connections.py,
``WriteDeadline``): a real aiohttp server and a real socket that never reads.

An answer smaller than the transport's high-water mark (64 KiB) never pauses the writes, so the
handler ends; once the client stopped reading, the rest waited in the node's buffer, and closing
the connection (the idle time, the cap) waited to flush it: asyncio never lets such a connection
go. It is aborted ``within_s`` after the answer.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from raftmq.cluster.api.connections import (
    IDLE_KEY,
    WRITES_KEY,
    IdleConnections,
    WriteDeadline,
    idle_middleware,
    listen,
)

WITHIN_S = 0.5
ANSWER = 48 * 1024  # under the high-water mark: the writes never pause


async def _unsent_answer_is_aborted() -> tuple[int, bool, int]:
    aborted: list[int] = []
    idle = IdleConnections(16, lambda: None)
    writes = WriteDeadline(WITHIN_S, lambda: aborted.append(1))
    transports: list[asyncio.Transport] = []

    async def answer(request: web.Request) -> web.Response:
        assert isinstance(request.transport, asyncio.Transport)
        transports.append(request.transport)
        # a small kernel buffer, so most of the answer stays in the node's
        request.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return web.Response(body=b"x" * ANSWER)

    app = web.Application(middlewares=[idle_middleware(idle, writes)])
    app[IDLE_KEY], app[WRITES_KEY] = idle, writes
    app.router.add_get("/", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server = await listen(runner, "127.0.0.1", 0, None)
    port = server.sockets[0].getsockname()[1]
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    try:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(client, ("127.0.0.1", port))
        await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(WITHIN_S / 5)
        (transport,) = transports
        unsent = transport.get_write_buffer_size()  # the premise: some waits, not paused
        await asyncio.sleep(WITHIN_S * 3)
        return unsent, transport.is_closing(), len(aborted)
    finally:
        client.close()
        server.close()
        await server.wait_closed()
        await runner.cleanup()


def test_an_answer_left_unsent_after_its_request_is_aborted_in_time() -> None:
    unsent, closed, aborted = asyncio.run(_unsent_answer_is_aborted())
    assert 0 < unsent < 64 * 1024, f"the premise: {unsent} bytes wait, the writes not paused"
    assert aborted == 1 and closed, "the connection with an unsent answer was kept"
