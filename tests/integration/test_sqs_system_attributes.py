"""The SQS API's ApproximateFirstReceiveTimestamp (a message system attribute) and
ApproximateNumberOfMessagesDelayed (a queue attribute), with the real boto3 and botocore against
real 3-node clusters (docs/sqs.md): the first receive's time, kept through redeliveries, on both
wires, from every node and across a leader's death; delayed messages counted per queue until
they are released, on every node."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .harness import Cluster, wait_until
from .sqs_clients import query_sqs_client, sqs_client

FIRST = "ApproximateFirstReceiveTimestamp"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _receive_one(sqs: Any, url: str, timeout_s: float = 20, **kw: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, **kw).get("Messages", [])
        if got:
            assert len(got) == 1, got
            message: dict[str, Any] = got[0]
            return message
    raise AssertionError(f"nothing received from {url} in {timeout_s} s")


def test_the_first_receive_timestamp_is_the_first_receives_time_through_redeliveries(
    cluster: Cluster, tmp_path: Path
) -> None:
    sqs = sqs_client(cluster.url("n1"))
    url = sqs.create_queue(QueueName="first-receive")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    time.sleep(1.0)  # the first receive is a second after the send: two different times
    asked = [FIRST, "ApproximateReceiveCount", "SentTimestamp"]
    before = _now_ms()
    first = _receive_one(sqs, url, VisibilityTimeout=1, MessageSystemAttributeNames=asked)
    after = _now_ms()
    assert set(first["Attributes"]) == set(asked)  # what was asked for, no more
    first_ms, sent_ms = int(first["Attributes"][FIRST]), int(first["Attributes"]["SentTimestamp"])
    assert before - 50 <= first_ms <= after + 50, (before, first_ms, after)  # the nodes share our clock
    assert first_ms >= sent_ms + 900
    # Redelivered after its visibility timeout, through another node, asked with "All" under the
    # older member name: the same first receive time, a later count.
    second = _receive_one(sqs_client(cluster.url("n2")), url, VisibilityTimeout=1, AttributeNames=["All"])
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["Attributes"][FIRST] == str(first_ms)
    assert second["Attributes"]["SentTimestamp"] == str(sent_ms)
    # The query protocol (XML) carries it too.
    query = query_sqs_client(cluster.url("n3"), tmp_path)
    third = _receive_one(query, url, AttributeNames=[FIRST, "ApproximateReceiveCount"])
    assert third["Attributes"] == {FIRST: str(first_ms), "ApproximateReceiveCount": "3"}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    # A new message: its own first receive.
    sqs.send_message(QueueUrl=url, MessageBody="n")
    fresh = _receive_one(sqs, url, MessageSystemAttributeNames=[FIRST])
    assert int(fresh["Attributes"][FIRST]) > first_ms + 2000


def _counts(sqs: Any, url: str) -> dict[str, str]:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    counts: dict[str, str] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return counts


def test_delayed_messages_are_counted_per_queue_until_released_on_every_node(cluster: Cluster) -> None:
    sqs = sqs_client(cluster.url("n1"))
    url = sqs.create_queue(QueueName="delayed-count", Attributes={"DelaySeconds": "8"})["QueueUrl"]
    other = sqs.create_queue(QueueName="delayed-other")["QueueUrl"]
    sqs.send_message(QueueUrl=other, MessageBody="another queue's", DelaySeconds=8)  # not counted here
    nothing = {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesDelayed": "0"}
    assert _counts(sqs, url) == nothing
    # Round robin over the queue's 3 queues (3 queue groups, each led by another node): each node
    # counts its own groups' delayed messages and asks the other leaders for theirs.
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"d{i}"} for i in range(4)])
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"e{i}", DelaySeconds=6)  # the message's own delay
    sqs.send_message(QueueUrl=url, MessageBody="now", DelaySeconds=0)
    for node in ("n1", "n2", "n3"):
        assert _counts(sqs_client(cluster.url(node)), url) == {
            "ApproximateNumberOfMessages": "1",
            "ApproximateNumberOfMessagesDelayed": "7",
        }, node
    everything = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert everything["ApproximateNumberOfMessagesDelayed"] == "7"
    assert _counts(sqs, other)["ApproximateNumberOfMessagesDelayed"] == "1"
    released = {"ApproximateNumberOfMessages": "8", "ApproximateNumberOfMessagesDelayed": "0"}
    wait_until(lambda: _counts(sqs, url) == released, 30, 0.2, "the delayed messages released")


def test_the_first_receive_timestamp_survives_the_death_of_the_queue_groups_leader(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        sqs = sqs_client(c.url("n1"), retries={"mode": "standard", "max_attempts": 10})
        url = sqs.create_queue(QueueName="first-failover")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="m")
        first = _receive_one(sqs, url, VisibilityTimeout=2, MessageSystemAttributeNames=[FIRST])
        queue = int(first["ReceiptHandle"].split(".")[1])
        victim = c.get("/v1/topics/first-failover").json()["queues"][queue]["leader"]
        survivor = next(n for n in c.nodes if n != victim)
        c.kill(victim)
        again = _receive_one(
            sqs_client(c.url(survivor), retries={"mode": "standard", "max_attempts": 10}),
            url,
            timeout_s=45,
            MessageSystemAttributeNames=[FIRST, "ApproximateReceiveCount"],
        )
        assert again["Attributes"] == {FIRST: first["Attributes"][FIRST], "ApproximateReceiveCount": "2"}
