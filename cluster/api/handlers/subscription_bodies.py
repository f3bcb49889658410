"""Request bodies of the subscription routes (``cluster/api/handlers/subscriptions.py``,
``cluster/api/handlers/dlq_locks.py``): a JSON object with known fields, integer fields in a range,
receipts."""

from __future__ import annotations

import re
from typing import Any

from raftmq.cluster.api.validation import bad, parse_json

__all__ = ["format_receipt", "int_field", "json_object", "parse_receipt"]


def int_field(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    if name not in body:
        if default is None:
            raise bad(f"'{name}' is required")
        return default
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad(f"'{name}' must be an integer from {lo} to {hi}")
    return value


def json_object(raw: bytes, allowed: set[str]) -> dict[str, Any]:
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"body: unknown field(s) {', '.join(map(repr, unknown))}")
    return body


def format_receipt(topic_id: int, queue: int, offset: int, token: int) -> str:
    """A receipt: opaque to clients; ``topic_id.queue.offset.token`` (the token is the raft index
    of the delivering ``receive``, so a receipt names one delivery)."""
    return f"{topic_id}.{queue}.{offset}.{token}"


_NUMBER = "(0|[1-9][0-9]{0,19})"  # no sign, no leading zero, ASCII digits only
_RECEIPT = re.compile(r"\.".join([_NUMBER] * 4))


def receipt_numbers(text: Any) -> tuple[int, int, int, int] | None:
    """A receipt's numbers, or None where ``text`` is none: numbers past what a command holds
    (2^32 for a topic id or queue, 2^64 for an offset or token) included. The SQS API's receipt
    handles are these too: one read here fails its own batch entry only."""
    match = _RECEIPT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    topic_id, queue, offset, token = map(int, match.groups())
    if topic_id >= 2**32 or queue >= 2**32 or offset >= 2**64 or token >= 2**64:
        return None
    return topic_id, queue, offset, token


def parse_receipt(text: Any, i: int) -> tuple[int, int, int, int]:
    numbers = receipt_numbers(text)
    if numbers is None:
        raise bad(f"receipts[{i}] is not a receipt")
    return numbers
