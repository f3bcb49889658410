"""The ``expire_producers`` command: its shape, its bytes and its strict decoder.

    {"op": "expire_producers", "now_ms": time, "idle_ms": duration >= 1, "max": 1..100000,
     "max_states": 0..10000000}

``max_states`` (the field level ``expire_producers.max_states``; absent from the entries written
before it, which apply as they did) sets the group's cap on live producer states, 0 none.

What it does to a queue group's store is ``cluster/machines/producers.py``.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.base.limits import MAX_DURATION_MS, MAX_PRODUCER_STATES, MAX_TIME_MS

__all__ = [
    "EXPIRE_MAX",
    "MAX_EXPIRE_ITEMS",
    "ExpireProducersCommand",
    "decode_expire_producers",
    "expire_producers",
]

MAX_EXPIRE_ITEMS = 100_000
"""Largest ``max`` of an ``expire_producers`` command."""
EXPIRE_MAX = 1000
"""The ``max`` the leader proposes: keys looked at per step (index keys, then swept ``P`` keys)."""


class ExpireProducersCommand(TypedDict):
    v: int
    op: Literal["expire_producers"]
    now_ms: int
    idle_ms: int
    max: int
    max_states: NotRequired[int]


def expire_producers(
    now_ms: int, idle_ms: int, max_items: int = EXPIRE_MAX, max_states: int | None = None
) -> bytes:
    """The ``expire_producers`` command bytes (``max_states`` None: the field is left out)."""
    body = {"v": 1, "op": "expire_producers", "now_ms": now_ms, "idle_ms": idle_ms, "max": max_items}
    if max_states is not None:
        body["max_states"] = max_states
    return orjson.dumps(body)


def decode_expire_producers(obj: dict[str, Any]) -> ExpireProducersCommand:
    """Strictly validate an ``expire_producers`` command (``obj`` is the parsed JSON object).

    Raises:
        BadCommand: an unknown or invalid field.
    """
    unknown = obj.keys() - {"v", "op", "now_ms", "idle_ms", "max", "max_states"}
    if unknown:
        raise BadCommand(errors.BAD_REQUEST, f"command: unknown fields {sorted(unknown)}")
    cmd: ExpireProducersCommand = {
        "v": 1,
        "op": "expire_producers",
        "now_ms": _uint(obj, "now_ms", 0, MAX_TIME_MS),
        "idle_ms": _uint(obj, "idle_ms", 1, MAX_DURATION_MS),
        "max": _uint(obj, "max", 1, MAX_EXPIRE_ITEMS),
    }
    if "max_states" in obj:
        cmd["max_states"] = _uint(obj, "max_states", 0, MAX_PRODUCER_STATES)
    return cmd


def _uint(obj: dict[str, Any], name: str, min_value: int, max_value: int) -> int:
    value = obj.get(name)
    # type() rather than isinstance(): a JSON true must not pass as 1.
    if type(value) is not int or not min_value <= value <= max_value:
        raise BadCommand(
            errors.BAD_REQUEST, f"{name}: expected an integer in [{min_value}, {max_value}], got {value!r}"
        )
    return value
