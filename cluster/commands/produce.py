"""Decoders of the produce, commit_offsets and retain commands (``cluster/commands/__init__.py``)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from raftmq.cluster.commands.fields import (
    _bad,
    _fields,
    _list,
    _name,
    _optional_duration,
    _optional_time,
    _optional_uint,
    _uint,
)
from raftmq.cluster.commands.shapes import (
    VERSION,
    CommitOffsetsCommand,
    ProduceBatch,
    ProduceCommand,
    RetainCommand,
    RetainQueue,
)
from raftmq.storage.keys import MAX_U32, MAX_U64
from raftmq.storage.records import NewMessage


def _produce(obj: dict[str, Any]) -> ProduceCommand:
    _fields(obj, "command", {"v", "op", "now_ms", "batches"})
    now_ms = _uint(obj, "now_ms", MAX_U64, "")
    batches = [_produce_batch(b, f"batches[{i}].", now_ms) for i, b in enumerate(_list(obj, "batches", ""))]
    return {"v": VERSION, "op": "produce", "now_ms": now_ms, "batches": batches}


def _produce_batch(batch: Any, where: str, now_ms: int) -> ProduceBatch:
    if type(batch) is not dict:
        raise _bad(f"{where[:-1]}: expected an object")
    _fields(batch, where[:-1], {"topic_id", "queue", "producer_id", "sequence", "messages"})
    has_producer, has_sequence = "producer_id" in batch, "sequence" in batch
    if has_producer != has_sequence:
        raise _bad(f"{where[:-1]}: producer_id and sequence must be given together")
    raw_messages = _list(batch, "messages", where)
    messages: list[NewMessage] = []
    deliver_at: list[int | None] | None = None
    for i, m in enumerate(raw_messages):
        message, due = _message(m, f"{where}messages[{i}]", now_ms)
        messages.append(message)
        if due is not None and deliver_at is None:
            deliver_at = [None] * i
        if deliver_at is not None:
            deliver_at.append(due)
    return {
        "topic_id": _uint(batch, "topic_id", MAX_U32, where),
        "queue": _uint(batch, "queue", MAX_U32, where),
        "producer_id": _name(batch, "producer_id", where) if has_producer else None,
        "sequence": _uint(batch, "sequence", MAX_U64, where) if has_sequence else None,
        "messages": messages,
        "deliver_at_ms": deliver_at,
    }


_MESSAGE_FIELDS = frozenset({"value", "value_b64", "key", "headers", "deliver_at_ms", "ttl_ms"})


def _message(msg: Any, where: str, now_ms: int) -> tuple[NewMessage, int | None]:
    """The message and its due time (None: not delayed)."""
    # Runs for every produced message on every replica: keep it lean.
    if type(msg) is not dict:
        raise _bad(f"{where}: expected an object")
    if not msg.keys() <= _MESSAGE_FIELDS:
        _fields(msg, where, set(_MESSAGE_FIELDS))
    if "value" in msg:
        if "value_b64" in msg:
            raise _bad(f"{where}: give value or value_b64, not both")
        text = msg["value"]
        if type(text) is not str:
            raise _bad(f"{where}.value: expected a string")
        value, binary = text.encode("utf-8"), False
    elif "value_b64" in msg:
        value, binary = _b64(msg["value_b64"], where), True
    else:
        raise _bad(f"{where}: value or value_b64 is required")
    key = msg.get("key")
    if "key" in msg and type(key) is not str:
        raise _bad(f"{where}.key: expected a string")
    headers = msg.get("headers")
    if "headers" in msg and (type(headers) is not dict or not all(type(v) is str for v in headers.values())):
        raise _bad(f"{where}.headers: expected an object of strings")
    if "deliver_at_ms" not in msg and "ttl_ms" not in msg:
        return NewMessage(value, binary, key, headers), None
    prefix = f"{where}."
    due = _optional_time(msg, "deliver_at_ms", prefix)
    ttl_ms = _optional_duration(msg, "ttl_ms", prefix)
    # TTL counts from when the message becomes deliverable: its due time if delayed.
    expires_at_ms = None if ttl_ms is None else (now_ms if due is None else due) + ttl_ms
    if expires_at_ms is not None and expires_at_ms > MAX_U64:
        raise _bad(f"{where}: the expiry time does not fit 64 bits")
    return NewMessage(value, binary, key, headers, expires_at_ms), due


def _b64(text: Any, where: str) -> bytes:
    if type(text) is not str:
        raise _bad(f"{where}.value_b64: expected a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{where}.value_b64: not valid base64") from None


def _commit_offsets(obj: dict[str, Any]) -> CommitOffsetsCommand:
    _fields(obj, "command", {"v", "op", "group", "topic_id", "offsets", "advance"})
    advance = obj.get("advance")
    if advance is not None and type(advance) is not bool:
        raise _bad("advance: expected true or false")
    raw = obj.get("offsets")
    if type(raw) is not dict or not raw:
        raise _bad("offsets: expected a non-empty object")
    offsets: dict[int, int] = {}
    for queue_text in raw:
        # Only canonical decimals ("7", not "07" or "+7"): one queue has one spelling.
        # (Length first: int() of a huge digit string is slow or raises.)
        canonical = (
            0 < len(queue_text) <= 10
            and queue_text.isascii()
            and queue_text.isdigit()
            and str(int(queue_text)) == queue_text
        )
        if not canonical or int(queue_text) > MAX_U32:
            raise _bad(f"offsets: queue {queue_text!r} is not an integer in [0, {MAX_U32}]")
        offsets[int(queue_text)] = _uint(raw, queue_text, MAX_U64, "offsets.")
    return {
        "v": VERSION,
        "op": "commit_offsets",
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "offsets": offsets,
        "advance": bool(advance),
    }


def _retain(obj: dict[str, Any]) -> RetainCommand:
    _fields(obj, "command", {"v", "op", "now_ms", "queues", "max_jump_ms", "max_batches"})
    now_ms = _uint(obj, "now_ms", MAX_U64, "")
    max_jump_ms = _optional_duration(obj, "max_jump_ms", "")
    max_batches = None if obj.get("max_batches") is None else _uint(obj, "max_batches", MAX_U32, "")
    if max_batches == 0:
        raise _bad("max_batches: expected an integer in [1, 4294967295], got 0")
    queues: list[RetainQueue] = []
    seen: set[tuple[int, int]] = set()
    for i, item in enumerate(_list(obj, "queues", "", allow_empty=True)):
        where = f"queues[{i}]."
        if type(item) is not dict:
            raise _bad(f"queues[{i}]: expected an object")
        _fields(item, f"queues[{i}]", {"topic_id", "queue", "max_age_ms", "max_bytes"})
        entry: RetainQueue = {
            "topic_id": _uint(item, "topic_id", MAX_U32, where),
            "queue": _uint(item, "queue", MAX_U32, where),
            "max_age_ms": _optional_uint(item, "max_age_ms", where),
            "max_bytes": _optional_uint(item, "max_bytes", where),
        }
        # Each queue once: a second entry would have to see the first one's deletions.
        if (entry["topic_id"], entry["queue"]) in seen:
            raise _bad(f"queues[{i}]: queue named twice")
        seen.add((entry["topic_id"], entry["queue"]))
        queues.append(entry)
    return {
        "v": VERSION,
        "op": "retain",
        "now_ms": now_ms,
        "queues": queues,
        "max_jump_ms": max_jump_ms,
        "max_batches": max_batches,
    }
