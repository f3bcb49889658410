"""The SQS message move tasks with the real boto3 against real 3-node clusters (docs/sqs.md, "Moving
dead letters back"): poison messages dead-lettered from two source queues go back each to its own
source, or all to a DestinationArn; MaxNumberOfMessagesPerSecond paces the moves; a task is
cancelled; every node lists every task; one active task per source (a node's death mid-task:
``test_sqs_move_task_failover.py``). Every wait is for a state, with a generous deadline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import query_sqs_client, sqs_client, until

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region


@pytest.fixture(scope="module")
def clients(cluster: Cluster) -> dict[str, Any]:
    return {n: sqs_client(cluster.url(n), retries={"max_attempts": 1}) for n in ("n1", "n2", "n3")}


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def _queues(sqs: Any, dlq: str, sources: list[str], *others: str) -> dict[str, str]:
    urls = {dlq: sqs.create_queue(QueueName=dlq)["QueueUrl"]}
    policy = lambda: json.dumps({"deadLetterTargetArn": ARN + dlq, "maxReceiveCount": 1})  # noqa: E731
    for name in sources:
        urls[name] = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy()})["QueueUrl"]
    for name in others:
        urls[name] = sqs.create_queue(QueueName=name)["QueueUrl"]
    return urls


def _count(sqs: Any, url: str) -> int:
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(got["Attributes"]["ApproximateNumberOfMessages"])


def _dead_letter(
    sqs: Any, urls: dict[str, str], dlq: str, bodies: dict[str, list[str]], sent: int = 0
) -> dict[str, str]:
    """Send ``bodies`` to their source queues and receive each (and ``sent`` messages sent
    before) until its RedrivePolicy (maxReceiveCount 1) moves it to ``dlq``; the MessageIds by
    body."""
    ids = {}
    for source, texts in bodies.items():
        for text in texts:
            ids[text] = sqs.send_message(QueueUrl=urls[source], MessageBody=text)["MessageId"]
    total = sent + sum(len(t) for t in bodies.values())

    def moved() -> bool:
        for source in bodies:  # a message received once, visible again at once, moved at the next
            sqs.receive_message(QueueUrl=urls[source], MaxNumberOfMessages=10, VisibilityTimeout=0)
        return _count(sqs, urls[dlq]) == total

    until("dead letters", moved)
    return ids


def _drain(sqs: Any, url: str, want: int = 0, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Receive and delete until ``want`` messages came (then one more short receive), or the
    deadline; what came."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]
        ).get("Messages", [])
        for m in answer:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        got.extend(answer)
        if not answer and len(got) >= want:
            break
    return got


def _task(sqs: Any, dlq: str, status: str | None = None, timeout_s: float = 60) -> dict[str, Any]:
    """The newest task of ``dlq`` as this client's node lists it, once it has ``status``."""

    def newest() -> dict[str, Any] | None:
        results = sqs.list_message_move_tasks(SourceArn=ARN + dlq)["Results"]
        if results and (status is None or results[0]["Status"] == status):
            task: dict[str, Any] = results[0]
            return task
        return None

    found: dict[str, Any] = until(f"{status or 'any'} task of {dlq}", newest, timeout_s)
    return found


def test_without_a_destination_each_message_goes_back_to_the_queue_it_was_dead_lettered_from(
    clients: dict[str, Any],
) -> None:
    sqs = clients["n1"]
    urls = _queues(sqs, "back-dlq", ["back-a", "back-b"])
    ids = _dead_letter(sqs, urls, "back-dlq", {"back-a": ["a0", "a1", "a2"], "back-b": ["b0", "b1"]})
    handle = sqs.start_message_move_task(SourceArn=ARN + "back-dlq")["TaskHandle"]
    assert handle.startswith("back-dlq:")
    done = _task(clients["n3"], "back-dlq", "COMPLETED")  # listed by another node
    assert done["ApproximateNumberOfMessagesMoved"] == 5
    assert done["ApproximateNumberOfMessagesToMove"] == 5
    assert done["SourceArn"] == ARN + "back-dlq"
    # As AWS: no handle once it is over, no DestinationArn or rate when none was given.
    assert not {"TaskHandle", "DestinationArn", "MaxNumberOfMessagesPerSecond", "FailureReason"} & set(done)
    for source, want in (("back-a", {"a0", "a1", "a2"}), ("back-b", {"b0", "b1"})):
        got = _drain(sqs, urls[source], len(want))
        assert sorted(m["Body"] for m in got) == sorted(want)
        assert {m["MessageId"] for m in got} == {ids[b] for b in want}  # the same messages
        assert {m["Attributes"]["ApproximateReceiveCount"] for m in got} == {"1"}  # new in the source
    left = _drain(sqs, urls["back-dlq"])
    assert [(m["Body"], m["Attributes"]) for m in left] == [], done


