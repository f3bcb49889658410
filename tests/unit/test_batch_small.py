"""The check of a small batch without numpy (``raftmq.batch._small.small_accepts``) refuses
exactly what the vectorised checks refuse, for the same reason and record, and gives the same view
of what it accepts: every batch, damaged or not, is checked both ways and the outcomes compared."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.batch import BadBatch, BatchBuilder, BatchView, Limits, _small, read, stamp
from raftmq.batch._format import COVERED
from raftmq.batch._small import SMALL_RECORDS, small_accepts
from raftmq.batch._validate import _check

TIGHT = Limits(max_message_bytes=40, max_key_bytes=6, max_records=SMALL_RECORDS + 8, max_batch_bytes=4096)
LIMITS = (None, Limits(), TIGHT)


def recrc(buf: bytearray) -> bytes:
    """``buf`` with both CRCs right again: what a broken or hostile client could send."""
    struct.pack_into("<I", buf, 32, crc32c.crc32c(bytes(buf[:32])))
    struct.pack_into("<I", buf, 36, crc32c.crc32c(bytes(buf[40:])))
    return bytes(buf)


def outcome(buf: bytes, limits: Limits | None, small_records: int) -> Any:
    """What one check gives: the error's reason, message and record, or the view's contents."""
    try:
        view = _check(memoryview(buf), limits, small_records)
    except BadBatch as e:
        return ("refused", e.reason, e.message, e.record)
    return ("accepted", *described(view))


def described(view: BatchView) -> tuple[Any, ...]:
    return (
        view.base_offset,
        view.append_time_ms,
        view.raft_index,
        view.count,
        view.producer_id,
        view.producer_epoch,
        view.base_sequence,
        view.base_timestamp_ms,
        bytes(view.buffer),
        dict(view.sections),
        view.table.dtype,
        view.table.tobytes(),
        view.header_table.dtype,
        view.header_table.tobytes(),
        view.delays.tolist(),
        view.ttls.tolist(),
        view.key_starts.tolist(),
        view.value_starts.tolist(),
        view.header_starts.tolist(),
        list(view.records()),
    )


def same_both_ways(buf: bytes) -> list[str]:
    """Check ``buf`` both ways under each limit; the outcomes of both, which must be equal."""
    results = []
    for limits in LIMITS:
        small, vectorised = outcome(buf, limits, SMALL_RECORDS), outcome(buf, limits, 0)
        assert small == vectorised, (limits, small[:4], vectorised[:4])
        results.append(small[0])
    return results


values = (
    st.binary(max_size=12)
    | st.binary(min_size=36, max_size=44)
    | st.text(alphabet="ab", max_size=6)
    | st.text(alphabet="ab\u00e9\u20ac", max_size=6)
    | st.text(max_size=4)
)
keys = st.none() | st.text(alphabet="kx", max_size=8) | st.text(alphabet="k\u00fc", max_size=4)
SPECIAL = [{}, {"headers": {"h": "v"}}, {"delay_ms": 5}, {"ttl_ms": 9}, {"headers": {}}]


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """A batch of 1 to SMALL_RECORDS + 4 records, most of them plain (what the small path takes),
    some with headers, delays or TTLs (what it leaves to the vectorised checks)."""
    producer_id = draw(st.none() | st.just("p-1"))
    sequence = draw(st.integers(0, 9)) if producer_id else 0
    b = BatchBuilder(producer_id, sequence, base_timestamp_ms=1_700_000_000_000)
    special = draw(st.booleans()) and draw(st.booleans())
    for _ in range(draw(st.integers(1, SMALL_RECORDS + 4))):
        extra: dict[str, Any] = draw(st.sampled_from(SPECIAL)) if special else {}
        b.append(draw(values), key=draw(keys), **extra)
    return b.finish()


# Values for a u32 word of the record table (mostly word 0, the attributes, and the key and value
# lengths) or the covered header that hit each check: bits, header counts, lengths around the
# sums and the limits. Bytes of the sections get ASCII, continuation and lead bytes.
WORD_VALUES = [0, 1, 2, 3, 4, 8, 0x10, 0x40, 0x100, 0x102, 0x10000, 0xFFFF_FFFF, 5, 6, 7, 40, 41]
BYTE_VALUES = [0x41, 0x7F, 0x80, 0xBF, 0xC3, 0xE2, 0xFF]


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    good = draw(batches())
    if draw(st.booleans()):
        good = stamp(good, draw(st.integers(0, 9)), 1_700_000_000_001, 3)
    view = read(good)
    buf = bytearray(good)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(
            st.sampled_from(["table", "table", "table", "keys", "values", "header_table", "covered"])
        )
        start, end = view.sections[where] if where != "covered" else (40, 96)
        if end <= start:
            continue
        if where == "table":  # record r's word 0 (attributes), 2 (key length) or 3 (value length)
            at = start + 16 * draw(st.integers(0, view.count - 1)) + 4 * draw(st.sampled_from([0, 0, 2, 3]))
        elif where != "keys" and where != "values":
            at = start + 4 * draw(st.integers(0, (end - start) // 4 - 1))
        else:
            buf[draw(st.integers(start, end - 1))] = draw(st.sampled_from(BYTE_VALUES))
            continue
        old = struct.unpack_from("<I", buf, at)[0]
        new = draw(st.sampled_from([*WORD_VALUES, old + 1, max(old - 1, 0), old ^ 2]))
        struct.pack_into("<I", buf, at, new & 0xFFFF_FFFF)
    return recrc(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_whole_batches_are_checked_alike_both_ways(buf: bytes) -> None:
    assert "accepted" in same_both_ways(buf)  # under no limit at least


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_batches_are_refused_alike_both_ways(buf: bytes) -> None:
    same_both_ways(buf)


def damage(buf: bytes, *changes: tuple[int, int, int]) -> bytes:
    """``buf`` with each ``(record, word, value)``: u32 ``word`` of the record's table entry set."""
    out = bytearray(buf)
    table = read(buf).sections["table"][0]
    for record, word, value in changes:
        struct.pack_into("<I", out, table + 16 * record + 4 * word, value)
    return recrc(out)


