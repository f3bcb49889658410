"""The SQS API on a cluster of its own: a queue group's leader killed while boto3 sends loses no
acknowledged send; a node whose metadata replica lags writes the RedrivePolicy it is sent (SigV4
on a cluster with tokens: test_sqs_auth.py)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from .harness import Cluster, running, wait_until
from .sqs_clients import sqs_client


def test_a_leader_killed_while_sending_loses_no_acknowledged_send(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        sqs = sqs_client(c.url("n1"), retries={"mode": "standard", "max_attempts": 10})
        url = sqs.create_queue(QueueName="failover")["QueueUrl"]
        topic = c.get("/v1/topics/failover").json()
        victim = next(q["leader"] for q in topic["queues"] if q["leader"] not in (None, "n1"))
        acked: list[str] = []
        failed: list[str] = []
        stop = threading.Event()

        def send() -> None:
            i = 0
            while not stop.is_set():
                body = f"m{i}"
                i += 1
                try:
                    if i % 3 == 0:
                        entries = [{"Id": str(j), "MessageBody": f"{body}.{j}"} for j in range(3)]
                        out = sqs.send_message_batch(QueueUrl=url, Entries=entries)
                        acked.extend(f"{body}.{s['Id']}" for s in out["Successful"])
                    else:
                        sqs.send_message(QueueUrl=url, MessageBody=body)
                        acked.append(body)
                except ClientError:
                    failed.append(body)  # not acknowledged: may or may not be stored

        sender = threading.Thread(target=send)
        sender.start()
        # The sends run 3 s before the kill and 8 s after it, and each phase waits for one
        # acknowledged at least: on a loaded machine boto3's first send, or one retried through
        # the election, may take longer than the phase.
        time.sleep(3)
        wait_until(lambda: acked, 60, what="a send acknowledged before the kill")
        before = len(acked)
        c.kill(victim)
        time.sleep(8)
        wait_until(lambda: len(acked) > before, 60, what="a send acknowledged after the kill")
        stop.set()
        sender.join(timeout=60)
        assert before > 0 and len(acked) > before, (before, len(acked), failed)
        received: set[str] = set()
        deadline = time.monotonic() + 90
        while not set(acked) <= received and time.monotonic() < deadline:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get(
                "Messages", []
            )
            received.update(m["Body"] for m in got)
            if got:
                sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(got)],
                )
        missing = set(acked) - received
        print(
            f"acknowledged {len(acked)} ({before} before the kill), unacknowledged {len(failed)}, "
            f"received {len(received)}"
        )
        assert not missing, f"{len(missing)} acknowledged sends lost of {len(acked)}: {sorted(missing)[:10]}"


def _pause(c: Cluster, nid: str, paused: bool) -> None:
    proc = c.nodes[nid].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


def test_a_lagging_node_writes_the_redrive_policy_it_is_sent(tmp_path: Path) -> None:
    """SetQueueAttributes took a RedrivePolicy equal to the queue's current one in the node's own
    metadata replica for no change and dropped it, though that replica may lag: the node that
    missed a change of the policy (paused; then resumed while the two others are paused) dropped a
    write of the former policy and answered success; the queue kept the other one. It writes it
    now (no tokens here: the write-back rule is only for a token refused on the dead-letter queue,
    and compares at the metadata leader)."""
    with running(Cluster(tmp_path, nodes=3)) as c:
        sqs = sqs_client(c.url("n1"), retries={"max_attempts": 1})
        for dlq in ("lag-dlq-a", "lag-dlq-b"):
            dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
        got = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
        arn = got["Attributes"]["QueueArn"].removesuffix("lag-dlq-b")

        def policy(dlq: str) -> str:
            return json.dumps({"deadLetterTargetArn": arn + dlq, "maxReceiveCount": 1})

        url = sqs.create_queue(QueueName="lag-src", Attributes={"RedrivePolicy": policy("lag-dlq-a")})[
            "QueueUrl"
        ]
        leader = c.wait_leader("meta")
        lagging, other = (n for n in c.nodes if n != leader)
        wait_until(
            lambda: "lag-dlq-a" in c.get("/v1/topics/lag-src", lagging).text, 30, what="src on every node"
        )
        _pause(c, lagging, True)
        # Past pysyncobj's connection timeout (3.5 s): the leader dropped its connection to the
        # paused node, so the change below waits for a key exchange instead of sitting in its
        # socket buffer, read at once on resuming.
        time.sleep(5)
        answers: list[Any] = []
        try:
            sqs_client(c.url(leader), retries={"max_attempts": 1}).set_queue_attributes(
                QueueUrl=url, Attributes={"RedrivePolicy": policy("lag-dlq-b")}
            )
            _pause(c, leader, True)  # the lagging node hears from no leader...
            _pause(c, other, True)  # ... nor elects another
            _pause(c, lagging, False)
            lagging_sqs = sqs_client(c.url(lagging), retries={"max_attempts": 1})
            writer = threading.Thread(
                target=lambda: answers.append(
                    lagging_sqs.set_queue_attributes(
                        QueueUrl=url, Attributes={"RedrivePolicy": policy("lag-dlq-a")}
                    )
                )
            )
            writer.start()
            time.sleep(1.0)  # the lagging node took the request: its write waits for the leader
            _pause(c, leader, False)
            writer.join(30)
        finally:
            for nid in c.nodes:
                _pause(c, nid, False)
        assert len(answers) == 1, "the write failed"

        def stored() -> str:
            return str(c.get("/v1/topics/lag-src", other).json()["attributes"]["sqs.RedrivePolicy"])

        wait_until(lambda: "lag-dlq-a" in stored(), 10, what="the policy written: lag-dlq-a")
        assert json.loads(stored())["deadLetterTargetArn"] == arn + "lag-dlq-a", stored()
