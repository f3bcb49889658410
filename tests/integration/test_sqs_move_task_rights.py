"""Who may run the SQS message move tasks on a cluster with API tokens, with the real boto3 against a
real 3-node cluster (docs/sqs.md "Permissions per action", cluster/api/sqs/access.py): a task
receives from the dead-letter queue and sends to its destination, so StartMessageMoveTask needs
``consume`` on the dead-letter queue and ``produce`` on the DestinationArn, or without one on
every queue whose RedrivePolicy names the dead-letter queue; ListMessageMoveTasks and
CancelMessageMoveTask need ``consume`` on the dead-letter queue. A refusal is AccessDenied (403)
and starts, cancels or moves nothing; with the rights the same calls work."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster, wait_until
from .sqs_clients import sqs_client

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region
DLQ, SOURCE, DEST = "moves-dlq", "moves-src", "moves-dest"
TOKENS = {
    "admin": ("move-admin-token-0123456789abcdef", 'admin = ["*"]\nproduce = ["*"]\nconsume = ["*"]'),
    # everything but consume on the dead-letter queue
    "sender": ("move-sender-token-0123456789abcd", 'produce = ["moves-*"]\nconsume = ["moves-src"]'),
    # consume on every queue, produce on none
    "reader": ("move-reader-token-0123456789abcd", 'consume = ["moves-*"]'),
    # consume on the dead-letter queue, produce on the destination only (not on the source)
    "to-dest": ("move-to-dest-token-0123456789abc", 'consume = ["moves-dlq"]\nproduce = ["moves-dest"]'),
    # consume on the dead-letter queue, produce on the source only (not on the destination)
    "to-source": ("move-to-source-token-0123456789a", 'consume = ["moves-dlq"]\nproduce = ["moves-src"]'),
}
SECURITY_TOML = "[security]\n" + "".join(
    f'[[security.tokens]]\nname = "{name}"\ntoken = "{token}"\n{rights}\n'
    for name, (token, rights) in TOKENS.items()
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("sqs-move-rights"), nodes=3, extra_toml=SECURITY_TOML) as c:
        c.start()
        c.wait_ready()
        yield c


def _client(c: Cluster, name: str, node: str = "n1") -> Any:
    r = c.get("/v1/sqs/credentials", node, headers={"Authorization": f"Bearer {TOKENS[name][0]}"})
    assert r.status_code == 200, r.text
    body = r.json()
    credentials = (body["access_key_id"], body["secret_access_key"])
    return sqs_client(c.url(node), credentials, region="us-east-1", retries={"max_attempts": 1})


def _denied(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    error = e.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("AccessDenied", 403)
    message: str = error["Error"]["Message"]
    return message


def _count(sqs: Any, url: str) -> int:
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(got["Attributes"]["ApproximateNumberOfMessages"])


def _tasks(sqs: Any) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = sqs.list_message_move_tasks(SourceArn=ARN + DLQ, MaxResults=10)["Results"]
    return results


def _ended(sqs: Any, status: str) -> dict[str, Any]:
    """The newest task once it is no longer RUNNING (or CANCELLING), which must be ``status``."""
    task: dict[str, Any] = wait_until(
        lambda: (t := _tasks(sqs)) and t[0]["Status"] not in ("RUNNING", "CANCELLING") and t[0],
        60,
        0.3,
        "the task's end",
    )
    assert task["Status"] == status, task
    return task


def test_move_tasks_need_consume_on_the_dead_letter_queue_and_produce_where_they_send(
    secure: Cluster,
) -> None:
    admin = _client(secure, "admin")
    dlq = admin.create_queue(QueueName=DLQ)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": ARN + DLQ, "maxReceiveCount": 1})
    source = admin.create_queue(QueueName=SOURCE, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    dest = admin.create_queue(QueueName=DEST)["QueueUrl"]
    # Three dead letters from the source (received once, moved at the next receive), two sent to the
    # dead-letter queue directly (no recorded source).
    for text in ("p1", "p2", "p3"):
        admin.send_message(QueueUrl=source, MessageBody=text)

    def dead_lettered() -> bool:
        admin.receive_message(QueueUrl=source, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return _count(admin, dlq) == 3

    wait_until(dead_lettered, 60, 0.3, "three dead letters")
    sender, reader = _client(secure, "sender", "n2"), _client(secure, "reader", "n3")
    to_dest, to_source = _client(secure, "to-dest"), _client(secure, "to-source", "n2")

    # Without consume on the dead-letter queue: no start (with or without a destination), no list.
    assert "consume" in _denied(
        lambda: sender.start_message_move_task(SourceArn=ARN + DLQ, DestinationArn=ARN + DEST)
    )
    _denied(lambda: sender.start_message_move_task(SourceArn=ARN + DLQ))
    _denied(lambda: sender.list_message_move_tasks(SourceArn=ARN + DLQ))
    # With consume but without produce where the messages would go: no start. The reader may list.
    assert "produce" in _denied(
        lambda: reader.start_message_move_task(SourceArn=ARN + DLQ, DestinationArn=ARN + DEST)
    )
    assert SOURCE in _denied(lambda: reader.start_message_move_task(SourceArn=ARN + DLQ))
    _denied(lambda: to_dest.start_message_move_task(SourceArn=ARN + DLQ))  # back to moves-src: no produce
    _denied(lambda: to_source.start_message_move_task(SourceArn=ARN + DLQ, DestinationArn=ARN + DEST))
    assert reader.list_message_move_tasks(SourceArn=ARN + DLQ)["Results"] == []
    # None of that started a task or moved a message.
    assert _tasks(admin) == [] and _count(admin, dlq) == 3 and _count(admin, dest) == 0

    # Produce on the source queue (the one the messages came from) is what a task without a
    # destination needs: all three go back.
    to_source.start_message_move_task(SourceArn=ARN + DLQ)
    assert _ended(to_source, "COMPLETED")["ApproximateNumberOfMessagesMoved"] == 3
    wait_until(lambda: _count(admin, source) == 3 and _count(admin, dlq) == 0, 30, 0.3, "the moves back")

    # Produce on the destination is what a task with a DestinationArn needs.
    wait_until(dead_lettered, 60, 0.3, "three dead letters again")
    for i in range(6):  # more to move, at one a second: a task still running to cancel
        admin.send_message(QueueUrl=dlq, MessageBody=f"direct{i}")
    handle = to_dest.start_message_move_task(
        SourceArn=ARN + DLQ, DestinationArn=ARN + DEST, MaxNumberOfMessagesPerSecond=1
    )["TaskHandle"]
    assert [t["Status"] for t in to_dest.list_message_move_tasks(SourceArn=ARN + DLQ)["Results"]] == [
        "RUNNING"
    ]
    # Cancelling needs consume on the dead-letter queue too (produce is not enough); then it works.
    _denied(lambda: sender.cancel_message_move_task(TaskHandle=handle))
    time.sleep(0.5)
    assert _tasks(admin)[0]["Status"] == "RUNNING"
    reader.cancel_message_move_task(TaskHandle=handle)
    cancelled = _ended(admin, "CANCELLED")
    assert cancelled["ApproximateNumberOfMessagesMoved"] < 9
    assert [t["Status"] for t in _tasks(admin)] == ["CANCELLED", "COMPLETED"]
    moved = cancelled["ApproximateNumberOfMessagesMoved"]

    def settled() -> bool:  # what the task held in flight is visible again within 30 s
        return _count(admin, dest) == moved and _count(admin, dlq) == 9 - moved

    wait_until(settled, 45, 0.3, "nothing lost: moved in the destination, the rest dead letters")


def test_a_dead_letter_goes_back_only_to_a_queue_whose_redrive_policy_names_the_dead_letter_queue(
    secure: Cluster,
) -> None:
    """The header ``sqs-dead-letter-source`` is no credential: a producer on the dead-letter queue
    (here through the REST API, where ``sqs-`` headers are not reserved) wrote one naming a queue it
    may not produce to, and a task without a DestinationArn, started by a token that may, sent the
    message there. Now such a message fails the task, is left in the dead-letter queue and nothing
    reaches that queue."""
    admin = _client(secure, "admin")
    dlq_name = "moves-forged-dlq"
    dlq = admin.create_queue(QueueName=dlq_name)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": ARN + dlq_name, "maxReceiveCount": 1})
    admin.create_queue(QueueName="moves-forged-src", Attributes={"RedrivePolicy": policy})
    elsewhere = admin.create_queue(QueueName="elsewhere")["QueueUrl"]  # the sender may not produce here
    forged = {"value": "forged", "headers": {"sqs-dead-letter-source": ARN + "elsewhere"}}
    r = secure.post(
        f"/v1/topics/{dlq_name}/messages",
        {"messages": [forged]},
        "n2",
        headers={"Authorization": f"Bearer {TOKENS['sender'][0]}"},
    )
    assert r.status_code == 200, r.text
    admin.start_message_move_task(SourceArn=ARN + dlq_name)
    task: dict[str, Any] = wait_until(
        lambda: (
            (t := admin.list_message_move_tasks(SourceArn=ARN + dlq_name)["Results"])
            and t[0]["Status"] != "RUNNING"
            and t[0]
        ),
        60,
        0.3,
        "the task's end",
    )
    assert task["Status"] == "FAILED" and "RedrivePolicy" in task["FailureReason"], task
    assert _count(admin, elsewhere) == 0
    wait_until(lambda: _count(admin, dlq) == 1, 45, 0.3, "the message back in the dead-letter queue")
