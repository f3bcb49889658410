"""The transport's failover rule, against a fake HTTP session (no sockets): a request whose outcome
is unknown is resent elsewhere only if it is idempotent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from raftmq.client import ClientClosed, ConnectionFailed, ConnectionLost, NotLeader
from raftmq.client._transport import Transport, normalize_urls

REFUSED = "refused"
DROPPED = "dropped"


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self._body = body

    async def read(self) -> bytes:
        return self._body


class FakeSession:
    """Per URL prefix: REFUSED (never sent), DROPPED (sent, no answer), or (status, body)."""

    def __init__(self, behaviour: dict[str, Any]) -> None:
        self.behaviour = behaviour
        self.calls: list[str] = []

    def request(self, method: str, url: str, **kw: Any) -> Any:
        self.calls.append(url)
        outcome = next(v for k, v in self.behaviour.items() if url.startswith(k))

        class Ctx:
            async def __aenter__(self) -> FakeResponse:
                if outcome == REFUSED:
                    key = SimpleNamespace(host="h", port=1, ssl=None)
                    raise aiohttp.ClientConnectorError(key, OSError(111, "refused"))  # type: ignore[arg-type]
                if outcome == DROPPED:
                    raise aiohttp.ServerDisconnectedError()
                return FakeResponse(*outcome)

            async def __aexit__(self, *exc: object) -> None:
                return None

        return Ctx()

    async def close(self) -> None: ...


def _transport(behaviour: dict[str, Any]) -> tuple[Transport, FakeSession]:
    t = Transport(["http://a", "http://b", "http://c"])
    t._preferred = 0
    session = FakeSession(behaviour)
    t._session = session  # type: ignore[assignment]
    return t, session


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_bootstrap_addresses_are_normalized() -> None:
    assert normalize_urls("h1:80, http://h2:81/") == ["http://h1:80", "http://h2:81"]
    with pytest.raises(ValueError):
        normalize_urls(" , ")


def test_a_refused_connection_moves_on_to_the_next_node_even_for_writes() -> None:
    t, session = _transport({"http://a": REFUSED, "http://b": (200, b'{"ok": 1}'), "http://c": REFUSED})
    assert run(t.request("POST", "/v1/topics", body={"name": "x"}, idempotent=False)) == {"ok": 1}
    assert session.calls == ["http://a/v1/topics", "http://b/v1/topics"]
    assert t._preferred == 1  # the refusing node is no longer tried first


def test_a_dropped_write_is_not_resent() -> None:
    t, session = _transport({"http://a": DROPPED, "http://b": (200, b"{}"), "http://c": (200, b"{}")})
    with pytest.raises(ConnectionLost) as info:
        run(t.request("POST", "/v1/topics", body={"name": "x"}, idempotent=False))
    assert not info.value.definite
    assert len(session.calls) == 1


def test_a_dropped_idempotent_request_moves_on() -> None:
    t, session = _transport({"http://a": DROPPED, "http://b": DROPPED, "http://c": (200, b"[1]")})
    assert run(t.request("GET", "/v1/topics", idempotent=True)) == [1]
    assert len(session.calls) == 3


def test_the_preferred_node_is_tried_first() -> None:
    t, session = _transport({"http://": (200, b"{}")})
    run(t.request("GET", "/x", node_url="http://leader", idempotent=True))
    assert session.calls == ["http://leader/x"]


def test_no_reachable_node_is_a_definite_connection_failure() -> None:
    t, _ = _transport({"http://": REFUSED})
    with pytest.raises(ConnectionFailed) as info:
        run(t.request("POST", "/x", body=b"{}", idempotent=False))
    assert type(info.value) is ConnectionFailed and info.value.definite


def test_an_error_answer_is_raised_without_trying_other_nodes() -> None:
    body = b'{"error": {"code": "not_leader", "message": "m", "retriable": true, "definite": true}}'
    t, session = _transport({"http://": (421, body)})
    with pytest.raises(NotLeader):
        run(t.request("GET", "/x", idempotent=True))
    assert len(session.calls) == 1


def test_a_closed_transport_refuses_requests() -> None:
    t, _ = _transport({"http://": (200, b"{}")})
    run(t.close())
    with pytest.raises(ClientClosed):
        run(t.request("GET", "/x", idempotent=True))
