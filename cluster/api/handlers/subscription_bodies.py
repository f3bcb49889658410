"""Request bodies of the subscription routes (``cluster/api/handlers/subscriptions.py``,
``cluster/api/handlers/dlq_locks.py``): a JSON object with known fields, integer fields in a range."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.validation import bad, parse_json

__all__ = ["int_field", "json_object"]


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
