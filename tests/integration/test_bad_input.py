"""Bad input gets a clear error and changes nothing (DESIGN §1), on every node.

Each case is sent to all three nodes (so forwarding paths are covered too) and must answer the
catalogued status and code with the stable error body; afterwards the topics, the queues' high
offsets and a consumer group's offsets are unchanged and every node still serves requests. Valid
Unicode edge cases round-trip exactly.
"""

from __future__ import annotations

import base64
import json
import socket
from typing import Any

import orjson
import pytest

from .conftest import assert_error, fetch, high_offsets
from .harness import Cluster

pytestmark = pytest.mark.timeout(240)

TOPIC = "bad"  # two queues, three messages each
GROUP = "g-bad"
MESSAGES = f"/v1/topics/{TOPIC}/messages"
FETCH = f"/v1/topics/{TOPIC}/queues/0/messages"
OFFSETS = f"/v1/groups/{GROUP}/offsets"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def c(cluster: Cluster) -> Cluster:
    cluster.create_topic(TOPIC, queues=2)
    for q in range(2):
        assert cluster.produce(TOPIC, [{"value": f"m{i}", "queue": q} for i in range(3)]).status_code == 200
    r = cluster.session.put(
        cluster.url() + OFFSETS, json={"topic": TOPIC, "offsets": {"0": 1, "1": 2}}, timeout=30
    )
    assert r.status_code == 200, r.text
    return cluster


@pytest.fixture(scope="module")
def baseline(c: Cluster) -> dict[str, Any]:
    return snapshot(c)


def snapshot(c: Cluster) -> dict[str, Any]:
    """What bad input must not change (the round-trip tests below add their own topics)."""
    topics = [t for t in c.get("/v1/topics").json()["topics"] if not t["name"].startswith("unicode-")]
    offsets = c.get(OFFSETS, params={"topic": TOPIC}).json()["offsets"]
    return {"topics": topics, "high": high_offsets(c, TOPIC), "offsets": offsets}


DROP = object()  # leave the field out


def produce(**body: Any) -> dict[str, Any]:
    return {"json": body}


def one(**message: Any) -> dict[str, Any]:
    """A produce body with one message (``value`` "v" unless given)."""
    if "value_b64" not in message and "value" not in message:
        message["value"] = "v"
    message = {k: v for k, v in message.items() if v is not DROP}
    return {"json": {"messages": [message]}}


def raw(data: bytes) -> dict[str, Any]:
    return {"data": data, "headers": {"Content-Type": "application/json"}}


def case(method: str, path: str, kw: dict[str, Any], status: int, code: str, id: str) -> Any:
    return pytest.param(method, path, kw, status, code, id=id)


# Table rows: P produce, F fetch (queue 0 unless ``path``), T create a topic, O commit offsets.
def P(kw: dict[str, Any], status: int, code: str, id: str) -> Any:
    return case("POST", MESSAGES, kw, status, code, f"produce-{id}")


def F(params: dict[str, Any], status: int, code: str, id: str, path: str = FETCH) -> Any:
    return case("GET", path, {"params": params}, status, code, f"fetch-{id}")


def T(body: Any, status: int, code: str, id: str) -> Any:
    return case("POST", "/v1/topics", {"json": body}, status, code, f"create-{id}")


def O(body: Any, status: int, code: str, id: str) -> Any:  # noqa: E743
    return case("PUT", OFFSETS, {"json": body}, status, code, f"offsets-{id}")


B400, J400 = (400, "bad_request"), (400, "invalid_json")

