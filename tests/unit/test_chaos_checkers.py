"""The chaos checkers on hand-built histories: each known fault must be caught, a clean history passes."""

from __future__ import annotations

from typing import Any

from raftmq.chaos.checkers import (
    availability,
    check_all,
    log_consistency,
    lost_write,
    queue_order,
    total_queue,
)
from raftmq.chaos.history import Op, fault_windows


class Builder:
    """Builds a history the way the workload writes one, with a clock that ticks once per op."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(self, **fields: Any) -> Op:
        op = {"index": len(self.ops), "time": len(self.ops) * 1_000_000, **fields}
        self.ops.append(op)
        return op

    def enqueue(self, process: int, value: str, queue: int, outcome: str = "ok", offset: int | None = None,
                error: str | None = None) -> None:  # fmt: skip
        self.op(type="invoke", process=process, f="enqueue", node="n1", queue=queue, value=value)
        done: dict[str, Any] = {"type": outcome, "process": process, "f": "enqueue", "node": "n1",
                                "queue": queue, "value": value}  # fmt: skip
        if offset is not None:
            done["offset"] = offset
        if error:
            done["error"] = error
        self.op(**done)

    def read(self, process: int, queue: int, offset: int, messages: list[tuple[int, str]], f: str = "fetch",
             node: str = "n2") -> None:  # fmt: skip
        self.op(type="invoke", process=process, f=f, node=node, queue=queue, offset=offset)
        self.op(type="ok", process=process, f=f, node=node, queue=queue, offset=offset,
                messages=[list(m) for m in messages])  # fmt: skip

    def nemesis(self, f: str, fault: str, fault_id: int) -> None:
        self.op(type="info", process="nemesis", f=f, fault=fault, fault_id=fault_id, value={})


def clean() -> Builder:
    """Two producers on queue 0, one on queue 1; a consumer reads everything; replicas agree."""
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=0)
    h.enqueue(2, "2-0", 0, offset=1)
    h.enqueue(1, "1-1", 0, offset=2)
    h.enqueue(3, "3-0", 1, offset=0)
    h.enqueue(3, "3-1", 1, outcome="info", error="timeout")  # indefinite: may or may not be there
    h.read(9, 0, 0, [(0, "1-0"), (1, "2-0")])
    h.read(9, 0, 2, [(2, "1-1")], f="drain")
    h.read(9, 1, 0, [(0, "3-0"), (1, "3-1")], f="drain")
    for node in ("n1", "n2", "n3"):
        h.read(10, 0, 0, [(0, "1-0"), (1, "2-0"), (2, "1-1")], f="read", node=node)
    return h


def test_a_clean_history_passes_every_checker() -> None:
    results = check_all(clean().ops)
    assert results["valid"], results
    tq = results["total_queue"]
    assert (tq["acknowledged_count"], tq["dequeue_count"], tq["lost_count"]) == (4, 5, 0)
    assert tq["recovered"] == ["3-1"]  # the timed-out enqueue was delivered after all: allowed


def test_total_queue_catches_a_lost_acknowledged_message() -> None:
    h = clean()
    h.enqueue(2, "2-1", 0, offset=3)  # acknowledged, never delivered, not even by the drain
    result = total_queue(h.ops)
    assert not result["valid"]
    assert result["lost"] == ["2-1"]


def test_total_queue_catches_an_unexpected_message() -> None:
    h = clean()
    h.read(9, 1, 2, [(2, "never-sent")], f="drain")
    result = total_queue(h.ops)
    assert not result["valid"]
    assert result["unexpected"] == ["never-sent"]


def test_total_queue_counts_a_duplicate_without_failing() -> None:
    h = clean()
    h.read(9, 0, 3, [(3, "1-0")], f="drain")  # delivered twice: at-least-once allows it
    result = total_queue(h.ops)
    assert result["valid"]
    assert result["duplicated"] == ["1-0"]
    consistency = log_consistency(h.ops)
    assert consistency["duplicate_offsets"] == {"1-0@0": [0, 3]}


def test_total_queue_counts_duplicates_of_the_idempotent_producer_apart() -> None:
    h = clean()
    h.op(type="invoke", process=5, f="enqueue", node="n1", queue=1, value="5-0", client="producer")
    h.op(type="ok", process=5, f="enqueue", node="n1", queue=1, value="5-0", client="producer", offset=2)
    h.read(9, 1, 2, [(2, "5-0"), (3, "5-0"), (4, "1-0")], f="drain")  # 5-0 stored twice
    result = total_queue(h.ops)
    assert result["valid"]
    assert result["duplicated"] == ["1-0", "5-0"]
    assert result["duplicated_idempotent"] == ["5-0"] and result["duplicated_idempotent_count"] == 1


def test_total_queue_flags_a_definite_failure_that_was_delivered() -> None:
    h = clean()
    h.enqueue(4, "4-0", 1, outcome="fail", error="unavailable")
    h.read(9, 1, 2, [(2, "4-0")], f="drain")
    result = total_queue(h.ops)
    assert result["recovered_after_definite_fail"] == ["4-0"]


def test_log_consistency_catches_two_values_at_one_offset() -> None:
    h = clean()
    h.read(10, 0, 0, [(0, "1-0"), (1, "1-1")], f="read", node="n3")  # n3's replica diverged at 1
    result = log_consistency(h.ops)
    assert not result["valid"]
    (d,) = result["divergent"]
    assert (d["queue"], d["offset"], sorted(d["values"])) == (0, 1, ["1-1", "2-0"])


def test_log_consistency_catches_an_acknowledgement_overwritten_by_another_message() -> None:
    h = clean()
    h.enqueue(4, "4-0", 1, offset=1)  # the ack says offset 1, where "3-1" was read
    assert not log_consistency(h.ops)["valid"]


def test_queue_order_catches_messages_of_one_producer_out_of_order() -> None:
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=1)
    h.enqueue(1, "1-1", 0, offset=0)  # sent after 1-0, stored before it
    h.read(9, 0, 0, [(0, "1-1"), (1, "1-0")])
    result = queue_order(h.ops)
    assert not result["valid"]
    assert [p["kind"] for p in result["problems"]] == ["reordered"]


def test_queue_order_catches_a_hole_in_the_offsets() -> None:
    h = Builder()
    h.read(9, 0, 0, [(0, "a"), (1, "b")])
    h.read(9, 0, 3, [(3, "c")])  # offset 2 never appears anywhere
    result = queue_order(h.ops)
    assert not result["valid"]
    assert result["problems"][0] == {"kind": "hole", "queue": 0, "offsets": [2], "count": 1}


def test_queue_order_catches_an_answer_that_skips_offsets() -> None:
    h = Builder()
    h.read(9, 0, 0, [(0, "a"), (2, "c")])
    h.read(9, 0, 0, [(0, "a"), (1, "b")], f="drain")
    kinds = [p["kind"] for p in queue_order(h.ops)["problems"]]
    assert kinds == ["gap_in_answer"]


def test_lost_write_catches_an_acknowledged_message_below_a_read_offset() -> None:
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=0)
    h.enqueue(1, "1-1", 0, offset=1)
    h.enqueue(1, "1-2", 0, offset=2)
    h.read(9, 0, 2, [(2, "1-2")])  # someone read offset 2; 1-1 (offset 1) was read by no one
    h.read(9, 0, 0, [(0, "1-0")])
    result = lost_write(h.ops)
    assert not result["valid"]
    assert result["lost"] == [{"queue": 0, "offset": 1, "value": "1-1"}]


def test_lost_write_ignores_messages_above_every_read() -> None:
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=0)
    h.enqueue(1, "1-1", 0, offset=1)
    h.read(9, 0, 0, [(0, "1-0")])
    assert lost_write(h.ops)["valid"]


def test_availability_splits_operations_by_fault_window() -> None:
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=0)
    h.nemesis("start", "kill", 1)
    h.enqueue(1, "1-1", 0, outcome="fail", error="unavailable")
    h.enqueue(1, "1-2", 0, offset=1)
    h.nemesis("stop", "kill", 1)
    h.enqueue(1, "1-3", 0, offset=2)
    result = availability(h.ops)
    assert result["during_faults"]["ok_share"] == 0.5
    assert result["outside_faults"]["ok_share"] == 1.0
    assert result["by_fault"]["kill"]["fail"] == 1
    assert fault_windows(h.ops) == [("kill", 2_000_000, 7_000_000)]
