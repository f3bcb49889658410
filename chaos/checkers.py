"""Checkers: pure functions from a history (see ``history``) to a verdict.

Each returns a JSON-ready dict with ``valid`` (bool) and the evidence. None does I/O or reads a clock.
Each takes a history it may walk more than once: a list, or a ``history.HistoryFile`` (read again on
each walk, never held whole; ``streaming`` checks a file so, and streams the two checks that need
every message over buckets on disk).

- ``total_queue`` (``total_queue``): at-least-once over multisets of values (Jepsen's total-queue).
  Valid iff nothing acknowledged went missing (``lost``) and nothing was delivered that nobody sent
  (``unexpected``).
- ``log_consistency``: a (queue, offset) names one message forever, on every replica and in every
  answer (acknowledgements, consumer fetches, receives, the drain, each replica's local copy).
- ``queue_order``: offsets are dense and each producer's acknowledged messages sit in a queue in the
  order it sent them.
- ``lost_write``: Kafka-style, needs no drain: once anyone has read offset b of a queue, every
  message acknowledged at an offset below b must have been read by someone.
- ``availability``: the share of operations that succeeded inside fault windows and outside them.
  Informational: it is always valid.
- ``receive_ack`` (``receive_checker``, when the history has receives): at-least-once delivery
  through receive/ack to one consumer group.
- ``group_consume`` (``group_checker``, when the history has group consumers): at-least-once for
  the prefix a consumer group committed, and committed offsets that never go backwards.
- ``sqs_queue`` (``sqs_checker``, when the history has SQS sends): the total queue over what boto3
  sent and received through the SQS API, and what became of deleted messages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from itertools import pairwise
from typing import Any

from .group_checker import group_consume, has_group_consumers
from .history import NEMESIS, OK, Op, completed, fault_windows
from .receive_checker import RECEIVES, has_receives, receive_ack
from .sqs_checker import has_sqs, sqs_queue
from .total_queue import total_queue

__all__ = [
    "availability",
    "check_all",
    "log_consistency",
    "lost_write",
    "queue_order",
    "total_queue",
]

READS = ("fetch", "drain", "read")
SQS_CALLS = ("sqs-send", "sqs-receive", "sqs-delete")  # the SQS workload's calls during the run
SAMPLE = 20  # how many examples a result lists of each kind of problem


def _client_ops(history: Iterable[Op]) -> Iterator[Op]:
    return (op for op in history if op.get("process") != NEMESIS)


def _messages(op: Op) -> list[tuple[int, str]]:
    return [(int(o), str(v)) for o, v in op.get("messages") or []]


def _sample(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=str)[:SAMPLE]


def _observations(history: Iterable[Op]) -> dict[tuple[int, int], dict[str, list[str]]]:
    """(queue, offset) -> value -> where it was seen ("ack p3", "fetch n1", "read n2", ...)."""
    seen: dict[tuple[int, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for op in _client_ops(history):
        if op["type"] != OK:
            continue
        if op["f"] == "enqueue" and op.get("offset") is not None:
            seen[(op["queue"], op["offset"])][op["value"]].append(f"ack to process {op['process']}")
        elif op["f"] in READS:
            for offset, value in _messages(op):
                seen[(op["queue"], offset)][value].append(f"{op['f']} via {op.get('node')}")
        elif op["f"] in RECEIVES:
            for queue, offset, value, _ in op.get("messages") or []:
                seen[(int(queue), int(offset))][str(value)].append(f"{op['f']} via {op.get('node')}")
    return seen


def log_consistency(history: Iterable[Op]) -> dict[str, Any]:
    """Two different values at one (queue, offset) anywhere in the history is a divergence (never
    allowed). One value at several offsets of a queue is a duplicate (allowed, counted)."""
    seen = _observations(history)
    divergent = []
    positions: dict[tuple[int, str], set[int]] = defaultdict(set)
    for (queue, offset), values in sorted(seen.items()):
        if len(values) > 1:
            divergent.append(
                {"queue": queue, "offset": offset, "values": {v: sorted(set(w)) for v, w in values.items()}}
            )
        for value in values:
            positions[(queue, value)].add(offset)
    duplicates = {f"{v}@{q}": sorted(offs) for (q, v), offs in positions.items() if len(offs) > 1}
    replicas: dict[str, dict[str, int]] = defaultdict(dict)
    for op in _client_ops(history):
        if op["f"] == "read" and op["type"] == OK:
            msgs = _messages(op)
            seen_high = replicas[str(op["queue"])].get(op["node"], 0)
            replicas[str(op["queue"])][op["node"]] = max(seen_high, msgs[-1][0] + 1 if msgs else 0)
    return {
        "valid": not divergent,
        "positions_checked": len(seen),
        "divergent_count": len(divergent),
        "divergent": divergent[:SAMPLE],
        "duplicate_offsets_count": len(duplicates),
        "duplicate_offsets": dict(sorted(duplicates.items())[:SAMPLE]),
        "replica_high_offsets": {q: dict(sorted(r.items())) for q, r in sorted(replicas.items())},
    }


def queue_order(history: Iterable[Op]) -> dict[str, Any]:
    """Offsets are dense: every answer to a read starts at the offset asked for and counts up by one,
    and the offsets seen of a queue are 0..max with no hole. Per producer process and queue, the
    acknowledged messages sit at increasing offsets in the order they were sent (a process has one
    request in flight at a time, so message i was committed before message i+1 was sent)."""
    problems: list[dict[str, Any]] = []
    offsets: dict[int, set[int]] = defaultdict(set)
    where: dict[tuple[int, str], int] = {}
    for op in _client_ops(history):
        if op["f"] not in READS or op["type"] != OK:
            continue
        msgs = _messages(op)
        expected = op.get("offset")
        for offset, value in msgs:
            if expected is not None and offset != expected:
                problems.append(
                    {"kind": "gap_in_answer", "queue": op["queue"], "index": op["index"],
                     "expected_offset": expected, "got_offset": offset}
                )  # fmt: skip
            expected = offset + 1
            offsets[op["queue"]].add(offset)
            where.setdefault((op["queue"], value), offset)
    for queue, seen in sorted(offsets.items()):
        holes = sorted(set(range(max(seen) + 1)) - seen)
        if holes:
            problems.append({"kind": "hole", "queue": queue, "offsets": holes[:SAMPLE], "count": len(holes)})
    sent: dict[tuple[Any, int], list[tuple[str, int]]] = defaultdict(list)
    for op in _client_ops(history):
        if op["f"] == "enqueue" and op["type"] == OK:
            found = where.get((op["queue"], op["value"]), op.get("offset"))
            if found is not None:
                sent[(op["process"], op["queue"])].append((op["value"], found))
    for (process, queue), values in sorted(sent.items(), key=str):
        for (v1, o1), (v2, o2) in pairwise(values):
            if o2 <= o1:
                problems.append(
                    {"kind": "reordered", "process": process, "queue": queue,
                     "first": [v1, o1], "then": [v2, o2]}
                )  # fmt: skip
    return {
        "valid": not problems,
        "queues": len(offsets),
        "producer_queues": len(sent),
        "problem_count": len(problems),
        "problems": problems[:SAMPLE],
    }


def lost_write(history: Iterable[Op]) -> dict[str, Any]:
    """For each queue, b = the highest offset anyone read; every message acknowledged at an offset
    below b must have been read by someone (anywhere in the queue)."""
    high: dict[int, int] = {}
    read: dict[int, set[str]] = defaultdict(set)
    for op in _client_ops(history):
        if op["f"] in READS and op["type"] == OK:
            for offset, value in _messages(op):
                high[op["queue"]] = max(high.get(op["queue"], -1), offset)
                read[op["queue"]].add(value)
    lost = []
    checked = 0
    for op in _client_ops(history):
        if op["f"] == "enqueue" and op["type"] == OK and op.get("offset") is not None:
            q = op["queue"]
            if op["offset"] < high.get(q, -1):
                checked += 1
                if op["value"] not in read[q]:
                    lost.append({"queue": q, "offset": op["offset"], "value": op["value"]})
    return {"valid": not lost, "checked": checked, "lost_count": len(lost), "lost": lost[:SAMPLE]}


def availability(
    history: Iterable[Op],
    functions: tuple[str, ...] = ("enqueue", "fetch", "receive", "ack", *SQS_CALLS),
) -> dict[str, Any]:
    """Share of ``ok`` completions among operations invoked inside any fault window vs outside
    (the final drain and reads, after the heal, are not counted)."""
    windows = fault_windows(history)
    end = max((op["time"] for op in history), default=0)
    spans = [(start, stop if stop is not None else end + 1, fault) for fault, start, stop in windows]

    def bucket() -> dict[str, int]:
        return {"ok": 0, "fail": 0, "info": 0, "pending": 0}

    during, outside = bucket(), bucket()
    by_fault: dict[str, dict[str, int]] = defaultdict(bucket)
    for invoke, done in completed(history):
        if invoke["f"] not in functions:
            continue
        kind = done["type"] if done is not None else "pending"
        hits = [fault for start, stop, fault in spans if start <= invoke["time"] < stop]
        (during if hits else outside)[kind] += 1
        for fault in set(hits):
            by_fault[fault][kind] += 1

    def share(b: dict[str, int]) -> float | None:
        total = sum(b.values())
        return round(b["ok"] / total, 4) if total else None

    return {
        "valid": True,
        "during_faults": {**during, "ok_share": share(during)},
        "outside_faults": {**outside, "ok_share": share(outside)},
        "by_fault": {f: {**b, "ok_share": share(b)} for f, b in sorted(by_fault.items())},
    }


def check_all(history: Sequence[Op]) -> dict[str, Any]:
    """Every checker; ``valid`` iff each one is."""
    results = {
        "total_queue": total_queue(history),
        "log_consistency": log_consistency(history),
        "queue_order": queue_order(history),
        "lost_write": lost_write(history),
        "availability": availability(history),
    }
    if has_receives(history):
        results["receive_ack"] = receive_ack(history)
    if has_group_consumers(history):
        results["group_consume"] = group_consume(history)
    if has_sqs(history):
        results["sqs_queue"] = sqs_queue(history)
    return {"valid": all(r["valid"] for r in results.values()), **results}
