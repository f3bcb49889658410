"""Record-batch format v2 (raftmq.batch): what a builder writes, every reader gives back."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.batch import (
    BadBatch,
    BatchBuilder,
    Limits,
    Record,
    _view,
    columns,
    is_reserved_header,
    read,
    read_stored,
    stamp,
    stamp_into,
    validate,
)

texts = st.text(max_size=30)  # any Unicode but lone surrogates (not UTF-8 encodable)
# Header names a producer may send: a raftmq-* name is the broker's own, which validate refuses
# (test_reserved_headers). Hypothesis draws the prefix, a string constant of the code under test.
header_names = texts.filter(lambda name: not is_reserved_header(name))
LIMITS = Limits()


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    value: str | bytes = draw(st.binary(max_size=300) | texts)
    return {
        "value": value,
        "key": draw(st.none() | texts),
        "headers": draw(st.none() | st.dictionaries(header_names, texts, max_size=5)),
        "delay_ms": draw(st.sampled_from([0, 0, 1, 5_000, LIMITS.max_delay_ms])),
        "ttl_ms": draw(st.sampled_from([0, 0, 1, 60_000, LIMITS.max_ttl_ms])),
        "timestamp_ms": draw(st.integers(1_700_000_000_000, 1_700_000_000_000 + 2**32 - 1)),
    }


batches = st.lists(messages(), min_size=1, max_size=40)
producers = st.none() | st.tuples(st.text(min_size=1, max_size=60), st.integers(0, 2**64 - 1))


def build(msgs: list[dict[str, Any]], producer: tuple[str, int] | None = None) -> bytes:
    pid, seq = producer if producer is not None else (None, 0)
    b = BatchBuilder(pid, seq, base_timestamp_ms=1_700_000_000_000)
    for m in msgs:
        b.append(**m)
    out = b.finish()
    assert b.size == len(out)
    return out


def expected(msgs: list[dict[str, Any]], base_offset: int = 0) -> list[Record]:
    return [
        Record(
            base_offset + i,
            m["timestamp_ms"],
            m["key"],
            m["value"].encode() if isinstance(m["value"], str) else m["value"],
            not isinstance(m["value"], str),
            m["headers"] or None,
            m["delay_ms"],
            m["ttl_ms"],
        )
        for i, m in enumerate(msgs)
    ]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(batches, producers)
def test_every_built_batch_validates_and_decodes_to_what_was_appended(
    msgs: list[dict[str, Any]], producer: tuple[str, int] | None
) -> None:
    view = validate(build(msgs, producer), LIMITS)
    assert list(view.records()) == expected(msgs)
    assert view.count == len(msgs)
    assert (view.producer_id, view.base_sequence) == (producer or (None, 0))
    timed = [(i, m["delay_ms"], m["ttl_ms"]) for i, m in enumerate(msgs) if m["delay_ms"] or m["ttl_ms"]]
    assert view.timing() == timed


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(batches, producers, st.data())
def test_a_stored_batch_reads_back_as_read_sees_it_and_a_damaged_one_is_refused(
    msgs: list[dict[str, Any]], producer: tuple[str, int] | None, data: st.DataObject
) -> None:
    stored = stamp(build(msgs, producer), 7, 1_700_000_000_000, 3)
    view, checked = read_stored(stored), read(stored)
    assert list(view.records()) == list(checked.records()) == expected(msgs, 7)
    assert view.timing() == checked.timing()
    assert view.sections == checked.sections
    assert (view.producer_id, view.base_sequence, view.raft_index) == (
        checked.producer_id,
        checked.base_sequence,
        checked.raft_index,
    )
    damaged = bytearray(stored)
    damaged[data.draw(st.integers(0, len(stored) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(BadBatch):
        read_stored(bytes(damaged))


def _recrc(batch: bytearray) -> bytes:
    """The batch with its CRC made to match its (changed) contents: a writer's bug, not damage."""
    struct.pack_into("<I", batch, 36, crc32c.crc32c(memoryview(batch)[40:]))
    return bytes(batch)


TABLE_AT = 96  # no producer id: the record table follows the 96-byte header
HEADER_TABLE = 1 << 20  # ``at`` from here on: from the header table's start (after the records')


