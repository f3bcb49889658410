"""The SQS API on a cluster of its own: a queue group's leader killed while boto3 sends loses no
acknowledged send (SigV4 on a cluster with tokens: test_sqs_auth.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from botocore.exceptions import ClientError

from .harness import Cluster, wait_until
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
