"""The workload's view of the broker: produce one message, fetch a queue by offset.

Every call ends in an ``Outcome`` whose ``type`` is what the history records:

- ``ok``: the broker answered 200.
- ``fail``: it certainly did not happen: an error with ``definite: true``, a connection that was
  never opened (refused, node down).
- ``info``: the outcome is unknown: a timeout, a reset or closed connection after the request went
  out, an error with ``definite: false``, a 5xx answer that is not the API's error body. Reads get
  ``info`` on the same grounds as writes (Jepsen's rule), though they change nothing.

The transport is plain HTTP (aiohttp) behind ``BrokerClient``; ``raftmq.client`` can replace it
without touching the workload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

__all__ = ["BrokerClient", "HttpBrokerClient", "NodeDown", "Outcome"]


class NodeDown(Exception):
    """The node has no address now (its container is stopped): nothing was sent."""


@dataclass
class Outcome:
    type: str  # "ok" | "fail" | "info"
    error: str | None = None
    body: dict[str, Any] = field(default_factory=dict)


class BrokerClient(Protocol):
    async def produce(self, node: str, topic: str, queue: int, value: str) -> Outcome:
        """Produce one message to ``queue`` through ``node``; ``body["results"][0]["offset"]`` on ok."""

    async def fetch(
        self, node: str, topic: str, queue: int, offset: int, max_messages: int, wait_ms: int, read_from: str
    ) -> Outcome:
        """Read ``queue`` from ``offset`` through ``node``; ``body["messages"]`` on ok."""

    async def close(self) -> None: ...


class HttpBrokerClient:
    """``BrokerClient`` over aiohttp. ``url_of(node)`` gives the node's current base URL (host ports
    change when a container restarts) or raises ``NodeDown``."""

    def __init__(self, url_of: Callable[[str], str], produce_timeout_s: float = 8.0,
                 fetch_timeout_s: float = 5.0) -> None:  # fmt: skip
        self._url_of = url_of
        self._produce_timeout = aiohttp.ClientTimeout(total=produce_timeout_s, sock_connect=2.0)
        self._fetch_timeout_s = fetch_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # A fresh connection per request: a pooled one to a killed or restarted node would turn
            # the next request's certain failure into an uncertain one.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    async def produce(self, node: str, topic: str, queue: int, value: str) -> Outcome:
        body = {"messages": [{"value": value, "queue": queue}]}
        return await self._call(
            "POST", node, f"/v1/topics/{topic}/messages", json=body, timeout=self._produce_timeout
        )

    async def fetch(
        self, node: str, topic: str, queue: int, offset: int, max_messages: int, wait_ms: int, read_from: str
    ) -> Outcome:
        params = {"offset": offset, "max": max_messages, "wait_ms": wait_ms, "read_from": read_from}
        timeout = aiohttp.ClientTimeout(total=self._fetch_timeout_s + wait_ms / 1000, sock_connect=2.0)
        return await self._call(
            "GET", node, f"/v1/topics/{topic}/queues/{queue}/messages", params=params, timeout=timeout
        )

    async def _call(self, method: str, node: str, path: str, **kw: Any) -> Outcome:
        unsure = "info"
        try:
            url = self._url_of(node) + path
        except NodeDown:
            return Outcome("fail", "node_down")
        try:
            async with self._http().request(method, url, **kw) as r:
                raw = await r.read()
                status = r.status
        except aiohttp.ClientConnectorError:
            return Outcome("fail", "connect_failed")
        except (TimeoutError, asyncio.TimeoutError):  # noqa: UP041 (aiohttp raises either)
            return Outcome(unsure, "client_timeout")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            return Outcome(unsure, "connection_reset")
        except aiohttp.ClientError as e:
            return Outcome(unsure, type(e).__name__)
        try:
            data = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            data = {}
        if status == 200:
            return Outcome("ok", body=data)
        err = data.get("error") if isinstance(data, dict) else None
        if not isinstance(err, dict) or "code" not in err:
            return Outcome(unsure if status >= 500 else "fail", f"http_{status}", data)
        definite = bool(err.get("definite", True))
        return Outcome("fail" if definite else "info", str(err["code"]), data)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
