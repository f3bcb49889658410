"""The SQS checker on hand-built histories: each known fault is caught, a clean history passes, what
at least once allows (duplicates, redeliveries, a delete with an older receipt) is counted and not
failed, and the streamed check over a file finds exactly what the in-memory one finds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from raftmq.chaos.checkers import check_all
from raftmq.chaos.history import Op
from raftmq.chaos.sqs_checker import sqs_queue
from raftmq.chaos.streaming import check_file


class Builder:
    """A history as chaos/sqs.py writes one (one clock tick per op)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.handles = 0

    def op(self, **fields: Any) -> Op:
        op = {"index": len(self.ops), "time": len(self.ops) * 1_000_000, **fields}
        self.ops.append(op)
        return op

    def send(self, process: int, values: list[str], results: list[str] | None = None,
             outcome: str = "ok") -> None:  # fmt: skip
        common = {"process": process, "f": "sqs-send", "node": "n1", "values": values}
        self.op(type="invoke", **common)
        if outcome == "ok":
            self.op(type="ok", results=results or ["ok"] * len(values), **common)
        else:
            error = "InternalError" if outcome == "info" else "ServiceUnavailable"
            self.op(type=outcome, error=error, **common)

    def receive(self, process: int, values: list[tuple[str, int]], f: str = "sqs-receive") -> list[list[Any]]:
        """``values``: (body, ApproximateReceiveCount); returns the messages, ready for ``delete``."""
        common = {"process": process, "f": f, "node": "n2"}
        self.op(type="invoke", **common)
        got = []
        for value, count in values:
            self.handles += 1
            got.append([value, f"id-{value}", count, f"1.0.{self.handles}.{self.handles}"])
        self.op(type="ok", messages=got, **common)
        return got

    def delete(self, process: int, got: list[list[Any]], results: list[str] | None = None,
               outcome: str = "ok", f: str = "sqs-delete") -> None:  # fmt: skip
        messages = [[m[0], m[3]] for m in got]
        common = {"process": process, "f": f, "node": "n2", "messages": messages}
        self.op(type="invoke", **common)
        if outcome == "ok":
            self.op(type="ok", results=results or ["ok"] * len(messages), **common)
        else:
            self.op(type=outcome, error="client_timeout", **common)


def clean() -> Builder:
    b = Builder()
    b.send(1, ["s0-0", "s0-1", "s0-2"])
    b.delete(5, b.receive(5, [("s0-0", 1), ("s0-2", 1)]))
    b.delete(6, b.receive(6, [("s0-1", 1)], f="sqs-drain-receive"), f="sqs-drain-delete")
    return b


def test_a_clean_history_passes() -> None:
    r = sqs_queue(clean().ops)
    assert r["valid"], r
    counts = (r["attempt_count"], r["acknowledged_count"], r["received_count"], r["deleted_count"])
    assert counts == (3, 3, 3, 3)
    assert (r["lost_count"], r["duplicated_count"], r["delivered_after_delete_count"]) == (0, 0, 0)


def test_an_acknowledged_send_never_received_is_lost() -> None:
    b = clean()
    b.send(2, ["s1-0", "s1-1"])
    b.delete(5, b.receive(5, [("s1-1", 1)]))
    r = sqs_queue(b.ops)
    assert not r["valid"]
    assert (r["lost_count"], r["lost"]) == (1, ["s1-0"])


def test_a_body_nobody_sent_is_unexpected() -> None:
    b = clean()
    b.delete(5, b.receive(5, [("ghost", 1)]))
    r = sqs_queue(b.ops)
    assert not r["valid"]
    assert (r["unexpected_count"], r["unexpected"]) == (1, ["ghost"])


def test_failed_and_unknown_entries_need_not_arrive_and_an_unknown_one_may() -> None:
    b = clean()
    b.send(2, ["s1-0", "s1-1", "s1-2"], results=["ServiceUnavailable", "InternalError", "ok"])
    b.send(3, ["s2-0"], outcome="info")
    b.send(4, ["s3-0"], outcome="fail")
    b.delete(5, b.receive(5, [("s1-2", 1), ("s2-0", 1)]))
    r = sqs_queue(b.ops)
    assert r["valid"], r
    counts = (r["acknowledged_count"], r["failed_count"], r["indefinite_count"], r["recovered_count"])
    assert counts == (4, 2, 2, 1)


def test_a_received_message_nobody_deleted_is_caught_after_the_drain() -> None:
    b = clean()
    b.send(2, ["s1-0", "s1-1"])
    got = b.receive(5, [("s1-0", 1), ("s1-1", 1)])
    b.delete(5, got[1:])
    b.delete(5, got[:1], results=["ReceiptHandleIsInvalid"])  # refused: not deleted
    r = sqs_queue(b.ops)
    assert not r["valid"]
    assert (r["never_deleted_count"], r["never_deleted"]) == (1, ["s1-0"])


