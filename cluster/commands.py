"""Queue-group commands: the bytes carried by each Raft entry of a queue group.

A command is an orjson object ``{"v": 1, "op": <op>, ...}``. Commands are the replicated log
format: every replica, today and after an upgrade, must read old entries the same way. So op names
are never renamed or reused (see :data:`OPS`) and fields are never reinterpreted.

Wire shapes (``v`` is always 1; every listed field is required unless marked ``?``)::

    {"op": "noop"}
    {"op": "produce", "now_ms": u64, "batches": [
        {"topic_id": u32, "queue": u32, "producer_id"?: str, "sequence"?: u64,
         "messages": [{"value": str} | {"value_b64": str}, "key"?: str, "headers"?: {str: str}]}]}
    {"op": "commit_offsets", "group": str, "topic_id": u32, "offsets": {"<queue>": u64}}
    {"op": "retain", "now_ms": u64, "queues": [
        {"topic_id": u32, "queue": u32, "max_age_ms"?: u64 | null, "max_bytes"?: u64 | null}]}
    {"op": "drop_topic", "topic_id": u32}

Validation is strict, because a command that one replica accepts and another rejects would fork
the queue group: unknown fields are rejected, ``true`` is not an integer, integers must be in range,
``producer_id`` and ``sequence`` come together, lists (``batches``, ``messages``, ``offsets``) are
non-empty (``retain.queues`` may be empty), ``value_b64`` is standard base64 with padding,
names (``producer_id``, ``group``) are 1..255 UTF-8 bytes, and a ``retain`` names each queue once.

The leader should run :func:`decode` on a command before proposing it, to answer a bad request at
once; the state machine decodes again and turns a :class:`BadCommand` into an error result.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

import orjson

from raftmq.storage.keys import MAX_U32, MAX_U64
from raftmq.storage.records import NewMessage

from . import errors
from .errors import ErrorCode

__all__ = [
    "MAX_NAME_BYTES",
    "OPS",
    "VERSION",
    "BadCommand",
    "Command",
    "CommitOffsetsCommand",
    "DropTopicCommand",
    "NoopCommand",
    "ProduceBatch",
    "ProduceCommand",
    "RetainCommand",
    "RetainQueue",
    "commit_offsets",
    "decode",
    "drop_topic",
    "noop",
    "produce",
    "retain",
]

VERSION = 1

# ONLY ADD TO THE END. An op name is part of the replicated log format: never rename or reuse one.
OPS: tuple[str, ...] = (
    "noop",
    "produce",
    "commit_offsets",
    "retain",
    "drop_topic",
)

MAX_NAME_BYTES = 255
"""Longest ``producer_id`` or consumer ``group``, in UTF-8 bytes."""


class BadCommand(Exception):
    """The command bytes are not a valid command.

    Attributes:
        code: The catalogue entry (``invalid_json`` or ``bad_request``).
        message: What is wrong, naming the field (e.g. ``batches[0].messages[3].value_b64``).
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ProduceBatch(TypedDict):
    """A decoded produce batch; messages are normalized to :class:`NewMessage`."""

    topic_id: int
    queue: int
    producer_id: str | None
    sequence: int | None
    messages: list[NewMessage]


class ProduceCommand(TypedDict):
    v: int
    op: Literal["produce"]
    now_ms: int
    batches: list[ProduceBatch]


class CommitOffsetsCommand(TypedDict):
    v: int
    op: Literal["commit_offsets"]
    group: str
    topic_id: int
    offsets: dict[int, int]


class RetainQueue(TypedDict):
    topic_id: int
    queue: int
    max_age_ms: int | None
    max_bytes: int | None


class RetainCommand(TypedDict):
    v: int
    op: Literal["retain"]
    now_ms: int
    queues: list[RetainQueue]


class DropTopicCommand(TypedDict):
    v: int
    op: Literal["drop_topic"]
    topic_id: int


class NoopCommand(TypedDict):
    v: int
    op: Literal["noop"]


Command = ProduceCommand | CommitOffsetsCommand | RetainCommand | DropTopicCommand | NoopCommand


# -- builders (leader side) -------------------------------------------------------------------


def produce(now_ms: int, batches: Sequence[Mapping[str, Any]]) -> bytes:
    """A produce command appending ``batches`` (wire shape, see the module docstring)."""
    return orjson.dumps({"v": VERSION, "op": "produce", "now_ms": now_ms, "batches": list(batches)})


def commit_offsets(group: str, topic_id: int, offsets: Mapping[int, int]) -> bytes:
    """A command committing consumer group ``group``'s ``{queue: offset}`` on ``topic_id``."""
    wire_offsets = {str(queue): offset for queue, offset in offsets.items()}
    return orjson.dumps(
        {"v": VERSION, "op": "commit_offsets", "group": group, "topic_id": topic_id, "offsets": wire_offsets}
    )


def retain(now_ms: int, queues: Sequence[Mapping[str, Any]]) -> bytes:
    """A command applying retention; each queue is ``{topic_id, queue, max_age_ms, max_bytes}``."""
    return orjson.dumps({"v": VERSION, "op": "retain", "now_ms": now_ms, "queues": list(queues)})


def drop_topic(topic_id: int) -> bytes:
    """A command removing every key of ``topic_id`` and refusing later writes to it."""
    return orjson.dumps({"v": VERSION, "op": "drop_topic", "topic_id": topic_id})


