"""SQS FIFO queues with the real boto3 against real 3-node clusters (docs/sqs.md, FIFO queues):
the FIFO attributes and AWS's errors, deduplication by id and by content (also across a leader's
death), order within each message group across many groups, and a group with a message in flight
handing out nothing more of it while other groups go on."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import sqs_client

ALL = ["All"]


@pytest.fixture(scope="module")
def sqs(cluster: Cluster) -> Any:
    return sqs_client(cluster.url("n1"))


def _code(e: pytest.ExceptionInfo[ClientError]) -> str:
    code: str = e.value.response["Error"]["Code"]
    return code


def _fifo(sqs: Any, name: str, **attributes: str) -> str:
    url: str = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]
    return url


def _drain(sqs: Any, url: str, timeout_s: float = 20, want: int | None = None) -> list[dict[str, Any]]:
    """Receive and delete until ``want`` messages came (or one empty long poll without ``want``)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (want is None or len(got) < want):
        batch = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageSystemAttributeNames=ALL
        ).get("Messages", [])
        if not batch and want is None:
            break
        got += batch
        for m in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return got


def test_fifo_queues_are_created_with_their_attributes_and_awss_errors(sqs: Any, cluster: Cluster) -> None:
    url = _fifo(sqs, "jobs.fifo", ContentBasedDeduplication="true")
    assert url.endswith("/000000000000/jobs.fifo")
    assert _fifo(sqs, "jobs.fifo", ContentBasedDeduplication="true") == url  # the same again: its URL
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=ALL)["Attributes"]
    assert {k: attributes[k] for k in ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope")} == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
        "DeduplicationScope": "queue",
    }
    assert attributes["FifoThroughputLimit"] == "perQueue"
    assert len(cluster.get("/v1/topics/jobs.fifo").json()["queues"]) == 1  # one queue, one log

    refusals = [
        (lambda: _fifo(sqs, "jobs.fifo", ContentBasedDeduplication="false"), "QueueAlreadyExists"),
        (lambda: sqs.create_queue(QueueName="jobs.fifo"), "InvalidParameterValue"),
        (
            lambda: sqs.create_queue(QueueName="plain", Attributes={"FifoQueue": "true"}),
            "InvalidParameterValue",
        ),
        (lambda: sqs.create_queue(QueueName="nofifo.fifo"), "InvalidParameterValue"),
        (
            lambda: sqs.create_queue(QueueName="f.fifo", Attributes={"FifoQueue": "false"}),
            "InvalidParameterValue",
        ),
        (
            lambda: sqs.create_queue(QueueName="f.fifo", Attributes={"FifoQueue": "yes"}),
            "InvalidParameterValue",
        ),
        (
            lambda: _fifo(sqs, "f.fifo", FifoThroughputLimit="perMessageGroupId"),
            "InvalidAttributeValue",
        ),
        (lambda: _fifo(sqs, "f.fifo", DeduplicationScope="group"), "InvalidAttributeValue"),
        (
            lambda: sqs.create_queue(QueueName="std", Attributes={"ContentBasedDeduplication": "true"}),
            "InvalidAttributeName",
        ),
        (
            lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "false"}),
            "InvalidAttributeName",
        ),
        (
            lambda: sqs.set_queue_attributes(
                QueueUrl=url, Attributes={"FifoThroughputLimit": "perMessageGroupId"}
            ),
            "InvalidAttributeValue",
        ),
    ]
    # Dead letters do not cross queue types (AWS's rule; test_sqs_fifo_redrive.py has more).
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    dlq = sqs.create_queue(QueueName="std-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(
        QueueName="std-src",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})},
    )
    to_fifo = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})
    refusals += [
        (
            lambda: sqs.create_queue(QueueName="std", Attributes={"RedrivePolicy": to_fifo}),
            "InvalidParameterValue",
        ),
        (
            lambda: _fifo(
                sqs,
                "f.fifo",
                RedrivePolicy=json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}),
            ),
            "InvalidParameterValue",
        ),
        (lambda: sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=arn), "InvalidParameterValue"),
    ]
    for call, code in refusals:
        with pytest.raises(ClientError) as e:
            call()
        assert _code(e) == code
    names = sqs.list_queues().get("QueueUrls", [])
    assert not any(n.endswith(("/plain", "/nofifo.fifo", "/f.fifo", "/std")) for n in names), names
    assert sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"] == []
    # The high-throughput pair, set together, is accepted; nothing was changed by the refusals.
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"},
    )
    now = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=ALL)["Attributes"]
    assert (now["DeduplicationScope"], now["FifoThroughputLimit"], now["FifoQueue"]) == (
        "messageGroup",
        "perMessageGroupId",
        "true",
    )


