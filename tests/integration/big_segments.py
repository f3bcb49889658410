"""A sealed segment of about 18 MiB and downloads of it that read nothing: what the tests of
segment downloads (``test_slow_segment_readers.py``, ``test_forwarded_segments.py``) measure a
node's memory and pools against."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, wait_until

VALUE = "s" * (900 * 1024)
TOML = """
[segments]
max_messages = 20
max_bytes = 67108864
check_ms = 200
parquet = false
"""


def sealed_big_segment(c: Cluster, topic: str = "big", batches: int = 5) -> dict[str, Any]:
    """A topic of one queue with ``batches`` of 4 messages of 900 KiB (20: ``TOML``'s
    ``max_messages``), sealed in one segment: its manifest entry (``base``, ``node`` that wrote
    it, ...) and ``path``, the segment's download path."""
    c.create_topic(topic, queues=1)
    for _ in range(batches):
        r = c.produce(topic, [{"value": VALUE}] * 4)
        assert r.status_code == 200, r.text

    def sealed() -> list[dict[str, Any]]:
        return list(c.get(f"/v1/topics/{topic}/segments").json()["queues"][0]["segments"])

    entry = wait_until(lambda: sealed()[0] if sealed() else None, timeout_s=30, what="the segment sealed")
    return {**entry, "path": f"/v1/topics/{topic}/segments/0/{entry['base']}"}


def resident_bytes(c: Cluster, node: str) -> int:
    proc = c.nodes[node].proc
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def stalled_downloads(
    c: Cluster, node: str, path: str, count: int, *, keep_alive: bool = False
) -> list[socket.socket]:
    """``count`` GETs of ``path`` at ``node`` whose clients read nothing (a receive buffer of 4 KiB):
    the caller closes them, or reads them to their end. ``keep_alive``: the connections ask to be
    kept open after the answer (the node then closes one only when its answer failed)."""
    connection = "keep-alive" if keep_alive else "close"
    host, port = c.nodes[node].http.rsplit(":", 1)
    sockets = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n".encode())
        sockets.append(s)
    return sockets


def wait_answered_ok(sockets: list[socket.socket], what: str = "every download answering 200") -> None:
    """Wait until each of ``sockets`` has the start of a 200 answer to read (peeked: none is
    consumed). A socket the node closed, or whose answer is an error, fails the test at once
    (``pytest.fail``, which ``wait_until`` does not take for "not yet" as it does an
    AssertionError): it holds no download, and a test counting on it would measure nothing."""

    def all_answering() -> bool:
        readable, _, _ = select.select(sockets, [], [], 0)
        for s in readable:
            start = s.recv(12, socket.MSG_PEEK)  # raises if the node reset the connection
            if not start:
                pytest.fail("the node closed a download's connection before any answer")
            if len(start) == 12 and not start.startswith(b"HTTP/1.1 200"):
                pytest.fail(f"a download answered {start!r}, not 200")
        return len(readable) == len(sockets)

    wait_until(all_answering, timeout_s=30, what=what)


SETTLED_GROWTH = 1 << 20  # at most this much more resident memory over SETTLED_S: settled
SETTLED_S = 1.0


def wait_resident_settled(c: Cluster, node: str, timeout_s: float = 30.0) -> int:
    """``node``'s resident bytes once they stop growing (less than ``SETTLED_GROWTH`` over
    ``SETTLED_S``): a download's first bytes come before the node has buffered what it will, so a
    measure taken then would miss a read-ahead without backpressure. Fails if it still grows at
    ``timeout_s`` (that regression, reading every segment whole into memory)."""
    deadline = time.monotonic() + timeout_s
    samples = [(time.monotonic(), resident_bytes(c, node))]
    while True:
        time.sleep(0.2)
        now, rss = time.monotonic(), resident_bytes(c, node)
        samples.append((now, rss))
        earlier = [value for at, value in samples if now - at >= SETTLED_S]
        if earlier and rss - earlier[-1] < SETTLED_GROWTH:
            return rss
        if now > deadline:
            raise AssertionError(f"{node}'s memory still grows after {timeout_s} s: {rss >> 20} MiB")


def read_head(s: socket.socket) -> tuple[bytes, bytes]:
    """The answer's head on ``s`` (read up to its blank line) and the body bytes read with it."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed before the answer's head: {got[:200]!r}")
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return head, body


def content_length(head: bytes) -> int:
    """The ``Content-Length`` of an answer's head."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no Content-Length in {head[:300]!r}")