def keyed(*messages: tuple[str | None, bytes | str]) -> bytes:
    b = BatchBuilder("p-1", 7)
    for key, value in messages:
        b.append(value, key=key)
    return b.finish()


KEYED = keyed(("k1", b"v0"), ("k2", b"v1"), (None, "v2"))


@pytest.mark.parametrize(
    ("buf", "limits", "expected"),
    [
        (KEYED, None, "accepted"),
        # record 1's key bit cleared: a key length without it
        (damage(KEYED, (1, 0, 0x01)), None, "bad_record"),
        (damage(KEYED, (1, 0, 0x03 | 0x40)), None, "bad_attributes"),
        (damage(KEYED, (1, 0, 0x03 | 0x10000)), None, "bad_attributes"),  # a reserved byte
        (damage(KEYED, (1, 0, 0x03 | 0x100)), None, "bad_length"),  # a header counted, no header table
        (damage(KEYED, (1, 0, 0x03 | 0x04)), None, "bad_length"),  # a delay bit, no delay section
        (damage(KEYED, (2, 3, 3)), None, "bad_length"),  # the value lengths exceed the section
        (damage(KEYED, (0, 3, 1), (1, 3, 3)), None, "accepted"),  # a byte moved between values
        (damage(KEYED, (2, 2, 1)), None, "bad_record"),
        (keyed(("k" * 7, b"v")), TIGHT, "key_too_large"),
        (keyed(("k", b"v" * 40)), TIGHT, "message_too_large"),
        (keyed(("k" * 6, b"v" * 34)), TIGHT, "accepted"),  # exactly at both limits
        (keyed(("\u00fc", b"v")), None, "accepted"),  # UTF-8 keys: the vectorised check
        (keyed((None, "\u20ac")), None, "accepted"),
        (keyed((None, b"\xff"), (None, "ok")), None, "accepted"),
        (keyed((None, b"\xff"), (None, b"\xc3")), None, "accepted"),  # binary: any bytes
    ],
)
def test_each_check_of_the_small_path_gives_the_vectorised_outcome(
    buf: bytes, limits: Limits | None, expected: str
) -> None:
    assert outcome(buf, limits, SMALL_RECORDS) == outcome(buf, limits, 0)
    result = outcome(buf, limits, SMALL_RECORDS)
    assert (result[1] if result[0] == "refused" else result[0]) == expected


def test_bad_utf8_in_a_small_batch_is_found_as_by_the_vectorised_check() -> None:
    for field in ("keys", "values"):
        buf = keyed(("ab", "cd"), ("ef", "gh"))
        out = bytearray(buf)
        out[read(buf).sections[field][0] + 2] = 0xFF  # the second record's key or value
        bad = recrc(out)
        assert outcome(bad, None, SMALL_RECORDS) == outcome(bad, None, 0)
        assert outcome(bad, None, SMALL_RECORDS)[1:4:2] == ("bad_utf8", 1)


