"""Large JSON fetches, read a record batch at a time and written in parts, answer exactly what was
produced: every kind of message, the max and max_bytes limits, TTL-expired messages skipped."""

from __future__ import annotations

import base64
import json
import socket
import struct
import time
from typing import Any

import pytest

from .harness import Cluster

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024


def produced_messages() -> list[dict[str, Any]]:
    """Requests of about 2-3 MiB: text of many sizes, binary values, keys, headers, one TTL."""
    out: list[dict[str, Any]] = []
    for i in range(60):
        size = (i * 37_717) % (900 * 1024) if i % 7 else 0
        m: dict[str, Any] = {"queue": 0}
        if i % 5 == 3:
            m["value_b64"] = base64.b64encode(bytes((i + j) % 256 for j in range(size // 3))).decode()
        else:
            m["value"] = f"{i:04d}-" + 'é\u2028"\\'[i % 4] * (size // 3)  # up to 3 UTF-8 bytes each
        if i % 3 == 0:
            m["key"] = f"k{i}"
        if i % 4 == 1:
            m["headers"] = {"i": str(i), "ü": "\n"}
        if i == 41:
            m["ttl_ms"] = 1  # expired when fetched: skipped, next_offset moves past it
        out.append(m)
    return out


def expected_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = []
    for offset, m in enumerate(messages):
        if "ttl_ms" in m:
            continue
        item: dict[str, Any] = {"offset": offset, "key": m.get("key"), "headers": m.get("headers", {})}
        item.update({k: m[k] for k in ("value", "value_b64") if k in m})
        items.append(item)
    return items


def value_size(item: dict[str, Any]) -> int:
    if "value" in item:
        return len(item["value"].encode())
    return len(base64.b64decode(item["value_b64"]))


def fetch(c: Cluster, topic: str, offset: int, node: str | None = None, **params: Any) -> dict[str, Any]:
    r = c.get(
        f"/v1/topics/{topic}/queues/0/messages", node=node, params={"offset": offset, **params}, timeout=60
    )
    assert r.status_code == 200, r.text[:500]
    assert r.headers["Content-Type"] == "application/json"
    assert int(r.headers["Content-Length"]) == len(r.content)
    body: dict[str, Any] = r.json()
    return body


def test_large_fetches_answer_exactly_what_was_produced(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("fetch-large", queues=1)
    messages = produced_messages()
    start = 0
    while start < len(messages):  # requests of at most about 3 MiB (the limit is 4 MiB)
        end, size = start + 1, len(json.dumps(messages[start]))  # as requests encodes it (ASCII)
        while end < len(messages) and size + len(json.dumps(messages[end])) < 3 * MIB:
            size += len(json.dumps(messages[end]))
            end += 1
        r = c.produce("fetch-large", messages[start:end])
        assert r.status_code == 200, r.text[:500]
        start = end
    time.sleep(0.01)  # the TTL message (1 ms) has expired
    expected = expected_items(messages)

    whole = fetch(c, "fetch-large", 0, max=10_000, max_bytes=64 * MIB)
    got = [{k: v for k, v in m.items() if k != "timestamp_ms"} for m in whole["messages"]]
    assert got == expected
    assert (whole["next_offset"], whole["low_offset"], whole["high_offset"]) == (60, 0, 60)
    stamps = [m["timestamp_ms"] for m in whole["messages"]]
    assert stamps == sorted(stamps)

    # Smaller answers: each within max_bytes (but never empty) and max, joining up exactly.
    for max_messages, max_bytes in ((7, 3 * MIB), (10_000, MIB), (3, 64 * MIB), (10_000, 1)):
        offset, joined = 0, []
        while offset < 60:
            body = fetch(c, "fetch-large", offset, max=max_messages, max_bytes=max_bytes)
            page = body["messages"]
            assert len(page) <= max_messages
            if len(page) > 1:
                assert sum(value_size(m) for m in page) <= max_bytes
            assert body["next_offset"] > offset
            joined += page
            offset = body["next_offset"]
        assert [{k: v for k, v in m.items() if k != "timestamp_ms"} for m in joined] == expected


def test_a_client_that_hangs_up_mid_answer_leaves_no_error_in_the_log(cluster: Cluster) -> None:
    """A client closing its connection while a large answer is written part by part (the writes
    then fail) is an ordinary event: no node logs a traceback, and each goes on serving. Every node
    is asked: the one serving the queue writes the answer itself, the others forward the fetch."""
    c = cluster
    c.create_topic("fetch-hangup", queues=1)
    value = "x" * (900 * 1024)
    for _ in range(8):  # 21.6 MiB in the queue: far more than the sockets' buffers hold
        r = c.produce("fetch-hangup", [{"queue": 0, "value": value}] * 3)
        assert r.status_code == 200, r.text[:500]
    before = {n: c.log(n).count("Traceback") for n in c.nodes}
    for node in c.nodes.values():
        host, port = node.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"GET /v1/topics/fetch-hangup/queues/0/messages?offset=0&max=100&max_bytes=67108864 "
                b"HTTP/1.1\r\nHost: raftmq\r\n\r\n"
            )
            head = s.recv(4096)  # the answer has started
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
    # And clients that leave during a long poll, before the answer has started: it fails at its
    # first byte (the headers) once a message arrives.
    for node in c.nodes.values():
        host, port = node.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"GET /v1/topics/fetch-hangup/queues/0/messages?offset=24&wait_ms=5000 "
                b"HTTP/1.1\r\nHost: raftmq\r\n\r\n"
            )
            time.sleep(0.5)  # the request has reached the node and waits
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
    r = c.produce("fetch-hangup", [{"queue": 0, "value": "wakes the long polls"}])
    assert r.status_code == 200, r.text[:500]
    # Every node still answers a whole fetch after the hang-ups.
    for node_id in c.nodes:
        whole = fetch(c, "fetch-hangup", 0, node=node_id, max=100, max_bytes=64 * MIB)
        assert [m["offset"] for m in whole["messages"]] == list(range(25))
    time.sleep(2.0)  # let any failed write of a hung-up answer reach the logs
    for node_id in c.nodes:
        log = c.log(node_id)
        assert "request_failed" not in log, log[-4000:]
        assert log.count("Traceback") == before[node_id], log[-4000:]
