"""The consume benchmark's proof that nothing was lost or duplicated, at little cost per message.

Each consumer appends the (queue, offset) of every message it received to two int arrays (C-level
``array.extend``, no per-message Python object kept); at the end :func:`ranges_of` sorts them into
per-queue ranges of distinct offsets and counts the repeats, and the parent merges every
consumer's ranges (:func:`merge_ranges`), counting offsets covered twice as duplicates. A lost
message is one the merged ranges do not cover (the topic's offsets less those covered).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

__all__ = ["Ranges", "distinct", "merge_ranges", "ranges_of"]

Ranges = dict[int, list[tuple[int, int]]]  # queue -> sorted, disjoint [first, end) ranges


def ranges_of(queues: array[int], offsets: array[int]) -> tuple[Ranges, int]:
    """The distinct offsets of each queue as ranges, and how many pairs were repeats."""
    q = np.frombuffer(queues, dtype=np.int64) if len(queues) else np.zeros(0, np.int64)
    o = np.frombuffer(offsets, dtype=np.int64) if len(offsets) else np.zeros(0, np.int64)
    order = np.lexsort((o, q))
    q, o = q[order], o[order]
    repeat = np.zeros(len(q), bool)
    repeat[1:] = (q[1:] == q[:-1]) & (o[1:] == o[:-1])
    q, o = q[~repeat], o[~repeat]
    # a range starts where the queue changes or the offset is not the previous one's successor
    starts = np.flatnonzero(np.r_[True, (q[1:] != q[:-1]) | (o[1:] != o[:-1] + 1)] if len(q) else [])
    ends = np.r_[starts[1:], len(q)] if len(q) else starts
    ranges: Ranges = {}
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        ranges.setdefault(int(q[s]), []).append((int(o[s]), int(o[e - 1]) + 1))
    return ranges, int(repeat.sum())


def merge_ranges(parts: Iterable[Ranges]) -> tuple[Ranges, int]:
    """The union of several consumers' ranges, and how many offsets more than one of them had."""
    by_queue: dict[int, list[tuple[int, int]]] = {}
    for part in parts:
        for queue, ranges in part.items():
            by_queue.setdefault(int(queue), []).extend((int(a), int(b)) for a, b in ranges)
    merged: Ranges = {}
    overlap = 0
    for queue, ranges in by_queue.items():
        out: list[tuple[int, int]] = []
        for first, end in sorted(ranges):
            if out and first < out[-1][1]:  # covered already, at least in part
                last_first, last_end = out[-1]
                overlap += min(end, last_end) - first
                out[-1] = (last_first, max(end, last_end))
            elif out and first == out[-1][1]:
                out[-1] = (out[-1][0], end)
            else:
                out.append((first, end))
        merged[queue] = out
    return merged, overlap


def distinct(merged: Ranges) -> int:
    """Pairs the ranges cover."""
    return sum(end - first for ranges in merged.values() for first, end in ranges)


def holes(merged: Ranges) -> int:
    """Offsets missing below each queue's highest one received (every queue of the benchmark's
    topic starts at offset 0 and has no gap): a loss that a count alone would miss when a stray
    pair (a wrong queue or an offset past the end) made up for it."""
    return sum(ranges[-1][1] - distinct({queue: ranges}) for queue, ranges in merged.items() if ranges)