PRODUCE_CASES = [
    P(raw(b'{"messages": [{"value": "a"}'), *J400, "malformed-json"),
    P(raw(b""), *J400, "empty-body"),
    P(raw(b"  "), *J400, "blank-body"),
    P(raw(b"NaN"), *J400, "nan"),
    P(raw(b'{"messages": [{"value": "\xff\xfe"}]}'), *J400, "invalid-utf8"),
    P(raw(b'{"messages": [{"value": "\xc3"}]}'), *J400, "truncated-utf8"),
    P(raw(b'{"messages": [{"value": "a\\ud800b"}]}'), *J400, "lone-surrogate-value"),
    P(raw(b'{"messages": [{"value": "a", "key": "\\udc00"}]}'), *J400, "lone-surrogate-key"),
    P(raw(b'{"messages": [{"value": "a", "headers": {"\\ud800": "v"}}]}'), *J400, "lone-surrogate-hkey"),
    P(raw(b'{"messages": [{"value": "a", "headers": {"h": "\\udfff"}}]}'), *J400, "lone-surrogate-hval"),
    P(raw(b"[]"), *B400, "array-body"),
    P(raw(b'"messages"'), *B400, "string-body"),
    P(raw(b"42"), *B400, "number-body"),
    P(raw(b"null"), *B400, "null-body"),
    P(produce(), *B400, "no-messages-field"),
    P(produce(messages=[]), *B400, "empty-messages"),
    P(produce(messages={"value": "a"}), *B400, "messages-object"),
    P(produce(messages=["a"]), *B400, "message-string"),
    P(produce(messages=[{"value": "a"}], extra=1), *B400, "unknown-body-field"),
    P(one(value="a", colour="red"), *B400, "unknown-message-field"),
    P(one(value=1), *B400, "value-number"),
    P(one(value=None), *B400, "value-null"),
    P(one(value=["a"]), *B400, "value-list"),
    P(one(value="a", value_b64="YQ=="), *B400, "value-and-value-b64"),
    P(one(value=DROP, key="k"), *B400, "neither-value"),
    P(one(value_b64="!!!!"), *B400, "bad-base64"),
    P(one(value_b64="YQ"), *B400, "base64-no-padding"),
    P(one(value_b64=5), *B400, "value-b64-number"),
    P(one(key=1), *B400, "key-number"),
    P(one(key=["k"]), *B400, "key-list"),
    P(one(key="k" * (64 * 1024 + 1)), *B400, "key-too-long"),
    P(one(headers=["h", "v"]), *B400, "headers-list"),
    P(one(headers="h"), *B400, "headers-string"),
    P(one(headers={"h": 1}), *B400, "header-value-number"),
    P(one(headers={"h": None}), *B400, "header-value-null"),
    P(one(headers={f"h{i}": "v" for i in range(65)}), *B400, "too-many-headers"),
    P(one(queue="0"), *B400, "queue-string"),
    P(one(queue=-1), *B400, "queue-negative"),
    P(one(queue=True), *B400, "queue-bool"),
    P(one(queue=0.0), *B400, "queue-float"),
    P(one(queue=2**64), *B400, "queue-beyond-u64"),
    P(one(queue=2), 404, "queue_not_found", "queue-too-big"),
    P(one(queue=2**40), 404, "queue_not_found", "queue-huge"),
    P(one(delay_ms=-1), *B400, "delay-ms-negative"),
    P(one(delay_ms=10, deliver_at_ms=10), *B400, "delay-ms-and-deliver-at"),
    P(one(ttl_ms=0), *B400, "ttl-ms-zero"),
    P(produce(messages=[{"value": "a"}], producer_id="p"), *B400, "producer-id-without-sequence"),
    P(produce(messages=[{"value": "a"}], sequence=1), *B400, "sequence-without-producer-id"),
    P(produce(messages=[{"value": "a"}], producer_id="p", sequence=-1), *B400, "sequence-negative"),
    P(produce(messages=[{"value": "a"}], producer_id="p", sequence="1"), *B400, "sequence-string"),
    P(produce(messages=[{"value": "a"}], producer_id="p", sequence=2**63), *B400, "sequence-too-big"),
    P(produce(messages=[{"value": "a"}], producer_id="", sequence=1), *B400, "producer-id-empty"),
    P(produce(messages=[{"value": "a"}], producer_id=7, sequence=1), *B400, "producer-id-number"),
    P(produce(messages=[{"value": "a"}], producer_id="p" * 256, sequence=1), *B400, "producer-id-long"),
    P(produce(messages=[{"value": "a"}, {"value": 1}]), *B400, "second-message-bad"),
    P(produce(messages=[{"value": ""}] * 10_001), 413, "request_too_large", "too-many-messages"),
    P(one(value="x" * (MiB + 1)), 413, "message_too_large", "message-over-1mib"),
    P(one(value="x" * MiB, key="k"), 413, "message_too_large", "value-plus-key-over-1mib"),
    P(one(value_b64=base64.b64encode(b"x" * (MiB + 1)).decode()), 413, "message_too_large", "b64-over"),
    P(one(value="x" * (5 * MiB)), 413, "request_too_large", "body-over-4mib"),
    case("POST", "/v1/topics/nope/messages", one(), 404, "topic_not_found", "produce-unknown-topic"),
    case("POST", "/v1/topics/a%3Fb/messages", one(), 404, "topic_not_found", "produce-bad-topic-name"),
]

