"""The receive/ack check over a history file, streamed as ``streaming`` streams the others: memory
bounded by one bucket whatever the run's length, the verdict exactly ``receive_checker.receive_ack``.

Operations are paired with their completions as they complete (as ``history.completed``: only those
in flight are held). Every part of the check is a message value's, except two counts (redeliveries,
stale acks), which add as the file goes, and the divergence (one (queue, offset) handed out with two
values), which is a (queue, offset)'s: records go to value and (queue, offset) buckets. The checker
keeps the first ``ok`` ack of a value in invoke order; a record carries its invoke's index, so the
bucket picks the same one. Both checks take their records from ``receive_checker.pair`` and judge
the values with ``receive_checker.Values``: one pairing, one judgement.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Collection
from itertools import chain
from pathlib import Path
from typing import Any

from .buckets import SAMPLE, Buckets, first_examples
from .history import INVOKE, NEMESIS, Op
from .receive_checker import COUNTS, RECEIVES, Values, pair

__all__ = ["PairingCheck", "ReceiveCheck"]

_EXAMPLES = ("lost", "unexpected", "never_acked", "duplicated", "delivered_after_ack")


class PairingCheck:
    """Pairs each operation of a streamed history with its completion as they come, per process
    (only the operations in flight are held): ``_pair(invoke, done)``, ``done`` None for one
    invoked again without completing. ``present`` once an invoke of ``starts`` was seen."""

    def __init__(self) -> None:
        self._pending: dict[Any, Op] = {}
        self.present = False

    def _feed(self, op: Op, starts: Collection[str]) -> None:
        if op.get("process") == NEMESIS:
            return
        if op["type"] == INVOKE:
            self.present |= op["f"] in starts
            earlier = self._pending.pop(op["process"], None)
            if earlier is not None:  # invoked again without completing: never will
                self._pair(earlier, None)
            self._pending[op["process"]] = op
        else:
            invoke = self._pending.pop(op["process"], None)
            if invoke is not None:
                self._pair(invoke, op)

    def _pair(self, invoke: Op, done: Op | None) -> None:
        raise NotImplementedError


class ReceiveCheck(PairingCheck):
    """Fed every operation of the file in order (:meth:`add`), then :meth:`result`; ``present``
    once the history has a receive (the check applies)."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.count = count
        self.values = Buckets(directory, "receive-values", count)
        self.places = Buckets(directory, "receive-places", count)
        super().__init__()
        self.redelivered = 0
        self.stale_acks = 0
        self.largest = 0

    def add(self, op: Op) -> None:
        """Pass 1: pair each operation with its completion as it comes (``history.completed``:
        only the operations in flight are held)."""
        self._feed(op, RECEIVES)

    def _pair(self, invoke: Op, done: Op | None) -> None:
        for r in pair(invoke, done):
            if r[0] == "s":
                self.stale_acks += 1
            elif r[0] == "r":
                _, value, index, queue, offset, attempt = r
                self.redelivered += 1 if attempt > 1 else 0
                self.values.add(str(value), ["r", value, index])
                self.places.add(f"{queue}:{offset}", [queue, offset, value])
            else:
                self.values.add(str(r[1]), list(r))

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
        merged = {key: sum(p[key] for p in parts) for key in COUNTS}
        examples = {key: first_examples(chain.from_iterable(p[key] for p in parts)) for key in _EXAMPLES}
        valid = not (merged["lost_count"] or merged["unexpected_count"] or merged["never_acked_count"]
                     or divergent_count)  # fmt: skip
        return {
            "valid": valid,
            **{k: merged[k] for k in COUNTS[:6]},
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
        values = Values()
        for r in records:
            values.add(r)
        verdicts = values.verdicts()
        # Only a sample of each fault's values is kept per bucket: the merge samples again.
        return {**verdicts, **{key: first_examples(verdicts[key]) for key in _EXAMPLES}}
