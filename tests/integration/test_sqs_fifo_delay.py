"""A FIFO queue's DelaySeconds with the real boto3 against a real 3-node cluster (docs/sqs.md, FIFO
queues): a message is numbered at its send and handed out first DelaySeconds later, a message group
never hands out a later message before an earlier delayed one, the delayed messages are counted
apart, a change of the delay applies to the messages already in the queue (as AWS's FIFO delay), and
a message's own DelaySeconds is still refused. Every wait is for a state, with a generous deadline;
the only time bounds asserted are lower ones (a message is never handed out before its delay)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import sqs_client

ALL = ["All"]
DELAY_S = 3


@pytest.fixture(scope="module")
def clients(cluster: Cluster) -> list[Any]:
    return [sqs_client(cluster.url(n)) for n in ("n1", "n2", "n3")]


@pytest.fixture(scope="module")
def sqs(clients: list[Any]) -> Any:
    return clients[1]


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def _fifo(sqs: Any, name: str, **attributes: str) -> str:
    url: str = sqs.create_queue(
        QueueName=name,
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true", **attributes},
    )["QueueUrl"]
    return url


def _receive(sqs: Any, url: str, wait_s: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s, MessageSystemAttributeNames=ALL
    ).get("Messages", [])
    return got


def _counts(sqs: Any, url: str) -> tuple[int, int, int]:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return int(got[names[0]]), int(got[names[1]]), int(got[names[2]])


def test_a_delayed_fifo_message_is_numbered_at_once_and_its_group_never_overtakes_it(
    sqs: Any, clients: list[Any]
) -> None:
    url = _fifo(sqs, "slow.fifo", DelaySeconds=str(DELAY_S))
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])["Attributes"] == {
        "DelaySeconds": str(DELAY_S)
    }
    a1_sent = time.monotonic()
    a1 = sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a")
    assert _receive(sqs, url, 0) == []  # stored, numbered, not visible
    assert _counts(sqs, url) == (0, 0, 1)
    time.sleep(1.5)
    later_sent = time.monotonic()
    b1 = sqs.send_message(QueueUrl=url, MessageBody="b1", MessageGroupId="b")
    a2 = sqs.send_message(QueueUrl=url, MessageBody="a2", MessageGroupId="a")
    numbers = [int(x["SequenceNumber"]) for x in (a1, b1, a2)]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3  # in send order, at the send
    # Every node counts them (at the queue group's leader: here, or asked over the peer link).
    assert [_counts(c, url) for c in clients] == [(0, 0, 3)] * 3

    first = _receive(sqs, url, 20)  # a long poll answered once a1 is due; b1 and a2 are not yet
    assert time.monotonic() - a1_sent >= DELAY_S - 0.5
    assert [m["Body"] for m in first] == ["a1"]
    assert first[0]["Attributes"]["SequenceNumber"] == a1["SequenceNumber"]

    second: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while not second and time.monotonic() < deadline:
        second = _receive(sqs, url, 20)
    assert time.monotonic() - later_sent >= DELAY_S - 0.5
    assert [m["Body"] for m in second] == ["b1"]  # a2 is due too, and waits for a1 in flight
    assert _receive(sqs, url, 1) == []
    assert _counts(sqs, url) == (1, 2, 0)  # a2 visible (waiting for its group), a1 and b1 in flight
    for m in first + second:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    third = _receive(sqs, url, 10)
    assert [m["Body"] for m in third] == ["a2"]
    assert third[0]["Attributes"]["SequenceNumber"] == a2["SequenceNumber"]


def test_a_change_of_the_delay_applies_to_the_messages_in_the_queue_and_a_messages_own_is_refused(
    sqs: Any,
) -> None:
    url = _fifo(sqs, "retro.fifo", DelaySeconds="900")
    sqs.send_message(QueueUrl=url, MessageBody="held", MessageGroupId="g")
    assert _receive(sqs, url, 2) == []
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0"})
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30  # (a node's replica of the queue's attributes: a moment later)
    while not got and time.monotonic() < deadline:
        got = _receive(sqs, url, 2)  # as AWS's FIFO delay: the change is retroactive
    assert [m["Body"] for m in got] == ["held"]

    refusals = [
        (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", DelaySeconds=5),
            "InvalidParameterValue",
        ),
        (
            lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "901"}),
            "InvalidAttributeValue",
        ),
        (lambda: _fifo(sqs, "bad-delay.fifo", DelaySeconds="-1"), "InvalidAttributeValue"),
    ]
    assert [_code(call) for call, _ in refusals] == [code for _, code in refusals]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])["Attributes"] == {
        "DelaySeconds": "0"
    }
    batch = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "y", "MessageGroupId": "g", "DelaySeconds": 1}]
    )
    assert [f["Code"] for f in batch["Failed"]] == ["InvalidParameterValue"] and not batch.get("Successful")
