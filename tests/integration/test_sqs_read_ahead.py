"""Read-ahead of the SQS API's standard queues (docs/sqs.md, Read-ahead), with the real boto3
against real 3-node clusters: a DeleteMessage(Batch) takes the next messages of the node's
receivers along in its Raft entry (``ack_receive``), so the ReceiveMessage after it on that node
writes no entry of its own; a read-ahead no receive takes within its hold is given back visible
and uncounted (``release``), and so is one held when the node stops gracefully; one taken keeps
the visibility timeout its receive asked; two queue groups with a backlog are both served; a queue
with a RedrivePolicy is never read ahead; and while a voter runs the release before, a delete takes
nothing along. Each test that needs the read-ahead to have happened checks the node's
``raftmq_read_ahead_messages`` counters."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.cluster.node.read_ahead import READ_AHEAD_HOLD_MS, READ_AHEAD_RUN

from .conftest import describe
from .harness import Cluster, wait_until
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(300)

CYCLES = 5
COUNT = ["ApproximateReceiveCount"]


def _entries(c: Cluster) -> int:
    """Raft entries committed so far in the queue groups (each group's highest commit index any
    node reports)."""
    best: dict[str, int] = {}
    for nid in c.nodes:
        for family in text_string_to_metric_families(c.get("/metrics", nid).text):
            for s in family.samples:
                group = s.labels.get("group_id", "meta")
                if s.name == "raftmq_raft_commit_index" and group != "meta":
                    best[group] = max(best.get(group, 0), int(s.value))
    return sum(best.values())


def _read_ahead(c: Cluster, nid: str) -> dict[str, int]:
    """The node's read-ahead counters (``raftmq_read_ahead_messages``) by outcome."""
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(c.get("/metrics", nid).text):
        for s in family.samples:
            if s.name == "raftmq_read_ahead_messages_total":
                out[s.labels["outcome"]] = int(s.value)
    return out


def _send(sqs: Any, url: str, count: int, prefix: str = "m") -> None:
    for start in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"{prefix}{i}"} for i in range(start, min(count, start + 10))
        ]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == len(entries)


def _delete(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
    answer = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    assert len(answer.get("Successful", [])) == len(entries), answer


def _receive_cycles(c: Cluster, sqs: Any, url: str) -> tuple[int, list[dict[str, Any]]]:
    """One receive and delete, then ``CYCLES`` more on the same node: the entries the receives
    after a delete wrote, and every message received."""
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=COUNT)
    seen = list(got["Messages"])
    _delete(sqs, url, got["Messages"])
    written = 0
    for _ in range(CYCLES):
        before = _entries(c)
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=COUNT
        )
        written += _entries(c) - before
        assert len(got["Messages"]) == 10, got
        seen += got["Messages"]
        _delete(sqs, url, got["Messages"])
    return written, seen


def test_a_receive_after_a_delete_on_the_same_node_writes_no_entry_of_its_own(cluster: Cluster) -> None:
    sqs = sqs_client(cluster.url("n2"))
    url = sqs.create_queue(QueueName="read-ahead-cycles")["QueueUrl"]
    _send(sqs_client(cluster.url("n1")), url, 10 * (CYCLES + 1))

    written, seen = _receive_cycles(cluster, sqs, url)

    # Without read-ahead each receive is an entry of its own (CYCLES at least); with it the
    # receives take what the deletes took along (a stray entry of the cluster's own allowed for).
    assert written < CYCLES, written
    assert sorted(m["Body"] for m in seen) == sorted(f"m{i}" for i in range(10 * (CYCLES + 1)))
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in seen} == {"1"}
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_a_read_ahead_no_receive_takes_is_given_back_visible_and_uncounted(cluster: Cluster) -> None:
    sqs = sqs_client(cluster.url("n2"))
    url = sqs.create_queue(QueueName="read-ahead-given-back")["QueueUrl"]
    _send(sqs_client(cluster.url("n1")), url, 20)
    before = _read_ahead(cluster, "n2")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    _delete(sqs, url, got)  # takes the next messages along for n2's next receive, which never comes
    deleted = {m["Body"] for m in got}
    assert _read_ahead(cluster, "n2")["taken"] == before.get("taken", 0) + 10

    other = sqs_client(cluster.url("n3"))
    rest: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10  # the queue's visibility timeout is 30 s
    while len(rest) < 10 and time.monotonic() < deadline:
        answer = other.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=COUNT
        )
        rest += answer.get("Messages", [])
    assert sorted(m["Body"] for m in rest) == sorted({f"m{i}" for i in range(20)} - deleted)
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in rest} == {"1"}
    # n2 counts its release once its entry's result is back, which can be after n3 served the
    # messages the entry made visible: waited for, then counted exactly.
    want = before.get("released", 0) + 10
    wait_until(lambda: _read_ahead(cluster, "n2").get("released", 0) >= want, 30, what="n2 counting them")
    assert _read_ahead(cluster, "n2")["released"] == want


