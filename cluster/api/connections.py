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

A client that never reads its socket held a handler for good: once the kernel's buffers are full an
answer's (or a push stream's frame's) write waits on the transport's drain, which never came, and
an answer left in the transport's buffer kept its connection open after the node closed it (asyncio
flushes a buffer before it lets go). :class:`WriteDeadline` aborts a connection whose writes are
paused (its buffer over the high-water mark, 64 KiB), or that has no request in the application
and still unsent bytes after its last answer, when less of its buffer left in
``limits.http_write_timeout_ms`` than ``MIN_WRITE_BYTES_PER_S`` would send
(``raftmq_http_write_timeouts_total``): a client that reads steadily at that rate is not cut,
whatever the answer's size; one reading a trickle is. A long poll or a push
stream that waits for messages writes nothing, and is not cut.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = ["IDLE_KEY", "WRITES_KEY", "IdleConnections", "WriteDeadline", "idle_middleware", "listen"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIN_WRITE_BYTES_PER_S = 64 * 1024  # the slowest steady reading the write deadline allows for
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

    def between_requests(self, protocol: asyncio.BaseProtocol, transport: asyncio.BaseTransport) -> bool:
        """Whether no request of the connection is in the application: it is idle, or closing."""
        return protocol in self._idle or transport.is_closing()

    def _evict(self) -> None:
        while len(self._idle) > self._max_idle:
            _, transport = self._idle.popitem(last=False)
            transport.close()
            self._on_evicted()


class WriteDeadline:
    """The node's connections by aiohttp's protocol, each with the deadline of its unsent bytes."""

    def __init__(self, within_s: float, on_timeout: Callable[[], None]) -> None:
        self.within_s = within_s
        self.on_timeout = on_timeout
        self._by_protocol: dict[asyncio.BaseProtocol, _Counted] = {}

    def opened(self, protocol: asyncio.BaseProtocol, connection: _Counted) -> None:
        self._by_protocol[protocol] = connection

    def closed(self, protocol: asyncio.BaseProtocol) -> None:
        self._by_protocol.pop(protocol, None)

    def answered(self, protocol: asyncio.BaseProtocol | None) -> None:
        """A request of ``protocol`` left the application: its answer must then be sent in time."""
        connection = self._by_protocol.get(protocol) if protocol is not None else None
        if connection is not None:
            connection.check_later(fresh=False)


IDLE_KEY: web.AppKey[IdleConnections] = web.AppKey("idle_connections", IdleConnections)
WRITES_KEY: web.AppKey[WriteDeadline] = web.AppKey("write_deadline", WriteDeadline)


def idle_middleware(idle: IdleConnections, writes: WriteDeadline) -> Middleware:
    """The outermost middleware: a connection is not idle while one of its requests is served."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        idle.busy(request.protocol)
        try:
            # (An answer aiohttp writes after this returns is in the transport's buffer, which
            # closing the connection for the cap flushes first: it is not cut, but it must leave
            # within the write deadline.)
            return await handler(request)
        finally:
            idle.done(request.protocol)
            writes.answered(request.protocol)

    return middleware


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, its opening and closing told to ``idle``, its writes
    held to ``writes``' deadline."""

    def __init__(self, inner: asyncio.Protocol, idle: IdleConnections, writes: WriteDeadline) -> None:
        self._inner = inner
        self._idle = idle
        self._writes = writes
        self._transport: asyncio.WriteTransport | None = None
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._unsent_when_set = 0  # the buffer's unsent bytes when the timer was set

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport
        self._inner.connection_made(transport)
        self._idle.opened(self._inner, transport)
        self._writes.opened(self._inner, self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._cancel()
        self._idle.closed(self._inner)
        self._writes.closed(self._inner)
        self._inner.connection_lost(exc)

    def check_later(self, fresh: bool) -> None:
        """Check the connection's unsent bytes ``within_s`` from now (``fresh``), or from when a
        check already due was set."""
        if fresh:
            self._cancel()
        if self._timer is None and self._transport is not None:
            self._unsent_when_set = self._transport.get_write_buffer_size()
            self._timer = asyncio.get_running_loop().call_later(self._writes.within_s, self._check)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        """Abort the connection if too little of its buffer left since the check was set and its
        writes are still paused, or bytes are still unsent with no request in the application
        (the answer of the last one: no later write of a request under way is judged here). A
        buffer that went down by ``MIN_WRITE_BYTES_PER_S`` over the deadline (or emptied) is a
        client still reading, however large the answer: the check is set again (a 4 MiB answer
        read steadily at 1.6 MB/s was cut at 0.4 MB by a 1 s deadline on the whole write); one
        that reads a trickle is cut (a packet per deadline would hold it, and its answer, for
        ever)."""
        self._timer = None
        transport = self._transport
        if transport is None:
            return
        unsent = transport.get_write_buffer_size()
        if not self._paused and not (unsent and self._idle.between_requests(self._inner, transport)):
            return
        moved = self._unsent_when_set - unsent
        if moved >= min(MIN_WRITE_BYTES_PER_S * self._writes.within_s, self._unsent_when_set):
            self.check_later(fresh=True)
            return
        transport.abort()  # not close(): that would wait to flush what the client never reads
        self._writes.on_timeout()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._paused = True
        self.check_later(fresh=True)
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False
        self._cancel()
        if self._transport is not None and self._transport.get_write_buffer_size():
            self.check_later(fresh=True)  # the rest must leave in time too
        self._inner.resume_writing()


async def listen(
    runner: web.AppRunner, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> asyncio.Server:
    """Serve ``runner`` (set up) on ``host:port``, each connection counted in its application's
    ``IDLE_KEY`` and its writes held to its ``WRITES_KEY``. Close the returned server before
    ``runner.cleanup()``, as a site is stopped."""
    server, idle, writes = runner.server, runner.app[IDLE_KEY], runner.app[WRITES_KEY]
    assert server is not None, "the runner is set up"
    # A TLS connection is made (and counted) once its handshake is done: a handshake gets
    # TLS_HANDSHAKE_S, not asyncio's default minute.
    handshake_s = TLS_HANDSHAKE_S if ssl_context is not None else None
    return await asyncio.get_running_loop().create_server(
        lambda: _Counted(server(), idle, writes),
        host,
        port,
        ssl=ssl_context,
        reuse_address=True,
        backlog=128,
        ssl_handshake_timeout=handshake_s,
    )
