"""SQS input nested past Python's stack, on a real 3-node cluster with API tokens (docs/security.md,
docs/sqs.md); each was answered ``InternalError`` (500) with a traceback in the node's log:

- a RedrivePolicy or RedriveAllowPolicy nested deeper than Python's JSON parser's stack, sent by a
token with ``admin`` on one queue only, on either wire, to CreateQueue or SetQueueAttributes, is
``InvalidParameterValue`` (400) and changes nothing (the parser's ``RecursionError`` is not a
``ValueError``: it escaped the access check and the action);
- a query-wire batch entry's field naming a batch entry's field again
  (``SendMessageBatchRequestEntry.1.SendMessageBatchRequestEntry.1...``), signed by any token (the
  form is read before any right is checked), is ``AccessDenied`` for a token without ``produce``
  and, for one with it, AWS's code for a batch whose entry has no id; nothing is sent (the reading
  of entries recursed once per level)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from .harness import Cluster, running, tokens_toml
from .sqs_clients import query_sqs_client, sqs_client

pytestmark = pytest.mark.timeout(240)

ADMIN_TOKEN = "policy-admin-token-0123456789abcd"
AUDIT_TOKEN = "policy-audit-token-0123456789abcd"  # every right on audit-* only
NOBODY_TOKEN = "policy-nobody-token-0123456789abc"  # no right on any queue
TOKENS = {
    "admin": (ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
    "audit": (AUDIT_TOKEN, '["audit-*"]', '["audit-*"]', '["audit-*"]'),
    "nobody": (NOBODY_TOKEN, "[]", "[]", "[]"),
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


def _credentials(c: Cluster, token: str) -> tuple[str, str]:
    answer = c.get("/v1/sqs/credentials", headers={"Authorization": f"Bearer {token}"}).json()
    return answer["access_key_id"], answer["secret_access_key"]


def _signed(c: Cluster, token: str, body: bytes, action: str | None = None) -> requests.Response:
    """A POST to ``/`` signed with ``token``'s SQS credentials by botocore's signer: the query wire,
    or the JSON wire's ``action``."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if action is not None:
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"}
    request = AWSRequest(method="POST", url=c.url("n1") + "/", data=body, headers=headers)
    SigV4Auth(Credentials(*_credentials(c, token)), "sqs", "us-east-1").add_auth(request)
    prepared = request.prepare()
    return requests.post(prepared.url, data=prepared.body, headers=dict(prepared.headers), timeout=30)


def _clients(c: Cluster, tmp: Path) -> list[Any]:
    """The audit token's SQS clients: the JSON wire (boto3's default) and the query wire."""
    credentials = _credentials(c, AUDIT_TOKEN)
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