def test_with_a_destination_every_message_goes_there(
    clients: dict[str, Any], cluster: Cluster, tmp_path: Path
) -> None:
    sqs = clients["n2"]
    urls = _queues(sqs, "to-dlq", ["to-a", "to-b"], "to-dest")
    attributes = {"kind": {"DataType": "String", "StringValue": "poison"}}
    sqs.send_message(QueueUrl=urls["to-a"], MessageBody="with attributes", MessageAttributes=attributes)
    _dead_letter(sqs, urls, "to-dlq", {"to-a": ["a0"], "to-b": ["b0", "b1"]}, sent=1)
    sqs.start_message_move_task(SourceArn=ARN + "to-dlq", DestinationArn=ARN + "to-dest")
    done = _task(clients["n1"], "to-dlq", "COMPLETED")
    assert done["DestinationArn"] == ARN + "to-dest"
    assert done["ApproximateNumberOfMessagesMoved"] == 4
    # The query protocol (XML) lists the same task.
    query = query_sqs_client(cluster.url("n3"), tmp_path)
    assert _task(query, "to-dlq", "COMPLETED") == done
    got = sqs.receive_message(
        QueueUrl=urls["to-dest"], MaxNumberOfMessages=10, WaitTimeSeconds=5, MessageAttributeNames=["All"]
    )["Messages"]
    got += _drain(sqs, urls["to-dest"], 4 - len(got))
    assert sorted(m["Body"] for m in got) == ["a0", "b0", "b1", "with attributes"]
    # The message attributes came along (boto3 checked their MD5).
    assert [m.get("MessageAttributes") for m in got if m["Body"] == "with attributes"] == [attributes]
    assert _drain(sqs, urls["to-a"]) == _drain(sqs, urls["to-b"]) == _drain(sqs, urls["to-dlq"]) == []


def test_the_rate_paces_the_moves(clients: dict[str, Any]) -> None:
    sqs = clients["n1"]
    urls = _queues(sqs, "pace-dlq", ["pace-src"], "pace-dest")
    _dead_letter(sqs, urls, "pace-dlq", {"pace-src": [f"m{i}" for i in range(6)]})
    sqs.start_message_move_task(
        SourceArn=ARN + "pace-dlq", DestinationArn=ARN + "pace-dest", MaxNumberOfMessagesPerSecond=2
    )
    done = _task(sqs, "pace-dlq", "COMPLETED")
    assert done["MaxNumberOfMessagesPerSecond"] == 2
    got = _drain(sqs, urls["pace-dest"], 6)
    assert len(got) == 6
    # Two a second: the batch that moves the 5th and 6th messages starts 2 s after the task at the
    # earliest (the node's own clock stamps both; a slow machine only makes the gap longer).
    last_sent = max(int(m["Attributes"]["SentTimestamp"]) for m in got)
    assert last_sent - done["StartedTimestamp"] >= 2000 - 5


