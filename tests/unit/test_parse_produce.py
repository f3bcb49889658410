"""``parse_produce``'s plain path (a text value, maybe a key and a queue) against the full check of
one message (``_parse_message``): the same messages for what it accepts, and for what it must
not accept (a wrong type, a size at or past a limit, text that is not ASCII) the same error,
message and fields, at the same index."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq.cluster.api.validation import MAX_KEY_BYTES, ApiError, _parse_message, parse_produce
from raftmq.cluster.config.cluster_file import Limits


class Text(str):
    pass


LIMITS = Limits()
MAX = 1000  # the topic's max_message_bytes in these tests
NOW_MS = 1_700_000_000_000

ACCEPTED = [
    {"value": "v"},
    {"value": ""},
    {"value": "x" * MAX},
    {"value": "x" * (MAX - 3), "key": "abc"},
    {"value": "v", "key": ""},
    {"value": "v", "key": None},
    {"value": "v", "queue": None},
    {"value": "v", "queue": 0},
    {"value": "v", "queue": 2**40},
    {"value": "v", "key": "k", "queue": 3},
    {"value": "\u00e9t\u00e9", "key": "cl\u00e9"},  # not ASCII: the long way, the same result
    {"value": "\u4e2d" * 333},  # 999 bytes of UTF-8 in 333 characters
    {"value": "v", "headers": {"h": "1"}},
    {"value": "v", "ttl_ms": 5},
    {"value": "v", "delay_ms": 10, "ttl_ms": 5, "key": "k"},
    {"value": "v", "deliver_at_ms": NOW_MS - 1},
    {"value_b64": "YQ=="},
    {"value": "v", "headers": {}},
    {"value": "v", "headers": None},
    {"value": Text("v")},  # a str subclass: the long way
]

REFUSED = [
    "v",
    None,
    {},
    {"key": "k"},
    {"value": None},
    {"value": 1},
    {"value": "v", "colour": "red"},
    {"value": "x" * (MAX + 1)},
    {"value": "x" * (MAX - 2), "key": "abc"},
    {"value": "\u00e9" * (MAX // 2 + 1)},  # fits in characters, not in bytes
    {"value": "a\ud800b"},
    {"value": "v", "key": 1},
    {"value": "v", "key": "\udc00"},
    {"value": "v", "key": "k" * (MAX_KEY_BYTES + 1)},
    {"value": "v", "queue": -1},
    {"value": "v", "queue": True},
    {"value": "v", "queue": 1.0},
    {"value": "v", "queue": "1"},
    {"value": "v", "value_b64": "dg=="},
    {"value": b"v"},  # bytes have isascii() too (orjson never makes them; a caller could)
]


def produce(*messages: Any, max_bytes: int = MAX) -> list[Any]:
    return parse_produce({"messages": list(messages)}, LIMITS, max_bytes, NOW_MS).messages


def full_check(message: Any, index: int, max_bytes: int = MAX) -> Any:
    return _parse_message(message, index, max_bytes, LIMITS, NOW_MS)


def typed(messages: list[Any]) -> list[Any]:
    """Each message's fields with their types: ``==`` alone takes True for 1 and a subclass for str."""
    return [[(type(f), f) for f in m] for m in messages]


@pytest.mark.parametrize("message", ACCEPTED, ids=repr)
def test_an_accepted_message_is_read_as_the_full_check_reads_it(message: dict[str, Any]) -> None:
    expected = [full_check({"value": "first"}, 0), full_check(message, 1)]
    assert typed(produce({"value": "first"}, message)) == typed(expected)


def test_a_key_at_its_limit_is_accepted_and_one_byte_more_refused() -> None:
    at_limit = {"value": "v", "key": "k" * MAX_KEY_BYTES}
    big = 2 * MAX_KEY_BYTES
    assert typed(produce(at_limit, max_bytes=big)) == typed([full_check(at_limit, 0, big)])
    with pytest.raises(ApiError) as e:
        produce({"value": "v", "key": "k" * (MAX_KEY_BYTES + 1)}, max_bytes=big)
    assert e.value.message == f"messages[0].key is longer than {MAX_KEY_BYTES} bytes"


@pytest.mark.parametrize("message", REFUSED, ids=repr)
def test_a_refused_message_gets_the_full_checks_error(message: Any) -> None:
    with pytest.raises(ApiError) as expected:
        full_check(message, 2)
    with pytest.raises(ApiError) as got:
        produce({"value": "a"}, {"value": "b", "key": "k", "queue": 1}, message, {"value": 1})
    assert (got.value.error, got.value.message, got.value.details) == (
        expected.value.error,
        expected.value.message,
        expected.value.details,
    )


def test_empty_or_null_headers_are_no_headers() -> None:
    messages = produce({"value": "v", "headers": {}}, {"value": "v", "headers": None})
    assert [m.headers for m in messages] == [None, None]
    assert produce({"value": "v", "headers": {"h": "1"}})[0].headers == {"h": "1"}
