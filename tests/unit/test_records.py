"""The record-batch codec: round trips, and every damage to stored bytes detected."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.batch import BatchBuilder, stamp
from raftmq.batch._format import CRC_AT, CRC_START
from raftmq.storage.records import (
    HEADER_SIZE,
    CorruptRecord,
    Message,
    NewMessage,
    decode_batch,
    decode_header,
    decode_messages,
    encode_batch,
)
from raftmq.storage.store import StoreError

texts = st.text(max_size=40)
headers = st.none() | st.dictionaries(texts, texts, max_size=4)


@st.composite
def new_messages(draw: st.DrawFn) -> NewMessage:
    binary = draw(st.booleans())
    value = draw(st.binary(max_size=200)) if binary else draw(texts).encode("utf-8")
    return NewMessage(value, binary, draw(st.none() | texts), draw(headers))


batches = st.lists(new_messages(), min_size=1, max_size=20)
u64 = st.integers(0, 2**64 - 1)


def expected(raft_index: int, append_time_ms: int, base_offset: int, msgs: list[NewMessage]) -> list[Message]:
    return [
        Message(
            base_offset + i,
            m.key,
            m.value,
            m.binary,
            None if m.headers is None else dict(m.headers),
            append_time_ms,
            raft_index,
        )
        for i, m in enumerate(msgs)
    ]


@given(msgs=batches, raft_index=u64, append_time_ms=u64, base_offset=st.integers(0, 2**63))
def test_round_trip_preserves_every_field(
    msgs: list[NewMessage], raft_index: int, append_time_ms: int, base_offset: int
) -> None:
    data = encode_batch(raft_index, append_time_ms, base_offset, msgs)
    batch = decode_batch(data)
    assert batch.header.raft_index == raft_index
    assert batch.header.append_time_ms == append_time_ms
    assert batch.header.base_offset == base_offset
    assert batch.header.count == len(msgs)
    assert batch.header.end_offset == base_offset + len(msgs)
    assert batch.messages == expected(raft_index, append_time_ms, base_offset, msgs)
    assert decode_header(data) == batch.header


@given(msgs=batches, data=st.data())
def test_decode_messages_starts_mid_batch_and_stops_at_max(
    msgs: list[NewMessage], data: st.DataObject
) -> None:
    encoded = encode_batch(7, 1000, 50, msgs)
    start = data.draw(st.integers(0, len(msgs) + 2))
    limit = data.draw(st.integers(0, len(msgs) + 2))
    got = decode_messages(encoded, 50 + start, limit)
    assert got == expected(7, 1000, 50, msgs)[start : start + limit]


def test_empty_headers_and_empty_key_are_not_none() -> None:
    batch = decode_batch(encode_batch(1, 2, 3, [NewMessage(b"", False, "", {})]))
    assert batch.messages[0].key == ""
    assert batch.messages[0].headers == {}
    assert batch.messages[0].value == b""


@settings(max_examples=200)
@given(msgs=batches, data=st.data())
def test_any_flipped_byte_after_the_header_is_detected(msgs: list[NewMessage], data: st.DataObject) -> None:
    encoded = bytearray(encode_batch(1, 2, 3, msgs))
    position = data.draw(st.integers(HEADER_SIZE, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        decode_batch(bytes(encoded))


@given(msgs=batches, data=st.data())
def test_truncated_batch_is_detected(msgs: list[NewMessage], data: st.DataObject) -> None:
    encoded = encode_batch(1, 2, 3, msgs)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CorruptRecord):
        decode_batch(encoded[:cut])


def test_trailing_bytes_are_detected() -> None:
    encoded = encode_batch(1, 2, 3, [NewMessage(b"v")])
    with pytest.raises(CorruptRecord, match="trailing"):
        decode_batch(encoded + b"\x00")


def test_crc_mismatch_is_reported_as_such() -> None:
    encoded = bytearray(encode_batch(1, 2, 3, [NewMessage(b"hello")]))
    encoded[-1] ^= 0x01  # last byte of the value
    with pytest.raises(CorruptRecord, match="CRC"):
        decode_batch(bytes(encoded))


def test_unknown_format_version_is_rejected() -> None:
    encoded = bytearray(encode_batch(1, 2, 3, [NewMessage(b"v")]))
    encoded[0] = 99
    with pytest.raises(CorruptRecord, match="version"):
        decode_header(bytes(encoded))


def test_corrupt_record_is_a_store_error() -> None:
    # The state machine lets StoreError escape (a replica with broken storage must stop).
    assert issubclass(CorruptRecord, StoreError)


def _with_body_crc(data: bytearray) -> bytes:
    """``data`` with its body CRC made right again: damage a CRC cannot see."""
    data[CRC_AT : CRC_AT + 4] = crc32c.crc32c(bytes(data[CRC_START:])).to_bytes(4, "little")
    return bytes(data)


def test_a_stored_v2_batch_whose_records_do_not_read_is_a_corrupt_record() -> None:
    """Stored values are read without their records checked again (apply's read checked them):
    one that still does not read (its CRCs right, a key no longer UTF-8) raises CorruptRecord, the
    storage error that stops a node's apply, not a UnicodeDecodeError a caller would take for a
    bad request."""
    builder = BatchBuilder(None, 0, base_timestamp_ms=1_700_000_000_000)
    builder.append(value=b"v", key="kkkk")
    stored = bytearray(stamp(builder.finish(), 0, 1_700_000_000_000, 3))
    assert [m.key for m in decode_messages(bytes(stored), 0, 10)] == ["kkkk"]
    at = stored.index(b"kkkk")
    stored[at : at + 4] = b"\xff\xfe\xfd\xfc"
    damaged = _with_body_crc(stored)
    with pytest.raises(CorruptRecord):
        decode_messages(damaged, 0, 10)
    with pytest.raises(CorruptRecord):
        decode_batch(damaged)
