"""The CLI's HTTP client never follows a redirect: urllib would carry the Authorization header (the
API token) on to wherever the Location points. Real servers on 127.0.0.1."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.cluster.cli.admin_http import AdminHttp, ServerError

TOKEN = "t" * 32


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = _serve(handler)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def test_a_redirect_is_an_error_and_the_token_goes_nowhere_else(
    recorder: tuple[str, list[dict[str, str]]],
) -> None:
    elsewhere, seen = recorder

    class Redirector(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", elsewhere + "/v1/cluster")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = _serve(Redirector)
    try:
        client = AdminHttp([f"http://127.0.0.1:{server.server_address[1]}"], token=TOKEN)
        with pytest.raises(ServerError) as e:
            client.get("/v1/cluster")
        assert e.value.status == 302
    finally:
        server.shutdown()
    assert seen == []  # the redirect's target heard nothing, so no token either


def test_a_plain_answer_still_carries_the_token(recorder: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = recorder
    assert AdminHttp([url], token=TOKEN).get("/v1/cluster") == {"ok": True}
    assert seen[0]["Authorization"] == f"Bearer {TOKEN}"
