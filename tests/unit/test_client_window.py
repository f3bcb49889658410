"""The consumer's sliding window: the committed offset is the low edge of finished offsets."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client._types import Message, ack_messages
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


def test_ack_many_of_the_next_offsets_moves_the_edge_past_them_and_wakes_once() -> None:
    w = OffsetWindow(0)
    calls: list[int] = []
    w.set_on_shrink(lambda: calls.append(w.low_edge))
    w.add(0, 10)
    assert w.ack_many([0, 1, 2, 3]) is True
    assert (w.low_edge, w.size, calls) == (4, 6, [4])
    assert w.ack_many(range(4, 10)) is True
    assert (w.low_edge, w.size, calls) == (10, 0, [4, 10])


def test_ack_many_behind_an_unfinished_offset_holds_the_edge() -> None:
    w = OffsetWindow(0)
    w.add(0, 10)
    assert w.ack_many([1, 2, 3]) is False
    assert (w.low_edge, w.size) == (0, 10)
    assert w.ack_many([0]) is True
    assert (w.low_edge, w.size) == (4, 6)


def test_ack_many_ignores_repeated_unknown_and_duplicated_offsets() -> None:
    w = OffsetWindow(5)
    w.add(5, 4)  # 5..8
    # as long as a contiguous run, but with a duplicate: 5, 5, 7 is not 5, 6, 7
    assert w.ack_many([5, 5, 7]) is True
    assert w.low_edge == 6  # 6 was never acked
    assert w.ack_many([-1, 4, 5, 99]) is False
    assert w.ack_many([6, 8]) is True
    assert (w.low_edge, w.size) == (9, 0)


def test_ack_many_after_a_forward_jump_crosses_the_skipped_range() -> None:
    w = OffsetWindow(0)
    w.add(0, 3)
    w.jump(50)
    w.add(50, 2)
    assert w.ack_many([0, 1, 2, 50]) is True
    assert (w.low_edge, w.size) == (51, 1)
    assert w.ack_many([10, 20]) is False  # skipped, never delivered
    assert w.ack_many([51]) is True
    assert (w.low_edge, w.size) == (52, 0)


def test_ack_many_of_a_revoked_window_does_nothing() -> None:
    w = OffsetWindow(0)
    w.add(0, 3)
    w.revoke()
    assert w.ack_many([0, 1, 2]) is False
    assert w.low_edge == 0


@given(
    st.integers(0, 1000),
    st.integers(1, 200),
    st.lists(st.lists(st.integers(-5, 210), max_size=40), max_size=20),
)
def test_ack_many_finishes_what_acks_one_by_one_finish(
    start: int, count: int, lists: list[list[int]]
) -> None:
    one, many = OffsetWindow(start), OffsetWindow(start)
    one.add(start, count)
    many.add(start, count)
    for offsets in lists:
        shifted = [start + o for o in offsets]
        moved = [one.ack(o) for o in shifted]
        assert many.ack_many(shifted) is any(moved)
        assert (many.low_edge, many.size) == (one.low_edge, one.size)


def test_acking_a_list_moves_each_queues_window_once_and_acks_every_message() -> None:
    a, b = OffsetWindow(0), OffsetWindow(100)
    moves: list[str] = []
    a.set_on_shrink(lambda: moves.append("a"))
    b.set_on_shrink(lambda: moves.append("b"))
    a.add(0, 4)
    b.add(100, 3)
    in_a = [Message("t", 0, o, "v", _window=a) for o in range(4)]
    in_b = [Message("t", 1, o, "v", _window=b) for o in range(100, 103)]
    # a poll's list: runs of one queue, interleaved; one of b's held back (not acked)
    ack_messages([*in_a[:2], *in_b[:1], *in_a[2:], in_b[2]])
    assert all(m.acked for m in in_a) and not in_b[1].acked
    assert (a.low_edge, b.low_edge) == (4, 101)  # b's 102 finished, behind the unacked 101
    assert sorted(moves) == ["a", "b"]
    ack_messages(in_a)  # repeated: nothing moves
    assert sorted(moves) == ["a", "b"]
    in_b[1].ack()
    assert b.low_edge == 103


def test_acking_an_iterable_that_raises_part_way_acks_the_messages_taken_before() -> None:
    """They look acked (a second ack does nothing), so their window must have heard: else the
    queue's committed offset stayed behind them for good and its fetches paused once full."""
    window = OffsetWindow(0)
    window.add(0, 3)
    messages = [Message("t", 0, o, "v", _window=window) for o in range(3)]

    def processed() -> Iterator[Message]:
        yield from messages[:2]
        raise RuntimeError("the handler of the third failed")

    with pytest.raises(RuntimeError):
        ack_messages(processed())
    assert messages[0].acked and messages[1].acked and not messages[2].acked
    assert (window.low_edge, window.size) == (2, 1)
