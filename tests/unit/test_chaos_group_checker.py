"""The group-consumer checker on hand-built histories: a committed offset that skips a message, a
committed offset that goes backwards, a consumed value that diverges from the acknowledged one and
a value nobody sent must each be caught; a clean history with redeliveries passes."""

from __future__ import annotations

from typing import Any

from raftmq.chaos.checkers import check_all
from raftmq.chaos.group_checker import group_consume
from raftmq.chaos.history import Op


class Builder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.process = 0

    def op(self, **fields: Any) -> None:
        self.ops.append({"index": len(self.ops), "time": len(self.ops) * 1_000_000, **fields})

    def pair(self, f: str, outcome: str = "ok", **done: Any) -> None:
        self.process += 1
        common = {"process": self.process, "f": f, "client": "group" if f != "enqueue" else "load"}
        if f == "enqueue":
            common["value"] = done.pop("value")
        self.op(type="invoke", **common)
        self.op(type=outcome, **common, **done)

    def enqueue(self, value: str, queue: int, offset: int) -> None:
        self.pair("enqueue", value=value, queue=queue, offset=offset)

    def consume(self, *messages: tuple[int, int, str]) -> None:
        self.pair("consume", member="load-0", messages=[list(m) for m in messages])

    def committed(self, offsets: dict[str, int | None], final: bool = False) -> None:
        self.pair("committed", offsets=offsets, group="chaos-load", **({"final": True} if final else {}))


def clean() -> Builder:
    b = Builder()
    for i in range(4):
        b.enqueue(f"v{i}", 0, i)
    b.enqueue("w0", 1, 0)
    b.committed({"0": None, "1": None})
    b.consume((0, 0, "v0"), (0, 1, "v1"))
    b.committed({"0": 2, "1": None})
    b.consume((0, 1, "v1"), (0, 2, "v2"), (1, 0, "w0"))  # v1 again: a redelivery after a rebalance
    b.committed({"0": 3, "1": 1}, final=True)
    return b


def test_a_clean_history_with_a_redelivery_passes() -> None:
    result = group_consume(clean().ops)
    assert result["valid"], result
    assert result["consumed_count"] == 4
    assert result["redelivered_count"] == 1
    assert result["acknowledged_below_committed"] == 4  # v0, v1, v2 below 3; w0 below 1
    assert result["committed_total"] == 4
    assert check_all(clean().ops)["group_consume"]["valid"]


def test_a_committed_offset_past_a_message_nobody_consumed_is_a_skip() -> None:
    b = clean()
    b.committed({"0": 4, "1": 1}, final=True)  # v3 at offset 3 was never consumed
    result = group_consume(b.ops)
    assert not result["valid"]
    assert result["skipped"] == [{"queue": 0, "offset": 3, "value": "v3"}]


def test_a_committed_offset_that_goes_back_is_caught() -> None:
    b = clean()
    b.committed({"0": 2, "1": 1}, final=True)
    result = group_consume(b.ops)
    assert not result["valid"]
    assert result["backwards"][0] | {"index": None} == {"queue": 0, "from": 3, "to": 2, "index": None}


def test_committed_offsets_that_vanish_are_caught() -> None:
    b = clean()
    b.committed({"0": None, "1": None}, final=True)
    result = group_consume(b.ops)
    assert not result["valid"]
    assert result["backwards_count"] == 2


def test_a_consumed_value_other_than_the_acknowledged_one_diverges() -> None:
    b = clean()
    b.consume((0, 3, "v9"))
    result = group_consume(b.ops)
    assert not result["valid"]
    assert result["divergent"] == [{"queue": 0, "offset": 3, "acknowledged": "v3", "consumed": "v9"}]
    assert result["unexpected"] == ["v9"]


def test_without_a_successful_committed_read_the_check_cannot_pass() -> None:
    b = Builder()
    b.enqueue("v0", 0, 0)
    b.consume((0, 0, "v0"))
    b.pair("committed", outcome="info", error="timeout", group="chaos-load")
    assert not group_consume(b.ops)["valid"]
