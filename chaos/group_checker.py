"""The group-consumer checker: at-least-once for the prefix a consumer group committed (a pure
function of a history; see ``group_load`` for the operations it reads).

- ``final_committed``: the group's committed offset of each queue, read after the drain (the
  last ``ok`` ``committed`` read marked ``final``; without one, the last ``ok`` read).
- ``skipped``: acknowledged enqueues (``ok``, with their queue and offset) at an offset below
  their queue's final committed offset whose value no ``consume`` delivered. A committed offset
  says "every message below was finished by some member": a skipped message broke that.
- ``backwards``: a queue's committed offset read lower than an earlier read had it (reads are
  linearizable and made one at a time, so each sees at least what the one before saw). The chaos
  run resets no offset (no ``PUT`` of the offset API, no retention), so any decrease is a fault;
  an offset that goes from a number to none (the group's offsets removed) is one too.
- ``divergent``: a consumed (queue, offset) whose value is not the one acknowledged there.
- ``unexpected``: a consumed value nobody attempted to enqueue.

Valid iff all four are empty and a final read exists. Counted: ``consumed`` (distinct values),
``deliveries`` (with repeats: redelivery after a rebalance or a restart is allowed), committed
reads, and the acknowledged messages the committed prefix covers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from .history import INVOKE, OK, Op

__all__ = ["group_consume", "has_group_consumers"]

SAMPLE = 20


def _sample(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=str)[:SAMPLE]


def has_group_consumers(history: Iterable[Op]) -> bool:
    return any(op.get("f") == "consume" for op in history)


def group_consume(history: Sequence[Op]) -> dict[str, Any]:
    attempted = {op["value"] for op in history if op.get("f") == "enqueue" and op["type"] == INVOKE}
    acknowledged = {
        (int(op["queue"]), int(op["offset"])): str(op["value"])
        for op in history
        if op.get("f") == "enqueue" and op["type"] == OK and op.get("offset") is not None
    }
    deliveries: Counter[str] = Counter()
    consumed_at: dict[tuple[int, int], str] = {}
    divergent: list[dict[str, Any]] = []
    for op in history:
        if op.get("f") != "consume" or op["type"] != OK:
            continue
        for q, offset, value in op["messages"]:
            deliveries[value] += 1
            place = (int(q), int(offset))
            consumed_at.setdefault(place, value)
            known = acknowledged.get(place)
            if known is not None and known != value:
                divergent.append({"queue": q, "offset": offset, "acknowledged": known, "consumed": value})

    reads = [op for op in history if op.get("f") == "committed" and op["type"] == OK]
    backwards: list[dict[str, Any]] = []
    last: dict[str, int | None] = {}
    for op in reads:
        for q, offset in op["offsets"].items():
            before = last.get(q)
            if before is not None and (offset is None or offset < before):
                backwards.append({"queue": int(q), "from": before, "to": offset, "index": op.get("index")})
            last[q] = offset
    finals = [op for op in reads if op.get("final")] or reads[-1:]
    final = {int(q): o for q, o in finals[-1]["offsets"].items()} if finals else {}

    skipped = []
    covered = 0
    for (q, offset), value in acknowledged.items():
        committed = final.get(q)
        if committed is None or offset >= committed:
            continue
        covered += 1
        if value not in deliveries:
            skipped.append({"queue": q, "offset": offset, "value": value})
    unexpected = set(deliveries) - attempted
    return {
        "valid": bool(finals) and not (skipped or backwards or divergent or unexpected),
        "final_committed": {str(q): o for q, o in sorted(final.items())},
        "committed_total": sum(o or 0 for o in final.values()),
        "acknowledged_below_committed": covered,
        "consumed_count": len(deliveries),
        "delivery_count": sum(deliveries.values()),
        "redelivered_count": sum(n - 1 for n in deliveries.values()),
        "committed_reads": len(reads),
        "skipped_count": len(skipped),
        "skipped": _sample(skipped),
        "backwards_count": len(backwards),
        "backwards": backwards[:SAMPLE],
        "divergent_count": len(divergent),
        "divergent": divergent[:SAMPLE],
        "unexpected_count": len(unexpected),
        "unexpected": _sample(unexpected),
    }