FETCH_CASES = [
    F({}, *B400, "offset-missing"),
    F({"offset": ""}, *B400, "offset-empty"),
    F({"offset": -1}, *B400, "offset-negative"),
    F({"offset": "one"}, *B400, "offset-word"),
    F({"offset": "1.0"}, *B400, "offset-float"),
    F({"offset": "1e3"}, *B400, "offset-exponent"),
    F({"offset": "+1"}, *B400, "offset-plus"),
    F({"offset": "٣"}, *B400, "offset-arabic-digit"),
    F({"offset": "9" * 20}, *B400, "offset-huge"),
    F({"offset": 0, "max": 0}, *B400, "max-zero"),
    F({"offset": 0, "max": 10_001}, *B400, "max-too-large"),
    F({"offset": 0, "max": -5}, *B400, "max-negative"),
    F({"offset": 0, "wait_ms": 15_001}, *B400, "wait-too-long"),
    F({"offset": 0, "wait_ms": "soon"}, *B400, "wait-word"),
    F({"offset": 0, "max_bytes": 0}, *B400, "max-bytes-zero"),
    F({"offset": 0, "read_from": "bogus"}, *B400, "read-from-bogus"),
    F({"offset": 0, "read_from": "LOCAL"}, *B400, "read-from-case"),
    F({"offset": 0, "colour": "red"}, *B400, "unknown-param"),
    F({"offset": 0}, 404, "queue_not_found", "unknown-queue", f"/v1/topics/{TOPIC}/queues/2/messages"),
    F({"offset": 0}, *B400, "queue-negative", f"/v1/topics/{TOPIC}/queues/-1/messages"),
    F({"offset": 0}, *B400, "queue-word", f"/v1/topics/{TOPIC}/queues/zero/messages"),
    F({"offset": 0}, *B400, "queue-huge", f"/v1/topics/{TOPIC}/queues/{2**70}/messages"),
    F({"offset": 0}, 404, "topic_not_found", "unknown-topic", "/v1/topics/nope/queues/0/messages"),
    F({"offset": 4}, 416, "offset_out_of_range", "offset-beyond-high"),
    F({"offset": 2**63 - 1}, 416, "offset_out_of_range", "offset-max"),
]

