"""The web console (``/ui``): static HTML, CSS and JavaScript served by every node.

The page is plain files in ``cluster/api/ui/`` (package data; no build step, nothing fetched from
outside: a Content-Security-Policy of ``'self'`` holds the page to this node). It reads the public
JSON API with the API token the operator types in (kept in the tab's ``sessionStorage``), so it
sees exactly what that token may see; the files themselves need no token. See ``docs/console.md``.

The page (``index.html``) carries what its first view needs, so that it shows something before
any request of its own: whether the cluster requires API tokens and, when it does not (anyone who
reaches the node may read ``GET /v1/cluster`` then), the cluster view, as a JSON data block that
the page reads and never executes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError

__all__ = ["add_console_routes", "console_files"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FIRST_VIEW_MARK = b"<!--first-view-->"
FIRST_VIEW_WAIT_S = 2.0  # a page without its first view is served after this, rather than late


def console_files() -> dict[str, tuple[bytes, str]]:
    """``name -> (bytes, content type)`` of every file the console serves, read once at start."""
    out = {}
    for entry in resources.files("raftmq.cluster.api").joinpath("ui").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def first_view_block(view: dict[str, Any]) -> bytes:
    """``view`` as a JSON data block for the page: ``<`` is escaped, so no value (a node id, a
    group name) can close the element or open another."""
    body = orjson.dumps(view).replace(b"<", b"\\u003c")
    return b'<script id="first-view" type="application/json">' + body + b"</script>"


def add_console_routes(
    app: web.Application,
    cluster_view: Callable[[], Awaitable[dict[str, Any]]],
    *,
    tokens_required: bool,
) -> None:
    """``GET /ui`` and ``/ui/`` (the page), ``GET /ui/{file}`` (its files; nothing else), and
    ``GET /``, a redirect to ``/ui`` (a browser pointed at a node finds the console).
    ``cluster_view`` is ``GET /v1/cluster``'s answer, written into the page when no token is needed."""
    files = console_files()

    def serve(name: str) -> web.Response:
        found = files.get(name)
        if found is None:  # only names from the console folder: no path ever reaches the disk
            raise ApiError(errors.NOT_FOUND, "no such console file")
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type, **_HEADERS})

    async def index(request: web.Request) -> web.Response:
        page, content_type = files["index.html"]
        now_ms = time.time_ns() // 1_000_000
        first: dict[str, Any] = {"tokens_required": tokens_required, "cluster": None, "at_ms": now_ms}
        if not tokens_required:
            with contextlib.suppress(TimeoutError):  # then the page reads it itself
                first["cluster"] = await asyncio.wait_for(cluster_view(), FIRST_VIEW_WAIT_S)
        body = page.replace(FIRST_VIEW_MARK, first_view_block(first), 1)
        return web.Response(body=body, headers={"Content-Type": content_type, **_HEADERS})

    async def file(request: web.Request) -> web.Response:
        return serve(request.match_info["file"])

    app.router.add_get("/ui", index)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/{file}", file)

    async def root(request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui")

    app.router.add_get("/", root)
