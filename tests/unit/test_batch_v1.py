"""Values stored in format v1 (storage/records.py) stay readable through raftmq.batch, which
reads them without importing storage/."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.batch import BadBatch, Record, columns, read, read_v1, v1_to_v2
from raftmq.storage.records import NewMessage, encode_batch

texts = st.text(max_size=20)


@st.composite
def v1_messages(draw: st.DrawFn) -> NewMessage:
    binary = draw(st.booleans())
    value = draw(st.binary(max_size=100)) if binary else draw(texts).encode()
    expires = draw(st.none() | st.integers(1_700_000_000_001, 1_800_000_000_000))
    return NewMessage(
        value,
        binary,
        draw(st.none() | texts),
        draw(st.none() | st.dictionaries(texts, texts, max_size=3)),
        expires,
    )


APPEND = 1_700_000_000_000


def want(msgs: list[NewMessage], base: int) -> list[Record]:
    return [
        Record(
            base + i,
            APPEND,
            m.key,
            m.value,
            m.binary,
            m.headers,
            0,
            0 if m.expires_at_ms is None else m.expires_at_ms - APPEND,
        )
        for i, m in enumerate(msgs)
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(v1_messages(), min_size=1, max_size=15), st.integers(0, 2**40))
def test_v1_values_decode_and_convert_to_equal_v2_batches(msgs: list[NewMessage], base: int) -> None:
    old = encode_batch(99, APPEND, base, msgs)
    v1 = read_v1(old)
    assert (v1.raft_index, v1.append_time_ms, v1.base_offset) == (99, APPEND, base)
    assert v1.records == want(msgs, base)
    assert v1.expires_at_ms == [m.expires_at_ms for m in msgs]
    new = read(v1_to_v2(old))
    assert (new.raft_index, new.append_time_ms, new.base_offset) == (99, APPEND, base)
    # v2 has one encoding for "no headers": {} (which the JSON API never stores) reads as None
    assert list(new.records()) == [r._replace(headers=r.headers or None) for r in want(msgs, base)]
    # expiry is the same instant in both: append time + ttl (v1 records carry no delay)
    assert [APPEND + r.ttl_ms if r.ttl_ms else None for r in new.records()] == v1.expires_at_ms
    assert columns([old]).to_arrow().column("offset").to_pylist() == [r.offset for r in want(msgs, base)]


def test_damaged_v1_values_raise_bad_batch() -> None:
    old = encode_batch(1, APPEND, 0, [NewMessage(b"hello", key="k"), NewMessage(b"\x00", True)])
    for end in range(len(old)):
        with pytest.raises(BadBatch):
            read_v1(old[:end])
    for pos in range(len(old)):
        bad = bytearray(old)
        bad[pos] ^= 0x01
        try:
            batch = read_v1(bytes(bad))
        except BadBatch:
            continue
        # v1 has no CRC over its header: a flip there reads as other header values, never as
        # other records (each record has its CRC)
        assert pos < 29 and [r.value for r in batch.records] == [b"hello", b"\x00"]


def test_v1_values_v2_cannot_hold_raise_bad_batch() -> None:
    """Stored v1 headers nested deeper than the stack, or more headers than a v2 record holds,
    raise BadBatch like any other bad value (RecursionError and ValueError escaped before)."""
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    old = bytearray(encode_batch(1, APPEND, 0, [NewMessage(b"v", headers={"h": "x" * (2 * depth - 8)})]))
    start = old.index(b'{"h":')
    assert old[start : start + 2 * depth].endswith(b'"}')
    old[start : start + 2 * depth] = nested  # same length; the record's CRC made anew
    body = 29 + 4  # v1 header, then the record's CRC over the rest
    old[29:body] = crc32c.crc32c(bytes(old[body:])).to_bytes(4, "big")
    with pytest.raises(BadBatch) as e:
        read_v1(bytes(old))
    assert e.value.reason == "bad_record"
    many = encode_batch(1, APPEND, 0, [NewMessage(b"v", headers={f"h{i}": "" for i in range(300)})])
    assert len(read_v1(many).records[0].headers or {}) == 300  # v1 holds them
    with pytest.raises(BadBatch) as e:
        v1_to_v2(many)
    assert e.value.reason == "bad_record" and e.value.record == 0
