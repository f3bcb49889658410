"""The URL a request is passed on to another node by (``router.as_routed``): the path this node
routed, as it is, dot segments included. Pure: aiohttp's own parse of a request line."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftmq.cluster.config.nodes import NodeConfig
from raftmq.cluster.node.router import as_routed

PEER = NodeConfig("n2", "127.0.0.1:8082", "127.0.0.1:9082", "/tmp/n2")


async def _answer(request: web.Request) -> web.Response:
    return web.Response()


def _routed(raw: str) -> dict[str, str]:
    """The route parameters aiohttp gives the request line ``raw``."""
    app = web.Application()
    app.router.add_post("/v1/groups/{group}/members", _answer)
    app.router.add_post("/v1/groups/{group}/members/{member_id}", _answer)
    return dict(asyncio.run(app.router.resolve(make_mocked_request("POST", raw, app=app))))


def test_a_routed_path_reaches_the_peer_as_it_was_routed_here() -> None:
    for raw in (
        "/v1/groups/%2E%2E/members",
        "/v1/groups/%2E/members/%2e%2e?x=1",
        "/v1/groups/a%2F..%2Fb/members",
        "/v1/groups/%C3%A9/members",
    ):
        here = make_mocked_request("POST", raw)
        url = as_routed(PEER, here.path_qs)
        assert str(url).startswith("http://127.0.0.1:8082/v1/groups/")
        # The peer's route and parameters are this node's: no dot segment removed on the way.
        assert _routed(url.raw_path_qs) == _routed(raw), raw
    assert as_routed(PEER, "/v1/topics/t/queues/0/messages?offset=3").raw_path_qs == (
        "/v1/topics/t/queues/0/messages?offset=3"
    )


def test_a_peer_host_beyond_ascii_is_sent_idna_encoded() -> None:
    """The peer's address is a URL's host, IDNA-encoded as the HTTP client needs it; the path is
    still sent as routed."""
    peer = NodeConfig("n3", "bücher.example:8082", "bücher.example:9082", "/tmp/n3")
    url = as_routed(peer, "/v1/groups/%2E%2E/members")
    assert url.raw_host == "xn--bcher-kva.example"
    assert url.host == "bücher.example"
    assert str(url) == "http://xn--bcher-kva.example:8082/v1/groups/%2E%2E/members"