def test_fifo_sends_are_checked_as_aws_checks_them(sqs: Any) -> None:
    url = _fifo(sqs, "checked.fifo")
    standard = sqs.create_queue(QueueName="checked-standard")["QueueUrl"]
    cases = [
        (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d"),
            "MissingParameter",
        ),
        (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g"),
            "InvalidParameterValue",
        ),
        (
            lambda: sqs.send_message(
                QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d", DelaySeconds=5
            ),
            "InvalidParameterValue",
        ),
        (
            lambda: sqs.send_message(
                QueueUrl=url, MessageBody="x", MessageGroupId="a b", MessageDeduplicationId="d"
            ),
            "InvalidParameterValue",
        ),
        (
            lambda: sqs.send_message(QueueUrl=standard, MessageBody="x", MessageDeduplicationId="d"),
            "InvalidParameterValue",
        ),
    ]
    for call, code in cases:
        with pytest.raises(ClientError) as e:
            call()
        assert _code(e) == code
    out = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "fine", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {"Id": "nogroup", "MessageBody": "bad", "MessageDeduplicationId": "2"},
        ],
    )
    assert [s["Id"] for s in out["Successful"]] == ["ok"]
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("nogroup", "MissingParameter")]
    assert [m["Body"] for m in _drain(sqs, url)] == ["fine"]  # nothing of the refused sends


def test_a_resend_within_the_window_answers_the_original_and_is_not_enqueued(sqs: Any) -> None:
    url = _fifo(sqs, "dedup.fifo")
    first = sqs.send_message(QueueUrl=url, MessageBody="one", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sqs.send_message(QueueUrl=url, MessageBody="two", MessageGroupId="g", MessageDeduplicationId="d1")
    assert (again["MessageId"], again["SequenceNumber"]) == (first["MessageId"], first["SequenceNumber"])
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "three", "MessageGroupId": "g", "MessageDeduplicationId": "d2"},
            {"Id": "b", "MessageBody": "again", "MessageGroupId": "g", "MessageDeduplicationId": "d2"},
            {"Id": "c", "MessageBody": "old", "MessageGroupId": "h", "MessageDeduplicationId": "d1"},
        ],
    )
    ids = {s["Id"]: s for s in batch["Successful"]}
    assert ids["a"]["MessageId"] == ids["b"]["MessageId"] and ids["c"]["MessageId"] == first["MessageId"]
    assert int(ids["a"]["SequenceNumber"]) > int(first["SequenceNumber"])
    got = _drain(sqs, url)
    assert [m["Body"] for m in got] == ["one", "three"]
    assert got[0]["MessageId"] == first["MessageId"]
    assert got[0]["Attributes"]["MessageDeduplicationId"] == "d1"
    assert got[0]["Attributes"]["MessageGroupId"] == "g"
    assert got[0]["Attributes"]["SequenceNumber"] == first["SequenceNumber"]
    # Deleted or not, the id is remembered for the window: a third send is still a duplicate.
    third = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d1")
    assert third["MessageId"] == first["MessageId"]
    assert _drain(sqs, url) == []


def test_content_based_deduplication_and_the_message_group_scope(sqs: Any) -> None:
    url = _fifo(sqs, "content.fifo", ContentBasedDeduplication="true")
    a = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g1")
    b = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g2")  # scope queue: a dup
    c = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="g1")
    assert a["MessageId"] == b["MessageId"] != c["MessageId"]
    assert sorted(m["Body"] for m in _drain(sqs, url)) == ["other", "same"]

    scoped = _fifo(
        sqs,
        "scoped.fifo",
        ContentBasedDeduplication="true",
        DeduplicationScope="messageGroup",
        FifoThroughputLimit="perMessageGroupId",
    )
    x = sqs.send_message(QueueUrl=scoped, MessageBody="same", MessageGroupId="g1")
    y = sqs.send_message(QueueUrl=scoped, MessageBody="same", MessageGroupId="g2")  # another group
    z = sqs.send_message(QueueUrl=scoped, MessageBody="same", MessageGroupId="g1")
    assert x["MessageId"] != y["MessageId"] and z["MessageId"] == x["MessageId"]
    got = _drain(sqs, scoped)
    assert sorted(m["Attributes"]["MessageGroupId"] for m in got) == ["g1", "g2"]


def test_a_group_with_a_message_in_flight_hands_out_no_other_while_other_groups_go_on(sqs: Any) -> None:
    url = _fifo(sqs, "blocking.fifo", ContentBasedDeduplication="true")
    for body, group in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a"), ("b2", "b")):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)["Messages"]
    assert [m["Body"] for m in first] == ["a1"]
    others = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in others] == ["b1", "b2"]  # group a waits for a1; b goes on
    assert (
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages") is None
    )
    # a1 made visible again comes back before the rest of its group, with its receive count.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"], VisibilityTimeout=0)
    back = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=2, MessageSystemAttributeNames=ALL
    )["Messages"]
    assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in back] == [("a1", "2")]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=back[0]["ReceiptHandle"])
    for m in others:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    # A long poll waiting on a blocked group is answered once the delete frees it.
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in rest] == ["a2", "a3"]


