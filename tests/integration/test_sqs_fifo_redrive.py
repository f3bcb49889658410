"""Dead-letter queues of SQS FIFO queues with the real boto3 against a real 3-node cluster
(docs/sqs.md, "Dead-letter queues"): a FIFO queue's RedrivePolicy names a FIFO queue (AWS's rule,
both ways), a message received maxReceiveCount times moves there in its message group, in order,
with its MessageId, MessageDeduplicationId and attributes, and its group goes on in the source;
ListDeadLetterSourceQueues lists the source; a message move task takes the dead letters back to
their FIFO source (also within 5 minutes of their first send: a move is never taken for a resend).
Every wait is for a state, with a generous deadline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import sqs_client, until

ALL = ["All"]


@pytest.fixture(scope="module")
def sqs(cluster: Cluster) -> Any:
    return sqs_client(cluster.url("n1"))


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return arn


def _fifo(sqs: Any, name: str, **attributes: str) -> str:
    url: str = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]
    return url


def _policy(arn: str, count: int = 1) -> str:
    return json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": count})


def _count(sqs: Any, url: str) -> int:
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(got["Attributes"]["ApproximateNumberOfMessages"])


def _receive(sqs: Any, url: str, **extra: Any) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=ALL,
        MessageAttributeNames=ALL,
        **extra,
    ).get("Messages", [])
    return got


def _drain(sqs: Any, url: str, want: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        batch = _receive(sqs, url, WaitTimeSeconds=1)
        for m in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        got += batch
    return got


def _dead_letter(sqs: Any, source: str, dlq: str, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``sent`` (send_message arguments) to ``source`` (maxReceiveCount 1), receive them once
    without deleting, then receive until all are in ``dlq``; the answers of the sends."""
    answers = [sqs.send_message(QueueUrl=source, **m) for m in sent]
    first = until("first receive", lambda: _receive(sqs, source, VisibilityTimeout=0, WaitTimeSeconds=1))
    assert [m["Body"] for m in first] == [m["MessageBody"] for m in sent]  # one group, in order

    def moved() -> bool:
        assert _receive(sqs, source, WaitTimeSeconds=1) == []  # each is moved, none handed out
        return _count(sqs, dlq) == len(sent)

    until("dead letters", moved)
    return answers


def test_a_fifo_queues_dead_letters_keep_their_group_order_ids_and_attributes(sqs: Any) -> None:
    dlq = _fifo(sqs, "orders-dlq.fifo")
    source = _fifo(sqs, "orders.fifo", RedrivePolicy=_policy(_arn(sqs, dlq)))
    assert json.loads(
        sqs.get_queue_attributes(QueueUrl=source, AttributeNames=ALL)["Attributes"]["RedrivePolicy"]
    ) == {
        "deadLetterTargetArn": _arn(sqs, dlq),
        "maxReceiveCount": 1,
    }
    color = {"color": {"DataType": "String", "StringValue": "red"}}
    sent = [
        {"MessageBody": f"poison {i}", "MessageGroupId": "alice", "MessageDeduplicationId": f"p{i}"}
        | ({"MessageAttributes": color} if i == 0 else {})
        for i in range(3)
    ]
    answers = _dead_letter(sqs, source, dlq, sent)

    # The group goes on in the source: a later message of it is handed out at once, first time.
    sqs.send_message(QueueUrl=source, MessageBody="fine", MessageGroupId="alice", MessageDeduplicationId="f")
    (fine,) = _drain(sqs, source, 1)
    assert (fine["Body"], fine["Attributes"]["ApproximateReceiveCount"]) == ("fine", "1")

    moved = _drain(sqs, dlq, 3)
    assert [m["Body"] for m in moved] == ["poison 0", "poison 1", "poison 2"]  # the group's order
    for m, given, answer in zip(moved, sent, answers, strict=True):
        assert m["MessageId"] == answer["MessageId"]
        assert m["Attributes"]["MessageGroupId"] == "alice"
        assert m["Attributes"]["MessageDeduplicationId"] == given["MessageDeduplicationId"]
        assert m["Attributes"]["ApproximateReceiveCount"] == "1"  # a new message in the dead-letter queue
    assert moved[0]["MessageAttributes"] == color and "MessageAttributes" not in moved[1]
    numbers = [int(m["Attributes"]["SequenceNumber"]) for m in moved]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3  # the dead-letter queue's own
    assert _receive(sqs, dlq, WaitTimeSeconds=1) == [] and _receive(sqs, source, WaitTimeSeconds=1) == []
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]


