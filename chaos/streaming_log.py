"""The log checkers over a history file, streamed as ``streaming`` streams the total-queue and group
checks: memory bounded by one bucket (``buckets``) and a bit per offset of each queue, whatever the
run's length; the verdicts exactly the in-memory ones (``checkers``).

- ``log_consistency``: the values seen at each (queue, offset), by (queue, offset) buckets; each
  value's offsets (a value at two offsets is a duplicate), by (queue, value) buckets fed from them.
  Each replica's high offset is followed as the file goes (a queue and a node per key).
- ``lost_write``: each queue's highest offset read is followed as the file goes; the reads and the
  acknowledgements of one (queue, value) meet in a bucket.
- ``queue_order``: a gap inside an answer is seen in the operation itself; the offsets read of each
  queue are a bitmap (a hole is a bit never set); the first offset each (queue, value) was read at
  meets its acknowledgements in a (queue, value) bucket, whose offsets go on to (process, queue)
  buckets to be put in each producer process's order.

Each list of examples is the in-memory checker's first ``SAMPLE``: the buckets' first ``SAMPLE`` by
the same order (the history's order where the checker keeps it, carried as each record's position).
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from .buckets import SAMPLE, Buckets
from .checkers import READS
from .history import NEMESIS, OK, Op
from .receive_checker import RECEIVES

__all__ = ["LogChecks"]

_UNSET = re.compile(rb"[^\xff]")  # a byte of a bitmap with a bit not set


def _key(*parts: Any) -> str:
    return ":".join(map(str, parts))


def _read_messages(op: Op) -> Iterator[tuple[int, str]]:
    return ((int(o), str(v)) for o, v in op.get("messages") or [])


class _Offsets:
    """The offsets read of one queue, a bit each: a hole is an offset up to the highest never read."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.high: int | None = None

    def add(self, offset: int) -> None:
        self.high = offset if self.high is None else max(self.high, offset)
        if offset < 0:  # below every hole (holes are counted from 0)
            return
        byte = offset >> 3
        if byte >= len(self.bits):
            self.bits.extend(bytes(byte + 1 - len(self.bits)))
        self.bits[byte] |= 1 << (offset & 7)

    def holes(self) -> tuple[list[int], int]:
        """The first ``SAMPLE`` holes and how many there are."""
        if self.high is None or self.high < 0:
            return [], 0
        count = self.high + 1 - int.from_bytes(self.bits, "little").bit_count()
        first: list[int] = []
        for m in _UNSET.finditer(self.bits):
            byte = m.start()
            for bit in range(8):
                offset = byte * 8 + bit
                if offset <= self.high and not self.bits[byte] >> bit & 1:
                    first.append(offset)
            if len(first) >= SAMPLE or byte * 8 > self.high:
                break
        return first[:SAMPLE], count


