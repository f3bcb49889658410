"""The node's HTTP listener, and its bound on connections with no request under way.

Anyone who reaches the HTTP port may open connections and send part of a request head before any
credential is looked at, and aiohttp keeps a head of up to 128 fields of 8 KiB (1 MiB; about twice
that of the node's memory) until it is complete: 200 such connections took 385 MB of a node. A
connection is *idle* from its accept until a request on it reaches the application, and again from
the end of each request it keeps alive. At most ``limits.http_max_idle_connections`` are kept:
one more closes the connection idle the longest (an attacker's heads push out each other, a
client whose request reaches the application is not counted while it is served: long polls and
push streams are never closed for this). ``limits.http_idle_timeout_ms`` closes the others in time.

Invariant: a protocol is in ``IdleConnections`` only while its connection is open and no request of
it is in the application (between :meth:`IdleConnections.busy` and :meth:`IdleConnections.done`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = ["IDLE_KEY", "IdleConnections", "idle_middleware", "listen"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TLS_HANDSHAKE_S = 10.0  # a TLS handshake not done by then is dropped (it is not counted as idle)


class IdleConnections:
    """The node's open HTTP connections with no request in the application, oldest first."""

    def __init__(self, max_idle: int, on_evicted: Callable[[], None]) -> None:
        self._max_idle = max_idle
        self._on_evicted = on_evicted
        self._idle: OrderedDict[asyncio.BaseProtocol, asyncio.BaseTransport] = OrderedDict()

    def __len__(self) -> int:
        return len(self._idle)

    def opened(self, protocol: asyncio.BaseProtocol, transport: asyncio.BaseTransport) -> None:
        self._idle[protocol] = transport
        self._evict()

    def busy(self, protocol: asyncio.BaseProtocol | None) -> None:
        if protocol is not None:
            self._idle.pop(protocol, None)

    def done(self, protocol: asyncio.BaseProtocol | None) -> None:
        transport = getattr(protocol, "transport", None)  # None once the connection is lost
        if protocol is None or transport is None or transport.is_closing():
            return
        self._idle[protocol] = transport
        self._evict()

    def closed(self, protocol: asyncio.BaseProtocol) -> None:
        self._idle.pop(protocol, None)

    def _evict(self) -> None:
        while len(self._idle) > self._max_idle:
            _, transport = self._idle.popitem(last=False)
            transport.close()
            self._on_evicted()


IDLE_KEY: web.AppKey[IdleConnections] = web.AppKey("idle_connections", IdleConnections)


def idle_middleware(idle: IdleConnections) -> Middleware:
    """The outermost middleware: a connection is not idle while one of its requests is served."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        idle.busy(request.protocol)
        try:
            # (An answer aiohttp writes after this returns is in the transport's buffer, which
            # closing the connection for the cap flushes first: it is not cut.)
            return await handler(request)
        finally:
            idle.done(request.protocol)

    return middleware


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, its opening and closing told to ``idle``."""

    def __init__(self, inner: asyncio.Protocol, idle: IdleConnections) -> None:
        self._inner = inner
        self._idle = idle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)
        self._idle.opened(self._inner, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._idle.closed(self._inner)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


async def listen(
    runner: web.AppRunner, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> asyncio.Server:
    """Serve ``runner`` (set up) on ``host:port``, each connection counted in its application's
    ``IDLE_KEY``. Close the returned server before ``runner.cleanup()``, as a site is stopped."""
    server, idle = runner.server, runner.app[IDLE_KEY]
    assert server is not None, "the runner is set up"
    # A TLS connection is made (and counted) once its handshake is done: a handshake gets
    # TLS_HANDSHAKE_S, not asyncio's default minute.
    handshake_s = TLS_HANDSHAKE_S if ssl_context is not None else None
    return await asyncio.get_running_loop().create_server(
        lambda: _Counted(server(), idle),
        host,
        port,
        ssl=ssl_context,
        reuse_address=True,
        backlog=128,
        ssl_handshake_timeout=handshake_s,
    )
