"""Frames of several batches in one body (raftmq.batch): split back into the same batches and
addresses, without copying."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.batch import (
    ANY_QUEUE,
    BadBatch,
    BatchBuilder,
    Frame,
    join_frames,
    split_batches,
    split_frames,
    stamp,
)


def one(value: str) -> bytes:
    b = BatchBuilder()
    b.append(value)
    return b.finish()


topics = st.none() | st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= 255)
queues = st.none() | st.integers(0, ANY_QUEUE - 1)


@given(st.lists(st.tuples(queues, topics, st.text(max_size=30)), min_size=1, max_size=10))
def test_frames_split_into_the_batches_and_addresses_joined(
    items: list[tuple[int | None, str | None, str]],
) -> None:
    batches = [one(v) for _, _, v in items]
    body = join_frames([(q, t, b) for (q, t, _), b in zip(items, batches, strict=True)])
    frames = split_frames(body)
    assert [(f.queue, f.topic, bytes(f.batch)) for f in frames] == [
        (q, t, b) for (q, t, _), b in zip(items, batches, strict=True)
    ]
    assert all(isinstance(f, Frame) and f.batch.obj is not None for f in frames)


def test_plain_concatenated_batches_split() -> None:
    batches = [stamp(one(str(i)), i, 0, 0) for i in range(5)]
    assert [bytes(b) for b in split_batches(b"".join(batches))] == batches
    with pytest.raises(BadBatch) as e:
        split_batches(b"".join(batches)[:-1])
    assert e.value.batch == 4


def test_too_many_frames_and_an_empty_body_are_refused() -> None:
    body = join_frames([(0, None, one("x"))] * 3)
    with pytest.raises(BadBatch) as e:
        split_frames(body, max_frames=2)
    assert (e.value.reason, e.value.batch) == ("too_many_batches", 2)
    with pytest.raises(BadBatch):
        split_frames(b"")


def test_frame_prefix_refuses_what_it_cannot_address() -> None:
    with pytest.raises(ValueError):
        join_frames([(ANY_QUEUE, None, one("x"))])
    with pytest.raises(ValueError):
        join_frames([(0, "t" * 256, one("x"))])