def test_dead_letters_and_move_tasks_do_not_cross_queue_types(sqs: Any) -> None:
    fifo_dlq = _fifo(sqs, "kinds-dlq.fifo")
    std_dlq = sqs.create_queue(QueueName="kinds-dlq")["QueueUrl"]
    _fifo(sqs, "kinds-src.fifo", RedrivePolicy=_policy(_arn(sqs, fifo_dlq)))
    sqs.create_queue(QueueName="kinds-src", Attributes={"RedrivePolicy": _policy(_arn(sqs, std_dlq))})
    fifo_src = sqs.get_queue_url(QueueName="kinds-src.fifo")["QueueUrl"]
    refusals = [
        lambda: _fifo(sqs, "kinds-other.fifo", RedrivePolicy=_policy(_arn(sqs, std_dlq))),
        lambda: sqs.create_queue(
            QueueName="kinds-other", Attributes={"RedrivePolicy": _policy(_arn(sqs, fifo_dlq))}
        ),
        lambda: sqs.set_queue_attributes(
            QueueUrl=fifo_src, Attributes={"RedrivePolicy": _policy(_arn(sqs, std_dlq))}
        ),
        lambda: sqs.start_message_move_task(SourceArn=_arn(sqs, fifo_dlq), DestinationArn=_arn(sqs, std_dlq)),
        lambda: sqs.start_message_move_task(SourceArn=_arn(sqs, std_dlq), DestinationArn=_arn(sqs, fifo_dlq)),
    ]
    assert [_code(call) for call in refusals] == ["InvalidParameterValue"] * len(refusals)
    names = sqs.list_queues(QueueNamePrefix="kinds-other").get("QueueUrls", [])
    assert names == []  # nothing created
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=fifo_src, AttributeNames=ALL)["Attributes"]["RedrivePolicy"]
    )
    assert policy["deadLetterTargetArn"] == _arn(sqs, fifo_dlq)  # nothing changed
    assert sqs.list_message_move_tasks(SourceArn=_arn(sqs, fifo_dlq))["Results"] == []
    assert sqs.list_message_move_tasks(SourceArn=_arn(sqs, std_dlq))["Results"] == []
    # A standard queue names no FIFO dead-letter queue through SetQueueAttributes either.
    std_src = sqs.get_queue_url(QueueName="kinds-src")["QueueUrl"]
    assert (
        _code(
            lambda: sqs.set_queue_attributes(
                QueueUrl=std_src, Attributes={"RedrivePolicy": _policy(_arn(sqs, fifo_dlq))}
            )
        )
        == "InvalidParameterValue"
    )


