"""A stand-in node for unit tests of the client: a real aiohttp server on 127.0.0.1 that answers
only the routes a test gives it, so the client's real transport meets answers the test controls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")


@contextlib.asynccontextmanager
async def serve(*routes: web.RouteDef) -> AsyncIterator[str]:
    """Serve ``routes`` (``web.get(path, handler)``, ...) on a free port until the block ends;
    yields the node's address, ``"127.0.0.1:<port>"``."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def run(main: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
    """Run a test's ``main`` in a new event loop; a hang fails it after ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(main, timeout_s))