def test_a_delete_that_failed_as_a_call_deleted_nothing() -> None:
    b = clean()
    b.send(2, ["s1-0"])
    b.delete(5, b.receive(5, [("s1-0", 1)]), outcome="fail")  # e.g. the node was down: nothing sent
    r = sqs_queue(b.ops)
    assert not r["valid"]
    assert (r["never_deleted"], r["delete_unknown_count"]) == (["s1-0"], 0)


def test_a_delete_whose_answer_was_lost_may_have_deleted() -> None:
    b = clean()
    b.send(2, ["s1-0"])
    b.delete(5, b.receive(5, [("s1-0", 1)]), outcome="info")
    r = sqs_queue(b.ops)
    assert r["valid"], r
    assert (r["delete_unknown_count"], r["never_deleted_count"]) == (1, 0)


def test_a_message_received_again_after_a_current_delete_is_counted_not_failed() -> None:
    b = clean()
    b.send(2, ["s1-0"])
    b.delete(5, b.receive(5, [("s1-0", 1)]))
    b.delete(6, b.receive(6, [("s1-0", 2)]))  # invoked after the ok delete: it did not hold
    r = sqs_queue(b.ops)
    assert r["valid"], r
    assert (r["delivered_after_delete_count"], r["delivered_after_delete"]) == (1, ["s1-0"])
    assert (r["duplicated_count"], r["redelivered_count"], r["deleted_count"]) == (1, 1, 5)


def test_a_delete_with_an_older_receipt_promises_nothing() -> None:
    """SQS answers ok to a delete whose receipt a later delivery replaced, and deletes nothing: the
    message received again after it is not a delete that failed to hold."""
    b = clean()
    b.send(2, ["s1-0"])
    first = b.receive(5, [("s1-0", 1)])
    second = b.receive(6, [("s1-0", 2)])  # the visibility timeout ran out: handed out again
    b.delete(5, first)  # stale: acknowledged, nothing deleted
    third = b.receive(7, [("s1-0", 3)])  # the second receiver was slow
    b.delete(6, second)  # stale too
    r = sqs_queue(b.ops)
    assert not r["valid"], "only older receipts were deleted: the message is still in the queue"
    assert (r["never_deleted_count"], r["never_deleted"]) == (1, ["s1-0"])
    b.delete(7, third)
    r = sqs_queue(b.ops)
    assert r["valid"], r
    assert (r["stale_delete_count"], r["delivered_after_delete_count"], r["redelivered_count"]) == (2, 0, 2)


def faulty(seed: int, sends: int) -> list[Op]:
    """Random senders and receivers with every kind of fault above, by the dozen."""
    rng = random.Random(seed)
    b = Builder()
    inflight: list[str] = []
    for n in range(sends):
        values = [f"s{n % 7}-{n}-{i}" for i in range(rng.randint(1, 4))]
        kinds = rng.choices(["ok", "ServiceUnavailable", "InternalError"], [8, 1, 1], k=len(values))
        b.send(n % 7, values, results=kinds, outcome=rng.choices(["ok", "info", "fail"], [8, 1, 1])[0])
        inflight += [v for v, k in zip(values, kinds, strict=True) if rng.random() < 0.9 or k != "ok"]
        if rng.random() < 0.05:
            inflight.append(f"ghost-{n}")
        while inflight and rng.random() < 0.7:
            take = [inflight.pop(rng.randrange(len(inflight))) for _ in range(min(len(inflight), 3))]
            got = b.receive(100 + n % 5, [(v, rng.randint(1, 3)) for v in take])
            roll = rng.random()
            if roll < 0.1:
                continue  # never deleted
            if roll < 0.2:
                b.delete(100 + n % 5, got, outcome="info")
            else:
                results = rng.choices(["ok", "ReceiptHandleIsInvalid"], [9, 1], k=len(got))
                b.delete(100 + n % 5, got, results=results)
            if rng.random() < 0.2:
                b.receive(200 + n % 3, [(got[0][0], 2)])  # again, after the delete
    return b.ops


@pytest.mark.parametrize("seed", [1, 2])
def test_the_streamed_check_finds_what_the_in_memory_one_finds(tmp_path: Path, seed: int) -> None:
    ops = faulty(seed, 600)
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"".join(orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE) for op in ops))
    expected = check_all(ops)
    sq = expected["sqs_queue"]
    assert not sq["valid"] and not expected["valid"]
    for key in ("lost_count", "unexpected_count", "never_deleted_count", "duplicated_count",
                "delivered_after_delete_count", "delete_unknown_count", "recovered_count"):  # fmt: skip
        assert sq[key] > 20, (key, sq)
    for bucket_bytes in (64, 4_096, 1 << 30):
        assert check_file(path, bucket_bytes=bucket_bytes)[0] == expected


def test_a_history_without_sqs_sends_has_no_sqs_check() -> None:
    b = Builder()
    b.op(type="invoke", process=1, f="enqueue", node="n1", queue=0, value="1-0")
    b.op(type="ok", process=1, f="enqueue", node="n1", queue=0, value="1-0", offset=0)
    assert "sqs_queue" not in check_all(b.ops)
    assert "sqs_queue" in check_all(clean().ops)
