"""HTTP transport: pooled connections to the bootstrap nodes, failover, and error mapping.

Failover rule (what makes a retry safe):
- The connection could not be opened: the request was never sent, so any request moves on to the
  next node.
- The connection broke (or timed out) after the request was sent: the outcome is unknown. Only an
  ``idempotent`` request (a read, an offset commit, a heartbeat, a produce carrying
  ``producer_id``/``sequence``) moves on to the next node; any other raises
  :class:`~raftmq.client.errors.ConnectionLost` (``definite = False``) and is never resent.

``address_map`` serves clients that cannot reach the addresses the cluster advertises (NAT, ports
mapped by a container runtime): each attempt's node address goes through it, and a node it maps to
None is skipped as unreachable (nothing sent). With one bootstrap node and no ``node_url``, a
request is a single attempt at that node (the chaos workload pins its clients this way).
"""

from __future__ import annotations

import asyncio
import random
import ssl as _ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import orjson

from .errors import ClientClosed, ConnectionFailed, ConnectionLost, UnexpectedResponse, error_from_body

__all__ = ["AddressMap", "Transport", "normalize_urls", "path_part"]

AddressMap = Callable[[str], str | None]
"""Maps a node's advertised base URL (``http://n1:8080``) to the URL to connect to, or None when the
node cannot be reached now."""

# Errors raised before a byte of the request left: the request was certainly not processed.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