def test_a_move_task_takes_fifo_dead_letters_back_to_their_source_in_order(sqs: Any) -> None:
    dlq = _fifo(sqs, "back-dlq.fifo")
    source = _fifo(sqs, "back.fifo", RedrivePolicy=_policy(_arn(sqs, dlq)))
    sent = [
        {"MessageBody": f"job {i}", "MessageGroupId": "bob", "MessageDeduplicationId": f"j{i}"}
        for i in range(4)
    ]
    answers = _dead_letter(sqs, source, dlq, sent)

    # Back within the 5 minutes of the sends: the moves are stored, not taken for resends.
    task = sqs.start_message_move_task(SourceArn=_arn(sqs, dlq))
    assert task["TaskHandle"]

    def completed() -> dict[str, Any] | None:
        results = sqs.list_message_move_tasks(SourceArn=_arn(sqs, dlq))["Results"]
        return results[0] if results and results[0]["Status"] == "COMPLETED" else None

    done = until("completed task", completed)
    assert done["ApproximateNumberOfMessagesMoved"] == 4
    back = _drain(sqs, source, 4)
    assert [m["Body"] for m in back] == [m["MessageBody"] for m in sent]
    assert [m["MessageId"] for m in back] == [a["MessageId"] for a in answers]
    assert {m["Attributes"]["MessageGroupId"] for m in back} == {"bob"}
    assert [m["Attributes"]["MessageDeduplicationId"] for m in back] == ["j0", "j1", "j2", "j3"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in back] == ["1"] * 4
    assert _receive(sqs, dlq, WaitTimeSeconds=1) == []
    # A client's resend of an original id within the window is still a duplicate of the original.
    again = sqs.send_message(QueueUrl=source, **sent[0])
    assert again["MessageId"] == answers[0]["MessageId"]
    assert again["SequenceNumber"] == answers[0]["SequenceNumber"]


def test_a_fifo_dead_letter_queues_redrive_allow_policy_decides_its_sources(sqs: Any) -> None:
    dlq = _fifo(sqs, "allow-dlq.fifo", RedriveAllowPolicy=json.dumps({"redrivePermission": "denyAll"}))
    assert _code(lambda: _fifo(sqs, "allow-a.fifo", RedrivePolicy=_policy(_arn(sqs, dlq)))) == (
        "InvalidParameterValue"
    )
    source = _fifo(sqs, "allow-b.fifo")
    by_queue = {"redrivePermission": "byQueue", "sourceQueueArns": [_arn(sqs, source)]}
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": json.dumps(by_queue)})
    sqs.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": _policy(_arn(sqs, dlq))})
    assert _code(lambda: _fifo(sqs, "allow-a.fifo", RedrivePolicy=_policy(_arn(sqs, dlq)))) == (
        "InvalidParameterValue"
    )
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    # Allowed by its queue: a message received too often moves there.
    _dead_letter(
        sqs, source, dlq, [{"MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "x"}]
    )
    assert [m["Body"] for m in _drain(sqs, dlq, 1)] == ["x"]


@pytest.mark.parametrize("bad_id", ["", "x" * 300])
def test_a_rest_producers_invalid_message_id_does_not_hold_its_group_back(
    cluster: Cluster, sqs: Any, bad_id: str
) -> None:
    # sqs-id is no reserved header: a REST producer may write one that is no valid MessageId.
    name = f"badid{len(bad_id)}"
    dlq = _fifo(sqs, f"{name}-dlq.fifo")
    source = _fifo(sqs, f"{name}.fifo", RedrivePolicy=_policy(_arn(sqs, dlq)))
    produced = cluster.session.post(
        cluster.url("n1") + f"/v1/topics/{name}.fifo/messages",
        json={"messages": [{"value": "poison", "key": "alice", "headers": {"sqs-id": bad_id}}]},
        timeout=30,
    )
    assert produced.status_code == 200, produced.text
    sqs.send_message(QueueUrl=source, MessageBody="next", MessageGroupId="alice", MessageDeduplicationId="n")
    first = until("first receive", lambda: _receive(sqs, source, VisibilityTimeout=0, WaitTimeSeconds=1))
    assert [m["Body"] for m in first] == ["poison", "next"]

    # The next receive moves the poison message (both exceeded maxReceiveCount 1), never holds
    # the group back behind a move that is refused every time.
    until("dead letters", lambda: _receive(sqs, source, WaitTimeSeconds=1) == [] and _count(sqs, dlq) == 2)
    moved = _drain(sqs, dlq, 2)
    assert [m["Body"] for m in moved] == ["poison", "next"]
    assert moved[0]["MessageId"] == "0-0"  # its place in the source
    assert moved[0]["Attributes"]["MessageGroupId"] == "alice"
