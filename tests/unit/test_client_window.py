"""The consumer's sliding window: the committed offset is the low edge of finished offsets."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client._window import OffsetWindow


def test_low_edge_is_the_next_offset_when_nothing_is_pending() -> None:
    w = OffsetWindow(7)
    assert (w.low_edge, w.next_offset, w.size) == (7, 7, 0)


def test_a_slow_message_holds_the_low_edge_however_many_later_ones_finish() -> None:
    w = OffsetWindow(0)
    w.add(0, 100)
    w.ack(0)
    for offset in range(2, 100):  # everything but offset 1
        w.ack(offset)
    assert w.low_edge == 1
    assert w.size == 99  # the finished ones behind the slow one still count against the backlog
    assert w.ack(1) is True
    assert (w.low_edge, w.size) == (100, 0)


def test_out_of_order_acks_move_the_edge_to_the_first_gap() -> None:
    w = OffsetWindow(10)
    w.add(10, 5)
    assert w.ack(12) is False
    assert w.ack(11) is False
    assert w.low_edge == 10
    assert w.ack(10) is True
    assert w.low_edge == 13


def test_repeated_and_unknown_acks_are_ignored() -> None:
    w = OffsetWindow(0)
    w.add(0, 3)
    assert w.ack(0) is True
    assert w.ack(0) is False  # repeated
    assert w.ack(2) is False
    assert w.ack(2) is False  # repeated, behind the head
    assert w.ack(99) is False  # never delivered
    assert w.ack(-1) is False
    assert w.low_edge == 1
    w.ack(1)
    assert w.low_edge == 3


def test_fetches_must_be_contiguous() -> None:
    w = OffsetWindow(0)
    w.add(0, 2)
    with pytest.raises(ValueError):
        w.add(5, 1)


def test_jump_forward_keeps_pending_offsets_and_skips_the_removed_range() -> None:
    w = OffsetWindow(0)
    w.add(0, 3)
    w.ack(1)
    w.jump(50)  # retention removed 3..49
    assert w.next_offset == 50
    assert w.low_edge == 0  # 0 is still unfinished
    w.ack(0)
    assert w.low_edge == 2
    w.ack(2)
    assert w.low_edge == 50
    w.add(50, 1)
    assert w.low_edge == 50


def test_jump_backward_restarts_the_window() -> None:
    w = OffsetWindow(10)
    w.add(10, 5)
    w.jump(0)
    assert (w.low_edge, w.next_offset, w.size) == (0, 0, 0)


def test_on_shrink_is_called_when_the_edge_moves() -> None:
    w = OffsetWindow(0)
    calls: list[int] = []
    w.set_on_shrink(lambda: calls.append(w.low_edge))
    w.add(0, 3)
    w.ack(1)
    assert calls == []
    w.ack(0)
    assert calls == [2]


@given(st.integers(0, 1000), st.integers(1, 200), st.randoms(use_true_random=False))
def test_low_edge_never_passes_an_unfinished_offset(start: int, count: int, rnd: random.Random) -> None:
    w = OffsetWindow(start)
    w.add(start, count)
    order = list(range(start, start + count))
    rnd.shuffle(order)
    finished: set[int] = set()
    for offset in order:
        w.ack(offset)
        finished.add(offset)
        edge = w.low_edge
        assert all(o in finished for o in range(start, edge))
        assert edge == start + count or edge not in finished
    assert w.low_edge == start + count and w.size == 0


def test_acks_from_many_threads_all_count() -> None:
    w = OffsetWindow(0)
    n = 20_000
    w.add(0, n)
    offsets = list(range(n))
    random.Random(1).shuffle(offsets)
    threads = [threading.Thread(target=lambda part=offsets[i::8]: [w.ack(o) for o in part]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (w.low_edge, w.size) == (n, 0)