def plain(n: int, key: str | None = "k1", value: bytes | str = b"x" * 20, **extra: Any) -> bytes:
    b = BatchBuilder("p-1", 7)
    for _ in range(n):
        b.append(value, key=key, **extra)
    return b.finish()


SQS_HEADERS = {"sqs-id": "0d9e5d2c-7a4b-4f4e-9a59-3f1b2c4d5e6f", "sqs-attributes": '{"a":["String","b"]}'}


def test_a_small_batch_is_checked_without_numpy_and_a_larger_one_with_it() -> None:
    """The comparisons above would pass if the small path were never taken: it is, for the
    batches it is meant for (an SQS send's among them: headers and a TTL), and only for them."""
    for n, key, value, extra, limits, taken in [
        (1, "k1", b"x" * 20, {}, Limits(), True),
        (SMALL_RECORDS, None, "text", {}, Limits(), True),
        (10, None, "x" * 100, {"headers": SQS_HEADERS, "ttl_ms": 345_600_000}, Limits(), True),
        (3, "k1", b"v", {"delay_ms": 5_000, "ttl_ms": 9}, Limits(), True),
        (3, "k1", "caf\u00e9", {}, Limits(), False),  # non-ASCII text: the vectorised UTF-8 check
        (3, "k\u00fc", b"\xff", {}, Limits(), False),  # a non-ASCII key, likewise
        (3, "k1", b"v", {"headers": {"h": "\u00e9"}}, Limits(), False),  # a non-ASCII header value
        (3, "k1", b"\xff" * 3, {}, Limits(), True),  # binary values are not text: any bytes
        (2, "k" * 7, b"x", {}, TIGHT, False),  # over a limit: the vectorised checks name the error
        (2, "k1", b"x" * 50, {}, TIGHT, False),
        (2, "k1", b"x", {"headers": {"h": "v" * 40}}, TIGHT, False),  # headers count in a message
        (2, None, b"x", {"ttl_ms": Limits().max_ttl_ms + 1}, None, True),  # no limits: read
        (2, None, b"x", {"ttl_ms": Limits().max_ttl_ms + 1}, Limits(), False),
    ]:
        buf = plain(n, key, value, **extra)
        view = read(buf)
        got = small_accepts(view.buffer, view.sections, n, 16, 8, len(view.header_table), limits)
        assert (got is not None) is taken, (n, key, value, extra)
        assert outcome(buf, limits, SMALL_RECORDS) == outcome(buf, limits, 0)


def test_a_reserved_header_is_left_to_the_vectorised_check_where_the_limits_refuse_it() -> None:
    buf = plain(2, None, b"x", headers={"Raftmq-Dlq-Reason": "x"})
    view = read(buf)
    for limits, taken in [(None, True), (Limits(refuse_reserved_headers=False), True), (Limits(), False)]:
        got = small_accepts(view.buffer, view.sections, 2, 16, 8, 2, limits)
        assert (got is not None) is taken, limits
        assert outcome(buf, limits, SMALL_RECORDS) == outcome(buf, limits, 0)
    assert outcome(buf, Limits(), SMALL_RECORDS)[:2] == ("refused", "reserved_header")


def test_a_header_count_no_record_may_have_is_not_walked_by_the_small_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One record claiming 10,000 headers (their table there, zeroed): refused the vectorised way
    without the small path reading the table entry by entry in Python (a batch of 4 MiB of such
    entries took 100 times as long to refuse that way)."""
    b = BatchBuilder(None, 0)
    b.append(b"v", headers={"h": "v"})
    buf = b.finish()
    table_at = read(buf).sections["header_table"][0]
    claimed = 10_000
    out = bytearray(buf[:table_at]) + bytes(8 * (claimed - 1)) + buf[table_at:]
    covered = list(COVERED.unpack_from(out, 40))
    covered[6] = claimed  # the header total
    COVERED.pack_into(out, 40, *covered)
    struct.pack_into("<I", out, 4, len(out))
    bad = recrc(out)

    def walked(*args: Any) -> None:
        raise AssertionError("the small path walked the header table")

    monkeypatch.setattr(_small, "_header_sizes", walked)
    assert outcome(bad, Limits(), SMALL_RECORDS) == outcome(bad, Limits(), 0)
    assert outcome(bad, Limits(), 0)[1] in ("bad_length", "too_many_headers")
