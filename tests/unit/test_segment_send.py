"""A segment's file as an answer (cluster/api/handlers/segments.py, ``send_file``): a real aiohttp
server with the node's error middleware, real files and a real socket.

A ``HEAD`` sent the whole file as a body (aiohttp's ``StreamResponse`` does not drop it), so the
next answer on the connection was read out of the file's bytes. A read that failed after the
headers (an ``OSError``: a disk's EIO) reached the error middleware, which wrote a whole
``HTTP/1.1 500`` inside the 200's body and kept the connection.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.api.handlers.segments import send_file

FILE = b"segment-bytes-" * 4096  # 56 KiB


async def _exchange(opener: Any, size: int, sent: bytes, settle_s: float = 0.5) -> bytes:
    """Serve ``opener()`` (``size`` bytes) at ``/``, send ``sent`` on one connection, and return
    all it answers until it closes or ``settle_s`` passes with nothing more."""

    async def segment(request: web.Request) -> web.StreamResponse:
        return await send_file(request, opener(), size, "application/octet-stream", {"X-Crc": "1"})

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/", segment)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    try:
        writer.write(sent)
        while True:
            try:
                part = await asyncio.wait_for(reader.read(65536), settle_s)
            except (TimeoutError, ConnectionError):
                break
            if not part:
                got += b"<EOF>"
                break
            got += part
        return got
    finally:
        writer.close()
        await runner.cleanup()


def test_head_answers_headers_only_and_the_connection_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "seg.arrow"
    path.write_bytes(FILE)
    head = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
    get = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = asyncio.run(_exchange(lambda: path.open("rb"), len(FILE), head + get))
    first_head, _, rest = got.partition(b"\r\n\r\n")
    assert first_head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(FILE)}".encode() in first_head
    assert rest.startswith(b"HTTP/1.1 200"), f"HEAD sent a body: {rest[:40]!r}"
    _, _, body = rest.partition(b"\r\n\r\n")
    assert body == FILE + b"<EOF>", "the GET after the HEAD did not get the file"


def test_a_read_error_after_the_headers_drops_the_connection() -> None:
    # /proc/self/mem is a real file whose read at offset 0 fails with EIO (nothing is mapped there)
    get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    mem = Path("/proc/self/mem")
    got = asyncio.run(_exchange(lambda: mem.open("rb", buffering=0), 4096, get, 3.0))
    assert got.startswith(b"HTTP/1.1 200"), got[:60]
    assert b"HTTP/1.1 500" not in got, "an error answer was written inside the 200's body"
    assert got.endswith(b"<EOF>"), "the connection was kept after a body cut short"
