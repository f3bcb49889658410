"""Every internal route is closed by the authentication middleware alone (``cluster/api/auth.py``):
without the peer key (no key, a wrong one, an API token, the backup key off its routes) a request
is refused 401 ``unauthorized`` before any handler runs, so no handler checks the key again. Only
``POST /internal/proof`` is open (an added node proves it holds the key there). Built from the
node's real application, so a route added later is covered too."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftmq.cluster.api.app import create_app
from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.config.keys import BACKUP_HEADER, BACKUP_ROUTES, PEER_HEADER, PROOF_PATH
from raftmq.cluster.node.node import Node

SECRET = "0123456789abcdef0123"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
NODES = [
    {"id": f"n{i}", "http": f"127.0.0.1:{8000 + i}", "raft": f"127.0.0.1:{7000 + 100 * i}", "data_dir": "/d"}
    for i in (1, 2, 3)
]


def app_and_node(tokens: bool) -> tuple[web.Application, Node]:
    raw: dict[str, Any] = {"cluster": {"secret": SECRET}, "nodes": NODES}
    if tokens:
        raw["security"] = {"tokens": [{"name": "ops", "token": ADMIN_TOKEN, "admin": ["*"]}]}
    node = Node(parse_config(raw), "n1")
    return create_app(node), node


def internal_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, route pattern) of every internal route of ``app``."""
    out = []
    for route in app.router.routes():
        canonical = route.resource.canonical if route.resource is not None else ""
        if canonical.startswith("/internal/") and (route.method, canonical) != ("POST", PROOF_PATH):
            out.append((route.method, canonical))
    return out


async def through_auth(app: web.Application, method: str, canonical: str, headers: dict[str, str]) -> Any:
    """The auth middleware's answer to a request for the route; "reached" when it passed it on."""
    path = re.sub(r"\{(\w+)\}", lambda m: "barrier" if m[1] == "action" else "x", canonical)
    request = make_mocked_request(method, path, headers=headers, app=app)
    match = await app.router.resolve(request)
    assert match.route.resource is not None and match.route.resource.canonical == canonical
    request._match_info = match  # as aiohttp's own dispatch sets it
    auth = app.middlewares[-1]

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text="reached")

    response = await auth(request, handler)
    if response.text == "reached":
        return "reached"
    return response.status, orjson.loads(response.body)["error"]["code"]


@pytest.mark.parametrize("tokens", [False, True])
def test_no_internal_route_passes_without_the_peer_key(tokens: bool) -> None:
    app, node = app_and_node(tokens)
    routes = internal_routes(app)
    assert len(routes) >= 15, routes  # the internal API is there to check
    refused = (401, "unauthorized")
    wrong_key = "0" * 64
    for method, canonical in routes:
        backup_route = (method if method != "HEAD" else "GET", canonical) in {
            (m, c) for m, c, _ in BACKUP_ROUTES
        }
        attempts: dict[str, dict[str, str]] = {
            "none": {},
            "wrong peer key": {PEER_HEADER: wrong_key},
            "admin token": {"Authorization": f"Bearer {ADMIN_TOKEN}"},
            "forwarded": {"X-Raftmq-Forwarded": "n2"},
        }
        if not backup_route:
            attempts["backup key"] = {BACKUP_HEADER: node.keys.backup}
        for what, headers in attempts.items():
            got = asyncio.run(through_auth(app, method, canonical, headers))
            assert got == refused, (method, canonical, what, got)
        # The peer key opens every one of them (so the refusals above are the key's doing).
        assert asyncio.run(through_auth(app, method, canonical, {PEER_HEADER: node.keys.peer})) == "reached"


def test_the_backup_key_opens_only_its_routes() -> None:
    app, node = app_and_node(True)
    opened = {
        (method, canonical)
        for method, canonical in internal_routes(app)
        if asyncio.run(through_auth(app, method, canonical, {BACKUP_HEADER: node.keys.backup})) == "reached"
    }
    # GET only (HEAD is not a backup route); the action route only for the barrier.
    assert opened == {
        ("GET", "/internal/status"),
        ("POST", "/internal/groups/{group}/{action}"),
        ("GET", "/internal/groups/{group}/checkpoint"),
    }
    request = make_mocked_request(
        "POST", "/internal/groups/0/append", headers={BACKUP_HEADER: node.keys.backup}, app=app
    )

    async def append() -> int:
        request._match_info = await app.router.resolve(request)

        async def handler(request: web.Request) -> web.StreamResponse:
            raise AssertionError("the append action was reached with the backup key")

        return (await app.middlewares[-1](request, handler)).status

    assert asyncio.run(append()) == 401
