"""What settling receipts that name nothing in flight costs the Raft log, on real nodes: an ack,
nack or extend (and SQS DeleteMessage / ChangeMessageVisibility) whose every receipt is unknown or
spent at the leader is answered there, with the apply's answer, and makes no entry. Before, each
such request was an entry on every replica that changed nothing: a client could make a group's
log write at the rate it sent made-up receipts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster, running
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(180)

ROUNDS = 30
SLACK = 3  # entries the group's own timers may commit meanwhile (each request made one before)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes, one queue group on all three."""
    with running(
        Cluster(tmp_path_factory.mktemp("settle"), nodes=3, queue_groups=1, replication=3)
    ) as cluster:
        yield cluster


def _sub(action: str) -> str:
    return f"/v1/topics/settle/subscriptions/g/{action}"


def _settle(c: Cluster, action: str, receipts: list[str], node: str, **body: Any) -> list[str]:
    r = c.post(_sub(action), {"receipts": receipts, **body}, node=node)
    assert r.status_code == 200, r.text
    return ["ok" if x.get("ok") else x["error"]["code"] for x in r.json()["results"]]


def test_settles_of_unknown_or_spent_receipts_make_no_entry(c: Cluster) -> None:
    c.create_topic("settle", queues=1)
    assert c.produce("settle", [{"value": f"m{i}"} for i in range(3)]).status_code == 200
    r = c.post(_sub("receive"), {"max": 3, "wait_ms": 5000, "visibility_ms": 60_000})
    got = r.json()["messages"]
    assert len(got) == 3, r.text
    topic_id, queue, offset, token = (int(x) for x in got[0]["receipt"].split("."))
    assert _settle(c, "ack", [got[0]["receipt"]], "n1") == ["ok"]
    spent = got[0]["receipt"]
    made_up = [
        f"{topic_id}.{queue}.{offset + 1}.{token - 1}",  # a message in flight, another delivery's
        f"{topic_id}.{queue}.{offset + 50}.{token}",  # past the queue's end
        f"{topic_id}.{queue}.{offset + 2}.1",
    ]
    before = c.commit_index("0")
    for i in range(ROUNDS):
        node = list(c.nodes)[i % 3]  # forwarded to the leader from the others
        assert _settle(c, "ack", [spent, *made_up], node) == ["stale_receipt"] * 4
        assert _settle(c, "nack", made_up, node, delay_ms=0) == ["stale_receipt"] * 3
        assert _settle(c, "extend", [spent], node, visibility_ms=1000) == ["stale_receipt"]
    many = [f"{topic_id}.{queue}.{offset + 100 + i}.{token}" for i in range(200)]  # read off the loop
    assert _settle(c, "ack", many, "n1") == ["stale_receipt"] * 200
    assert c.commit_index("0") - before <= SLACK, "a settle that changes nothing was proposed"
    # A token the leader has not applied is answered the same after a shared barrier: its one
    # entry, no settle entry after it (review: a made-up token of 10**9 made both).
    future = f"{topic_id}.{queue}.{offset + 1}.{10**9}"
    before = c.commit_index("0")
    for i in range(ROUNDS):
        assert _settle(c, "ack", [future], list(c.nodes)[i % 3]) == ["stale_receipt"]
    assert c.commit_index("0") - before <= ROUNDS + SLACK, "a settle of a made-up token was proposed"
    # The real receipts still settle, alone or among stale ones.
    assert _settle(c, "extend", [got[1]["receipt"]], "n3", visibility_ms=60_000) == ["ok"]
    assert _settle(c, "ack", [made_up[0], got[1]["receipt"], got[2]["receipt"]], "n2") == [
        "stale_receipt",
        "ok",
        "ok",
    ]
    assert _settle(c, "ack", [got[1]["receipt"]], "n1") == ["stale_receipt"]


def test_sqs_settles_of_a_spent_handle_make_no_entry(c: Cluster) -> None:
    sqs = sqs_client(c.url("n1"))
    url = sqs.create_queue(QueueName="spent")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="v")
    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=1)["Messages"][0]
    second = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10, VisibilityTimeout=60)["Messages"][0]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    before = c.commit_index("0")
    for _ in range(ROUNDS):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # accepted, deletes nothing
        with pytest.raises(ClientError) as e:
            sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5
            )
        assert e.value.response["Error"]["Code"] == "AWS.SimpleQueueService.MessageNotInflight"
    assert c.commit_index("0") - before <= SLACK, "a settle that changes nothing was proposed"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, VisibilityTimeout=0)