def noop() -> bytes:
    """A command that changes nothing but ``applied_index`` (a read barrier)."""
    return orjson.dumps({"v": VERSION, "op": "noop"})


# -- decoding (every replica) -----------------------------------------------------------------


def decode(data: bytes) -> Command:
    """Parse and strictly validate command bytes.

    Args:
        data: The bytes of one Raft entry.

    Returns:
        The validated command, normalized: produce messages become :class:`NewMessage` (value
        bytes, base64 decoded), optional fields are present with None, offsets keys are ints.

    Raises:
        BadCommand: ``data`` is not JSON (``invalid_json``) or not a valid command
            (``bad_request``).
    """
    try:
        obj = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError) as e:
        raise BadCommand(errors.INVALID_JSON, f"command is not JSON: {e}") from None
    if type(obj) is not dict:
        raise BadCommand(errors.BAD_REQUEST, "command is not a JSON object")
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        raise BadCommand(errors.BAD_REQUEST, f"unsupported command version {version!r}")
    op = obj.get("op")
    if op == "produce":
        return _produce(obj)
    if op == "commit_offsets":
        return _commit_offsets(obj)
    if op == "retain":
        return _retain(obj)
    if op == "drop_topic":
        _fields(obj, "command", {"v", "op", "topic_id"})
        return {"v": VERSION, "op": "drop_topic", "topic_id": _uint(obj, "topic_id", MAX_U32, "")}
    if op == "noop":
        _fields(obj, "command", {"v", "op"})
        return {"v": VERSION, "op": "noop"}
    raise BadCommand(errors.BAD_REQUEST, f"unknown op {op!r}")


def _bad(message: str) -> BadCommand:
    return BadCommand(errors.BAD_REQUEST, message)


def _fields(obj: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = obj.keys() - allowed
    if unknown:
        raise _bad(f"{where}: unknown fields {sorted(unknown)}")


def _uint(obj: dict[str, Any], name: str, max_value: int, where: str) -> int:
    value = obj.get(name)
    # type() rather than isinstance(): a JSON true must not pass as 1.
    if type(value) is not int or not 0 <= value <= max_value:
        raise _bad(f"{where}{name}: expected an integer in [0, {max_value}], got {value!r}")
    return value


def _optional_uint(obj: dict[str, Any], name: str, where: str) -> int | None:
    if obj.get(name) is None:
        return None
    return _uint(obj, name, MAX_U64, where)


def _name(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if type(value) is not str or not 1 <= len(value.encode("utf-8")) <= MAX_NAME_BYTES:
        raise _bad(f"{where}{name}: expected a string of 1..{MAX_NAME_BYTES} UTF-8 bytes")
    return value


def _list(obj: dict[str, Any], name: str, where: str, *, allow_empty: bool = False) -> list[Any]:
    value = obj.get(name)
    if type(value) is not list or (not value and not allow_empty):
        raise _bad(f"{where}{name}: expected a {'' if allow_empty else 'non-empty '}list")
    return value


def _produce(obj: dict[str, Any]) -> ProduceCommand:
    _fields(obj, "command", {"v", "op", "now_ms", "batches"})
    now_ms = _uint(obj, "now_ms", MAX_U64, "")
    batches = [_produce_batch(b, f"batches[{i}].") for i, b in enumerate(_list(obj, "batches", ""))]
    return {"v": VERSION, "op": "produce", "now_ms": now_ms, "batches": batches}


def _produce_batch(batch: Any, where: str) -> ProduceBatch:
    if type(batch) is not dict:
        raise _bad(f"{where[:-1]}: expected an object")
    _fields(batch, where[:-1], {"topic_id", "queue", "producer_id", "sequence", "messages"})
    has_producer, has_sequence = "producer_id" in batch, "sequence" in batch
    if has_producer != has_sequence:
        raise _bad(f"{where[:-1]}: producer_id and sequence must be given together")
    raw_messages = _list(batch, "messages", where)
    return {
        "topic_id": _uint(batch, "topic_id", MAX_U32, where),
        "queue": _uint(batch, "queue", MAX_U32, where),
        "producer_id": _name(batch, "producer_id", where) if has_producer else None,
        "sequence": _uint(batch, "sequence", MAX_U64, where) if has_sequence else None,
        "messages": [_message(m, f"{where}messages[{i}]") for i, m in enumerate(raw_messages)],
    }


_MESSAGE_FIELDS = frozenset({"value", "value_b64", "key", "headers"})


def _message(msg: Any, where: str) -> NewMessage:
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
    return NewMessage(value, binary, key, headers)


def _b64(text: Any, where: str) -> bytes:
    if type(text) is not str:
        raise _bad(f"{where}.value_b64: expected a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{where}.value_b64: not valid base64") from None


def _commit_offsets(obj: dict[str, Any]) -> CommitOffsetsCommand:
    _fields(obj, "command", {"v", "op", "group", "topic_id", "offsets"})
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
    }


def _retain(obj: dict[str, Any]) -> RetainCommand:
    _fields(obj, "command", {"v", "op", "now_ms", "queues"})
    now_ms = _uint(obj, "now_ms", MAX_U64, "")
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
    return {"v": VERSION, "op": "retain", "now_ms": now_ms, "queues": queues}
