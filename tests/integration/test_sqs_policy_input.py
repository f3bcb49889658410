"""Hostile SQS policy texts on a real 3-node cluster with API tokens (docs/security.md, docs/sqs.md):
a RedrivePolicy or RedriveAllowPolicy nested deeper than Python's JSON parser's stack, sent by a
token with ``admin`` on one queue only, on either wire, to CreateQueue or SetQueueAttributes, is
``InvalidParameterValue`` (400) and changes nothing. Before, the parser's ``RecursionError`` (not a
``ValueError``) escaped the access check and the action: ``InternalError`` (500) and a traceback in
the node's log for each request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster, running, tokens_toml
from .sqs_clients import query_sqs_client, sqs_client

pytestmark = pytest.mark.timeout(240)

ADMIN_TOKEN = "policy-admin-token-0123456789abcd"
AUDIT_TOKEN = "policy-audit-token-0123456789abcd"  # every right on audit-* only
TOKENS = {
    "admin": (ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
    "audit": (AUDIT_TOKEN, '["audit-*"]', '["audit-*"]', '["audit-*"]'),
}
DEEP = "[" * 50_000  # 50 KB: far deeper than the parser's recursion limit, far below the body limit
POLICIES = ("RedrivePolicy", "RedriveAllowPolicy")


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(
        tmp_path_factory.mktemp("sqs-policy-input"),
        extra_toml=tokens_toml((name, *spec) for name, spec in TOKENS.items()),
    )
    with running(cluster, ADMIN_TOKEN):
        yield cluster


def _clients(c: Cluster, tmp: Path) -> list[Any]:
    """The audit token's SQS clients: the JSON wire (boto3's default) and the query wire."""
    answer = c.get("/v1/sqs/credentials", headers={"Authorization": f"Bearer {AUDIT_TOKEN}"}).json()
    credentials = (answer["access_key_id"], answer["secret_access_key"])
    config = {"region": "us-east-1", "retries": {"max_attempts": 1}}
    return [sqs_client(c.url(), credentials, **config), query_sqs_client(c.url(), tmp, credentials, **config)]


def _refused(call: Any, **params: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as e:
        call(**params)
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"]


def test_a_policy_nested_past_the_parser_is_invalid_and_changes_nothing(c: Cluster, tmp_path: Path) -> None:
    clients = _clients(c, tmp_path)
    url = clients[0].create_queue(QueueName="audit-policies")["QueueUrl"]
    before = c.get("/v1/topics/audit-policies").json()["attributes"]
    for client in clients:
        for name in POLICIES:
            attributes = {name: DEEP}
            assert _refused(client.set_queue_attributes, QueueUrl=url, Attributes=attributes) == (
                400,
                "InvalidParameterValue",
            ), name
            assert _refused(client.create_queue, QueueName="audit-new", Attributes=attributes) == (
                400,
                "InvalidParameterValue",
            ), name
    assert c.get("/v1/topics/audit-policies").json()["attributes"] == before
    assert c.get("/v1/topics/audit-new").status_code == 404
    for node in c.nodes:
        assert "sqs_action_failed" not in c.log(node), c.log(node)[-3000:]
