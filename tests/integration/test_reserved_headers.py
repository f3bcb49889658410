"""Headers named ``raftmq-*`` are the broker's own (dead-letter provenance, the redrive target): a
producer cannot set them on either wire, through any node, delayed or not, in any ASCII case, and
the Python producer refuses them before sending. A refused request stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from raftmq import batch as rb
from raftmq.client import Producer
from raftmq.client.errors import ReservedHeader

from .conftest import assert_error, describe, high_offsets
from .harness import Cluster

pytestmark = pytest.mark.timeout(300)

FORGED = [
    {"raftmq-redrive-group": "x"},
    {"RAFTMQ-DLQ-TOPIC": "payments"},
    {"ok": "1", "Raftmq-Anything": "y"},
]


def leader_and_other(c: Cluster, topic: str) -> tuple[str, str]:
    leader = describe(c, topic)["queues"][0]["leader"]
    assert leader, describe(c, topic)
    return leader, next(n for n in c.nodes if n != leader)


def post_json(c: Cluster, topic: str, messages: list[dict[str, Any]], node: str) -> requests.Response:
    return c.post(f"/v1/topics/{topic}/messages", {"messages": messages}, node)


def post_binary(c: Cluster, topic: str, batch: bytes, node: str) -> requests.Response:
    body = rb.join_frames([(0, None, batch)])
    url = f"{c.url(node)}/v1/topics/{topic}/messages"
    return requests.post(url, data=body, headers={"Content-Type": rb.BATCH_MEDIA_TYPE}, timeout=30)


def test_json_produce_refuses_reserved_headers_at_every_node_and_stores_nothing(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("rh-json", queues=1)
    nodes = leader_and_other(c, "rh-json")
    for node in nodes:
        for headers in FORGED:
            good = {"value": "fine", "queue": 0}
            r = post_json(c, "rh-json", [good, {"value": "forged", "queue": 0, "headers": headers}], node)
            e = assert_error(r, 400, "reserved_header")
            assert e["index"] == 1 and e["header"].lower().startswith("raftmq-"), e
        delayed = {"value": "later", "queue": 0, "delay_ms": 60_000, "headers": {"raftmq-dlq-reason": "x"}}
        assert_error(post_json(c, "rh-json", [delayed], node), 400, "reserved_header")
    assert high_offsets(c, "rh-json") == [0]
    # Near misses are ordinary headers.
    near = {"raftmq": "1", "x-raftmq-dlq": "2", "raftmq_redrive": "3"}
    r = post_json(c, "rh-json", [{"value": "ok", "queue": 0, "headers": near}], nodes[1])
    assert r.status_code == 200, r.text
    assert c.fetch_all("rh-json", 0)[0]["headers"] == near


def test_binary_produce_refuses_reserved_headers_at_every_node_and_stores_nothing(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("rh-bin", queues=1)
    for node in leader_and_other(c, "rh-bin"):  # the second is forwarded to the leader
        for headers in FORGED:
            b = rb.BatchBuilder()
            b.append("fine", headers={"trace": "1"})
            b.append("forged", headers=headers)
            e = assert_error(post_binary(c, "rh-bin", b.finish(), node), 400, "reserved_header")
            assert (e["reason"], e["record"], e["batch"]) == ("reserved_header", 1, 0), e
        delayed = rb.BatchBuilder()
        delayed.append("later", headers={"raftmq-redrive-group": "x"}, delay_ms=60_000)
        assert_error(post_binary(c, "rh-bin", delayed.finish(), node), 400, "reserved_header")
    assert high_offsets(c, "rh-bin") == [0]


def test_the_producer_refuses_reserved_headers_before_sending(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("rh-client", queues=1)
    with Producer([c.url()]) as producer:
        for headers in FORGED:
            with pytest.raises(ReservedHeader) as info:
                producer.send("rh-client", "forged", headers=headers)
            assert info.value.code == "reserved_header"
        producer.send("rh-client", "fine", headers={"trace": "1"}).result(timeout=30)
    assert high_offsets(c, "rh-client") == [1]