def test_receivers_waiting_together_never_share_a_group(sqs: Any, cluster: Cluster) -> None:
    """Four long polls wait on an empty queue; one batch of a single group arrives: one receiver
    gets its first message, the others nothing while it is in flight (their demands are not added
    up into one take whose messages would be split among them)."""
    url = _fifo(sqs, "waiting.fifo", ContentBasedDeduplication="true")
    clients = [sqs_client(cluster.url(n)) for n in ("n1", "n2", "n3", "n1")]
    got: list[list[str]] = []

    def receive(client: Any) -> None:
        answer = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=6, VisibilityTimeout=60
        )
        got.append([m["Body"] for m in answer.get("Messages", [])])

    threads = [threading.Thread(target=receive, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(2)  # all four are waiting
    entries = [{"Id": str(i), "MessageBody": f"a{i}", "MessageGroupId": "a"} for i in range(4)]
    assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 4
    for t in threads:
        t.join(timeout=30)
    assert sorted(got) == [[], [], [], ["a0"]], got


def test_order_within_each_group_across_many_groups(sqs: Any, cluster: Cluster) -> None:
    """600 messages over 30 groups sent in batches through all three nodes; receivers on all three
    nodes hold some messages a while and let some time out: each group comes out in the order it
    was sent, and no message of a group is handed out while another of it is held."""
    url = _fifo(sqs, "many.fifo")
    clients = [sqs_client(cluster.url(n)) for n in ("n1", "n2", "n3")]
    rng = random.Random(11)
    sent: dict[str, list[str]] = {}
    entries = []
    for i in range(600):
        group = f"g{rng.randrange(30)}"
        sent.setdefault(group, []).append(f"{group}:{i}")
        entries.append(
            {
                "Id": str(i % 10),
                "MessageBody": f"{group}:{i}",
                "MessageGroupId": group,
                "MessageDeduplicationId": str(i),
            }
        )
    for start in range(0, 600, 10):
        out = clients[start // 10 % 3].send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])
        assert len(out["Successful"]) == 10, out.get("Failed")
    delivered: dict[str, list[str]] = {}
    held: dict[str, tuple[Any, dict[str, Any]]] = {}  # group -> (client, a message not deleted yet)
    deadline = time.monotonic() + 120
    turn = 0
    while sum(map(len, delivered.values())) < 600 and time.monotonic() < deadline:
        turn += 1
        client = clients[turn % 3]
        got = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=60
        ).get("Messages", [])
        for m in got:
            group = m["Body"].split(":")[0]
            assert group not in held, f"{m['Body']} handed out while {held[group][1]['Body']} is in flight"
        for group, (holder, m) in list(held.items()):  # held over one receive: now done
            holder.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            del held[group]
        for m in got:
            group = m["Body"].split(":")[0]
            delivered.setdefault(group, []).append(m["Body"])
            if group not in held and rng.random() < 0.2:
                held[group] = (client, m)
            else:
                client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert delivered == sent


def test_the_deduplication_window_survives_the_queue_leaders_death(tmp_path: Path) -> None:
    """The window is replicated with the queue: a resend after the leader's death, through another
    node, is answered with the original MessageId and SequenceNumber and not enqueued twice."""
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        sqs = sqs_client(c.url("n1"), retries={"mode": "standard", "max_attempts": 10})
        url = _fifo(sqs, "failover.fifo")
        sent = {
            i: sqs.send_message(
                QueueUrl=url, MessageBody=f"m{i}", MessageGroupId=f"g{i % 3}", MessageDeduplicationId=f"d{i}"
            )
            for i in range(20)
        }
        leader = c.get("/v1/topics/failover.fifo").json()["queues"][0]["leader"]
        c.kill(leader)
        other = next(n for n in ("n1", "n2", "n3") if n != leader)
        survivor = sqs_client(c.url(other), retries={"mode": "standard", "max_attempts": 10})
        for i in range(20):  # every one again, as a producer unsure of its sends would
            again = survivor.send_message(
                QueueUrl=url, MessageBody=f"m{i}", MessageGroupId=f"g{i % 3}", MessageDeduplicationId=f"d{i}"
            )
            assert (again["MessageId"], again["SequenceNumber"]) == (
                sent[i]["MessageId"],
                sent[i]["SequenceNumber"],
            )
        new = survivor.send_message(
            QueueUrl=url, MessageBody="new", MessageGroupId="g0", MessageDeduplicationId="n"
        )
        assert int(new["SequenceNumber"]) > max(int(s["SequenceNumber"]) for s in sent.values())
        got = _drain(survivor, url, timeout_s=60, want=21)
        bodies = [m["Body"] for m in got]
        assert sorted(bodies) == sorted([f"m{i}" for i in range(20)] + ["new"])
        by_group: dict[str, list[int]] = {}
        for m in got:
            if m["Body"] != "new":
                by_group.setdefault(m["Attributes"]["MessageGroupId"], []).append(int(m["Body"][1:]))
        assert all(v == sorted(v) for v in by_group.values()), by_group
        assert _drain(survivor, url) == []
