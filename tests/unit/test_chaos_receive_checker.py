"""The receive/ack checker on hand-built histories: each known fault must be caught, a clean history
passes, and what at-least-once allows (duplicates, redeliveries, stale acks) is counted, not failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftmq.chaos.checkers import check_all, log_consistency
from raftmq.chaos.history import Op
from raftmq.chaos.logscan import scan_logs
from raftmq.chaos.receive_checker import receive_ack


class Builder:
    """A history as the workload and the receivers write one (one clock tick per op)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.token = 0

    def op(self, **fields: Any) -> Op:
        op = {"index": len(self.ops), "time": len(self.ops) * 1_000_000, **fields}
        self.ops.append(op)
        return op

    def enqueue(self, process: int, value: str, queue: int, offset: int | None, outcome: str = "ok") -> None:
        common = {"process": process, "f": "enqueue", "node": "n1", "queue": queue, "value": value}
        self.op(type="invoke", **common)
        self.op(type=outcome, **common, **({"offset": offset} if outcome == "ok" else {"error": "timeout"}))

    def receive(
        self, process: int, messages: list[tuple[int, int, str, int]], outcome: str = "ok", f: str = "receive"
    ) -> list[list[Any]]:
        """Returns the messages with receipts, ready for ``ack``."""
        common = {"process": process, "f": f, "node": "n2", "group": "g"}
        self.op(type="invoke", **common)
        if outcome != "ok":
            self.op(type=outcome, error="timeout", **common)
            return []
        self.op(type="ok", messages=[list(m) for m in messages], **common)
        received = []
        for q, o, v, _ in messages:
            self.token += 1
            received.append([q, o, v, f"t.{q}.{o}.{self.token}"])
        return received

    def ack(self, process: int, received: list[list[Any]], results: list[str] | None = None,
            outcome: str = "ok", f: str = "ack") -> None:  # fmt: skip
        common = {"process": process, "f": f, "node": "n2", "group": "g", "messages": received}
        self.op(type="invoke", **common)
        if outcome == "ok":
            self.op(type="ok", results=results or ["ok"] * len(received), **common)
        else:
            self.op(type=outcome, error="connection_lost", **common)


def clean() -> Builder:
    b = Builder()
    b.enqueue(1, "1-0", 0, 0)
    b.enqueue(1, "1-1", 1, 0)
    b.enqueue(2, "2-0", 0, 1)
    b.ack(5, b.receive(5, [(0, 0, "1-0", 1), (0, 1, "2-0", 1)]))
    b.ack(6, b.receive(6, [(1, 0, "1-1", 1)], f="drain-receive"), f="drain-ack")
    return b


def test_a_clean_history_passes() -> None:
    r = receive_ack(clean().ops)
    assert r["valid"], r
    assert (r["acknowledged_count"], r["received_count"], r["acked_count"]) == (3, 3, 3)
    assert (r["lost_count"], r["duplicated_count"], r["redelivered_count"]) == (0, 0, 0)


def test_an_acknowledged_message_never_received_is_lost() -> None:
    b = clean()
    b.enqueue(3, "3-0", 1, 1)
    r = receive_ack(b.ops)
    assert not r["valid"]
    assert r["lost"] == ["3-0"] and r["lost_count"] == 1


def test_a_message_seen_only_in_a_receive_whose_answer_was_lost_is_lost() -> None:
    b = clean()
    b.enqueue(3, "3-0", 1, 1)
    b.receive(7, [(1, 1, "3-0", 1)], outcome="info")  # nobody saw it: it must come back
    assert receive_ack(b.ops)["lost"] == ["3-0"]


def test_a_duplicate_delivery_is_counted_not_failed() -> None:
    b = clean()
    # 1-0 delivered again after its deadline (attempt 2): the first ack came too late (stale).
    first = b.receive(7, [(1, 5, "x-9", 1)])
    b.enqueue(9, "x-9", 1, 5)
    again = b.receive(8, [(1, 5, "x-9", 2)])
    b.ack(7, first, results=["stale_receipt"])
    b.ack(8, again)
    r = receive_ack(b.ops)
    assert r["valid"], r
    assert r["duplicated"] == ["x-9"] and r["redelivered_count"] == 1 and r["stale_ack_count"] == 1
    assert r["delivered_after_ack_count"] == 0


