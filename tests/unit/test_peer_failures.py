"""A call to another node that fails is a retriable 503, never a 500 ``internal`` (issue 21, item
1): ``router.peer_call`` around a call, and the error middleware for a failure a handler left
unmapped. Nothing sent, or a read: ``unavailable``; a write whose answer was lost:
``unknown_outcome``. The client's own connection closed under the request (it left mid-body) is
no peer's failure: answered 400 to nobody, and not logged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from unittest import mock

import aiohttp
import orjson
import pytest
import structlog
from aiohttp import web
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.test_utils import make_mocked_request

from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.node.router import peer_call

_KEY = ConnectionKey("127.0.0.1", 8083, False, True, None, None, None)


def _refused() -> BaseException:
    return aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(111, "Connect call failed"))


FAILURES: dict[str, Callable[[], BaseException]] = {
    "refused": _refused,
    "disconnected": lambda: aiohttp.ServerDisconnectedError(),
    "reset": lambda: aiohttp.ClientOSError(104, "Connection reset by peer"),
    "timeout": lambda: TimeoutError(),
    "payload": lambda: aiohttp.ClientPayloadError("truncated"),
}


def _expected(method: str, failure: str) -> str:
    return "unavailable" if failure == "refused" or method == "GET" else "unknown_outcome"


def _transport(closing: bool) -> mock.Mock:
    """The request's connection: open, or closing (the client left)."""
    return mock.Mock(is_closing=mock.Mock(return_value=closing))


def _answer(
    method: str,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    client_left: bool = False,
    status: int = 503,
) -> dict[str, object]:
    async def run() -> web.StreamResponse:
        request = make_mocked_request(method, "/v1/groups/duo/offsets", transport=_transport(client_left))
        return await error_middleware(request, handler)

    response = asyncio.run(run())
    assert isinstance(response, web.Response) and response.body is not None
    assert response.status == status, response.body
    if status != 503:
        return dict(orjson.loads(response.body)["error"])
    error: dict[str, object] = orjson.loads(response.body)["error"]
    assert error["retriable"] is True
    return error


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_peer_failure_a_handler_left_unmapped_is_a_retriable_503(method: str, failure: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise FAILURES[failure]()

    error = _answer(method, handler)
    assert error["code"] == _expected(method, failure)
    assert error["definite"] is (error["code"] == "unavailable")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_clients_own_connection_reset_is_a_400_and_logs_nothing(method: str) -> None:
    """Before, it was logged as peer_call_failed: a line per connection, unauthenticated on the
    open POST /internal/proof (and the SQS API, which reads a body before its signature)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        raise ConnectionResetError("Connection lost")  # reading the body of a client that left

    with structlog.testing.capture_logs() as logs:
        error = _answer(method, handler, client_left=True, status=400)
    assert error["code"] == "bad_request" and logs == []


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("failure", [*sorted(FAILURES), "undecodable"])
def test_peer_call_maps_every_failure_of_a_call_to_a_retriable_503(method: str, failure: str) -> None:
    with pytest.raises(RaftmqError) as caught, peer_call(method, "the leader n3 of group 1"):
        if failure == "undecodable":
            orjson.loads(b"<html>bad gateway</html>")
        raise FAILURES[failure]()
    code = caught.value.error
    assert code.status == 503 and code.retriable
    assert code.code == _expected(method, "timeout" if failure == "undecodable" else failure)
