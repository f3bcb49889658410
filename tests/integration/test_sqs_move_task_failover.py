"""A message move task whose node dies (docs/sqs.md, "Moving dead letters back"), with the real
boto3 against a real 3-node cluster: the task is listed FAILED by the nodes left and by its own node
once restarted, and no message is lost: each is in the destination or back in the dead-letter queue
after its visibility timeout (at least once: maybe both)."""

from __future__ import annotations

from pathlib import Path

from .harness import Cluster
from .sqs_clients import sqs_client, until
from .test_sqs_move_tasks import ARN, _dead_letter, _queues, _task

# sqs.move_task_lease_ms: 6 s, not the 30 s default (the test waited it out twice). Six heartbeats
# (every second) fit in it; a task of a dead node that is never failed, or messages it took that
# never come back, still fail the waits below.
LEASE = "[sqs]\nmove_task_lease_ms = 6000\n"


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
        # No heartbeat any more: listed FAILED once the lease (6 s) is over, by the nodes left.
        failed = _task(other, "die-dlq", "FAILED", timeout_s=120)
        assert "stopped" in failed["FailureReason"]
        c.start("n3")
        c.wait_ready()
        assert _task(runner, "die-dlq")["Status"] == "FAILED"  # its own node, restarted, too
        # What the dead node held in flight is back after the lease (6 s): every
        # message is in the destination or still a dead letter (at least once: maybe both).
        seen: set[str] = set()

        def every_message_found() -> bool:
            for url in (urls["die-dest"], urls["die-dlq"]):
                got = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
                for m in got.get("Messages", []):
                    seen.add(m["Body"])
                    other.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return seen == set(bodies)

        until("every message in the destination or the dead-letter queue", every_message_found, 150)