def test_a_batch_entry_nested_in_entries_is_refused_by_any_token_and_sends_nothing(c: Cluster) -> None:
    url = c.url("n1") + "/000000000000/audit-batches"
    assert sqs_client(c.url(), _credentials(c, AUDIT_TOKEN), "us-east-1").create_queue(
        QueueName="audit-batches"
    )
    nested = "SendMessageBatchRequestEntry.1." * 2_000 + "Id"  # 62 KB: 2,000 levels
    form = f"Action=SendMessageBatch&QueueUrl={url}&{nested}=a&SendMessageBatchRequestEntry.1.MessageBody=b"
    # The form is read before any right is checked: a token with none got the InternalError too.
    for token, status, code in (
        (NOBODY_TOKEN, 403, "AccessDenied"),
        (AUDIT_TOKEN, 400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    ):
        r = _signed(c, token, form.encode())
        assert r.status_code == status and f"<Code>{code}</Code>" in r.text, r.text[:500]
    high = c.get("/v1/topics/audit-batches").json()["queues"]
    assert all(q["high_offset"] == 0 for q in high), high
    for node in c.nodes:
        assert "sqs_action_failed" not in c.log(node), c.log(node)[-3000:]


DEEPEST = "@deepest@"  # in a body: an array as deep as the JSON wire reads it (below)
# The JSON wire's parser reads 1,024 levels, the body's object counted: a batch entry's field sits
# 3 levels down. ``str()`` of 1,000 levels overflows Python 3.11's stack (the project's Python),
# not later ones', whose ``str()`` reads deeper than any body can nest: there the wire has no such
# hole, and ``quoted`` is proved 50,000 deep by its unit test (tests/unit/test_sqs_wire.py).
WIRE_DEEPEST = 1_020


# (token, action, parameters, AWS's code): each value nested as deep as the JSON wire reads it.
NESTED_VALUES = (
    (NOBODY_TOKEN, "ListQueues", {"MaxResults": DEEPEST}, "InvalidParameterValue"),
    (NOBODY_TOKEN, "ListQueues", {"NextToken": DEEPEST}, "InvalidParameterValue"),
    (
        AUDIT_TOKEN,
        "ListDeadLetterSourceQueues",
        {"QueueUrl": "@url@", "MaxResults": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "ReceiveMessage",
        {"QueueUrl": "@url@", "WaitTimeSeconds": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "SendMessage",
        {"QueueUrl": "@url@", "MessageBody": "x", "DelaySeconds": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "SendMessage",
        {"QueueUrl": "@fifo@", "MessageBody": "x", "MessageGroupId": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "SendMessage",
        {"QueueUrl": "@fifo@", "MessageBody": "x", "MessageGroupId": "g", "DelaySeconds": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "SendMessageBatch",
        {"QueueUrl": "@url@", "Entries": [{"Id": "a", "MessageBody": DEEPEST}]},
        None,
    ),
    (
        AUDIT_TOKEN,
        "ChangeMessageVisibility",
        {"QueueUrl": "@url@", "ReceiptHandle": "1.0.0.1", "VisibilityTimeout": DEEPEST},
        "InvalidParameterValue",
    ),
    (
        AUDIT_TOKEN,
        "DeleteMessageBatch",
        {"QueueUrl": "@url@", "Entries": [{"Id": "a", "ReceiptHandle": DEEPEST}]},
        None,
    ),
    (
        AUDIT_TOKEN,
        "ChangeMessageVisibilityBatch",
        {"QueueUrl": "@url@", "Entries": [{"Id": "a", "ReceiptHandle": DEEPEST, "VisibilityTimeout": 1}]},
        None,
    ),
    (AUDIT_TOKEN, "StartMessageMoveTask", {"SourceArn": DEEPEST}, "InvalidParameterValue"),
    (AUDIT_TOKEN, "ListMessageMoveTasks", {"SourceArn": DEEPEST}, "InvalidParameterValue"),
)


def test_a_value_nested_where_a_text_or_number_belongs_is_refused_and_changes_nothing(c: Cluster) -> None:
    """Each such value was quoted in its error message with ``str()``, which ran out of Python's
    stack: ListQueues' ``MaxResults`` or ``NextToken`` by a token with no right on any queue."""
    sqs = sqs_client(c.url(), _credentials(c, AUDIT_TOKEN), "us-east-1")
    urls = {
        b'"@url@"': orjson.dumps(sqs.create_queue(QueueName="audit-values")["QueueUrl"]),
        b'"@fifo@"': orjson.dumps(
            sqs.create_queue(QueueName="audit-values.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        ),
        b'"@deepest@"': b"[" * WIRE_DEEPEST + b"]" * WIRE_DEEPEST,
    }
    for token, action, params, code in NESTED_VALUES:
        body = orjson.dumps(params)
        for placeholder, value in urls.items():
            body = body.replace(placeholder, value)
        r = _signed(c, token, body, action)
        if code is None:  # a batch: the entry fails, the request is answered
            assert r.status_code == 200 and len(r.json()["Failed"]) == 1, (action, r.text[:300])
        else:
            assert (r.status_code, r.json()["__type"]) == (400, f"com.amazonaws.sqs#{code}"), (
                action,
                r.text[:300],
            )
        # Nested past what the wire reads, the body is not read at all (docs/sqs.md, Errors).
        past = b"[" * 50_000 + b"]" * 50_000
        r = _signed(c, token, body.replace(urls[b'"@deepest@"'], past), action)
        assert (r.status_code, r.json()["__type"]) == (400, "com.amazonaws.sqs#SerializationException"), (
            action,
            r.text[:300],
        )
    for name in ("audit-values", "audit-values.fifo"):
        queues = c.get(f"/v1/topics/{name}").json()["queues"]
        assert all(q["high_offset"] == 0 for q in queues), (name, queues)
    for node in c.nodes:
        assert "sqs_action_failed" not in c.log(node), c.log(node)[-3000:]
