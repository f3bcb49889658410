"""The transport's ``address_map`` and ``keep_alive`` options, against a real aiohttp server.

``address_map`` lets a client reach nodes whose advertised addresses it cannot (the chaos harness:
``http://n1:8080`` inside a docker network is a random port on 127.0.0.1 outside); ``keep_alive=False``
gives every request a fresh connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from raftmq.client import ConnectionFailed
from raftmq.client._transport import Transport

ADVERTISED = "http://n1:8080"


class Server:
    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self.url = ""

    async def echo(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.peers.append(tuple(peer) if peer else ("?", 0))
        return web.json_response({"path": request.path})


def run_with_server(test: Callable[[Server], Awaitable[None]]) -> None:
    """Serve ``GET /v1/echo`` on a free port of 127.0.0.1 while ``test(server)`` runs."""

    async def main() -> None:
        server = Server()
        app = web.Application()
        app.router.add_get("/v1/echo", server.echo)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            await test(server)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_requests_to_an_advertised_address_go_where_the_map_says() -> None:
    async def test(server: Server) -> None:
        seen: list[str] = []

        def address_map(url: str) -> str | None:
            seen.append(url)
            return server.url if url == ADVERTISED else None

        t = Transport([ADVERTISED], address_map=address_map, request_timeout_ms=2000)
        try:
            assert await t.request("GET", "/v1/echo", idempotent=True) == {"path": "/v1/echo"}
        finally:
            await t.close()
        assert seen == [ADVERTISED]
        assert len(server.peers) == 1

    run_with_server(test)


def test_a_node_the_map_cannot_place_is_a_definite_failure_and_nothing_is_sent() -> None:
    async def test(server: Server) -> None:
        t = Transport([ADVERTISED], address_map=lambda url: None, request_timeout_ms=2000)
        try:
            with pytest.raises(ConnectionFailed) as caught:
                await t.request("GET", "/v1/echo", idempotent=False)
        finally:
            await t.close()
        assert caught.value.definite
        assert type(caught.value) is ConnectionFailed  # not ConnectionLost: nothing left the client
        assert server.peers == []

    run_with_server(test)


def test_an_unplaceable_node_is_skipped_for_the_next_one() -> None:
    async def test(server: Server) -> None:
        t = Transport(
            [ADVERTISED, "http://n2:8080"],
            address_map=lambda url: server.url if url == "http://n2:8080" else None,
            request_timeout_ms=2000,
        )
        t._preferred = 0
        try:
            assert await t.request("GET", "/v1/echo", idempotent=False) == {"path": "/v1/echo"}
        finally:
            await t.close()
        assert len(server.peers) == 1

    run_with_server(test)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_keep_alive_false_opens_a_connection_per_request(keep_alive: bool) -> None:
    async def test(server: Server) -> None:
        t = Transport([server.url], keep_alive=keep_alive, request_timeout_ms=2000)
        try:
            for _ in range(3):
                await t.request("GET", "/v1/echo", idempotent=True)
        finally:
            await t.close()
        client_ports = {port for _, port in server.peers}
        assert len(server.peers) == 3
        assert len(client_ports) == (1 if keep_alive else 3)

    run_with_server(test)
