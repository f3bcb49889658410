"""What a slow or non-reading client can make a node hold once its request is in the application
(cluster/api/slow_clients.py, cluster/api/connections.py).

Real sockets against a real node with API tokens: a token holder's request head with a large
``Content-Length`` whose body then trickles in was awaited for as long as the client liked (its
connection is not idle, so nothing closed it); it is answered 408 ``request_timeout`` after
``limits.request_timeout_ms`` (plus a second per 64 KiB declared) and its connection closed, while
a normal client is served meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.cluster.api.slow_clients import body_deadline_s

from .harness import Cluster, answer_of

pytestmark = pytest.mark.timeout(180)

TOKEN = "slow-clients-token-Hq2LmN9sT4vWxYz7"
BODY_S = 3.0  # request_timeout_ms: a body must all arrive within it, and a second per 64 KiB declared
DECLARED = 65536  # the trickled bodies' Content-Length: their deadline is BODY_S + 1 s
TRICKLE_S = body_deadline_s(BODY_S, DECLARED, 4 * 1024 * 1024)
LATE_S = 10.0  # slack for a loaded machine (a leak: never answered)
TOML = f"""
[limits]
request_timeout_ms = {int(BODY_S * 1000)}

[[security.tokens]]
name = "admin"
token = "{TOKEN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=1, queue_groups=1, extra_toml=TOML) as c:
        c.session.headers["Authorization"] = f"Bearer {TOKEN}"
        c.start()
        c.wait_ready()
        c.create_topic("slow", queues=1)
        yield c
        assert c.alive("n1"), c.log("n1")[-3000:]


def connect(c: Cluster) -> socket.socket:
    host, port = c.nodes["n1"].http.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


class Trickle:
    """Sends ``data`` on ``s`` a byte every ``every_s`` until stopped or refused."""

    def __init__(self, s: socket.socket, data: bytes, every_s: float = 0.2) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(s, data, every_s), daemon=True)
        self._thread.start()

    def _run(self, s: socket.socket, data: bytes, every_s: float) -> None:
        for byte in data:
            if self._stop.wait(every_s):
                return
            try:
                s.send(bytes([byte]))
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_a_token_holders_trickled_body_is_answered_408_in_time_and_its_connection_closed(
    cluster: Cluster,
) -> None:
    head = (
        b"POST /v1/topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {DECLARED}\r\n\r\n".encode()
    )
    sockets = [connect(cluster) for _ in range(4)]
    trickles = []
    try:
        for s in sockets:
            s.sendall(head + b'{"messages": [{"value": "')
            trickles.append(Trickle(s, b"a" * 100_000))
        started = time.monotonic()
        # meanwhile the node serves a normal client
        r = cluster.produce("slow", [{"value": "fine"}])
        assert r.status_code == 200, r.text
        for s in sockets:
            answer, closed = answer_of(s, TRICKLE_S + LATE_S)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
            assert b'"code":"request_timeout"' in answer and b'"retriable":true' in answer, answer
            if not closed:
                closed = answer_of(s, LATE_S)[1]
            assert closed, "the connection of a late body was left open"
        assert time.monotonic() - started >= TRICKLE_S * 0.9  # not before the deadline
    finally:
        for t in trickles:
            t.stop()
        for s in sockets:
            s.close()
    r = cluster.post("/v1/topics/slow/messages", {"messages": [{"value": "after"}]})
    assert r.status_code == 200, r.text


def test_a_body_sent_in_time_is_read_whole(cluster: Cluster) -> None:
    """A body that arrives in pieces but within the deadline is served: the bound is the time."""
    body = b'{"messages": [{"value": "in pieces"}]}'
    head = (
        b"POST /v1/topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    with contextlib.closing(connect(cluster)) as s:
        s.sendall(head)
        for i in range(0, len(body), 8):
            time.sleep(BODY_S / 20)
            s.sendall(body[i : i + 8])
        answer, _ = answer_of(s, 5)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
