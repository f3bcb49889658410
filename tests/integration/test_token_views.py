"""What a token can SEE, on a real 3-node cluster with API tokens (docs/security.md, "What a token
can see"): no answer names a topic the token has no right on, and only a cluster admin sees the
nodes' Raft addresses.

- ``GET /v1/cluster``: a produce-only token gets what a client routes by (node ids, HTTP
  addresses, reachability, group leaders) and no Raft address; the Python client routes with it.
- An SQS queue's attributes name other queues (RedrivePolicy, RedriveAllowPolicy, its move tasks'
  destinations): ``GET /v1/topics/{topic}``, ``GET /v1/topics``, GetQueueAttributes and
  ListMessageMoveTasks show each such name only to a token with some right on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.client import Producer

from .harness import Cluster, running, tokens_toml
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(240)

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region
SRC, DLQ, DEST = "views-src", "views-dlq", "hidden-dest"
ADMIN_TOKEN = "views-admin-token-0123456789abcd"
PRODUCER_TOKEN = "views-producer-token-0123456789ab"  # produce on orders only
DLQ_TOKEN = "views-dlq-token-0123456789abcdef"  # consume on the dead-letter queue only
SRC_TOKEN = "views-src-token-0123456789abcdef"  # produce on the source queue only
BOTH_TOKEN = "views-both-token-0123456789abcde"  # consume on every views-* queue
REPLICA_FIELDS = {"node_id", "is_leader", "term", "commit_index", "applied_index", "has_quorum"}
TOKENS = {
    "admin": (ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
    "producer": (PRODUCER_TOKEN, "[]", '["orders"]', "[]"),
    "dlq-reader": (DLQ_TOKEN, "[]", "[]", f'["{DLQ}"]'),
    "src-producer": (SRC_TOKEN, "[]", f'["{SRC}"]', "[]"),
    "both": (BOTH_TOKEN, "[]", "[]", '["views-*"]'),
}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    security = tokens_toml((name, *spec) for name, spec in TOKENS.items())
    cluster = Cluster(tmp_path_factory.mktemp("token-views"), extra_toml=security)
    with running(cluster, ADMIN_TOKEN):  # the harness's own calls as admin
        yield cluster


def _sqs(c: Cluster, token: str) -> Any:
    r = c.get("/v1/sqs/credentials", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    body = r.json()
    credentials = (body["access_key_id"], body["secret_access_key"])
    return sqs_client(c.url(), credentials, region="us-east-1", retries={"max_attempts": 1})


def test_a_token_without_cluster_admin_sees_no_raft_address(c: Cluster) -> None:
    raft_ports = [str(n.raft_base) for n in c.nodes.values()]
    admin = c.get("/v1/cluster").json()
    assert {n["raft"] for n in admin["nodes"]} == {f"127.0.0.1:{p}" for p in raft_ports}
    for node in c.nodes:
        r = c.call_as(PRODUCER_TOKEN, "GET", "/v1/cluster", node)
        assert r.status_code == 200, r.text
        view = r.json()
        assert [(n["id"], n["http"]) for n in view["nodes"]] == [(n["id"], n["http"]) for n in admin["nodes"]]
        assert all(set(n) == {"id", "http", "reachable"} for n in view["nodes"]), view["nodes"]
        for g in view["groups"]:
            assert set(g) == {"group_id", "leader", "term", "replicas", "placement"}, g
            assert all(set(replica) <= REPLICA_FIELDS for replica in g["replicas"]), g
        for port in raft_ports:  # no Raft address anywhere (the members, term rises' peers...)
            assert f":{port}" not in r.text, r.text
    # The client routes with what it is shown.
    c.post("/v1/topics", {"name": "orders", "queues": 3})
    with Producer(c.url("n2"), token=PRODUCER_TOKEN) as producer:
        sent = [producer.send("orders", f"m{q}", queue=q) for q in range(3)]
        assert [f.result(30).queue for f in sent] == [0, 1, 2]
    assert sum(len(c.fetch_all("orders", q)) for q in range(3)) == 3
