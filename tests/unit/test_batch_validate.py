"""raftmq.batch.validate names the first bad record; limits and UTF-8 are checked for the whole
batch at once, and bad input never gets past it."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest

from raftmq.batch import BadBatch, BatchBuilder, Limits, read, stamp, validate


def recrc(buf: bytearray) -> bytes:
    """``buf`` with both CRCs made right again: a batch a broken or hostile client could send."""
    struct.pack_into("<I", buf, 32, crc32c.crc32c(bytes(buf[:32])))
    struct.pack_into("<I", buf, 36, crc32c.crc32c(bytes(buf[40:])))
    return bytes(buf)


def batch(n: int = 6, **special: dict[str, Any]) -> bytes:
    """``n`` plain records; ``special={"3": {...}}`` gives record 3 these append arguments."""
    b = BatchBuilder(base_timestamp_ms=0, timestamps=False)
    for i in range(n):
        b.append(**special.get(str(i), {"value": f"v{i}"}))
    return b.finish()


def error(buf: bytes, limits: Limits | None = None) -> tuple[str, int | None]:
    with pytest.raises(BadBatch) as e:
        validate(buf, limits or Limits())
    assert e.value.code == "bad_batch"
    return e.value.reason, e.value.record


def patch_section(buf: bytes, section: str, at: int, data: bytes) -> bytes:
    view = read(buf)
    start, _ = view.sections[section]
    out = bytearray(buf)
    out[start + at : start + at + len(data)] = data
    return recrc(out)


@pytest.mark.parametrize(
    ("section", "key_of", "at", "data"),
    [
        ("keys", "key", 0, b"\xff"),  # not UTF-8 at all
        ("keys", "key", 0, b"\xed\xa0\x80"),  # a lone surrogate, as UTF-8 bytes
        ("keys", "key", 2, b"\xc3"),  # a character cut at the end of the key
        ("header_names", "headers", 0, b"\x80"),  # a continuation byte starting a name
        ("values", "value", 0, b"\xe2\x82"),  # a text value with a cut character
    ],
)
def test_utf8_errors_name_the_first_bad_record(section: str, key_of: str, at: int, data: bytes) -> None:
    fields: dict[str, Any] = {"value": "abc"}
    fields[key_of] = {"abc": "x"} if key_of == "headers" else "abc"
    # records 2 and 4 carry the field; record 4 is damaged, record 2 stays good
    buf = batch(6, **{"2": fields, "4": fields})
    start = read(buf).key_starts[4] if section == "keys" else 0
    if section == "values":
        start = read(buf).value_starts[4]
    if section == "header_names":
        start = 3  # the second header name (record 4's)
    assert error(patch_section(buf, section, int(start) + at, data)) == ("bad_utf8", 4)


def test_a_binary_value_is_never_checked_for_utf8_and_a_text_value_in_a_mixed_batch_is() -> None:
    buf = batch(4, **{"1": {"value": b"\xff\xfe"}, "2": {"value": "ok"}, "3": {"value": b"\x80"}})
    validate(buf, Limits())
    start = int(read(buf).value_starts[2])
    assert error(patch_section(buf, "values", start, b"\xff")) == ("bad_utf8", 2)


def test_valid_multibyte_text_next_to_binary_values_is_accepted() -> None:
    validate(
        batch(3, **{"0": {"value": b"\xe2"}, "1": {"value": "\u20ac"}, "2": {"value": b"\x82\xac"}}), Limits()
    )


@pytest.mark.parametrize(
    ("fields", "limits", "reason"),
    [
        ({"value": "x" * 101}, Limits(max_message_bytes=100), "message_too_large"),
        (
            {"value": "x" * 50, "key": "k" * 30, "headers": {"h" * 10: "v" * 11}},
            Limits(max_message_bytes=100),
            "message_too_large",
        ),
        ({"value": "x", "key": "k" * 11}, Limits(max_key_bytes=10), "key_too_large"),
        (
            {"value": "x", "headers": {str(i): "" for i in range(3)}},
            Limits(max_headers=2),
            "too_many_headers",
        ),
        ({"value": "x", "delay_ms": 1001}, Limits(max_delay_ms=1000), "bad_delay"),
        ({"value": "x", "ttl_ms": 1001}, Limits(max_ttl_ms=1000), "bad_ttl"),
    ],
)
def test_limits_name_the_first_record_breaking_them(
    fields: dict[str, Any], limits: Limits, reason: str
) -> None:
    assert error(batch(8, **{"5": fields, "6": fields}), limits) == (reason, 5)


def test_the_first_bad_record_wins_over_a_later_worse_one() -> None:
    limits = Limits(max_message_bytes=100, max_key_bytes=10)
    buf = batch(8, **{"2": {"value": "x" * 200}, "6": {"value": "x", "key": "k" * 20}})
    assert error(buf, limits) == ("message_too_large", 2)


def test_batch_limits_and_header_checks() -> None:
    assert error(batch(11), Limits(max_records=10)) == ("too_many_records", None)
    assert error(batch(3), Limits(max_batch_bytes=100)) == ("batch_too_large", None)
    buf = bytearray(batch(3))
    buf[0] = 3
    assert error(bytes(buf)) == ("unknown_version", None)


def test_a_zero_delay_with_the_delay_bit_is_refused() -> None:
    buf = batch(3, **{"1": {"value": "x", "delay_ms": 9}})
    view = read(buf)
    start, _ = view.sections["delays"]
    out = bytearray(buf)
    out[start : start + 8] = bytes(8)
    assert error(recrc(out)) == ("bad_delay", 1)


def test_unknown_record_bits_and_inconsistent_lengths_are_refused() -> None:
    buf = batch(4)
    table, _ = read(buf).sections["table"]
    out = bytearray(buf)
    out[table + 16 * 2] |= 0x40  # record 2: an attribute bit no version defines
    assert error(recrc(out)) == ("bad_attributes", 2)
    out = bytearray(buf)
    out[table + 16 * 1 + 12] += 1  # record 1's value one byte longer than the values section holds
    assert error(recrc(out))[0] == "bad_length"
    out = bytearray(buf)
    out[table + 16 * 3 + 8] = 1  # a key length on a record without the key bit
    assert error(recrc(out)) == ("bad_record", 3)


def test_a_character_split_across_two_keys_is_refused_at_the_first_of_them() -> None:
    fields = {"value": "x", "key": "abc"}
    buf = batch(6, **{"2": fields, "4": fields})
    view = read(buf)
    keys, starts = view.sections["keys"][0], view.key_starts
    out = bytearray(buf)
    out[keys + int(starts[2]) + 2] = 0xC3  # "ab\xc3": cut before its end
    out[keys + int(starts[4])] = 0xA9  # "\xa9bc": the rest of "é"
    assert error(recrc(out)) == ("bad_utf8", 2)  # the section alone would decode as "abébc"


def test_a_later_version_that_only_adds_fields_is_read_by_this_one() -> None:
    """A batch whose header and record entries carry 4 more bytes each (fields a later version
    appends) reads as the same records: readers step by header_size and record_entry_size."""
    msgs: list[dict[str, Any]] = [
        {"value": "a", "key": "k", "headers": {"h": "v"}, "ttl_ms": 5},
        {"value": b"\x00", "delay_ms": 7},
    ]
    b = BatchBuilder("p", 3, base_timestamp_ms=0, timestamps=False)
    for m in msgs:
        b.append(**m)
    old = b.finish()
    count = 2
    pid_end = 96 + 1
    table_end = pid_end + 16 * count
    covered = bytearray(old[40:96])
    struct.pack_into("<H", covered, 0, 100)  # header_size
    covered[4] = 20  # record_entry_size
    entries = b"".join(
        old[pid_end + 16 * i : pid_end + 16 * (i + 1)] + b"\xaa\xbb\xcc\xdd" for i in range(count)
    )
    body = bytes(covered) + b"\x01\x02\x03\x04" + old[96:pid_end] + entries + old[table_end:]
    new = bytearray(old[:40] + body)
    struct.pack_into("<I", new, 4, len(new))
    later = recrc(new)
    assert list(validate(later, Limits()).records()) == list(read(old).records())


def test_times_and_offsets_beyond_int64_are_refused() -> None:
    """Offsets and times are read into int64 (records, columns, Arrow): a batch whose base
    timestamp or stamped fields reach 2**63 is refused, instead of passing validation and then
    making every read of it raise OverflowError or wrap around to negative times."""
    b = BatchBuilder(base_timestamp_ms=2**63 + 5)
    b.append(b"v")
    with pytest.raises(BadBatch) as e:
        validate(b.finish(), Limits())
    assert e.value.reason == "bad_header"
    fine = BatchBuilder(base_timestamp_ms=1_700_000_000_000)
    fine.append(b"v")
    batch = fine.finish()
    for fields in ((2**63 - 1, 0, 0), (0, 2**63, 0), (0, 0, 2**63)):
        with pytest.raises(BadBatch) as e:
            read(stamp(batch, *fields))
        assert e.value.reason == "bad_header", fields
    assert read(stamp(batch, 2**63 - 2, 2**63 - 1, 2**63 - 1)).base_offset == 2**63 - 2
