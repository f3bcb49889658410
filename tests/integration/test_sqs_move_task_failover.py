"""A message move task whose node dies (docs/sqs.md, "Moving dead letters back"), with the real
boto3 against a real 3-node cluster: the task is listed FAILED by the nodes left and by its own node
once restarted, and no message is lost: each is in the destination or back in the dead-letter queue
after its visibility timeout (at least once: maybe both). A message the dead node held mid-append
is back after the lease, the hold of its take, not 30 s (the first test's kill lands between
batches, with nothing in flight, most of the time: it passed with a literal 30 s hold)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from .harness import Cluster
from .sqs_clients import sqs_client, until
from .test_sqs_move_tasks import ARN, _count, _dead_letter, _queues, _task

# sqs.move_task_lease_ms: 10 s (the least allowed), not the 30 s default (the test waited it out
# twice). The task must be listed FAILED within the lease and 8 s of the kill (a poll, an election):
# far under 30 s, so a lease that is not the cluster's setting fails it. Every message must be back
# within that bound too (a batch the kill caught in flight is held for the lease: the second test
# catches one every time).
LEASE_S = 10
WITHIN_S = LEASE_S + 8
LEASE = f"[sqs]\nmove_task_lease_ms = {LEASE_S * 1000}\n"


def test_a_task_whose_node_dies_is_failed_and_loses_no_message(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3, extra_toml=LEASE) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        runner, other = (
            sqs_client(c.url("n3"), retries={"max_attempts": 1}),
            sqs_client(c.url("n1"), retries={"max_attempts": 3}),
        )
        urls = _queues(other, "die-dlq", ["die-src"], "die-dest")
        bodies = [f"m{i}" for i in range(8)]
        _dead_letter(other, urls, "die-dlq", {"die-src": bodies})
        runner.start_message_move_task(
            SourceArn=ARN + "die-dlq", DestinationArn=ARN + "die-dest", MaxNumberOfMessagesPerSecond=1
        )
        until("a moved message", lambda: _task(other, "die-dlq")["ApproximateNumberOfMessagesMoved"] >= 1)
        c.kill("n3")
        killed = time.monotonic()
        # No heartbeat any more: listed FAILED once the lease (10 s) is over, by the nodes left.
        failed = _task(other, "die-dlq", "FAILED", timeout_s=60)
        assert "stopped" in failed["FailureReason"]
        took_s = time.monotonic() - killed
        assert took_s <= WITHIN_S, f"FAILED {took_s:.1f} s after the kill (lease {LEASE_S} s)"
        # What the dead node held in flight is back after the lease too: every message is in the
        # destination or still a dead letter (at least once: maybe both).
        seen: set[str] = set()

        def every_message_found() -> bool:
            for url in (urls["die-dest"], urls["die-dlq"]):
                got = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
                for m in got.get("Messages", []):
                    seen.add(m["Body"])
                    other.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return seen == set(bodies)

        until("every message in the destination or the dead-letter queue", every_message_found, 60)
        took_s = time.monotonic() - killed
        assert took_s <= WITHIN_S, f"every message back {took_s:.1f} s after the kill (lease {LEASE_S} s)"
        c.start("n3")
        c.wait_ready()
        assert _task(runner, "die-dlq")["Status"] == "FAILED"  # its own node, restarted, too


def _node_of(c: Cluster, queue: str) -> str:
    """The node hosting FIFO queue ``queue`` (its one queue; replication 1: one replica)."""
    (replica,) = c.get(f"/v1/topics/{queue}").json()["queues"][0]["replicas"]
    return str(replica)


def _not_visible(sqs: Any, url: str) -> int:
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    return int(got["Attributes"]["ApproximateNumberOfMessagesNotVisible"])


def test_a_message_the_dead_node_held_is_back_after_the_lease_not_30_s(tmp_path: Path) -> None:
    """The hold of the messages a task takes (its take's ``visibility_ms``) is the lease: a dead
    letter whose move the task's node died in the middle of is received from the dead-letter queue
    again after ``move_task_lease_ms`` (10 s here), not after 30 s. FIFO queues (one queue each)
    with replication 1 put the dead-letter queue and the destination on two nodes: the
    destination's node paused holds the append, and so the taken message in flight, until the
    task's node, the third, is killed."""
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    with Cluster(tmp_path, nodes=3, queue_groups=3, replication=1, extra_toml=LEASE) as c:
        c.start()
        c.wait_ready()
        sqs = sqs_client(c.url("n1"), retries={"max_attempts": 3})
        urls = {"dlq": sqs.create_queue(QueueName="hold-dlq.fifo", Attributes=fifo)["QueueUrl"]}
        holder = _node_of(c, "hold-dlq.fifo")
        # Nor on the metadata group's leader (not balanced: any node may lead it): paused, it would
        # hold the start's compare-and-set for 15 s, a 500 the test passed only through a retry.
        meta = c.wait_leader("meta")
        for i in range(8):  # each topic starts at the next group: the 3 nodes within 3 tries
            dest = f"hold-dest-{i}.fifo"
            urls["dest"] = sqs.create_queue(QueueName=dest, Attributes=fifo)["QueueUrl"]
            if _node_of(c, dest) not in (holder, meta):
                break
        paused = _node_of(c, dest)
        assert paused not in (holder, meta), ("every destination on the DLQ's or meta's node", holder, meta)
        runner = next(n for n in c.nodes if n not in (holder, paused))
        # Through the task's node: it learns that every node serves FIFO redrives and what the
        # destination's node applies, which it could not ask the paused node.
        by_runner = sqs_client(c.url(runner), retries={"max_attempts": 1})
        policy = json.dumps({"deadLetterTargetArn": ARN + "hold-dlq.fifo", "maxReceiveCount": 1})
        urls["src"] = by_runner.create_queue(
            QueueName="hold-src.fifo", Attributes={**fifo, "RedrivePolicy": policy}
        )["QueueUrl"]
        by_runner.send_message(QueueUrl=urls["dest"], MessageBody="warm", MessageGroupId="g")
        asker = sqs_client(c.url(holder), retries={"max_attempts": 3})
        asker.send_message(QueueUrl=urls["src"], MessageBody="held", MessageGroupId="g")
        for _ in range(2):  # received once, then moved to the dead-letter queue at the next
            asker.receive_message(QueueUrl=urls["src"], VisibilityTimeout=0, WaitTimeSeconds=1)
        until("the dead letter", lambda: _count(asker, urls["dlq"]) == 1, 30)
        proc = c.nodes[paused].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        try:
            by_runner.start_message_move_task(SourceArn=ARN + "hold-dlq.fifo", DestinationArn=ARN + dest)
            until("the message taken", lambda: _not_visible(asker, urls["dlq"]) == 1, 5)
            taken = time.monotonic()
            c.kill(runner)  # mid-append: nothing acks or releases the message it took
        finally:
            proc.send_signal(signal.SIGCONT)

        def received() -> bool:
            got = asker.receive_message(QueueUrl=urls["dlq"], WaitTimeSeconds=1)
            return any(m["Body"] == "held" for m in got.get("Messages", []))

        until("the held message back in the dead-letter queue", received, 60)
        took_s = time.monotonic() - taken
        assert LEASE_S - 2 <= took_s <= WITHIN_S, f"back {took_s:.1f} s after its take (lease {LEASE_S} s)"
