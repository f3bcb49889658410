"""The light read a receive makes (``read_delivery_fields``, ``decode_delivery_fields``): the same
offsets, expiry times and redrive header as reading whole messages (v1 and v2 batches), the same
errors, and the same hand-out decisions (``delivery._deliverable_fields`` against
``delivery._deliverable``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.delivery import REDRIVE_GROUP_HEADER, _deliverable, _deliverable_fields
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import OffsetOutOfRange, read_delivery_fields, read_messages
from raftmq.storage.records import (
    CorruptRecord,
    Message,
    NewMessage,
    decode_delivery_fields,
    decode_messages,
    encode_batch,
)

REDRIVE = REDRIVE_GROUP_HEADER
texts = st.text(max_size=30)
header_maps = st.none() | st.dictionaries(
    st.sampled_from(["a", "raftmq-dlq-topic", REDRIVE_GROUP_HEADER, "x" * 40]),
    texts | st.just("g"),
    max_size=3,
)


@st.composite
def new_messages(draw: st.DrawFn) -> NewMessage:
    binary = draw(st.booleans())
    value = draw(st.binary(max_size=60)) if binary else draw(texts).encode()
    expires = draw(st.none() | st.integers(0, 2**40))
    return NewMessage(value, binary, draw(st.none() | texts), draw(header_maps), expires)


def fields_of(messages: list[Message]) -> list[tuple[int, int, int | None, str | None]]:
    return [
        (m.offset, m.timestamp_ms, m.expires_at_ms, (m.headers or {}).get(REDRIVE_GROUP_HEADER))
        for m in messages
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(new_messages(), min_size=1, max_size=12), st.integers(0, 14), st.integers(1, 14))
def test_decoded_fields_are_those_of_the_decoded_messages(
    batch: list[NewMessage], start: int, count: int
) -> None:
    data = encode_batch(7, 1_000, 100, batch)
    got = [
        (o, 1_000, e, h) for o, e, h in decode_delivery_fields(data, 100 + start, count, REDRIVE_GROUP_HEADER)
    ]
    assert got == fields_of(decode_messages(data, 100 + start, count))


v2_records = st.lists(
    st.tuples(
        texts,  # value
        st.none() | texts,  # key
        header_maps,
        st.sampled_from([0, 0, 5, 3_000]),  # delay_ms
        st.sampled_from([0, 0, 1, 700]),  # ttl_ms
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(v2_records, st.integers(0, 14), st.integers(0, 14))
def test_a_v2_batch_s_fields_are_those_of_its_decoded_messages(
    records: list[tuple[str, str | None, dict[str, str] | None, int, int]], start: int, count: int
) -> None:
    builder = rb.BatchBuilder()
    for value, key, headers, delay_ms, ttl_ms in records:
        builder.append(value, key=key, headers=headers, delay_ms=delay_ms, ttl_ms=ttl_ms)
    data = rb.stamp(builder.finish(), 100, 1_000, 7)
    got = [
        (o, 1_000, e, h) for o, e, h in decode_delivery_fields(data, 100 + start, count, REDRIVE_GROUP_HEADER)
    ]
    assert got == fields_of(decode_messages(data, 100 + start, count))
    view = rb.read_stored(data)
    for name in ("a", "x" * 40, "absent", REDRIVE_GROUP_HEADER):
        expected = [(r.headers or {}).get(name) for r in view.records(100 + start, count)]
        assert view.header_values(name, 100 + start, count) == expected


def test_a_damaged_record_is_detected_as_when_reading_messages() -> None:
    data = bytearray(encode_batch(1, 1, 0, [NewMessage(b"first"), NewMessage(b"second")]))
    data[-3] ^= 0x01  # inside the second record's value
    assert len(decode_delivery_fields(bytes(data), 0, 1, "h")) == 1  # records not returned are not checked
    with pytest.raises(CorruptRecord):
        decode_messages(bytes(data), 0, 2)
    with pytest.raises(CorruptRecord):
        decode_delivery_fields(bytes(data), 0, 2, "h")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(new_messages(), min_size=1, max_size=6), min_size=1, max_size=6),
    st.integers(0, 40),
    st.integers(1, 40),
)
def test_reading_a_queue_gives_the_fields_of_the_messages_read(
    batches: list[list[NewMessage]], offset: int, count: int
) -> None:
    store = MemoryStore()
    machine = QueueGroupMachine(store, 0)
    for i, batch in enumerate(batches, start=1):
        messages = [_produced(m) for m in batch]
        result = machine.apply(
            i, commands.produce(i * 10, [{"topic_id": 1, "queue": 0, "messages": messages}])
        )
        assert "results" in result, result
    high = sum(len(b) for b in batches)
    if offset > high:
        with pytest.raises(OffsetOutOfRange):
            read_delivery_fields(store, 1, 0, offset, count, REDRIVE_GROUP_HEADER)
        return
    assert read_delivery_fields(store, 1, 0, offset, count, REDRIVE_GROUP_HEADER) == fields_of(
        read_messages(store, 1, 0, offset, count)
    )


def _produced(m: NewMessage) -> dict[str, Any]:
    """``m`` as a produce request's message (its expiry as a TTL)."""
    out: dict[str, Any] = (
        {"value_b64": base64.b64encode(m.value).decode()} if m.binary else {"value": m.value.decode()}
    )
    if m.key is not None:
        out["key"] = m.key
    if m.headers is not None:
        out["headers"] = m.headers
    if m.expires_at_ms is not None:
        out["ttl_ms"] = 1 + m.expires_at_ms % 10_000
    return out


@settings(max_examples=200, deadline=None)
@given(
    header_maps,
    st.none() | st.integers(0, 3_000),
    st.integers(0, 3_000),
    st.none() | st.integers(0, 3_000),
    st.sampled_from(["g", "other"]),
)
def test_the_hand_out_decision_from_fields_is_the_one_from_the_message(
    headers: dict[str, str] | None, expires_at_ms: int | None, now_ms: int, max_age_ms: int | None, group: str
) -> None:
    message = Message(5, None, b"v", False, headers, 1_000, 3, expires_at_ms)
    redrive_group = (headers or {}).get(REDRIVE_GROUP_HEADER)
    from_fields = _deliverable_fields(1_000, expires_at_ms, redrive_group, group, now_ms, max_age_ms)
    assert from_fields == _deliverable(message, group, now_ms, max_age_ms)


def test_a_receive_s_read_builds_no_header_index_when_no_record_has_the_header() -> None:
    """The usual SQS batch (an ``sqs-id`` header on each message, no redrive header) is read for
    the redrive header without the per-record header index (issue 24: a numpy cumsum on every
    replica's ``ack_receive`` apply); TTLs on every record are read without a mask."""
    builder = rb.BatchBuilder(base_timestamp_ms=1_000, timestamps=False)
    for i in range(10):
        builder.append(f"m{i}", headers={"sqs-id": f"id-{i}"}, ttl_ms=345_600_000)
    view = rb.read_stored(builder.finish())
    assert view.header_values(REDRIVE, 3, 5) == [None] * 5
    assert view._header_starts is None
    assert view.ttl_ms().tolist() == [345_600_000] * 10
    assert view.header_values("sqs-id", 3, 2) == ["id-3", "id-4"]  # a header that is there: read
