"""The consume benchmark's checker (tests/bench/_offset_ranges.py): per-queue ranges of received
offsets, merged over the consumers, catch a lost and a duplicated message."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def ranges() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import _offset_ranges
    finally:
        sys.path.remove(str(BENCH))
    yield _offset_ranges
    sys.modules.pop("_offset_ranges", None)


def received(
    ranges: ModuleType, pairs: list[tuple[int, int]]
) -> tuple[dict[int, list[tuple[int, int]]], int]:
    return ranges.ranges_of(array("q", [q for q, _ in pairs]), array("q", [o for _, o in pairs]))  # type: ignore[no-any-return]


def check(ranges: ModuleType, consumers: list[list[tuple[int, int]]], total: int) -> tuple[int, int]:
    """(lost, duplicates) as the benchmark reports them."""
    parts = [received(ranges, pairs) for pairs in consumers]
    merged, overlap = ranges.merge_ranges(part for part, _ in parts)
    lost = max(total - ranges.distinct(merged), ranges.holes(merged))
    return lost, overlap + sum(repeats for _, repeats in parts)


def everything(queues: int, per_queue: int) -> list[tuple[int, int]]:
    return [(q, o) for q in range(queues) for o in range(per_queue)]


def test_every_message_once_over_three_consumers_is_nothing_lost_nothing_twice(ranges: ModuleType) -> None:
    pairs = everything(6, 1_000)
    shares = [[p for p in pairs if p[0] % 3 == i] for i in range(3)]
    assert check(ranges, shares, 6_000) == (0, 0)


def test_a_lost_message_is_caught(ranges: ModuleType) -> None:
    pairs = everything(6, 1_000)
    pairs.remove((4, 517))
    assert check(ranges, [pairs[:3_000], pairs[3_000:]], 6_000) == (1, 0)


def test_a_message_received_twice_by_one_consumer_is_caught(ranges: ModuleType) -> None:
    pairs = everything(6, 1_000)
    pairs.insert(10, (0, 3))  # redelivered later, out of order
    assert check(ranges, [pairs], 6_000) == (0, 1)


def test_a_message_received_by_two_consumers_is_caught(ranges: ModuleType) -> None:
    pairs = everything(6, 1_000)
    # a rebalance: the second consumer starts queue 2 again a little before the first stopped
    first = [p for p in pairs if p[0] != 2 or p[1] < 600]
    second = [p for p in pairs if p[0] == 2 and p[1] >= 590]
    assert check(ranges, [first, second], 6_000) == (0, 10)


def test_a_lost_and_a_duplicated_message_together_do_not_cancel_out(ranges: ModuleType) -> None:
    pairs = everything(2, 100)
    pairs.remove((1, 50))
    pairs.append((1, 49))
    assert check(ranges, [pairs], 200) == (1, 1)


def test_offsets_in_any_order_make_the_same_ranges(ranges: ModuleType) -> None:
    pairs = [(1, 5), (0, 2), (1, 3), (0, 0), (1, 4), (0, 1), (1, 9)]
    assert received(ranges, pairs) == ({0: [(0, 3)], 1: [(3, 6), (9, 10)]}, 0)
    assert received(ranges, []) == ({}, 0)


def test_a_lost_message_is_caught_even_when_a_stray_pair_makes_up_the_count(ranges: ModuleType) -> None:
    """Queue 0 of 10 messages loses offset 4; a pair past the end (a mis-decoded offset) arrives
    instead: as many pairs as messages, but a hole below the highest offset."""
    pairs = [(0, o) for o in range(10) if o != 4] + [(0, 10)]
    assert check(ranges, [pairs], total=10) == (1, 0)