def test_a_message_taken_from_a_read_ahead_keeps_the_visibility_timeout_asked(cluster: Cluster) -> None:
    sqs = sqs_client(cluster.url("n2"))
    url = sqs.create_queue(QueueName="read-ahead-visibility", Attributes={"VisibilityTimeout": "10"})[
        "QueueUrl"
    ]
    _send(sqs_client(cluster.url("n1")), url, 20)
    before = _read_ahead(cluster, "n2").get("handed_out", 0)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    _delete(sqs, url, first)
    held = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    received_at = time.monotonic()
    assert len(held) == 10
    assert _read_ahead(cluster, "n2")["handed_out"] == before + 10  # this receive took the read-ahead
    ids = {m["MessageId"] for m in held}

    other = sqs_client(cluster.url("n3"))
    while time.monotonic() < received_at + 9.0:  # hidden for the whole timeout asked
        answer = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        early = [m for m in answer.get("Messages", []) if m["MessageId"] in ids]
        assert not early, f"visible again {time.monotonic() - received_at:.1f} s after its receive"
        time.sleep(0.5)
    back: list[dict[str, Any]] = []
    deadline = received_at + 10 + 1 + 5  # the timeout, the read-ahead's hold, and some slack
    while len(back) < 10 and time.monotonic() < deadline:
        answer = other.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=COUNT
        )
        back += answer.get("Messages", [])
    assert {m["MessageId"] for m in back} == ids
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in back} == {"2"}


def test_while_a_voter_runs_the_release_before_a_delete_takes_nothing_along(tmp_path: Path) -> None:
    fault = '[faults]\nprevious_release_node = "n4"\n'
    with Cluster(tmp_path, nodes=4, replication=3, queue_groups=4, extra_toml=fault) as c:
        c.start()
        c.wait_ready()
        assert "ack_receive" not in c.status("n4").get("capabilities", [])
        sqs = sqs_client(c.url("n1"))
        url = sqs.create_queue(QueueName="read-ahead-upgrade")["QueueUrl"]
        # Every message in a queue whose group has n4 as a voter.
        q = next(q["queue"] for q in describe(c, "read-ahead-upgrade")["queues"] if "n4" in q["replicas"])
        produced = c.produce("read-ahead-upgrade", [{"value": f"m{i}", "queue": q} for i in range(60)])
        assert produced.status_code == 200, produced.text

        written, seen = _receive_cycles(c, sqs, url)

        assert written >= CYCLES  # each receive an entry of its own, as the release before
        assert sorted(m["Body"] for m in seen) == sorted(f"m{i}" for i in range(10 * (CYCLES + 1)))
        assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_two_queue_groups_with_a_backlog_are_both_served(cluster: Cluster) -> None:
    """Queues 0 and 1 (queue groups of their own) both have a backlog larger than the cycles
    receive; one receiver on n2 receives and deletes in a loop. A read-ahead comes from its
    receipts' group, but at most READ_AHEAD_RUN in a row while the other has messages: both queues
    are served within the cycles (a read-ahead that always follows its receipts' group serves one
    queue until it runs dry)."""
    name = "read-ahead-fair"
    sqs = sqs_client(cluster.url("n2"))
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queues = describe(cluster, name)["queues"]
    assert len({q["group_id"] for q in queues[:2]}) == 2, queues
    cycles = 2 * (READ_AHEAD_RUN + 1) + 4
    for q in (0, 1):
        for start in range(0, 10 * cycles + 100, 100):
            produced = cluster.produce(
                name, [{"value": f"q{q}-{i}", "queue": q} for i in range(start, start + 100)]
            )
            assert produced.status_code == 200, produced.text
    before = _read_ahead(cluster, "n2")

    served: list[str] = []
    for _ in range(cycles):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
        served += [m["Body"].split("-")[0] for m in got]
        _delete(sqs, url, got)

    counts = {q: served.count(q) for q in ("q0", "q1")}
    assert min(counts.values()) >= 10 * READ_AHEAD_RUN // 2, counts
    after = _read_ahead(cluster, "n2")
    assert after["handed_out"] - before.get("handed_out", 0) >= 10 * READ_AHEAD_RUN  # it did read ahead


