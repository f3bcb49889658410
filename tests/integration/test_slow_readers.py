"""A client that does not read its answers holds nothing past ``limits.http_write_timeout_ms``
(cluster/api/connections.py, ``WriteDeadline``).

Real sockets against a real node: a client that sends requests whose answers are large and never
reads its socket made each handler wait on the transport's drain for good (no write deadline): a
task, up to the transport's buffers and a descriptor each, as long as the client liked. Its
connection is aborted once its writes stay paused that long, counted in
``raftmq_http_write_timeouts_total``, while a normal client is served meanwhile; a client that
reads slowly but steadily gets its whole answer. Clients' requests in the application at once are
capped (``limits.http_max_requests``): one more is refused 429 ``too_many_requests`` at once, a
peer's call is not.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from .harness import Cluster, answer_of

pytestmark = pytest.mark.timeout(180)

WRITE_S = 2.0  # http_write_timeout_ms
LATE_S = 10.0  # slack for a loaded machine
MAX_REQUESTS = 8  # http_max_requests
SPEC = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"  # an answer of about 100 KiB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    limits = (
        f"[limits]\nhttp_write_timeout_ms = {int(WRITE_S * 1000)}\nrequest_timeout_ms = 3000\n"
        f"http_max_requests = {MAX_REQUESTS}\n"
    )
    with Cluster(tmp, nodes=1, queue_groups=1, extra_toml=limits) as c:
        c.start()
        c.wait_ready()
        c.create_topic("readers", queues=1)
        yield c
        assert c.alive("n1"), c.log("n1")[-3000:]


def connect(c: Cluster, rcvbuf: int = 4096) -> socket.socket:
    """A socket whose receive buffer is small (set before the connection: no autotuning), so the
    node's kernel buffers fill soon and the rest waits in the node."""
    host, port = c.nodes["n1"].http.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect((host, int(port)))
    return s


def test_a_client_that_never_reads_its_answers_is_cut_after_the_write_timeout(cluster: Cluster) -> None:
    before = cluster.metric_sum("n1", "raftmq_http_write_timeouts_total")
    answer_bytes = len(cluster.get("/openapi.json").content)
    count = 100  # about 10 MiB of answers: past any kernel buffer of a loopback connection
    sockets = [connect(cluster) for _ in range(3)]
    try:
        for s in sockets:
            s.sendall(SPEC * count)
        time.sleep(WRITE_S)
        assert cluster.get("/v1/topics/readers").status_code == 200  # a normal client is served
        time.sleep(WRITE_S + LATE_S / 2)  # nothing read: the node gives up on them meanwhile
        for s in sockets:
            got, closed = answer_of(s, LATE_S)
            assert closed, "a connection whose answers were never read was kept"
            assert len(got) < count * answer_bytes, "every answer was sent: the client was waited for"
    finally:
        for s in sockets:
            s.close()
    after = cluster.metric_sum("n1", "raftmq_http_write_timeouts_total")
    assert after - before >= len(sockets)
    assert cluster.get("/v1/topics/readers").status_code == 200


def test_a_client_that_reads_slowly_but_steadily_gets_every_answer(cluster: Cluster) -> None:
    answer_bytes = len(cluster.get("/openapi.json").content)
    count = 20
    with connect(cluster) as s:
        s.sendall(SPEC * count)
        s.settimeout(5)
        got, started = 0, time.monotonic()
        while got < count * answer_bytes and time.monotonic() - started < 60:
            chunk = s.recv(16384)
            if not chunk:
                break
            got += len(chunk)
            time.sleep(0.01)  # about 1.6 MB/s at most: slower than the node writes
    assert got >= count * answer_bytes, f"cut at {got} bytes of {count * answer_bytes}"


def test_clients_requests_over_the_cap_are_refused_429_and_peers_calls_are_not(cluster: Cluster) -> None:
    poll_url = cluster.url("n1") + "/v1/topics/readers/queues/0/messages"

    def long_poll() -> requests.Response:
        return requests.get(poll_url, params={"offset": 0, "wait_ms": 6000}, timeout=30)

    with ThreadPoolExecutor(MAX_REQUESTS) as pool:
        polls = [pool.submit(long_poll) for _ in range(MAX_REQUESTS)]
        time.sleep(2)  # every long poll is under way
        refused = cluster.get("/v1/topics/readers")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_requests", refused.text
        peer = cluster.internal("GET", "/internal/status", "n1")  # another node's call is served
        assert peer.status_code == 200, peer.text
        assert all(p.result(timeout=30).status_code == 200 for p in polls)
    assert cluster.get("/v1/topics/readers").status_code == 200  # served again once they are done


def test_a_push_stream_whose_client_never_reads_is_cut_after_the_write_timeout(cluster: Cluster) -> None:
    cluster.create_topic("pushed", queues=1)
    value = "v" * (512 * 1024)
    for _ in range(10):  # 40 messages of 512 KiB: about 20 MiB to push
        r = cluster.produce("pushed", [{"value": value}] * 4)
        assert r.status_code == 200, r.text
    before = cluster.metric_sum("n1", "raftmq_http_write_timeouts_total")
    s = connect(cluster)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            b"GET /v1/topics/pushed/subscriptions/g/stream?heartbeat_ms=60000 HTTP/1.1\r\nHost: x\r\n"
            + f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n".encode()
            + b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        rdy, mask = b'{"op":"rdy","n":40}', os.urandom(4)
        s.sendall(bytes([0x81, 0x80 | len(rdy)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(rdy)))
        time.sleep(2 * WRITE_S + LATE_S / 2)  # its frames are never read
        got, closed = answer_of(s, LATE_S)
        assert closed, "a push stream whose frames were never read was kept"
        assert len(got) < 40 * len(value), "every frame was sent: the client was waited for"
    finally:
        s.close()
    assert cluster.metric_sum("n1", "raftmq_http_write_timeouts_total") > before
    assert cluster.get("/v1/topics/pushed").status_code == 200


def test_an_sqs_body_trickled_without_tokens_is_refused_in_sqs_terms_in_time(cluster: Cluster) -> None:
    """Without tokens SQS reads its body unsigned: past ``request_timeout_ms`` (3 s here) the late
    body is an SQS ``RequestTimeout`` (as with tokens, before the signature; a code botocore's
    standard mode retries), not a 5xx."""
    s = connect(cluster)
    try:
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\n"
            b"X-Amz-Target: AmazonSQS.ListQueues\r\nContent-Length: 1000\r\n\r\n{"
        )
        s.settimeout(3 + LATE_S)
        answer = s.recv(65536)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"RequestTimeout" in answer and b"did not arrive" in answer, answer
