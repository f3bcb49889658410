"""Dead-letter queues through the SQS API with the real boto3 against a real 3-node cluster
(docs/sqs.md): a RedrivePolicy moves a message received more than maxReceiveCount times to its
dead-letter queue with its MessageId, body and attributes; ListDeadLetterSourceQueues finds the
sources; RedriveAllowPolicy decides which sources may name a queue; every bad policy is refused
with AWS's code and changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import sqs_client

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region


@pytest.fixture(scope="module")
def sqs(cluster: Cluster) -> Any:
    return sqs_client(cluster.url("n2"), retries={"max_attempts": 1})


def _policy(target: str, count: Any = 2) -> str:
    return json.dumps({"deadLetterTargetArn": ARN + target, "maxReceiveCount": count})


def _code(call: Any) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def _sources(sqs: Any, url: str, want: list[str]) -> list[str]:
    """ListDeadLetterSourceQueues, asked until it answers ``want`` (up to 10 s): the node reads
    its replica of the metadata group, which may be a moment behind a change made elsewhere."""
    deadline = time.monotonic() + 10
    while True:
        got: list[str] = sorted(sqs.list_dead_letter_source_queues(QueueUrl=url)["queueUrls"])
        if got == sorted(want) or time.monotonic() > deadline:
            return got


def _receive(sqs: Any, url: str, **kw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kw).get(
        "Messages", []
    )
    return messages


def test_a_message_received_too_often_moves_to_the_dead_letter_queue(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName="jobs-dlq")["QueueUrl"]
    url = sqs.create_queue(QueueName="jobs", Attributes={"RedrivePolicy": _policy("jobs-dlq", 2)})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(got["RedrivePolicy"]) == {"deadLetterTargetArn": ARN + "jobs-dlq", "maxReceiveCount": 2}
    attributes = {"kind": {"DataType": "String", "StringValue": "poison"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="poison pill", MessageAttributes=attributes)
    sqs.send_message(QueueUrl=url, MessageBody="good")
    receives: dict[str, list[str]] = {"poison pill": [], "good": []}
    deadline = time.monotonic() + 30
    while len(receives["poison pill"]) < 2 and time.monotonic() < deadline:
        for m in _receive(sqs, url, WaitTimeSeconds=1, AttributeNames=["All"]):
            receives[m["Body"]].append(m["Attributes"]["ApproximateReceiveCount"])
            if m["Body"] == "good":
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            else:  # a failed processing: visible again at once
                sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
    assert receives == {"poison pill": ["1", "2"], "good": ["1"]}
    # The third receive moves it instead of handing it out (and the answer waits for other messages).
    assert _receive(sqs, url, WaitTimeSeconds=2) == []
    moved = _receive(sqs, dlq, WaitTimeSeconds=5, MessageAttributeNames=["All"], AttributeNames=["All"])
    assert [(m["Body"], m["MessageId"]) for m in moved] == [("poison pill", sent["MessageId"])]
    assert moved[0]["MessageAttributes"] == attributes  # boto3 checked their MD5 too
    assert moved[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert _receive(sqs, url, WaitTimeSeconds=1) == []  # gone from the source
    assert _sources(sqs, dlq, [url]) == [url]
    assert _sources(sqs, url, []) == []

    # An empty RedrivePolicy removes it: no more moves, and no longer a source.
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert "RedrivePolicy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert _sources(sqs, dlq, []) == []
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    counts = []
    for _ in range(20):
        counts += [
            m["Attributes"]["ApproximateReceiveCount"]
            for m in _receive(sqs, url, VisibilityTimeout=0, WaitTimeSeconds=1, AttributeNames=["All"])
        ]
        if len(counts) >= 4:
            break
    assert counts[:4] == ["1", "2", "3", "4"]


def test_a_receive_with_visibility_timeout_0_moves_a_dead_letter_once(sqs: Any) -> None:
    # The move acks the message after its append to the dead-letter queue: taken for 1 ms, its ack
    # came too late, the message stayed, and every later receive moved it once more.
    dlq = sqs.create_queue(QueueName="zero-dlq")["QueueUrl"]
    url = sqs.create_queue(QueueName="zero", Attributes={"RedrivePolicy": _policy("zero-dlq", 1)})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    handed = [
        m["Attributes"]["ApproximateReceiveCount"]
        for _ in range(6)
        for m in _receive(sqs, url, VisibilityTimeout=0, WaitTimeSeconds=1, AttributeNames=["All"])
    ]
    assert handed == ["1"]  # handed out once (visible again at once), then moved
    moved = _receive(sqs, dlq, WaitTimeSeconds=5)
    for m in moved:
        sqs.delete_message(QueueUrl=dlq, ReceiptHandle=m["ReceiptHandle"])
    later = _receive(sqs, dlq, WaitTimeSeconds=2)
    assert [m["Body"] for m in moved + later] == ["poison"]


def test_bad_redrive_policies_are_refused_and_change_nothing(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="tasks")["QueueUrl"]
    sqs.create_queue(QueueName="tasks-dlq")
    bad = [
        _policy("no-such-queue"),  # the target must exist
        _policy("tasks"),  # not itself
        _policy("tasks-dlq", 0),
        _policy("tasks-dlq", 1001),
        json.dumps(
            {"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:000000000000:tasks-dlq", "maxReceiveCount": 2}
        ),
        json.dumps({"deadLetterTargetArn": ARN + "tasks-dlq"}),
        "not json",
    ]
    for policy in bad:
        assert _code(
            lambda p=policy: sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": p})
        ) == ("InvalidParameterValue"), policy
        self_target = policy.replace('tasks"', 'tasks-new"')  # CreateQueue's own name is the self case
        assert (
            _code(
                lambda p=self_target: sqs.create_queue(QueueName="tasks-new", Attributes={"RedrivePolicy": p})
            )
            == "InvalidParameterValue"
        ), self_target
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in attributes
    names = [t["name"] for t in cluster.get("/v1/topics").json()["topics"]]
    assert "tasks-new" not in names


def test_a_redrive_allow_policy_decides_which_sources_may_name_a_queue(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName="mail-dlq")["QueueUrl"]
    allowed = sqs.create_queue(QueueName="mail-allowed")["QueueUrl"]
    other = sqs.create_queue(QueueName="mail-other")["QueueUrl"]
    by_queue = json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [ARN + "mail-allowed"]})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": by_queue})
    assert json.loads(
        sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])["Attributes"][
            "RedriveAllowPolicy"
        ]
    ) == json.loads(by_queue)
    sqs.set_queue_attributes(QueueUrl=allowed, Attributes={"RedrivePolicy": _policy("mail-dlq")})

    def set_other() -> None:
        sqs.set_queue_attributes(QueueUrl=other, Attributes={"RedrivePolicy": _policy("mail-dlq")})

    assert _code(set_other) == "InvalidParameterValue"
    sqs.set_queue_attributes(
        QueueUrl=dlq, Attributes={"RedriveAllowPolicy": '{"redrivePermission": "denyAll"}'}
    )
    assert _code(set_other) == "InvalidParameterValue"
    sqs.set_queue_attributes(
        QueueUrl=dlq, Attributes={"RedriveAllowPolicy": '{"redrivePermission": "allowAll"}'}
    )
    set_other()
    assert _sources(sqs, dlq, [allowed, other]) == sorted([allowed, other])
    for bad in ('{"redrivePermission": "byQueue"}', '{"redrivePermission": "maybe"}', "[]"):
        assert (
            _code(lambda b=bad: sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": b}))
            == "InvalidParameterValue"
        )
    stored = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])["Attributes"]
    assert json.loads(stored["RedriveAllowPolicy"]) == {"redrivePermission": "allowAll"}
