"""The receive/ack check over a history file, streamed as ``streaming`` streams the others: memory
bounded by one bucket whatever the run's length, the verdict exactly ``receive_checker.receive_ack``.

Operations are paired with their completions as they complete (as ``history.completed``: only those
in flight are held). Every part of the check is a message value's, except two counts (redeliveries,
stale acks), which add as the file goes, and the divergence (one (queue, offset) handed out with two
values), which is a (queue, offset)'s: records go to value and (queue, offset) buckets. The checker
keeps the first ``ok`` ack of a value in invoke order; a record carries its invoke's index, so the
bucket picks the same one.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from itertools import chain
from pathlib import Path
from typing import Any

from .buckets import SAMPLE, Buckets, first_examples
from .history import INVOKE, NEMESIS, OK, Op
from .receive_checker import ACKS, MAYBE_DONE, RECEIVES

__all__ = ["ReceiveCheck"]

_COUNTS = (
    "attempt_count", "acknowledged_count", "received_count", "delivery_count", "acked_count",
    "ack_unknown_count", "lost_count", "unexpected_count", "never_acked_count", "duplicated_count",
    "delivered_after_ack_count", "recovered_count",
)  # fmt: skip
_EXAMPLES = ("lost", "unexpected", "never_acked", "duplicated", "delivered_after_ack")


class ReceiveCheck:
    """Fed every operation of the file in order (:meth:`add`), then :meth:`result`; ``present``
    once the history has a receive (the check applies)."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.count = count
        self.values = Buckets(directory, "receive-values", count)
        self.places = Buckets(directory, "receive-places", count)
        self._pending: dict[Any, Op] = {}
        self.present = False
        self.redelivered = 0
        self.stale_acks = 0
        self.largest = 0

    def add(self, op: Op) -> None:
        """Pass 1: pair each operation with its completion as it comes (``history.completed``:
        only the operations in flight are held)."""
        if op.get("process") == NEMESIS:
            return
        if op["type"] == INVOKE:
            self.present |= op["f"] in RECEIVES
            earlier = self._pending.pop(op["process"], None)
            if earlier is not None:  # invoked again without completing: never will
                self._pair(earlier, None)
            self._pending[op["process"]] = op
        else:
            invoke = self._pending.pop(op["process"], None)
            if invoke is not None:
                self._pair(invoke, op)

    def _pair(self, invoke: Op, done: Op | None) -> None:
        f = invoke["f"]
        if f == "enqueue":
            value = invoke["value"]
            self.values.add(str(value), ["e", value, done is not None and done["type"] == OK])
        elif f in RECEIVES and done is not None and done["type"] == OK:
            for queue, offset, value, attempt in done.get("messages") or []:
                self.redelivered += 1 if (attempt or 1) > 1 else 0
                self.values.add(str(value), ["r", value, invoke["index"]])
                self.places.add(f"{int(queue)}:{int(offset)}", [int(queue), int(offset), value])
        elif f in ACKS:
            msgs = invoke.get("messages") or []
            if done is None or done["type"] == "info":
                for m in msgs:
                    self.values.add(str(m[2]), ["u", m[2]])
            elif done["type"] == OK:
                for m, result in zip(msgs, done.get("results") or [], strict=False):
                    if result == "ok":
                        self.values.add(str(m[2]), ["k", m[2], invoke["index"], done["index"]])
                    elif result == "stale_receipt":
                        self.stale_acks += 1
                    elif result in MAYBE_DONE:
                        self.values.add(str(m[2]), ["u", m[2]])

    def _read(self, buckets: Buckets, i: int) -> list[list[Any]]:
        records = buckets.read(i)
        self.largest = max(self.largest, len(records))
        return records

    def result(self) -> dict[str, Any]:
        for invoke in self._pending.values():  # never completed
            self._pair(invoke, None)
        self._pending.clear()
        self.values.close()
        self.places.close()
        parts = [self._value_bucket(self._read(self.values, i)) for i in range(self.count)]
        divergent: list[tuple[tuple[int, int], list[Any]]] = []
        divergent_count = 0
        for i in range(self.count):
            positions: dict[tuple[int, int], set[Any]] = defaultdict(set)
            for q, offset, value in self._read(self.places, i):
                positions[(q, offset)].add(value)
            here = [(place, sorted(vs)) for place, vs in positions.items() if len(vs) > 1]
            divergent_count += len(here)
            divergent = heapq.nsmallest(SAMPLE, divergent + here, key=lambda d: d[0])
        merged = {key: sum(p[key] for p in parts) for key in _COUNTS}
        examples = {key: first_examples(chain.from_iterable(p[key] for p in parts)) for key in _EXAMPLES}
        valid = not (merged["lost_count"] or merged["unexpected_count"] or merged["never_acked_count"]
                     or divergent_count)  # fmt: skip
        return {
            "valid": valid,
            **{k: merged[k] for k in _COUNTS[:6]},
            "lost_count": merged["lost_count"],
            "lost": examples["lost"],
            "unexpected_count": merged["unexpected_count"],
            "unexpected": examples["unexpected"],
            "never_acked_count": merged["never_acked_count"],
            "never_acked": examples["never_acked"],
            "divergent_count": divergent_count,
            "divergent": {f"{q}@{o}": vs for (q, o), vs in divergent},
            "duplicated_count": merged["duplicated_count"],
            "duplicated": examples["duplicated"],
            "redelivered_count": self.redelivered,
            "stale_ack_count": self.stale_acks,
            "delivered_after_ack_count": merged["delivered_after_ack_count"],
            "delivered_after_ack": examples["delivered_after_ack"],
            "recovered_count": merged["recovered_count"],
        }

    @staticmethod
    def _value_bucket(records: list[list[Any]]) -> dict[str, Any]:
        """One value bucket, as ``receive_ack`` judges values."""
        attempts: set[Any] = set()
        acknowledged: set[Any] = set()
        unsure: set[Any] = set()
        deliveries: Counter[Any] = Counter()
        received_at: dict[Any, list[int]] = defaultdict(list)
        first_ack: dict[Any, tuple[int, int]] = {}  # value -> (invoke index, completion index)
        ack_unknown: set[Any] = set()
        for r in records:
            kind, value = r[0], r[1]
            if kind == "e":
                attempts.add(value)
                (acknowledged if r[2] else unsure).add(value)
            elif kind == "r":
                deliveries[value] += 1
                received_at[value].append(r[2])
            elif kind == "k":
                if value not in first_ack or r[2] < first_ack[value][0]:
                    first_ack[value] = (r[2], r[3])
            else:
                ack_unknown.add(value)
        acked = {v: at for v, (_, at) in first_ack.items()}
        received = set(deliveries)
        lost = acknowledged - received
        unexpected = {v: n for v, n in deliveries.items() if v not in attempts}
        never_acked = received - set(acked) - ack_unknown
        duplicated = {v: n for v, n in deliveries.items() if n > 1}
        after_ack = {v for v, at in acked.items() if any(i > at for i in received_at[v])}
        return {
            "attempt_count": len(attempts),
            "acknowledged_count": len(acknowledged),
            "received_count": len(received),
            "delivery_count": sum(deliveries.values()),
            "acked_count": len(acked),
            "ack_unknown_count": len(ack_unknown - set(acked)),
            "lost_count": len(lost),
            "lost": first_examples(lost),
            "unexpected_count": sum(unexpected.values()),
            "unexpected": first_examples(unexpected),
            "never_acked_count": len(never_acked),
            "never_acked": first_examples(never_acked),
            "duplicated_count": len(duplicated),
            "duplicated": first_examples(duplicated),
            "delivered_after_ack_count": len(after_ack),
            "delivered_after_ack": first_examples(after_ack),
            "recovered_count": len(received & unsure - acknowledged),
        }
