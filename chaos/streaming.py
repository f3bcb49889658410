"""Every checker over a history file, for runs too long to hold in memory (a soak at production
load records tens of millions of operations), with memory bounded by one bucket whatever the run's
length.

Two passes, each reading the file one operation at a time:

1. Every record a check needs goes to one of ``buckets`` files on disk (beside the history), chosen
   by a hash of its key: a message's value, a (queue, offset), a (queue, value) (``buckets``). The
   number of buckets grows with the file (one per ``bucket_bytes`` of history), so a bucket holds
   about the same whatever the run's length. Only what is small by design stays in memory: each
   queue's last committed offset and highest offset read, each replica's high offset, the
   ``SAMPLE`` first examples of each kind of problem, a bit per offset of each queue (holes).
2. One bucket at a time is read back and judged.

Every part of each check depends on one key only, so the buckets' verdicts add up to the in-memory
checkers' (``checkers``, ``group_checker``) exactly: counts add, and each list of examples is the
first ``SAMPLE`` of the buckets' first ``SAMPLE`` in the same order. Here: total queue (the
in-memory checker itself run on each value bucket) and group consume, which joins in two steps:
the (queue, offset) buckets decide which value each acknowledged position holds (the last
acknowledgement there, as in memory) and which positions the final committed offsets cover; those
go to value buckets beside the deliveries, which decide what was skipped. The log checks (log
consistency, queue order, lost write) are in ``streaming_log``, receive/ack in
``streaming_receive``, the SQS check in ``streaming_sqs``. Availability walks the file again,
holding only the operations in flight.

Memory: one bucket's records (``BUCKET_BYTES`` of history: some tens of MiB), the records waiting to
be written (``buckets.HELD_BYTES``, 8 MiB) and the small state above. Disk: the buckets, about the
size of the history, in a temporary directory beside it, removed at the end.
"""

from __future__ import annotations

import heapq
import tempfile
from collections import Counter
from itertools import chain
from pathlib import Path
from typing import Any

from .buckets import BUCKET_BYTES, SAMPLE, Buckets, bucket_count, first_examples
from .checkers import availability
from .history import INVOKE, NEMESIS, OK, HistoryFile, Op
from .streaming_log import LogChecks
from .streaming_receive import ReceiveCheck
from .streaming_sqs import SqsCheck
from .total_queue import DELIVERIES, total_queue

__all__ = ["BUCKET_BYTES", "check_file", "stream_group_consume", "stream_total_queue"]

# -- total queue ---------------------------------------------------------------------------------


_TQ_COUNTS = (
    "attempt_count", "acknowledged_count", "failed_count", "indefinite_count", "dequeue_count",
    "distinct_dequeued_count", "lost_count", "unexpected_count", "duplicated_count",
    "duplicated_idempotent_count", "recovered_count", "recovered_after_definite_fail_count",
)  # fmt: skip


def _total_queue_records(op: Op, buckets: Buckets) -> None:
    """Pass 1: an enqueue (any outcome) and each delivered message, by value."""
    if op.get("process") == NEMESIS:
        return
    if op["f"] == "enqueue":
        buckets.add(str(op["value"]), ["e", op["type"], op["value"], op.get("client")])
    elif op["f"] in DELIVERIES and op["type"] == OK:
        for _, value in op.get("messages") or []:
            buckets.add(str(value), ["d", str(value)])


def _total_queue_bucket(records: list[list[Any]]) -> dict[str, Any]:
    """One bucket judged by the in-memory checker: its enqueues, and one delivery holding all of its
    delivered values (the checker counts values, not operations)."""
    ops: list[Op] = [
        {"f": "enqueue", "type": r[1], "value": r[2], "client": r[3]} for r in records if r[0] == "e"
    ]
    ops.append({"f": "fetch", "type": OK, "messages": [[0, r[1]] for r in records if r[0] == "d"]})
    return total_queue(ops)