CREATE_CASES = [
    T({"name": ""}, *B400, "name-empty"),
    T({"name": "x" * 201}, *B400, "name-too-long"),
    T({"name": "a b"}, *B400, "name-space"),
    T({"name": "a/b"}, *B400, "name-slash"),
    T({"name": ".."}, *B400, "name-dotdot"),
    T({"name": "."}, *B400, "name-dot"),
    T({"name": "é"}, *B400, "name-accent"),
    T({"name": "名前"}, *B400, "name-cjk"),
    T({"name": "a\u0000"}, *B400, "name-nul"),
    T({"name": "a\n"}, *B400, "name-trailing-newline"),  # the name pattern's "$" matched before it
    T({"name": 5}, *B400, "name-number"),
    T({"queues": 2}, *B400, "name-missing"),
    T({"name": "q", "queues": 0}, *B400, "queues-zero"),
    T({"name": "q", "queues": -1}, *B400, "queues-negative"),
    T({"name": "q", "queues": 1025}, *B400, "queues-too-many"),
    T({"name": "q", "queues": 2**64}, *B400, "queues-huge"),
    T({"name": "q", "queues": "4"}, *B400, "queues-string"),
    T({"name": "q", "queues": True}, *B400, "queues-bool"),
    T({"name": "q", "queues": 2.0}, *B400, "queues-float"),
    T({"name": "q", "queues": None}, *B400, "queues-null"),
    T({"name": "q", "retention_ms": 0}, *B400, "retention-zero"),
    T({"name": "q", "retention_bytes": "1"}, *B400, "retention-bytes-string"),
    T({"name": "q", "max_message_bytes": MiB + 1}, *B400, "max-message-bytes-over-limit"),
    T({"name": "q", "partitions": 3}, *B400, "unknown-field"),
    T([{"name": "q"}], *B400, "array-body"),
    T({"name": TOPIC}, 409, "topic_exists", "duplicate"),
    case("POST", "/v1/topics", raw(b"{"), *J400, "create-malformed"),
    case("POST", "/v1/topics", raw(b'{"name": "\xff"}'), *J400, "create-invalid-utf8"),
    case(
        "POST", "/v1/topics", {"json": {"name": "q" + "x" * 5 * MiB}}, 413, "request_too_large", "create-big"
    ),
]

OFFSET_CASES = [
    O({"offsets": {"0": 1}}, *B400, "topic-missing"),
    O({"topic": 5, "offsets": {"0": 1}}, *B400, "topic-number"),
    O({"topic": TOPIC}, *B400, "offsets-missing"),
    O({"topic": TOPIC, "offsets": {}}, *B400, "offsets-empty"),
    O({"topic": TOPIC, "offsets": [1]}, *B400, "offsets-list"),
    O({"topic": TOPIC, "offsets": {"0": -1}}, *B400, "offset-negative"),
    O({"topic": TOPIC, "offsets": {"0": "1"}}, *B400, "offset-string"),
    O({"topic": TOPIC, "offsets": {"0": True}}, *B400, "offset-bool"),
    O({"topic": TOPIC, "offsets": {"0": 1.5}}, *B400, "offset-float"),
    O({"topic": TOPIC, "offsets": {"0": 0}, "x": 1}, *B400, "unknown-field"),
    O({"topic": TOPIC, "offsets": {"x": 0}}, 404, "queue_not_found", "queue-word"),
    O({"topic": TOPIC, "offsets": {"²": 0}}, 404, "queue_not_found", "queue-superscript"),
    O({"topic": TOPIC, "offsets": {"2": 0}}, 404, "queue_not_found", "queue-too-big"),
    O({"topic": TOPIC, "offsets": {"9" * 5000: 0}}, 404, "queue_not_found", "queue-5000-digits"),
    O({"topic": "nope", "offsets": {"0": 0}}, 404, "topic_not_found", "unknown-topic"),
    O({"topic": TOPIC, "offsets": {"0": 4}}, 416, "offset_out_of_range", "beyond-high"),
    O({"topic": TOPIC, "offsets": {"0": 0, "1": 4}}, 416, "offset_out_of_range", "beyond-high-2nd-group"),
    O([], *B400, "array-body"),
    case("PUT", OFFSETS, raw(b""), *J400, "offsets-empty-body"),
    case(
        "PUT",
        "/v1/groups/" + "g" * 256 + "/offsets",
        {"json": {"topic": TOPIC, "offsets": {"0": 0}}},
        *B400,
        "offsets-group-too-long",
    ),
    case("GET", OFFSETS, {}, *B400, "get-offsets-no-topic"),
    case("GET", OFFSETS, {"params": {"topic": "nope"}}, 404, "topic_not_found", "get-offsets-unknown-topic"),
    case(
        "GET", "/v1/groups/" + "g" * 256 + "/offsets", {"params": {"topic": TOPIC}}, *B400, "get-offsets-long"
    ),
]

