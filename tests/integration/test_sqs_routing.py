"""Where the SQS API's writes are made (docs/sqs.md, "What maps to what"), with the real boto3
against a real 3-node cluster: a send is appended to a queue whose queue group the answering node
leads (no forwarding hop), and a receive of a standard queue is served at the node it reached,
without a hop to the topic's receive coordinator."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .conftest import describe
from .harness import Cluster
from .sqs_clients import sqs_client

ACTION_ROUTE = "/internal/groups/{group}/{action}"  # a write or take passed on to a group's leader


def _high_offsets(c: Cluster, name: str) -> dict[int, int]:
    return {q["queue"]: q["high_offset"] for q in describe(c, name)["queues"]}


def _passed_on(c: Cluster, node: str) -> int:
    """The actions other nodes passed on to ``node`` so far (``ACTION_ROUTE`` requests it answered)."""
    total = 0
    for family in text_string_to_metric_families(c.get("/metrics", node).text):
        for s in family.samples:
            if s.name == "raftmq_http_requests_total" and s.labels.get("route") == ACTION_ROUTE:
                total += int(s.value)
    return total


def test_a_send_is_appended_to_a_queue_the_answering_node_leads(cluster: Cluster) -> None:
    url = sqs_client(cluster.url("n1")).create_queue(QueueName="routed-sends")["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    for nid in sorted(cluster.nodes):
        queues = describe(cluster, "routed-sends")["queues"]
        led = {q["queue"] for q in queues if q["leader"] == nid}
        assert led, f"{nid} leads none of the queue's groups: {queues}"
        before = _high_offsets(cluster, "routed-sends")
        sqs = sqs_client(cluster.url(nid))
        for _ in range(4):
            answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
            assert len(answer["Successful"]) == 10, answer
        sqs.send_message(QueueUrl=url, MessageBody="single")
        after = _high_offsets(cluster, "routed-sends")
        grown = {q: after[q] - before[q] for q in after}
        assert sum(grown[q] for q in led) == 41, (nid, led, grown)
        assert all(n == 0 for q, n in grown.items() if q not in led), (nid, led, grown)


def test_a_standard_queue_receive_takes_no_hop_to_the_receive_coordinator(cluster: Cluster) -> None:
    name = "routed-receives"
    url = sqs_client(cluster.url("n1")).create_queue(QueueName=name)["QueueUrl"]
    queues = describe(cluster, name)["queues"]
    coordinator = queues[0]["leader"]  # the leader of queue 0's group coordinates REST receives
    entry = next(nid for nid in sorted(cluster.nodes) if nid != coordinator)
    (mine,) = [q["queue"] for q in queues if q["leader"] == entry]
    sqs = sqs_client(cluster.url(entry))
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)  # subscribed now
    produced = cluster.produce(name, [{"value": f"m{i}", "queue": mine} for i in range(30)])
    assert produced.status_code == 200, produced.text
    before = _passed_on(cluster, coordinator)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(got) < 30 and time.monotonic() < deadline:
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        got += answer.get("Messages", [])
    passed_on = _passed_on(cluster, coordinator) - before
    assert sorted(m["Body"] for m in got) == sorted(f"m{i}" for i in range(30))
    # Every message was in a queue the entry node leads: it received them itself (through the
    # coordinator, each receive was a take passed on to it). The receive coordinator answered
    # nothing for them (one stray internal call of the cluster's own is allowed for).
    assert passed_on <= 1, passed_on
    handles = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
    for start in range(0, len(handles), 10):
        done = sqs.delete_message_batch(QueueUrl=url, Entries=handles[start : start + 10])
        assert len(done["Successful"]) == len(handles[start : start + 10]), done
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