def test_a_delivery_after_an_ok_ack_is_counted() -> None:
    b = clean()
    b.ack(9, b.receive(9, [(0, 0, "1-0", 2)]))
    r = receive_ack(b.ops)
    assert r["valid"] and r["delivered_after_ack"] == ["1-0"]


def test_a_message_nobody_sent_is_unexpected() -> None:
    b = clean()
    b.ack(9, b.receive(9, [(1, 7, "ghost", 1)]))
    r = receive_ack(b.ops)
    assert not r["valid"] and r["unexpected"] == ["ghost"]


def test_a_received_message_that_no_ack_finished_is_caught() -> None:
    b = clean()
    b.enqueue(3, "3-0", 1, 1)
    got = b.receive(7, [(1, 1, "3-0", 1)])
    b.ack(7, got, results=["stale_receipt"])  # refused, and it never came back
    r = receive_ack(b.ops)
    assert not r["valid"] and r["never_acked"] == ["3-0"]


def test_an_ack_with_an_unknown_outcome_may_have_finished_the_message() -> None:
    b = clean()
    b.enqueue(3, "3-0", 1, 1)
    b.ack(7, b.receive(7, [(1, 1, "3-0", 1)]), outcome="info")
    r = receive_ack(b.ops)
    assert r["valid"], r
    assert r["ack_unknown_count"] == 1


def test_a_receipt_answered_with_an_indefinite_code_may_have_been_acked() -> None:
    # One ack request over two queue groups: one group's leader died with the ack in flight, so its
    # receipts answered unknown_outcome while the request as a whole answered 200.
    b = clean()
    b.enqueue(3, "3-0", 1, 1)
    b.enqueue(4, "4-0", 2, 0)
    b.ack(7, b.receive(7, [(1, 1, "3-0", 1), (2, 0, "4-0", 1)]), results=["ok", "unknown_outcome"])
    r = receive_ack(b.ops)
    assert r["valid"], r
    assert (r["acked_count"], r["ack_unknown_count"]) == (4, 1)  # clean() acks three of its own


def test_one_position_handed_out_with_two_values_diverges() -> None:
    b = clean()
    b.enqueue(3, "3-0", 0, 5)
    b.ack(7, b.receive(7, [(0, 1, "3-0", 2)]))  # (0, 1) was 2-0
    r = receive_ack(b.ops)
    assert not r["valid"] and r["divergent"] == {"0@1": ["2-0", "3-0"]}
    assert not log_consistency(b.ops)["valid"]  # the log checker sees receives too


def test_a_recovered_message_counts_and_passes() -> None:
    b = clean()
    b.enqueue(3, "3-0", 1, None, outcome="info")
    b.ack(7, b.receive(7, [(1, 1, "3-0", 1)]))
    r = receive_ack(b.ops)
    assert r["valid"] and r["recovered_count"] == 1


def test_check_all_runs_the_receive_checker_only_when_there_are_receives() -> None:
    b = Builder()
    b.enqueue(1, "1-0", 0, 0)
    assert "receive_ack" not in check_all(b.ops)
    b.ack(2, b.receive(2, [(0, 0, "1-0", 1)]))
    result = check_all(b.ops)
    assert result["receive_ack"]["valid"]
    assert not result["valid"]  # total_queue: 1-0 was never fetched by offset (no offset drain here)


def test_tracebacks_count_once_per_record_and_by_design_ones_apart(tmp_path: Path) -> None:
    json_expected = (
        '{"event": "storage_failure_stopping", "exception": "Traceback (most recent call last):\\n x\\n'
        "The above exception was the direct cause of the following exception:\\n\\n"
        'Traceback (most recent call last):\\n y"}'
    )
    json_bug = '{"event": "handler_failed", "exception": "Traceback (most recent call last):\\n z"}'
    plain = [
        "2026-01-01 ERROR pysyncobj.syncobj: failed _onTick",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "Exception: first",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in g',
        "StoreError: second",
    ]
    (tmp_path / "n1.log").write_text("\n".join([json_expected, json_bug, *plain]) + "\n")
    (tmp_path / "n2.log").write_text('{"event": "node_started"}\n')
    found = scan_logs(tmp_path)
    assert found["n1"] == {"storage_failure": 1, "traceback": 2, "traceback_expected": 1}
    assert found["n2"] == {}
