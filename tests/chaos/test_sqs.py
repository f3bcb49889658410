"""At least once through the Amazon SQS API under kills and partitions (issue 24): boto3 senders
(SendMessageBatch) and receivers (ReceiveMessage, DeleteMessageBatch) on every node, each call one
attempt; after the heal the queue is drained through SQS until it holds nothing. The total-queue
checker decides over what boto3 sent and received: every acknowledged send received, nothing
received that nobody sent, every received message deleted. Duplicates and messages received again
after an ok delete are counted (at least once allows them) and shown in the summary.
"""

from __future__ import annotations

from pathlib import Path

from raftmq.chaos.nemesis import time_for_each
from raftmq.chaos.runner import ChaosSpec, run

QUIET_S = (2.0, 4.0)
FAULT_S = (5.0, 7.0)
FAULTS = ["kill", "kill-leader", "partition-halves", "partition-leader"]


def test_sqs_sends_and_deletes_hold_at_least_once_under_kills_and_partitions(
    chaos_images: str, store: Path
) -> None:
    spec = ChaosSpec(
        name="suite-sqs",
        faults=tuple(FAULTS),
        time_limit_s=time_for_each(FAULTS, QUIET_S, FAULT_S),  # each nemesis once: 45 s
        seed=1,
        quiet_s=QUIET_S,
        fault_s=FAULT_S,
        workload="sqs",
        store=store,
    )
    result = run(spec)
    print((result.directory / "summary.txt").read_text())
    run_info, where = result.results["run"], f"see {result.directory}/summary.txt"
    assert set(run_info["faults_injected"]) == set(FAULTS), "every nemesis must have run"
    assert run_info["recovery_s"] is not None, f"the cluster did not recover after the heal; {where}"
    assert run_info["sqs_drain"]["complete"], f"the SQS queue was not drained: {run_info['sqs_drain']}"
    sq = result.checks["sqs_queue"]
    assert sq["acknowledged_count"] > 0 and sq["received_count"] > 0, f"nothing went through: {sq}"
    assert sq["deleted_count"] > 0, f"nothing was deleted: {sq}"
    assert (sq["lost_count"], sq["unexpected_count"]) == (0, 0), (
        f"lost {sq['lost']}, unexpected {sq['unexpected']}; {where}"
    )
    assert sq["never_deleted_count"] == 0, f"received, never deleted, gone: {sq['never_deleted']}; {where}"
    tracebacks = {n: a["traceback"] for n, a in run_info["log_alerts"].items() if a.get("traceback")}
    assert not tracebacks, f"unexplained tracebacks in the node logs (node: count): {tracebacks}; {where}"
    assert result.valid