def normalize_urls(bootstrap: str | Sequence[str]) -> list[str]:
    """``"h1:80,h2:80"`` or ``["http://h1:80", ...]`` as ``["http://h1:80", ...]``."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    urls = []
    for item in items:
        url = item.strip().rstrip("/")
        if not url:
            continue
        urls.append(url if "://" in url else f"http://{url}")
    if not urls:
        raise ValueError("bootstrap needs at least one node address")
    return urls


def path_part(name: str) -> str:
    """``name`` escaped as one URL path segment."""
    return quote(name, safe="")


class Transport:
    """Sends requests to the cluster. Create and use it inside one event loop.

    Args:
        bootstrap: Node addresses; any node answers any request.
        request_timeout_ms: Total time for one attempt at one node (long polls add their wait).
        connect_timeout_ms: Time to open a connection before moving on to the next node.
        max_connections: Pooled connections in total (0: unlimited).
        address_map: Where to connect for a node address (see the module docstring).
        keep_alive: False opens a new connection for every request: a pooled connection to a node
            that restarted would turn a certain failure (refused) into an unknown one (reset).
        token: API token, sent as ``Authorization: Bearer <token>`` (clusters with tokens).
        ca_file: CA certificates (PEM) that ``https://`` nodes' certificates are verified against
            (default: the system's CAs).
        ssl: An SSL context for ``https://`` nodes (overrides ``ca_file``).
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 2_000,
        max_connections: int = 0,
        address_map: AddressMap | None = None,
        keep_alive: bool = True,
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self.bootstrap = normalize_urls(bootstrap)
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        # Certificates are always verified: the system's CAs, ca_file's, or the caller's context.
        self._ssl = ssl or (_ssl.create_default_context(cafile=ca_file) if ca_file else True)
        self._address_map = address_map
        self._keep_alive = keep_alive
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._max_connections = max_connections
        self._preferred = random.randrange(len(self.bootstrap))  # spread clients over the nodes
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    limit_per_host=0,
                    force_close=not self._keep_alive,
                    ssl=self._ssl,
                ),
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    def _candidates(self, node_url: str | None) -> list[str]:
        n = len(self.bootstrap)
        ordered = [self.bootstrap[(self._preferred + i) % n] for i in range(n)]
        if node_url is not None:
            ordered = [node_url, *(u for u in ordered if u != node_url)]
        return ordered

    def _reachable(self, node_url: str | None, failures: list[Exception]) -> Iterator[tuple[str, str]]:
        """``(url, where to connect)`` of each candidate node in turn; a node ``address_map`` maps to
        None is skipped (demoted, its failure appended to ``failures``, as the caller's are)."""
        for url in self._candidates(node_url):
            target = url if self._address_map is None else self._address_map(url)
            if target is None:
                failures.append(ConnectionFailed(f"{url} has no address now"))
                self._demote(url)
                continue
            yield url, target

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        node_url: str | None = None,
        idempotent: bool,
        extra_timeout_ms: int = 0,
        content_type: str = "application/json",
    ) -> Any:
        """One request, answered by the first node that can be reached.

        Args:
            method, path: e.g. ``"GET"``, ``"/v1/topics"``.
            body: JSON bytes, or an object to encode (or bytes of ``content_type``).
            params: Query parameters.
            node_url: A node to try first (the leader of the group concerned).
            idempotent: Safe to resend after the outcome of an attempt became unknown.
            extra_timeout_ms: Added to the attempt's timeout (the ``wait_ms`` of a long poll).
            content_type: The body's media type (the producer's record batches:
                ``application/vnd.raftmq.batch``).

        Returns:
            The parsed JSON answer of a 2xx response.

        Raises:
            RaftmqError: The mapped API error; ConnectionFailed when no node could be reached;
                ConnectionLost when an attempt's outcome is unknown (see the module docstring).
        """
        session = self._get_session()
        data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else None
        timeout = aiohttp.ClientTimeout(
            total=(self.request_timeout_ms + extra_timeout_ms) / 1000,
            sock_connect=self.connect_timeout_ms / 1000,
        )
        sent_somewhere = False
        failures: list[Exception] = []
        for url, target in self._reachable(node_url, failures):
            try:
                async with session.request(
                    method, target + path, data=data, params=params, headers=headers, timeout=timeout
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
            except _NOT_SENT as e:
                failures.append(e)
                self._demote(url)
                continue
            except (aiohttp.ClientError, TimeoutError) as e:
                failures.append(e)
                sent_somewhere = True
                self._demote(url)
                if idempotent:
                    continue
                raise ConnectionLost(f"{method} {url}{path}: {_describe(e)}") from e
            return _parse(status, raw)
        where = ", ".join(self._candidates(node_url))
        last = _describe(failures[-1] if failures else None)
        if sent_somewhere:
            raise ConnectionLost(f"{method} {path}: no answer from any node ({where}): {last}")
        raise ConnectionFailed(f"{method} {path}: cannot reach any node ({where}): {last}")

    async def open_websocket(
        self, path: str, *, params: Mapping[str, str | int] | None = None, heartbeat_s: float | None = None
    ) -> aiohttp.ClientWebSocketResponse[Literal[False]]:
        """A WebSocket (text frames as bytes) to the first node that accepts it (the push stream).

        Raises:
            RaftmqError: The API error of a refused upgrade (asked of the same route without it);
                ConnectionFailed when no node could be reached.
        """
        session = self._get_session()
        failures: list[Exception] = []
        for url, target in self._reachable(None, failures):
            try:
                async with asyncio.timeout((self.connect_timeout_ms + self.request_timeout_ms) / 1000):
                    return await session.ws_connect(
                        target + path, params=params, heartbeat=heartbeat_s, max_msg_size=0, decode_text=False
                    )
            except aiohttp.WSServerHandshakeError:
                await self.request("GET", path, params=params, node_url=url, idempotent=True)
                raise UnexpectedResponse(f"{url}{path} refused the WebSocket upgrade") from None
            except (aiohttp.ClientError, TimeoutError) as e:
                failures.append(e)
                self._demote(url)
        where = ", ".join(self._candidates(None))
        last = _describe(failures[-1] if failures else None)
        raise ConnectionFailed(f"GET {path} (WebSocket): cannot reach any node ({where}): {last}")

    def _demote(self, url: str) -> None:
        """Prefer the next bootstrap node after ``url`` failed."""
        if url in self.bootstrap and self.bootstrap[self._preferred] == url:
            self._preferred = (self._preferred + 1) % len(self.bootstrap)

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


def _describe(e: Exception | None) -> str:
    return f"{type(e).__name__}: {e}" if e is not None else "no attempt"


def _parse(status: int, raw: bytes) -> Any:
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    if 200 <= status < 300:
        if body is None:
            raise UnexpectedResponse(f"HTTP {status} with a body that is not JSON", {"status": status})
        return body
    raise error_from_body(status, body)