def test_one_task_per_source_and_a_cancel_stops_it_with_nothing_lost(clients: dict[str, Any]) -> None:
    sqs = clients["n1"]
    urls = _queues(sqs, "stop-dlq", ["stop-src"], "stop-dest")
    bodies = [f"m{i:02}" for i in range(12)]
    _dead_letter(sqs, urls, "stop-dlq", {"stop-src": bodies})
    handle = sqs.start_message_move_task(
        SourceArn=ARN + "stop-dlq", DestinationArn=ARN + "stop-dest", MaxNumberOfMessagesPerSecond=1
    )["TaskHandle"]
    # Another node refuses a second task on the same source while this one runs (AWS's code).
    assert _code(lambda: clients["n2"].start_message_move_task(SourceArn=ARN + "stop-dlq")) == (
        "InvalidParameterValue"
    )
    running = _task(clients["n3"], "stop-dlq", "RUNNING")
    assert running["TaskHandle"] == handle and running["ApproximateNumberOfMessagesToMove"] == 12
    moved: list[dict[str, Any]] = until(  # the first moved message arrived: cancel
        "a moved message",
        lambda: sqs.receive_message(QueueUrl=urls["stop-dest"], WaitTimeSeconds=1).get("Messages"),
    )
    cancelled = clients["n2"].cancel_message_move_task(TaskHandle=handle)
    for m in moved:
        sqs.delete_message(QueueUrl=urls["stop-dest"], ReceiptHandle=m["ReceiptHandle"])
    assert 0 <= cancelled["ApproximateNumberOfMessagesMoved"] < 12
    final = _task(clients["n3"], "stop-dlq", "CANCELLED")
    assert final["ApproximateNumberOfMessagesMoved"] < 12
    assert "TaskHandle" not in final
    # Nothing lost, the rest still dead letters; a cancelled task cannot be cancelled again.
    assert _code(lambda: sqs.cancel_message_move_task(TaskHandle=handle)) == "InvalidParameterValue"
    moved += _drain(sqs, urls["stop-dest"])
    left = _drain(sqs, urls["stop-dlq"], 12 - len(moved))
    assert len(left) > 0
    assert sorted({m["Body"] for m in moved + left}) == bodies
    # The task is over: a new one on the same source may start.
    sqs.start_message_move_task(SourceArn=ARN + "stop-dlq")
    assert _task(clients["n2"], "stop-dlq", "COMPLETED")["ApproximateNumberOfMessagesMoved"] == 0
    tasks = sqs.list_message_move_tasks(SourceArn=ARN + "stop-dlq", MaxResults=10)["Results"]
    assert [t["Status"] for t in tasks] == ["COMPLETED", "CANCELLED"]  # newest first


def test_bad_requests_are_refused_with_aws_codes_and_start_nothing(clients: dict[str, Any]) -> None:
    sqs = clients["n3"]
    urls = _queues(sqs, "bad-dlq", ["bad-src"], "bad-plain")
    start = sqs.start_message_move_task
    # Not a dead-letter queue of any queue; no such queue; no such destination; the source itself.
    assert _code(lambda: start(SourceArn=ARN + "bad-plain")) == "InvalidParameterValue"
    assert _code(lambda: start(SourceArn=ARN + "bad-nothing")) == "ResourceNotFoundException"
    assert _code(lambda: start(SourceArn="not an arn")) == "InvalidParameterValue"
    assert (
        _code(lambda: start(SourceArn=ARN + "bad-dlq", DestinationArn=ARN + "bad-nothing"))
        == "ResourceNotFoundException"
    )
    assert (
        _code(lambda: start(SourceArn=ARN + "bad-dlq", DestinationArn=ARN + "bad-dlq"))
        == "InvalidParameterValue"
    )
    for rate in (0, 501):
        assert _code(lambda r=rate: start(SourceArn=ARN + "bad-dlq", MaxNumberOfMessagesPerSecond=r)) == (
            "InvalidParameterValue"
        )
    cancel = sqs.cancel_message_move_task
    assert _code(lambda: cancel(TaskHandle="foobared")) == "InvalidParameterValue"
    assert _code(lambda: cancel(TaskHandle="bad-nothing:" + "0" * 32)) == "ResourceNotFoundException"
    assert _code(lambda: cancel(TaskHandle="bad-dlq:" + "0" * 32)) == "ResourceNotFoundException"
    listing = sqs.list_message_move_tasks
    assert _code(lambda: listing(SourceArn=ARN + "bad-nothing")) == "ResourceNotFoundException"
    assert _code(lambda: listing(SourceArn=ARN + "bad-dlq", MaxResults=11)) == "InvalidParameterValue"
    assert listing(SourceArn=ARN + "bad-dlq", MaxResults=10)["Results"] == []
    assert listing(SourceArn=ARN + "bad-plain")["Results"] == []
    assert set(urls) == {"bad-dlq", "bad-src", "bad-plain"}
