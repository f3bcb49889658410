"""Damaged batches and bodies (raftmq.batch): every single-byte change and every truncation is
refused with BadBatch, never accepted, never another exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.batch import BadBatch, BatchBuilder, Limits, join_frames, read, split_frames, stamp, validate

LIMITS = Limits()


def sample_batch() -> bytes:
    """A small batch using every section: producer id, keys, headers, text and binary values,
    non-ASCII text, a delay and a TTL."""
    b = BatchBuilder("p-ü", 42, base_timestamp_ms=1_700_000_000_000)
    b.append("héllo", key="k1", headers={"trace": "a1", "ü": "ö"}, timestamp_ms=1_700_000_000_005)
    b.append(b"\x00\xff\x80", delay_ms=1_000)
    b.append("", key="", ttl_ms=60_000, headers={"": ""})
    b.append("€uro", key="日本", delay_ms=5, ttl_ms=7)
    return b.finish()


def refused(check: Callable[[bytes], Any], data: bytes) -> bool:
    try:
        check(data)
    except BadBatch:
        return True
    return False  # any other exception propagates and fails the test


@pytest.mark.parametrize("stamped", [False, True], ids=["as produced", "as stored"])
def test_every_single_byte_change_is_refused(stamped: bool) -> None:
    good = sample_batch()
    if stamped:
        good = stamp(good, 1_000, 1_700_000_000_100, 77)
    validate(good, LIMITS)
    accepted = []
    for pos in range(len(good)):
        for xor in range(1, 256):
            bad = bytearray(good)
            bad[pos] ^= xor
            if not (refused(lambda d: validate(d, LIMITS), bytes(bad)) and refused(read, bytes(bad))):
                accepted.append((pos, xor))
    assert accepted == []


def test_every_truncation_and_extension_is_refused() -> None:
    good = stamp(sample_batch(), 5, 6, 7)
    for end in range(len(good)):
        assert refused(read, good[:end]), end
    for extra in (b"\x00", b"\x00" * 8, good):
        assert refused(read, good + extra)


def test_every_single_byte_change_of_a_body_of_frames_is_refused() -> None:
    body = join_frames([(3, None, sample_batch()), (None, "orders", sample_batch())])

    def accept(data: bytes) -> None:
        for f in split_frames(data):
            validate(f.batch, LIMITS)

    accept(body)
    accepted = []
    for pos in range(len(body)):
        for xor in (0x01, 0x80, 0xFF, 0x10):
            bad = bytearray(body)
            bad[pos] ^= xor
            if not refused(accept, bytes(bad)):
                accepted.append((pos, xor))
    assert accepted == []
    # A body cut inside a frame is refused; cut between frames it is a shorter body of whole
    # batches (HTTP's Content-Length tells the node the body ended early).
    first_frame_end = len(body) - len(sample_batch()) - len(b"orders") - 9
    for end in range(1, len(body)):
        if end != first_frame_end:
            assert refused(accept, body[:end]), end


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.binary(max_size=50) | st.text(max_size=10), st.none() | st.text(max_size=8)),
        min_size=1,
        max_size=8,
    ),
    st.data(),
)
def test_random_damage_to_random_batches_is_refused(
    msgs: list[tuple[bytes | str, str | None]], data: st.DataObject
) -> None:
    b = BatchBuilder()
    for value, key in msgs:
        b.append(value, key=key, headers={"h": "v"} if key else None)
    good = b.finish()
    bad = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):  # a change escapes CRC-32C with odds of 2**-32
        pos = data.draw(st.integers(0, len(bad) - 1))
        bad[pos] = data.draw(st.integers(0, 255).filter(lambda v, p=pos: v != good[p]))
    if bytes(bad) != good:
        assert refused(lambda d: validate(d, LIMITS), bytes(bad))


@given(st.binary(max_size=300))
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_raise_only_bad_batch(blob: bytes) -> None:
    for check in (read, lambda d: validate(d, LIMITS), split_frames):
        refused(check, blob)
        refused(check, b"\x02" + blob)
