"""The producer's column-wise batch writer writes the bytes ``raftmq.batch.BatchBuilder`` writes
for the same messages (docs/format.md), and the format's own validation accepts them."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.batch import BatchBuilder, Limits, is_reserved_header, validate
from raftmq.client import _batch_writer
from raftmq.client._batch_writer import ColumnBatch

BASE_NS = 1_790_000_000_123 * 1_000_000

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)  # no lone surrogates
values = st.one_of(text, st.binary(max_size=40), st.sampled_from(["x" * 100, "", "é", "🙂"]))
keys = st.one_of(st.none(), text)
# Header names the broker reserves (raftmq-..., any case) are refused by validate: a client's
# batch never carries one (hypothesis draws the prefix from the code's own constants).
names = text.filter(lambda name: not is_reserved_header(name))
headers = st.one_of(st.none(), st.just({}), st.dictionaries(names, text, max_size=3))
# ns after BASE_NS: in order, out of order (a clock stepping back), or far apart
offsets = st.integers(-5_000_000_000, 5_000_000_000_000)


def both(
    messages: list[tuple[Any, Any, Any, int]], producer_id: str | None, sequence: int
) -> tuple[bytes, bytes]:
    """The column writer's bytes and the builder's for ``messages``; the column writer's are
    checked to be the same whether it writes the record table by numpy or record by record."""
    times = [BASE_NS + (0 if i == 0 else offset) for i, (*_, offset) in enumerate(messages)]
    written = []
    small_up_to = _batch_writer.SMALL_BATCH_RECORDS
    for threshold in (0, len(messages)):  # numpy's table, then the small batch's
        columns = ColumnBatch(producer_id, sequence)
        for value, key, hdrs, _ in messages:
            columns.append(value, key, hdrs)
        columns._times = array("q", times)  # the times of the appends, fixed for the comparison
        _batch_writer.SMALL_BATCH_RECORDS = threshold
        try:
            written.append(columns.finish())
        finally:
            _batch_writer.SMALL_BATCH_RECORDS = small_up_to
    assert written[0] == written[1]
    base = times[0] // 1_000_000
    builder = BatchBuilder(producer_id, sequence, base_timestamp_ms=base)
    for (value, key, hdrs, _), t in zip(messages, times, strict=True):
        builder.append(value, key, hdrs, timestamp_ms=t // 1_000_000)
    return written[0], builder.finish()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(values, keys, headers, offsets), min_size=1, max_size=40),
    st.one_of(st.none(), st.just("p-7f3a")),
    st.integers(0, 2**63),
)
def test_the_column_writer_writes_the_builder_s_bytes(
    messages: list[tuple[Any, Any, Any, int]], producer_id: str | None, sequence: int
) -> None:
    if producer_id is None:
        sequence = 0
    got, expected = both(messages, producer_id, sequence)
    assert got == expected
    view = validate(got, Limits())
    records = list(view.records())
    assert [(bytes(r.value) if r.binary else str(r.value, "utf-8")) for r in records] == [
        m[0] for m in messages
    ]
    assert [r.key for r in records] == [m[1] for m in messages]


@pytest.mark.parametrize(
    "messages",
    [
        [("plain ascii", None, None, 0)] * 3,
        [("ключ", None, None, 0), ("ascii", None, None, 7_000_000)],
        [(b"\x00", None, None, 0), ("text", None, None, 0)],
        [("v", None, None, 0), ("v", "k", None, 0), ("v", None, None, 0), ("v", "", None, 0)],
        [("v", None, None, 0), ("v", None, {"h": "1"}, 0)],
    ],
)
def test_the_column_writer_on_known_mixes(messages: list[tuple[Any, Any, Any, int]]) -> None:
    got, expected = both(messages, "p-1", 3)
    assert got == expected


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        ColumnBatch(None, 0).finish()