@pytest.mark.parametrize(
    ("at", "fmt", "change"),
    [
        (TABLE_AT + 16 + 12, "<I", 8),  # record 1's value length past the values, into its TTL
        (TABLE_AT + 12, "<I", -1),  # record 0's value length short of its own
        (TABLE_AT + 8, "<I", 1),  # record 0's key length past the keys, into the header names
        (TABLE_AT + 16 + 1, "<B", 1),  # record 1 counts a header the header table does not have
        (HEADER_TABLE + 4, "<I", 1),  # a header value length past the header values
        (TABLE_AT, "<B", 0x04),  # record 0 (a key: 0x02) gains the delay bit, no delay in the section
    ],
    ids=["value past", "value short", "key past", "header count", "header value past", "delay bit"],
)
@pytest.mark.parametrize("more", [0, 40], ids=["small", "numpy"])  # records after the two: either path
def test_a_stored_batch_whose_lengths_do_not_add_up_to_its_sections_is_refused(
    at: int, fmt: str, change: int, more: int
) -> None:
    """A batch with matching CRCs whose record or header lengths do not add up to their sections
    (a writer's bug the CRC carries along): read_stored refuses it as read does, rather than
    hand out a value reaching into the next section."""
    plain = {"value": b"", "key": None, "headers": None, "delay_ms": 0, "ttl_ms": 0}
    msgs = [
        {**plain, "value": "ab", "key": "k", "headers": {"h": "v"}},
        {**plain, "value": "cd", "ttl_ms": 60_000},
        *[plain] * more,
    ]
    good = stamp(build(msgs), 7, 1_700_000_000_000, 3)
    assert [r.value for r in read_stored(good)][:2] == [b"ab", b"cd"]
    if at >= HEADER_TABLE:
        at += TABLE_AT + 16 * len(msgs) - HEADER_TABLE
    batch = bytearray(good)
    (value,) = struct.unpack_from(fmt, batch, at)
    struct.pack_into(fmt, batch, at, value + change)
    bad = _recrc(batch)
    with pytest.raises(BadBatch) as checked:
        read(bad)
    with pytest.raises(BadBatch) as stored:
        read_stored(bad)
    assert stored.value.reason == checked.value.reason == "bad_length"


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(batches, st.integers(0, 2**62), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.data())
def test_stamping_keeps_the_batch_valid_and_moves_only_the_stamped_fields(
    msgs: list[dict[str, Any]], base_offset: int, append_time_ms: int, raft_index: int, data: st.DataObject
) -> None:
    raw = build(msgs)
    stamped = stamp(raw, base_offset, append_time_ms, raft_index)
    assert stamped[40:] == raw[40:]  # the records and their CRC are untouched
    view = read(stamped)
    assert (view.base_offset, view.append_time_ms, view.raft_index) == (
        base_offset,
        append_time_ms,
        raft_index,
    )
    assert list(view.records()) == expected(msgs, base_offset)
    start = data.draw(st.integers(base_offset - 2, base_offset + len(msgs) + 2))
    assert (
        list(view.records(from_offset=start, max_records=3))
        == [r for r in expected(msgs, base_offset) if r.offset >= start][:3]
    )
    assert (
        list(view.values(from_offset=start, max_records=3))
        == [r.value for r in expected(msgs, base_offset) if r.offset >= start][:3]
    )
    in_place = bytearray(b"xx" + raw)
    stamp_into(in_place, base_offset, append_time_ms, raft_index, at=2)
    assert bytes(in_place[2:]) == stamped


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(batches, min_size=1, max_size=4))
def test_columns_of_several_batches_match_their_records(groups: list[list[dict[str, Any]]]) -> None:
    stored, want, base = [], [], 0
    for i, msgs in enumerate(groups):
        stored.append(stamp(build(msgs), base, 1_000 + i, 10 + i))
        want += expected(msgs, base)
        base += len(msgs) + 7  # a gap, as retention or compaction may leave
    cols = columns(stored)
    rows = cols.to_arrow().to_pylist()
    assert [r["offset"] for r in rows] == [r.offset for r in want]
    assert [r["key"] for r in rows] == [r.key for r in want]
    assert [r["value"] for r in rows] == [r.value for r in want]
    assert [r["binary"] for r in rows] == [r.binary for r in want]
    assert [dict(r["headers"]) or None for r in rows] == [r.headers for r in want]
    assert [(r["timestamp_ms"], r["delay_ms"], r["ttl_ms"]) for r in rows] == [
        (r.timestamp_ms, r.delay_ms, r.ttl_ms) for r in want
    ]


def test_empty_and_maximal_values_round_trip_at_the_limit() -> None:
    limits = Limits(max_message_bytes=1024 * 1024)
    big = bytes(range(256)) * 4096  # exactly 1 MiB
    msgs: list[dict[str, Any]] = [
        {
            "value": b"",
            "key": None,
            "headers": None,
            "delay_ms": 0,
            "ttl_ms": 0,
            "timestamp_ms": 1_700_000_000_000,
        },
        {
            "value": "",
            "key": "",
            "headers": {},
            "delay_ms": 0,
            "ttl_ms": 0,
            "timestamp_ms": 1_700_000_000_000,
        },
        {
            "value": big,
            "key": None,
            "headers": None,
            "delay_ms": 0,
            "ttl_ms": 0,
            "timestamp_ms": 1_700_000_000_000,
        },
    ]
    view = validate(build(msgs), limits)
    assert list(view.records()) == expected(msgs)
    with pytest.raises(BadBatch) as e:
        validate(build([*msgs[:2], {**msgs[2], "key": "k"}]), limits)
    assert (e.value.code, e.value.reason, e.value.record) == ("bad_batch", "message_too_large", 2)


def test_many_records_round_trip() -> None:
    msgs = [
        {
            "value": f"m{i}",
            "key": str(i % 7) if i % 3 else None,
            "headers": {"i": str(i)} if i % 5 == 0 else None,
            "delay_ms": 0,
            "ttl_ms": 1000 if i % 11 == 0 else 0,
            "timestamp_ms": 1_700_000_000_000 + i,
        }
        for i in range(10_000)
    ]
    view = validate(build(msgs), LIMITS)
    assert list(view.records()) == expected(msgs)


def test_an_empty_builder_cannot_finish_and_a_sequence_needs_a_producer() -> None:
    with pytest.raises(ValueError):
        BatchBuilder().finish()
    with pytest.raises(ValueError):
        BatchBuilder(None, 5)
    with pytest.raises(UnicodeEncodeError):
        BatchBuilder().append("\ud800")


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=32), st.integers(0, 34), st.integers(0, 34))
def test_a_small_batch_read_in_python_gives_the_records_of_the_numpy_path(
    msgs: list[dict[str, Any]], start: int, count: int
) -> None:
    """``BatchView.records`` reads a batch of at most ``SMALL_READ`` records without numpy (issue
    24: a ReceiveMessage's answer reads one or two of 10): the same records, from any offset."""
    view = read(stamp(build(msgs), 100, 1_700_000_000_000, 7))
    small = list(view.records(100 + start, count))
    _view.SMALL_READ, kept = 0, _view.SMALL_READ
    try:
        assert small == list(view.records(100 + start, count))
    finally:
        _view.SMALL_READ = kept
    assert len(small) == max(0, min(count, len(msgs) - start))