def _merge_total_queue(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in parts[0]:
        if key == "valid":
            merged[key] = all(p["valid"] for p in parts)
        elif key in _TQ_COUNTS:
            merged[key] = sum(p[key] for p in parts)
        else:  # an example list: each part's is its first SAMPLE, ordered by str
            merged[key] = first_examples(chain.from_iterable(p[key] for p in parts))
    return merged


def stream_total_queue(path: Path, *, bucket_bytes: int = BUCKET_BYTES) -> dict[str, Any]:
    """``checkers.total_queue`` of the history in ``path``, in memory one bucket at a time."""
    with tempfile.TemporaryDirectory(prefix="check-", dir=path.parent) as tmp:
        buckets = Buckets(Path(tmp), "total-queue", bucket_count(path, bucket_bytes))
        for op in HistoryFile(path):
            _total_queue_records(op, buckets)
        buckets.close()
        return _merge_total_queue([_total_queue_bucket(buckets.read(i)) for i in range(len(buckets.paths))])


# -- group consume -------------------------------------------------------------------------------


class _Committed:
    """The committed reads, followed as they come: each queue's last offset (a queue per key), the
    first SAMPLE times one went back, the last read and the last final read."""

    def __init__(self) -> None:
        self.reads = 0
        self.last: dict[str, int | None] = {}
        self.backwards: list[dict[str, Any]] = []
        self.backwards_count = 0
        self.last_read: Op | None = None
        self.last_final: Op | None = None

    def add(self, op: Op) -> None:
        self.reads += 1
        for q, offset in op["offsets"].items():
            before = self.last.get(q)
            if before is not None and (offset is None or offset < before):
                self.backwards_count += 1
                if len(self.backwards) < SAMPLE:
                    self.backwards.append(
                        {"queue": int(q), "from": before, "to": offset, "index": op.get("index")}
                    )
            self.last[q] = offset
        self.last_read = op
        if op.get("final"):
            self.last_final = op

    def final(self) -> Op | None:
        return self.last_final or self.last_read


def _place(q: Any, offset: Any) -> str:
    return f"{int(q)}:{int(offset)}"


def _group_records(op: Op, position: int, values: Buckets, places: Buckets, committed: _Committed) -> bool:
    """Pass 1 for the group check; True if ``op`` is a consume (the check applies)."""
    f = op.get("f")
    if f == "enqueue":
        if op["type"] == INVOKE:
            values.add(str(op["value"]), ["a", op["value"]])
        elif op["type"] == OK and op.get("offset") is not None:
            places.add(
                _place(op["queue"], op["offset"]),
                ["k", int(op["queue"]), int(op["offset"]), str(op["value"])],
            )
    elif f == "consume":
        if op["type"] == OK:
            for n, (q, offset, value) in enumerate(op["messages"]):
                values.add(str(value), ["d", value])
                places.add(_place(q, offset), ["c", q, offset, value, position, n])
        return True
    elif f == "committed" and op["type"] == OK:
        committed.add(op)
    return False


def _group_places(
    records: list[list[Any]], final: dict[int, int | None], covered: Buckets
) -> tuple[list[tuple[int, int, dict[str, Any]]], int, int]:
    """One (queue, offset) bucket: the consumed values other than the one acknowledged there (with
    their place in the history, for the order of the examples), and the acknowledged positions the
    final committed offsets cover, written to ``covered`` by value."""
    acknowledged: dict[tuple[int, int], str] = {}
    for r in records:
        if r[0] == "k":
            acknowledged[(r[1], r[2])] = r[3]  # the last acknowledgement of a position wins
    divergent = []
    count = 0
    for r in records:
        if r[0] != "c":
            continue
        _, q, offset, value, position, n = r
        known = acknowledged.get((int(q), int(offset)))
        if known is not None and known != value:
            count += 1
            divergent.append(
                (position, n, {"queue": q, "offset": offset, "acknowledged": known, "consumed": value})
            )
    below = 0
    for (q, offset), value in acknowledged.items():
        committed = final.get(q)
        if committed is None or offset >= committed:
            continue
        below += 1
        covered.add(value, [q, offset, value])
    return heapq.nsmallest(SAMPLE, divergent, key=lambda d: (d[0], d[1])), count, below


def _group_values(records: list[list[Any]], covered: list[list[Any]]) -> dict[str, Any]:
    """One value bucket: deliveries, unexpected values, and the covered positions never consumed."""
    attempted = {r[1] for r in records if r[0] == "a"}
    deliveries: Counter[Any] = Counter(r[1] for r in records if r[0] == "d")
    skipped = [
        {"queue": q, "offset": offset, "value": value}
        for q, offset, value in covered
        if value not in deliveries
    ]
    unexpected = set(deliveries) - attempted
    return {
        "consumed": len(deliveries),
        "deliveries": sum(deliveries.values()),
        "skipped_count": len(skipped),
        "skipped": first_examples(skipped),
        "unexpected_count": len(unexpected),
        "unexpected": first_examples(unexpected),
    }


def _group_result(
    committed: _Committed,
    final: dict[int, int | None],
    divergent: list[tuple[int, int, dict[str, Any]]],
    divergent_count: int,
    covered: int,
    parts: list[dict[str, Any]],
) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(p[key] for p in parts)

    skipped, unexpected = total("skipped_count"), total("unexpected_count")
    deliveries = total("deliveries")
    return {
        "valid": committed.final() is not None
        and not (skipped or committed.backwards_count or divergent_count or unexpected),
        "final_committed": {str(q): o for q, o in sorted(final.items())},
        "committed_total": sum(o or 0 for o in final.values()),
        "acknowledged_below_committed": covered,
        "consumed_count": total("consumed"),
        "delivery_count": deliveries,
        "redelivered_count": deliveries - total("consumed"),
        "committed_reads": committed.reads,
        "skipped_count": skipped,
        "skipped": first_examples(chain.from_iterable(p["skipped"] for p in parts)),
        "backwards_count": committed.backwards_count,
        "backwards": committed.backwards,
        "divergent_count": divergent_count,
        "divergent": [d for _, _, d in heapq.nsmallest(SAMPLE, divergent, key=lambda d: (d[0], d[1]))],
        "unexpected_count": unexpected,
        "unexpected": first_examples(chain.from_iterable(p["unexpected"] for p in parts)),
    }


class _GroupCheck:
    """The group check's buckets and followed reads, fed by pass 1, judged by :meth:`result`."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.values = Buckets(directory, "group-values", count)
        self.places = Buckets(directory, "group-places", count)
        self.committed = _Committed()
        self.present = False

    def add(self, op: Op, position: int) -> None:
        self.present |= _group_records(op, position, self.values, self.places, self.committed)

    def result(self) -> dict[str, Any]:
        self.values.close()
        self.places.close()
        last = self.committed.final()
        final = {int(q): o for q, o in last["offsets"].items()} if last is not None else {}
        count = len(self.values.paths)
        covered = Buckets(self.directory, "group-covered", count)
        divergent: list[tuple[int, int, dict[str, Any]]] = []
        divergent_count = below = 0
        for i in range(count):
            first, n, b = _group_places(self.places.read(i), final, covered)
            divergent = heapq.nsmallest(SAMPLE, divergent + first, key=lambda d: (d[0], d[1]))
            divergent_count += n
            below += b
        covered.close()
        parts = [_group_values(self.values.read(i), covered.read(i)) for i in range(count)]
        return _group_result(self.committed, final, divergent, divergent_count, below, parts)

    @property
    def largest_bucket(self) -> int:
        return max(self.values.largest, self.places.largest)


def stream_group_consume(path: Path, *, bucket_bytes: int = BUCKET_BYTES) -> dict[str, Any]:
    """``group_checker.group_consume`` of the history in ``path``, in memory one bucket at a time."""
    with tempfile.TemporaryDirectory(prefix="check-", dir=path.parent) as tmp:
        check = _GroupCheck(Path(tmp), bucket_count(path, bucket_bytes))
        for position, op in enumerate(HistoryFile(path)):
            check.add(op, position)
        return check.result()


# -- every checker ------------------------------------------------------------------------------


def check_file(path: Path, *, bucket_bytes: int = BUCKET_BYTES) -> tuple[dict[str, Any], dict[str, Any]]:
    """``checkers.check_all`` of the history in ``path``: one pass feeds the buckets of the
    total-queue, group and log checks, then each is judged one bucket at a time; availability and
    receive/ack walk the file again. Returns the verdicts and the streaming figures (buckets, the
    most records one held)."""
    history = HistoryFile(path)
    count = bucket_count(path, bucket_bytes)
    with tempfile.TemporaryDirectory(prefix="check-", dir=path.parent) as tmp:
        queue_buckets = Buckets(Path(tmp), "total-queue", count)
        group = _GroupCheck(Path(tmp), count)
        logs = LogChecks(Path(tmp), count)
        receives = ReceiveCheck(Path(tmp), count)
        sqs = SqsCheck(Path(tmp), count)
        for position, op in enumerate(history):
            _total_queue_records(op, queue_buckets)
            group.add(op, position)
            logs.add(op, position)
            receives.add(op)
            sqs.add(op)
        queue_buckets.close()
        tq = _merge_total_queue([_total_queue_bucket(queue_buckets.read(i)) for i in range(count)])
        gc = group.result() if group.present else None
        log_results = logs.results()
        rx = receives.result() if receives.present else None
        sq = sqs.result() if sqs.present else None
        figures = {
            "history_bytes": history.size_bytes(),
            "buckets": count,
            "bucket_bytes": bucket_bytes,
            "largest_bucket_records": max(
                queue_buckets.largest, group.largest_bucket, logs.largest, receives.largest, sqs.largest
            ),
        }
    results: dict[str, Any] = {
        "total_queue": tq,
        "log_consistency": log_results["log_consistency"],
        "queue_order": log_results["queue_order"],
        "lost_write": log_results["lost_write"],
        "availability": availability(history),
    }
    if rx is not None:
        results["receive_ack"] = rx
    if gc is not None:
        results["group_consume"] = gc
    if sq is not None:
        results["sqs_queue"] = sq
    return {"valid": all(r["valid"] for r in results.values()), **results}, figures
