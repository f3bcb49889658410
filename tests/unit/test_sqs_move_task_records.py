"""The records of the SQS message move tasks (``cluster/api/sqs/move_task_records.py``) and who may
start one (``access.py``): an active task whose node stopped is FAILED, the records stay bounded,
a record an admin mangled is left out, ListMessageMoveTasks shows what AWS shows."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from raftmq.cluster.api.sqs import move_task_records as records
from raftmq.cluster.api.sqs.access import authorize
from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.config.tokens import TokenGrant
from raftmq.cluster.machines.metadata import MAX_ATTRIBUTE_VALUE_BYTES

ARN = "arn:aws:sqs:us-east-1:000000000000:"
LEASE_MS = 12_000  # a lease other than the default, so a default left in the code shows


def _task(n: int = 0, **kw: object) -> records.MoveTask:
    fields: dict[str, object] = {
        "id": f"{n:032x}",
        "status": "RUNNING",
        "owner": "n1",
        "started_ms": 1_000,
        "heartbeat_ms": 1_000,
        **kw,
    }
    return records.MoveTask(**fields)  # type: ignore[arg-type]


def test_an_active_task_whose_heartbeat_is_older_than_the_lease_is_failed() -> None:
    """The lease is the one given (``sqs.move_task_lease_ms``), here 12 s, not the 30 s default."""
    task = _task(moved=3)
    fresh = 1_000 + LEASE_MS
    assert records.effective(task, fresh, orphaned=False, lease_ms=LEASE_MS) == task
    stale = records.effective(task, fresh + 1, orphaned=False, lease_ms=LEASE_MS)
    assert (stale.status, stale.reason, stale.moved) == ("FAILED", records.NODE_STOPPED, 3)
    cancelling = records.effective(_task(status="CANCELLING"), fresh + 1, orphaned=False, lease_ms=LEASE_MS)
    assert cancelling.status == "CANCELLED"


def test_a_task_its_own_node_no_longer_runs_is_failed_at_once() -> None:
    assert records.effective(_task(), 1_001, orphaned=True, lease_ms=LEASE_MS).status == "FAILED"


def test_a_finished_task_stays_as_it_ended() -> None:
    for status in ("COMPLETED", "CANCELLED", "FAILED"):
        task = _task(status=status)
        assert records.effective(task, 10**12, orphaned=True, lease_ms=LEASE_MS) == task


def test_the_records_keep_the_newest_ten_and_fit_an_attribute_value() -> None:
    tasks = [_task(n, destination=ARN + "d" * 80, reason="x" * 5_000, status="FAILED") for n in range(15)]
    text = records.dump(tasks)
    assert len(text.encode()) <= MAX_ATTRIBUTE_VALUE_BYTES
    kept = records.load(text)
    assert 1 <= len(kept) <= records.KEEP
    assert [t.id for t in kept] == [t.id for t in tasks[: len(kept)]]  # the newest first
    assert all(t.reason is not None and len(t.reason) <= 200 for t in kept)
    assert len(records.load(records.dump([_task(n) for n in range(15)]))) == records.KEEP


def test_what_is_not_a_record_is_left_out() -> None:
    good = dataclasses.asdict(_task(1))
    for raw in (None, "", "not json", "{}", "[1]", json.dumps([{**good, "status": "DONE"}])):
        assert records.load(raw) == [], raw
    mangled = [{**good, "moved": "3"}, {**good, "extra": 1}, {**good, "id": "x"}, good]
    assert [t.id for t in records.load(json.dumps(mangled))] == [good["id"]]


def test_a_task_handle_names_the_queue_and_the_task() -> None:
    handle = records.handle("orders-dlq", "ab" * 16)
    assert records.parse_handle(handle) == ("orders-dlq", "ab" * 16)
    for bad in ("foobared", "orders-dlq:", ":" + "ab" * 16, "a b:" + "ab" * 16, "q:" + "AB" * 16, None, 5):
        assert records.parse_handle(bad) is None, bad


def test_the_list_entry_shows_what_aws_shows() -> None:
    running = records.entry(_task(to_move=4), "dlq", ARN + "dlq")
    assert running == {
        "Status": "RUNNING",
        "SourceArn": ARN + "dlq",
        "ApproximateNumberOfMessagesMoved": 0,
        "ApproximateNumberOfMessagesToMove": 4,
        "StartedTimestamp": 1_000,
        "TaskHandle": "dlq:" + "0" * 32,
    }
    failed = records.entry(_task(status="FAILED", reason="why", destination=ARN + "d", rate=5), "dlq", ARN)
    assert "TaskHandle" not in failed
    assert (failed["FailureReason"], failed["DestinationArn"], failed["MaxNumberOfMessagesPerSecond"]) == (
        "why",
        ARN + "d",
        5,
    )


async def _names(name: str, creating: bool) -> list[str]:
    return [name]


def _authorize(grant: TokenGrant, action: str, **params: object) -> None:
    asyncio.run(authorize(action, dict(params), grant, _names))


def test_a_move_task_needs_consume_on_the_source_and_produce_on_the_destination() -> None:
    both = TokenGrant("ops", b"", produce=("orders",), consume=("orders-dlq",))
    _authorize(both, "StartMessageMoveTask", SourceArn=ARN + "orders-dlq", DestinationArn=ARN + "orders")
    _authorize(both, "ListMessageMoveTasks", SourceArn=ARN + "orders-dlq")
    _authorize(both, "CancelMessageMoveTask", TaskHandle=records.handle("orders-dlq", "0" * 32))
    consume_only = TokenGrant("reader", b"", consume=("*",))
    with pytest.raises(SqsError) as e:
        _authorize(
            consume_only, "StartMessageMoveTask", SourceArn=ARN + "orders-dlq", DestinationArn=ARN + "x"
        )
    assert e.value.aws.code == "AccessDenied"
    produce_only = TokenGrant("writer", b"", produce=("*",))
    for action, params in (
        ("StartMessageMoveTask", {"SourceArn": ARN + "orders-dlq"}),
        ("ListMessageMoveTasks", {"SourceArn": ARN + "orders-dlq"}),
        ("CancelMessageMoveTask", {"TaskHandle": records.handle("orders-dlq", "0" * 32)}),
    ):
        with pytest.raises(SqsError) as e:
            _authorize(produce_only, action, **params)
        assert e.value.aws.code == "AccessDenied", action