class LogChecks:
    """The three log checks of one history: :meth:`add` each operation in the file's order (pass 1),
    then :meth:`results` (pass 2, one bucket at a time). ``directory`` holds the buckets."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.count = count
        self.places = Buckets(directory, "log-places", count)  # (queue, offset): values seen there
        self.lost_write = Buckets(directory, "lost-write", count)  # (queue, value): read? acknowledged
        self.first_read = Buckets(directory, "order-first-read", count)  # (queue, value)
        self.replicas: dict[str, dict[str, int]] = defaultdict(dict)
        self.high: dict[Any, int] = {}
        self.offsets: dict[Any, _Offsets] = defaultdict(_Offsets)
        self.gaps: list[dict[str, Any]] = []
        self.gap_count = 0
        self.largest = 0

    def add(self, op: Op, position: int) -> None:
        if op.get("process") == NEMESIS or op["type"] != OK:
            return
        f = op["f"]
        if f == "enqueue":
            if op.get("offset") is not None:
                q, offset, value = op["queue"], op["offset"], op["value"]
                self.places.add(_key(q, offset), ["s", q, offset, value, f"ack to process {op['process']}"])
                self.lost_write.add(_key(q, value), ["k", q, offset, value, position])
            q, value = op["queue"], op["value"]
            self.first_read.add(_key(q, value), ["k", op["process"], q, value, op.get("offset"), position])
        elif f in READS:
            self._read(op, position)
        elif f in RECEIVES:
            where = f"{f} via {op.get('node')}"
            for queue, offset, value, _ in op.get("messages") or []:
                q, o = int(queue), int(offset)
                self.places.add(_key(q, o), ["s", q, o, str(value), where])

    def _read(self, op: Op, position: int) -> None:
        q = op["queue"]
        where = f"{op['f']} via {op.get('node')}"
        expected = op.get("offset")
        last = None
        for offset, value in _read_messages(op):
            if expected is not None and offset != expected:
                self.gap_count += 1
                if len(self.gaps) < SAMPLE:
                    self.gaps.append({"kind": "gap_in_answer", "queue": q, "index": op["index"],
                                      "expected_offset": expected, "got_offset": offset})  # fmt: skip
            expected = offset + 1
            last = offset
            self.offsets[q].add(offset)
            self.high[q] = max(self.high.get(q, -1), offset)
            self.places.add(_key(q, offset), ["s", q, offset, value, where])
            self.lost_write.add(_key(q, value), ["r", q, value])
            self.first_read.add(_key(q, value), ["w", q, value, offset])
        if op["f"] == "read":
            seen = self.replicas[str(q)].get(op["node"], 0)
            self.replicas[str(q)][op["node"]] = max(seen, last + 1 if last is not None else 0)

    def results(self) -> dict[str, dict[str, Any]]:
        for b in (self.places, self.lost_write, self.first_read):
            b.close()
        return {
            "log_consistency": self._log_consistency(),
            "queue_order": self._queue_order(),
            "lost_write": self._lost_write(),
        }

    def _read_bucket(self, buckets: Buckets, i: int) -> list[list[Any]]:
        records = buckets.read(i)
        self.largest = max(self.largest, len(records))
        return records

    # -- log consistency ---------------------------------------------------------------------------

    def _log_consistency(self) -> dict[str, Any]:
        values_at = Buckets(self.directory, "log-values", self.count)  # (queue, value): its offsets
        divergent: list[dict[str, Any]] = []
        divergent_count = positions = 0
        for i in range(self.count):
            seen: dict[tuple[Any, Any], dict[Any, list[str]]] = defaultdict(lambda: defaultdict(list))
            for _, q, offset, value, where in self._read_bucket(self.places, i):
                seen[(q, offset)][value].append(where)
            positions += len(seen)
            here = []
            for (q, offset), values in seen.items():
                if len(values) > 1:
                    here.append({"queue": q, "offset": offset,
                                 "values": {v: sorted(set(w)) for v, w in values.items()}})  # fmt: skip
                for value in values:
                    values_at.add(_key(q, value), [q, value, offset])
            divergent_count += len(here)
            divergent = heapq.nsmallest(SAMPLE, divergent + here, key=lambda d: (d["queue"], d["offset"]))
        values_at.close()
        duplicates: list[tuple[str, list[int]]] = []
        duplicate_count = 0
        for i in range(self.count):
            offsets: dict[tuple[Any, Any], set[int]] = defaultdict(set)
            for q, value, offset in self._read_bucket(values_at, i):
                offsets[(q, value)].add(offset)
            here_dups = [(f"{v}@{q}", sorted(offs)) for (q, v), offs in offsets.items() if len(offs) > 1]
            duplicate_count += len(here_dups)
            duplicates = heapq.nsmallest(SAMPLE, duplicates + here_dups)
        return {
            "valid": not divergent_count,
            "positions_checked": positions,
            "divergent_count": divergent_count,
            "divergent": divergent,
            "duplicate_offsets_count": duplicate_count,
            "duplicate_offsets": dict(duplicates),
            "replica_high_offsets": {q: dict(sorted(r.items())) for q, r in sorted(self.replicas.items())},
        }

    # -- lost write --------------------------------------------------------------------------------

    def _lost_write(self) -> dict[str, Any]:
        lost: list[tuple[int, dict[str, Any]]] = []
        lost_count = checked = 0
        for i in range(self.count):
            records = self._read_bucket(self.lost_write, i)
            read = {(r[1], r[2]) for r in records if r[0] == "r"}
            for r in records:
                if r[0] != "k":
                    continue
                _, q, offset, value, position = r
                if offset < self.high.get(q, -1):
                    checked += 1
                    if (q, value) not in read:
                        lost_count += 1
                        lost.append((position, {"queue": q, "offset": offset, "value": value}))
            lost = heapq.nsmallest(SAMPLE, lost, key=lambda t: t[0])
        return {
            "valid": not lost_count,
            "checked": checked,
            "lost_count": lost_count,
            "lost": [d for _, d in lost],
        }

    # -- queue order -------------------------------------------------------------------------------

    def _queue_order(self) -> dict[str, Any]:
        holes = []
        for q, offsets in sorted(self.offsets.items()):
            first, count = offsets.holes()
            if count:
                holes.append({"kind": "hole", "queue": q, "offsets": first, "count": count})
        sent = Buckets(self.directory, "order-sent", self.count)  # (process, queue)
        for i in range(self.count):
            where: dict[tuple[Any, Any], int] = {}
            records = self._read_bucket(self.first_read, i)
            for r in records:
                if r[0] == "w":
                    where.setdefault((r[1], r[2]), r[3])
            for r in records:
                if r[0] == "k":
                    _, process, q, value, offset, position = r
                    found = where.get((q, value), offset)
                    if found is not None:
                        sent.add(_key(process, q), [process, q, value, found, position])
        sent.close()
        reordered: list[tuple[str, int, dict[str, Any]]] = []
        reordered_count = producer_queues = 0
        for i in range(self.count):
            groups: dict[tuple[Any, Any], list[tuple[int, str, int]]] = defaultdict(list)
            for process, q, value, found, position in self._read_bucket(sent, i):
                groups[(process, q)].append((position, value, found))
            producer_queues += len(groups)
            for (process, q), entries in groups.items():
                if len(entries) < 2:
                    continue
                values = [(value, found) for _, value, found in sorted(entries)]
                order = str(((process, q), values))  # the in-memory checker's: sorted(sent.items(), key=str)
                for n, ((v1, o1), (v2, o2)) in enumerate(pairwise(values)):
                    if o2 <= o1:
                        reordered_count += 1
                        reordered.append((order, n, {"kind": "reordered", "process": process, "queue": q,
                                                     "first": [v1, o1], "then": [v2, o2]}))  # fmt: skip
            reordered = heapq.nsmallest(SAMPLE, reordered, key=lambda t: (t[0], t[1]))
        problems = self.gaps + holes + [p for _, _, p in reordered]
        count = self.gap_count + len(holes) + reordered_count
        return {
            "valid": not count,
            "queues": len(self.offsets),
            "producer_queues": producer_queues,
            "problem_count": count,
            "problems": problems[:SAMPLE],
        }