def _stop_holding(c: Cluster, name: str) -> tuple[str, set[str], float]:
    """Rounds on queue ``name``: 20 messages sent, n2 receives 10 and deletes them, until its
    delete takes messages along (held for its next receive; a node just started does so once it
    learnt that its peers apply ``ack_receive``); then n2 is stopped with SIGTERM. The queue's
    URL, the bodies sent and not deleted, and the seconds from that delete sent to n2 gone."""
    sqs = sqs_client(c.url("n2"))
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    left: set[str] = set()
    for round_ in range(10):
        _send(sqs_client(c.url("n1")), url, 20, prefix=f"r{round_}-")
        left |= {f"r{round_}-{i}" for i in range(20)}
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
        taken = _read_ahead(c, "n2").get("taken", 0)
        sent = time.monotonic()
        _delete(sqs, url, got)
        left -= {m["Body"] for m in got}
        if _read_ahead(c, "n2").get("taken", 0) > taken:
            break
    else:
        pytest.fail("no delete on n2 took messages along")
    assert c.terminate("n2") == 0
    return url, left, time.monotonic() - sent


def test_a_graceful_stop_gives_back_what_the_node_read_ahead(tmp_path: Path) -> None:
    """n2 holds a read-ahead (its delete took the next messages along) when it is stopped with
    SIGTERM: they are released on the way out, visible again at once and their receive count
    as before, not hidden for the 30 s visibility timeout. n2 is gone before the read-ahead's
    hold (READ_AHEAD_HOLD_MS) runs out, so its stop alone can have given them back; a stop that
    took longer (the hold's own release may have run) is done again on a queue of its own."""
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        for attempt in range(3):
            url, left, stopped_s = _stop_holding(c, f"read-ahead-stop-{attempt}")
            if stopped_s < READ_AHEAD_HOLD_MS / 1000:
                break
            c.start("n2")
            c.wait_ready()
        else:
            pytest.fail(f"n2 stopped after its hold ran out three times (the last in {stopped_s:.2f} s)")

        other = sqs_client(c.url("n3"))
        rest: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10  # well within the visibility timeout of 30 s
        while len(rest) < len(left) and time.monotonic() < deadline:
            answer = other.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=COUNT
            )
            rest += answer.get("Messages", [])
        assert sorted(m["Body"] for m in rest) == sorted(left)
        assert {m["Attributes"]["ApproximateReceiveCount"] for m in rest} == {"1"}


def test_a_queue_with_a_redrive_policy_is_never_read_ahead(cluster: Cluster) -> None:
    """A read-ahead no consumer got (its node crashed) counts a receive; with maxReceiveCount 1
    that would dead-letter a message never delivered. Such a queue's deletes take nothing along
    (each receive is an entry of its own), and every message is delivered once, none
    dead-lettered."""
    sqs = sqs_client(cluster.url("n2"))
    dlq = sqs.create_queue(QueueName="read-ahead-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "1"})
    url = sqs.create_queue(QueueName="read-ahead-redrive", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    _send(sqs_client(cluster.url("n1")), url, 10 * (CYCLES + 1))
    before = _read_ahead(cluster, "n2").get("taken", 0)

    written, seen = _receive_cycles(cluster, sqs, url)

    assert written >= CYCLES  # each receive an entry of its own
    assert sorted(m["Body"] for m in seen) == sorted(f"m{i}" for i in range(10 * (CYCLES + 1)))
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in seen} == {"1"}
    assert "Messages" not in sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=0)
    assert _read_ahead(cluster, "n2").get("taken", 0) == before
