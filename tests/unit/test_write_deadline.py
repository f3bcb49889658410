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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

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


@dataclass
class _Served:
    """A node-like server answering ``GET /`` with ``size`` bytes through the write deadline, and a
    client socket connected to it (both with kernel buffers of ``buffer`` bytes)."""

    client: socket.socket
    aborted: list[int] = field(default_factory=list)
    transports: list[asyncio.Transport] = field(default_factory=list)


@asynccontextmanager
async def _served(size: int, buffer: int, within_s: float = WITHIN_S) -> AsyncIterator[_Served]:
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    client.setblocking(False)
    served = _Served(client)
    idle = IdleConnections(16, lambda: None)
    writes = WriteDeadline(within_s, lambda: served.aborted.append(1))

    async def answer(request: web.Request) -> web.Response:
        assert isinstance(request.transport, asyncio.Transport)
        served.transports.append(request.transport)
        # a small kernel buffer, so most of the answer stays in the node's
        request.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        return web.Response(body=b"x" * size)

    app = web.Application(middlewares=[idle_middleware(idle, writes)])
    app[IDLE_KEY], app[WRITES_KEY] = idle, writes
    app.router.add_get("/", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server = await listen(runner, "127.0.0.1", 0, None)
    try:
        await asyncio.get_running_loop().sock_connect(
            client, ("127.0.0.1", server.sockets[0].getsockname()[1])
        )
        yield served
    finally:
        client.close()
        server.close()
        await server.wait_closed()
        await runner.cleanup()


async def _unsent_answer_is_aborted() -> tuple[int, bool, int]:
    async with _served(ANSWER, 4096) as served:
        await asyncio.get_running_loop().sock_sendall(served.client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(WITHIN_S / 5)
        (transport,) = served.transports
        unsent = transport.get_write_buffer_size()  # the premise: some waits, not paused
        await asyncio.sleep(WITHIN_S * 3)
        return unsent, transport.is_closing(), len(served.aborted)


def test_an_answer_left_unsent_after_its_request_is_aborted_in_time() -> None:
    unsent, closed, aborted = asyncio.run(_unsent_answer_is_aborted())
    assert 0 < unsent < 64 * 1024, f"the premise: {unsent} bytes wait, the writes not paused"
    assert aborted == 1 and closed, "the connection with an unsent answer was kept"


LARGE = 4 * 1024 * 1024  # one write, far over the high-water mark: the writes pause at once
STEADY_S = 0.02  # the client reads 32 KiB each STEADY_S: about 1.6 MB/s, 4 MiB in about 2.6 s


async def _steady_reader_gets_all(
    chunk: int = 32768, pause_s: float = STEADY_S, within_s: float = WITHIN_S, give_up_s: float = 60.0
) -> tuple[int, int]:
    """A 4 MiB answer written at once, a 0.5 s deadline, and a client that reads ``chunk`` bytes
    every ``pause_s`` (by default it reads the answer steadily over about five deadlines: the bytes
    move all the time, so nothing may cut it)."""
    received = 0
    async with _served(LARGE, 16384, within_s) as served:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(served.client, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        give_up = loop.time() + give_up_s
        while received < LARGE and loop.time() < give_up:
            await asyncio.sleep(pause_s)
            try:
                part = await asyncio.wait_for(loop.sock_recv(served.client, chunk), WITHIN_S * 4)
            except (ConnectionError, TimeoutError):
                break
            if not part:
                break
            received += len(part)
        return received, len(served.aborted)


def test_a_client_reading_a_large_answer_steadily_is_not_cut() -> None:
    received, aborted = asyncio.run(_steady_reader_gets_all())
    assert aborted == 0, f"a client still reading was cut after {received} bytes"
    assert received >= LARGE, f"only {received} bytes of the answer arrived"


def test_a_client_that_reads_a_trickle_is_cut() -> None:
    """Reading 8 KiB every 0.2 s (40 KiB/s) moves the buffer in every deadline, below the floor of
    ``MIN_WRITE_BYTES_PER_S``: such a client would hold its connection and its answer for as long
    as it liked (review: a byte per deadline was enough to re-arm it)."""
    received, aborted = asyncio.run(_steady_reader_gets_all(8192, 0.2, within_s=1.0, give_up_s=4.0))
    assert aborted == 1 and received < LARGE, (received, aborted)
