"""A node's refusals made before the SQS handler runs, in the SQS wire of the request (docs/sqs.md,
"Errors"): over ``limits.http_max_requests`` an SQS client got raftmq's JSON 429
``too_many_requests``, which botocore's query protocol could not parse (a ``ResponseParserError``,
never retried; on the JSON protocol botocore retried the bare 429 and raised code ``'429'`` at the
end); it is now ``RequestThrottled`` (403), which botocore retries in its legacy and standard modes.
A body trickled past its deadline was ``MalformedQueryString`` (query) or ``InvalidParameterValue``
(JSON), neither retried; it is now ``RequestTimeout``, its connection closed.

The real boto3 (JSON 1.0) and botocore on the query protocol against a real node; raw sockets only
for the trickled body, which no SDK sends on purpose.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from botocore.exceptions import ClientError

from .harness import Cluster, answer_of
from .sqs_clients import query_sqs_client, sqs_client, until

pytestmark = pytest.mark.timeout(240)

MAX_REQUESTS = 4  # http_max_requests
TIMEOUT_S = 2.0  # request_timeout_ms
WIRES = ["json", "query"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    limits = f"[limits]\nhttp_max_requests = {MAX_REQUESTS}\nrequest_timeout_ms = {int(TIMEOUT_S * 1000)}\n"
    with Cluster(tmp, nodes=1, queue_groups=1, extra_toml=limits) as c:
        c.start()
        c.wait_ready()
        c.create_topic("held", queues=1)
        yield c
        assert c.alive("n1"), c.log("n1")[-3000:]


def client(c: Cluster, wire: str, tmp: Path, **config: Any) -> Any:
    url = c.url("n1")
    return sqs_client(url, **config) if wire == "json" else query_sqs_client(url, tmp, **config)


@contextmanager
def cap_held(c: Cluster, hold_s: float) -> Iterator[None]:
    """The node's ``MAX_REQUESTS`` taken by REST long polls of ``hold_s``, from when a request is
    refused until they end. A poll refused (the probe took its place a moment) is sent again."""
    poll_url = c.url("n1") + "/v1/topics/held/queues/0/messages"
    params = {"offset": 0, "wait_ms": int(hold_s * 1000)}

    def poll() -> requests.Response:
        while (r := requests.get(poll_url, params=params, timeout=60)).status_code == 429:
            time.sleep(0.05)
        return r

    with ThreadPoolExecutor(MAX_REQUESTS) as pool:
        polls = [pool.submit(poll) for _ in range(MAX_REQUESTS)]
        until("the cap taken", lambda: c.get("/v1/topics/held").status_code == 429, timeout_s=20)
        yield
        assert all(p.result(timeout=60).status_code == 200 for p in polls)


@pytest.mark.parametrize("wire", WIRES)
def test_over_the_cap_an_sqs_client_without_retries_gets_request_throttled(
    cluster: Cluster, wire: str, tmp_path: Path
) -> None:
    sqs = client(cluster, wire, tmp_path, retries={"total_max_attempts": 1})
    url = sqs.create_queue(QueueName=f"throttled-{wire}")["QueueUrl"]
    with cap_held(cluster, 5.0), pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="refused")
    answer = refused.value.response
    assert answer["Error"]["Code"] == "RequestThrottled", answer
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 403, answer
    assert "at most" in answer["Error"]["Message"], answer
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"  # nothing was sent


def test_over_the_cap_a_post_to_a_queue_url_gets_request_throttled_in_xml(cluster: Cluster) -> None:
    """The query protocol's other route, ``POST /{account}/{queue}`` (an SDK that posts to the queue
    URL; botocore posts to ``/``): refused in XML too, before the body is read."""
    url = sqs_client(cluster.url("n1")).create_queue(QueueName="throttled-path")["QueueUrl"]
    with cap_held(cluster, 5.0):
        r = requests.post(url, data={"Action": "SendMessage", "MessageBody": "refused"}, timeout=10)
    assert r.status_code == 403 and "<Code>RequestThrottled</Code>" in r.text, r.text


@pytest.mark.parametrize("mode", ["legacy", "standard"])
def test_over_the_cap_an_sqs_client_retries_and_its_send_succeeds(
    cluster: Cluster, mode: str, tmp_path: Path
) -> None:
    """On the query protocol (botocore retried the JSON protocol's bare 429 already: what it sees
    there is the code, checked by the test without retries above)."""
    wire = "query"
    sqs = client(cluster, wire, tmp_path, retries={"mode": mode, "max_attempts": 10})
    url = sqs.create_queue(QueueName=f"retried-{wire}-{mode}")["QueueUrl"]
    with cap_held(cluster, 3.0):
        sent = sqs.send_message(QueueUrl=url, MessageBody="retried")
    assert sent["ResponseMetadata"]["RetryAttempts"] >= 1, sent  # its first attempt was refused
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert [m["MessageId"] for m in got] == [sent["MessageId"]]


HEADS = {
    "json": (
        b"Content-Type: application/x-amz-json-1.0\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n",
        b'{"QueueUrl": "http://x/000000000000/q", "MessageBody": "',
    ),
    "query": (b"Content-Type: application/x-www-form-urlencoded\r\n", b"Action=SendMessage&MessageBody="),
}


def _trickled(c: Cluster, wire: str) -> tuple[bytes, bool]:
    """A SendMessage whose body's first bytes come, then one byte a second: the node's answer
    within the body's deadline and some slack, and whether it closed the connection."""
    headers, start = HEADS[wire]
    host, port = c.nodes["n1"].http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n" + headers + b"Content-Length: 1000\r\n\r\n" + start)
        deadline = time.monotonic() + TIMEOUT_S + 8
        got, closed = b"", False
        while not got and time.monotonic() < deadline:
            try:
                s.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            got, closed = answer_of(s, 1.0)
        more, closed = answer_of(s, 3.0) if not closed else (b"", True)
        return got + more, closed


@pytest.mark.parametrize("wire", WIRES)
def test_a_trickled_sqs_body_is_answered_request_timeout_in_its_wire(cluster: Cluster, wire: str) -> None:
    got, closed = _trickled(cluster, wire)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), got
    if wire == "json":
        assert b"x-amzn-query-error: RequestTimeout;Sender" in head, got
        assert orjson.loads(body)["__type"] == "com.amazonaws.sqs#RequestTimeout", got
    else:
        assert b"<Code>RequestTimeout</Code>" in body, got
    assert closed, "the connection of a body that never came was kept open"