ROUTE_CASES = [
    case("GET", "/v1/nothing", {}, 404, "not_found", "unknown-route"),
    case("GET", "/v2/topics", {}, 404, "not_found", "unknown-version"),
    case("GET", f"/v1/topics/{TOPIC}/queues", {}, 404, "not_found", "partial-route"),
    case("GET", "/v1/topics/nope", {}, 404, "topic_not_found", "describe-unknown"),
    case("GET", "/v1/topics/a%3Fx", {}, 404, "topic_not_found", "describe-query-in-name"),
    case("GET", "/v1/topics/%2e%2e", {}, 404, "topic_not_found", "describe-dotdot"),
    case("DELETE", "/v1/topics/nope", {}, 404, "topic_not_found", "delete-unknown"),
    case("DELETE", "/v1/topics/a%20b", {}, 404, "topic_not_found", "delete-bad-name"),
    case("PATCH", f"/v1/topics/{TOPIC}", {"json": {}}, 400, "bad_request", "patch-topic-without-attributes"),
    case(
        "PATCH",
        f"/v1/topics/{TOPIC}",
        {"json": {"attributes": {"a b": "x"}}},
        400,
        "bad_request",
        "patch-bad-name",
    ),
    case(
        "PATCH",
        f"/v1/topics/{TOPIC}",
        {"json": {"attributes": {"team\n": "x"}}},
        400,
        "bad_request",
        "patch-name-trailing-newline",
    ),
    case("PUT", f"/v1/topics/{TOPIC}", {"json": {}}, 405, "method_not_allowed", "put-topic"),
    case("DELETE", "/v1/topics", {}, 405, "method_not_allowed", "delete-all-topics"),
    case("PUT", MESSAGES, one(), 405, "method_not_allowed", "put-messages"),
    case("POST", "/healthz", {}, 405, "method_not_allowed", "post-healthz"),
    case("POST", FETCH, one(), 405, "method_not_allowed", "post-fetch"),
]

ALL_CASES = PRODUCE_CASES + FETCH_CASES + CREATE_CASES + OFFSET_CASES + ROUTE_CASES


@pytest.mark.parametrize(("method", "path", "kw", "status", "code"), ALL_CASES)
def test_bad_input_gets_a_clear_error_and_changes_nothing(
    c: Cluster, baseline: dict[str, Any], method: str, path: str, kw: dict[str, Any], status: int, code: str
) -> None:
    for nid in c.nodes:
        r = c.session.request(method, c.url(nid) + path, timeout=30, **kw)
        e = assert_error(r, status, code)
        if code == "offset_out_of_range":
            assert isinstance(e["low_offset"], int) and isinstance(e["high_offset"], int), e
            assert (e["low_offset"], e["high_offset"]) == (0, 3), e
    assert snapshot(c) == baseline
    for nid in c.nodes:  # every node is up and still serves a good request
        assert c.alive(nid)
        r = fetch(c, TOPIC, 1, nid, offset=0, max=1)
        assert r.status_code == 200 and r.json()["messages"][0]["value"] == "m0", r.text


def test_fetch_beyond_high_reports_the_queue_bounds(c: Cluster) -> None:
    for nid in c.nodes:
        for read_from in ("leader", "local"):
            e = assert_error(
                fetch(c, TOPIC, 0, nid, offset=99, read_from=read_from), 416, "offset_out_of_range"
            )
            assert (e["low_offset"], e["high_offset"]) == (0, 3)
        r = fetch(c, TOPIC, 0, nid, offset=3)  # high itself is in range: nothing yet
        assert r.status_code == 200 and r.json()["messages"] == [] and r.json()["next_offset"] == 3


