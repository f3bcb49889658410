"""The web console (``/ui``): static HTML, CSS and JavaScript served by every node.

The page is plain files in ``cluster/api/ui/`` (package data; no build step, nothing fetched from
outside: a Content-Security-Policy of ``'self'`` holds the page to this node). It reads the public
JSON API with the API token the operator types in (kept in the tab's ``sessionStorage``), so it
sees exactly what that token may see; the files themselves need no token. See ``docs/console.md``.
"""

from __future__ import annotations

from importlib import resources

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


def console_files() -> dict[str, tuple[bytes, str]]:
    """``name -> (bytes, content type)`` of every file the console serves, read once at start."""
    out = {}
    for entry in resources.files("raftmq.cluster.api").joinpath("ui").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def add_console_routes(app: web.Application) -> None:
    """``GET /ui`` and ``/ui/`` (the page), ``GET /ui/{file}`` (its files; nothing else), and
    ``GET /``, a redirect to ``/ui`` (a browser pointed at a node finds the console)."""
    files = console_files()

    def serve(name: str) -> web.Response:
        found = files.get(name)
        if found is None:  # only names from the console folder: no path ever reaches the disk
            raise ApiError(errors.NOT_FOUND, "no such console file")
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type, **_HEADERS})

    async def index(request: web.Request) -> web.Response:
        return serve("index.html")

    async def file(request: web.Request) -> web.Response:
        return serve(request.match_info["file"])

    app.router.add_get("/ui", index)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/{file}", file)

    async def root(request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui")

    app.router.add_get("/", root)
