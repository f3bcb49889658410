"""A request whose queue group's store closes under it (a snapshot install, a storage failure
stopping the group) is answered 503 and retriable, never 500 ``internal``: the chaos soak's binary
fetch answered 500 when its first read met a closed store."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftmq.cluster.api.common import error_middleware
from raftmq.storage.memory import MemoryStore


async def answer(method: str) -> web.StreamResponse:
    store = MemoryStore()
    store.close()

    async def handler(request: web.Request) -> web.StreamResponse:
        store.get(b"queue-meta")  # raises StoreClosed
        return web.Response()

    request = make_mocked_request(method, "/v1/topics/t/queues/0/messages")
    return await error_middleware(request, handler)


@pytest.mark.parametrize(
    ("method", "code", "definite"), [("GET", "unavailable", True), ("POST", "unknown_outcome", False)]
)
def test_a_closed_store_is_a_retriable_503(method: str, code: str, definite: bool) -> None:
    response = asyncio.run(answer(method))
    assert isinstance(response, web.Response) and response.body is not None
    assert response.status == 503
    error = orjson.loads(bytes(response.body))["error"]  # type: ignore[arg-type]
    assert (error["code"], error["retriable"], error["definite"]) == (code, True, definite)