# -- valid Unicode edge cases round-trip exactly ----------------------------------------------

UNICODE = {
    "emoji": "👋🏽 family 👨‍👩‍👧‍👦 flags 🇯🇵",
    "cjk": "漢字かなカナ한국어",
    "combining": "e\u0301 a\u0308 \u0915\u094d\u0937 Z\u0351\u0352\u0353",
    "nul": "a\u0000b\u0000",
    "controls": "\t\n\r\u0001\u001f\u007f\u0085",
    "rtl": "مرحبا עברית \u202e",
    "specials": "\ufeff\ufffd\uffff\U0010ffff",
    "escapes": '"quoted" \\back\\slash /slash/',
    "empty": "",
}


@pytest.mark.parametrize("encoding", ["utf8", "ascii-escapes"])
def test_valid_unicode_round_trips_exactly(c: Cluster, encoding: str) -> None:
    messages: list[dict[str, Any]] = [
        {"value": text, "key": text, "headers": {text: text, "n": name}} for name, text in UNICODE.items()
    ]
    messages.append({"value": "long key", "key": "界" * 21_845})  # 65,535 UTF-8 bytes: under the limit
    messages.append({"value": "k" * (64 * 1024), "key": "k" * (64 * 1024)})  # key exactly at the limit
    messages.append({"value": "x" * (MiB - 1), "key": "y"})  # exactly 1 MiB with its key
    messages.append({"value_b64": base64.b64encode(b"\x00\xff\xfe" + "é".encode()).decode()})
    body = {"messages": messages}
    # The same content as raw UTF-8 and as \\u escapes (json.dumps keeps only ASCII).
    data = orjson.dumps(body) if encoding == "utf8" else json.dumps(body).encode()
    assert data.isascii() == (encoding != "utf8")
    topic = f"unicode-{encoding}"
    c.create_topic(topic, queues=3)
    r = c.post(f"/v1/topics/{topic}/messages", node="n2", data=data)
    assert r.status_code == 200, r.text[:500]
    results = r.json()["results"]
    for nid in c.nodes:
        for m, res in zip(messages, results, strict=True):
            got = fetch(c, topic, res["queue"], nid, offset=res["offset"], max=1).json()["messages"][0]
            assert got["offset"] == res["offset"]
            assert got.get("value") == m.get("value") and got.get("value_b64") == m.get("value_b64")
            assert got["key"] == m.get("key") and got["headers"] == m.get("headers", {})


MALFORMED_METRIC = "raftmq_http_malformed_requests_total"
MALFORMED_HTTP = [
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",  # a bad header value
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",  # a bad URL
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunking
]


def test_malformed_http_is_a_400_counted_not_a_log_line_each(c: Cluster) -> None:
    """aiohttp logged each request its parser refused with a traceback at ERROR, before any credential
    was looked at: a way for anyone to fill a node's log. Now a 400, a count in /metrics and at most
    one summary line a minute (cluster/api/server_log.py)."""
    rounds = 5
    for node in c.nodes:
        host, port = c.nodes[node].http.split(":")
        logged, counted = len(c.log(node)), c.metric_sum(node, MALFORMED_METRIC)
        for _ in range(rounds):
            for raw in MALFORMED_HTTP:
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(raw)
                    assert s.recv(4096).startswith(b"HTTP/1.0 400 Bad Request"), raw
        assert c.metric_sum(node, MALFORMED_METRIC) - counted == rounds * len(MALFORMED_HTTP)
        since = c.log(node)[logged:]
        assert "Traceback" not in since and "Error handling request" not in since, since
        assert since.count("malformed_http_requests") <= 1, since
        assert c.get("/healthz", node).status_code == 200
