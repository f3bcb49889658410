"""Queue-group commands: the bytes carried by each Raft entry of a queue group.

A command is an orjson object ``{"v": 1, "op": <op>, ...}``. Commands are the replicated log
format: every replica, today and after an upgrade, must read old entries the same way. So op names
are never renamed or reused (see :data:`OPS`) and fields are never reinterpreted.

Wire shapes (``v`` is always 1; every listed field is required unless marked ``?``)::

    {"op": "noop"}
    {"op": "produce", "now_ms": u64, "batches": [
        {"topic_id": u32, "queue": u32, "producer_id"?: str, "sequence"?: u64,
         "messages": [{"value": str} | {"value_b64": str}, "key"?: str, "headers"?: {str: str},
                      "deliver_at_ms"?: time, "ttl_ms"?: duration]}]}
    {"op": "commit_offsets", "group": str, "topic_id": u32, "offsets": {"<queue>": u64}}
    {"op": "retain", "now_ms": u64, "queues": [
        {"topic_id": u32, "queue": u32, "max_age_ms"?: u64 | null, "max_bytes"?: u64 | null}]}
    {"op": "drop_topic", "topic_id": u32}

Receive/ack, delayed messages and locks (``cluster/delivery.py``, ``docs/delivery.md``); a receipt
is ``[queue u32, offset u64, token u64]``; ``time`` is a u64 up to 2**62 and ``duration`` a u64 up
to 2**40::

    {"op": "subscribe", "group": str, "topic_id": u32, "topic": str, "dlq_topic_id": u32 | null,
     "max_deliveries": u32 >= 1, "backoff_ms": [duration, ...] (1..64), "overwrite": bool}
    {"op": "receive", "now_ms": time, "group": str, "topic_id": u32, "queues": [u32, ...] (distinct),
     "max": 1..10000, "visibility_ms": duration >= 1, "epoch"?: u64, "max_age_ms"?: duration}
    {"op": "ack", "now_ms": time, "group": str, "topic_id": u32, "receipts": [receipt, ...],
     "epoch"?: u64}
    {"op": "nack", ... as ack ..., "delay_ms"?: duration}
    {"op": "extend", ... as ack ..., "visibility_ms": duration >= 1}
    {"op": "deliver_tick", "now_ms": time, "max": 1..100000}
    {"op": "lock", "now_ms": time, "group": str, "topic_id": u32, "queue": u32, "consumer": str,
     "lease_ms": duration >= 1}
    {"op": "unlock", "group": str, "topic_id": u32, "queue": u32, "consumer": str, "epoch": u64}
    {"op": "commit_fenced", ... as commit_offsets ..., "epoch": u64}
    {"op": "redrive", "now_ms": time, "group": str, "topic_id": u32, "dlq_topic_id": u32,
     "queues": [u32, ...] (distinct), "max": 1..10000}

Validation is strict, because a command that one replica accepts and another rejects would fork
the queue group: unknown fields are rejected, ``true`` is not an integer, integers must be in range,
``producer_id`` and ``sequence`` come together, lists (``batches``, ``messages``, ``offsets``) are
non-empty (``retain.queues`` may be empty), ``value_b64`` is standard base64 with padding,
names (``producer_id``, ``group``, ``consumer``, ``topic``) are 1..255 UTF-8 bytes, and a
``retain`` names each queue once. Optional fields are absent or null.

The leader should run :func:`decode` on a command before proposing it, to answer a bad request at
once; the state machine decodes again and turns a :class:`BadCommand` into an error result.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypedDict

import orjson

from raftmq.storage.keys import MAX_U32, MAX_U64
from raftmq.storage.records import NewMessage

from . import errors
from .errors import ErrorCode
from .producers import ExpireProducersCommand, decode_expire_producers
from .segments import SealSegmentCommand, decode_seal_segment

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
    "validate",
]

VERSION = 1

# ONLY ADD TO THE END. An op name is part of the replicated log format: never rename or reuse one.
OPS: tuple[str, ...] = (
    "noop",
    "produce",
    "commit_offsets",
    "retain",
    "drop_topic",
    "subscribe",
    "receive",
    "ack",
    "nack",
    "extend",
    "deliver_tick",
    "lock",
    "unlock",
    "commit_fenced",
    "redrive",
    "seal_segment",  # cluster/segments.py
    "expire_producers",  # cluster/producers.py
)

MAX_NAME_BYTES = 255
"""Longest ``producer_id``, consumer ``group`` or ``consumer``, in UTF-8 bytes."""
MAX_TIME_MS = 2**62
"""Largest point in time (ms since the epoch) a command may carry: sums with durations fit u64."""
MAX_DURATION_MS = 2**40
"""Largest duration (ms; about 35 years) a command may carry."""
MAX_RECEIVE = 10_000
"""Most messages one ``receive`` or ``redrive`` hands out (per queue for redrive)."""
MAX_RECEIPTS = 10_000
"""Most receipts in one ``ack``, ``nack`` or ``extend``."""
MAX_TICK_ITEMS = 100_000
"""Largest ``max`` of a ``deliver_tick``."""
MAX_BACKOFF_LEVELS = 64


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
    """A decoded produce batch; messages are normalized to :class:`NewMessage` (with
    ``expires_at_ms`` = (``deliver_at_ms`` or ``now_ms``) + ``ttl_ms``). ``deliver_at_ms`` is None
    when no message of the batch is delayed, else one entry per message (None: not delayed)."""

    topic_id: int
    queue: int
    producer_id: str | None
    sequence: int | None
    messages: list[NewMessage]
    deliver_at_ms: list[int | None] | None


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


class SubscribeCommand(TypedDict):
    v: int
    op: Literal["subscribe"]
    group: str
    topic_id: int
    topic: str
    dlq_topic_id: int | None
    max_deliveries: int
    backoff_ms: list[int]
    overwrite: bool


class ReceiveCommand(TypedDict):
    v: int
    op: Literal["receive"]
    now_ms: int
    group: str
    topic_id: int
    queues: list[int]
    max: int
    visibility_ms: int
    epoch: int | None
    max_age_ms: int | None


class Receipt(NamedTuple):
    queue: int
    offset: int
    token: int


class ReceiptsCommand(TypedDict):
    """``ack``, ``nack`` and ``extend``; ``delay_ms`` is only set for nack, ``visibility_ms``
    only for extend (0 otherwise)."""

    v: int
    op: Literal["ack", "nack", "extend"]
    now_ms: int
    group: str
    topic_id: int
    receipts: list[Receipt]
    epoch: int | None
    delay_ms: int | None
    visibility_ms: int


class DeliverTickCommand(TypedDict):
    v: int
    op: Literal["deliver_tick"]
    now_ms: int
    max: int


class LockCommand(TypedDict):
    v: int
    op: Literal["lock"]
    now_ms: int
    group: str
    topic_id: int
    queue: int
    consumer: str
    lease_ms: int


class UnlockCommand(TypedDict):
    v: int
    op: Literal["unlock"]
    group: str
    topic_id: int
    queue: int
    consumer: str
    epoch: int


class CommitFencedCommand(TypedDict):
    v: int
    op: Literal["commit_fenced"]
    group: str
    topic_id: int
    offsets: dict[int, int]
    epoch: int


class RedriveCommand(TypedDict):
    v: int
    op: Literal["redrive"]
    now_ms: int
    group: str
    topic_id: int
    dlq_topic_id: int
    queues: list[int]
    max: int


Command = (
    ProduceCommand
    | CommitOffsetsCommand
    | RetainCommand
    | DropTopicCommand
    | NoopCommand
    | SubscribeCommand
    | ReceiveCommand
    | ReceiptsCommand
    | DeliverTickCommand
    | LockCommand
    | UnlockCommand
    | CommitFencedCommand
    | RedriveCommand
    | SealSegmentCommand
    | ExpireProducersCommand
)


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


def _command(op: str, **fields: Any) -> bytes:
    """A command of ``op``; fields that are None are left out (absent = null = not given)."""
    return orjson.dumps({"v": VERSION, "op": op, **{k: v for k, v in fields.items() if v is not None}})


def subscribe(
    group: str,
    topic_id: int,
    topic: str,
    dlq_topic_id: int | None,
    max_deliveries: int,
    backoff_ms: Sequence[int],
    *,
    overwrite: bool = False,
) -> bytes:
    """Store the subscription settings of ``group`` on ``topic_id``. Without ``overwrite`` an
    existing subscription keeps its ``max_deliveries`` and ``backoff_ms``."""
    return _command(
        "subscribe",
        group=group,
        topic_id=topic_id,
        topic=topic,
        dlq_topic_id=dlq_topic_id,
        max_deliveries=max_deliveries,
        backoff_ms=list(backoff_ms),
        overwrite=overwrite,
    )


def receive(
    now_ms: int,
    group: str,
    topic_id: int,
    queues: Sequence[int],
    max_messages: int,
    visibility_ms: int,
    *,
    epoch: int | None = None,
    max_age_ms: int | None = None,
) -> bytes:
    """Hand out up to ``max_messages`` messages of ``queues`` (due retries first)."""
    return _command(
        "receive",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        queues=list(queues),
        max=max_messages,
        visibility_ms=visibility_ms,
        epoch=epoch,
        max_age_ms=max_age_ms,
    )


def _wire_receipts(receipts: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    return [[queue, offset, token] for queue, offset, token in receipts]


def ack(
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    *,
    epoch: int | None = None,
) -> bytes:
    """Finish the messages of ``receipts`` (``(queue, offset, token)``)."""
    return _command(
        "ack", now_ms=now_ms, group=group, topic_id=topic_id, receipts=_wire_receipts(receipts), epoch=epoch
    )


def nack(
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    *,
    delay_ms: int | None = None,
    epoch: int | None = None,
) -> bytes:
    """Give the messages back for a retry after ``delay_ms`` (default: the backoff schedule)."""
    return _command(
        "nack",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        receipts=_wire_receipts(receipts),
        delay_ms=delay_ms,
        epoch=epoch,
    )


def extend(
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    visibility_ms: int,
    *,
    epoch: int | None = None,
) -> bytes:
    """Move the visibility deadline of the messages to ``now_ms + visibility_ms``."""
    return _command(
        "extend",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        receipts=_wire_receipts(receipts),
        visibility_ms=visibility_ms,
        epoch=epoch,
    )


def deliver_tick(now_ms: int, max_items: int) -> bytes:
    """Release due delayed messages and expire in-flight deadlines, at most ``max_items`` each."""
    return _command("deliver_tick", now_ms=now_ms, max=max_items)


def lock(now_ms: int, group: str, topic_id: int, queue: int, consumer: str, lease_ms: int) -> bytes:
    """Acquire or renew the exclusive lock of a queue for ``consumer`` of ``group``."""
    return _command(
        "lock",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        queue=queue,
        consumer=consumer,
        lease_ms=lease_ms,
    )


def unlock(group: str, topic_id: int, queue: int, consumer: str, epoch: int) -> bytes:
    """Release the lock if ``consumer`` holds it with ``epoch``."""
    return _command("unlock", group=group, topic_id=topic_id, queue=queue, consumer=consumer, epoch=epoch)


def commit_fenced(group: str, topic_id: int, offsets: Mapping[int, int], epoch: int) -> bytes:
    """Like :func:`commit_offsets`, refused unless every queue's lock has ``epoch``."""
    wire_offsets = {str(queue): offset for queue, offset in offsets.items()}
    return _command("commit_fenced", group=group, topic_id=topic_id, offsets=wire_offsets, epoch=epoch)


def redrive(
    now_ms: int, group: str, topic_id: int, dlq_topic_id: int, queues: Sequence[int], max_messages: int
) -> bytes:
    """Move up to ``max_messages`` dead letters per queue back to the source topic."""
    return _command(
        "redrive",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        dlq_topic_id=dlq_topic_id,
        queues=list(queues),
        max=max_messages,
    )


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
    return validate(obj)


def validate(obj: Any) -> Command:
    """:func:`decode` for a command already parsed from JSON (e.g. built by the leader, to check it
    before proposing it without encoding it first).

    Raises:
        BadCommand: ``obj`` is not a valid command (``bad_request``).
    """
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
    if op == "seal_segment":
        return decode_seal_segment(obj)
    if op == "expire_producers":
        return decode_expire_producers(obj)
    decoder = _DELIVERY_DECODERS.get(op) if type(op) is str else None
    if decoder is not None:
        return decoder(obj)
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


# -- receive/ack, delayed messages, locks ---------------------------------------------------------


def _optional_time(obj: dict[str, Any], name: str, where: str) -> int | None:
    return None if obj.get(name) is None else _uint(obj, name, MAX_TIME_MS, where)


def _optional_duration(obj: dict[str, Any], name: str, where: str) -> int | None:
    return None if obj.get(name) is None else _uint(obj, name, MAX_DURATION_MS, where)


def _positive(obj: dict[str, Any], name: str, max_value: int) -> int:
    value = _uint(obj, name, max_value, "")
    if value < 1:
        raise _bad(f"{name}: expected an integer in [1, {max_value}], got 0")
    return value


def _queue_list(obj: dict[str, Any], name: str) -> list[int]:
    raw = _list(obj, name, "")
    if len(raw) > MAX_RECEIVE:
        raise _bad(f"{name}: more than {MAX_RECEIVE} queues")
    queues = [_uint({"q": q}, "q", MAX_U32, f"{name}[{i}].") for i, q in enumerate(raw)]
    if len(set(queues)) != len(queues):
        raise _bad(f"{name}: a queue is named twice")
    return queues


def _object(obj: dict[str, Any], allowed: set[str]) -> None:
    _fields(obj, "command", {"v", "op", *allowed})


def _subscribe(obj: dict[str, Any]) -> SubscribeCommand:
    _object(obj, {"group", "topic_id", "topic", "dlq_topic_id", "max_deliveries", "backoff_ms", "overwrite"})
    backoff = _list(obj, "backoff_ms", "")
    if len(backoff) > MAX_BACKOFF_LEVELS:
        raise _bad(f"backoff_ms: more than {MAX_BACKOFF_LEVELS} levels")
    overwrite = obj.get("overwrite", False)
    if type(overwrite) is not bool:
        raise _bad("overwrite: expected true or false")
    dlq = obj.get("dlq_topic_id")
    return {
        "v": VERSION,
        "op": "subscribe",
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "topic": _name(obj, "topic", ""),
        "dlq_topic_id": None if dlq is None else _uint(obj, "dlq_topic_id", MAX_U32, ""),
        "max_deliveries": _positive(obj, "max_deliveries", MAX_U32),
        "backoff_ms": [
            _uint({"b": b}, "b", MAX_DURATION_MS, f"backoff_ms[{i}].") for i, b in enumerate(backoff)
        ],
        "overwrite": overwrite,
    }


def _receive(obj: dict[str, Any]) -> ReceiveCommand:
    _object(obj, {"now_ms", "group", "topic_id", "queues", "max", "visibility_ms", "epoch", "max_age_ms"})
    return {
        "v": VERSION,
        "op": "receive",
        "now_ms": _uint(obj, "now_ms", MAX_TIME_MS, ""),
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "queues": _queue_list(obj, "queues"),
        "max": _positive(obj, "max", MAX_RECEIVE),
        "visibility_ms": _positive(obj, "visibility_ms", MAX_DURATION_MS),
        "epoch": _optional_uint(obj, "epoch", ""),
        "max_age_ms": _optional_duration(obj, "max_age_ms", ""),
    }


_tuple_new = tuple.__new__


def _receipts_command(obj: dict[str, Any]) -> ReceiptsCommand:
    op = obj["op"]
    extra = {"delay_ms"} if op == "nack" else {"visibility_ms"} if op == "extend" else set()
    _object(obj, {"now_ms", "group", "topic_id", "receipts", "epoch", *extra})
    raw = _list(obj, "receipts", "")
    if len(raw) > MAX_RECEIPTS:
        raise _bad(f"receipts: more than {MAX_RECEIPTS}")
    receipts = []
    for i, r in enumerate(raw):
        # The common case checked inline (this runs for every receipt on every replica); the
        # field-by-field checks below only name what is wrong.
        if type(r) is list and len(r) == 3:
            queue, offset, token = r
            if (
                type(queue) is int
                and type(offset) is int
                and type(token) is int
                and 0 <= queue <= MAX_U32
                and 0 <= offset <= MAX_U64
                and 0 <= token <= MAX_U64
            ):
                receipts.append(_tuple_new(Receipt, r))  # Receipt(*r) without its Python __new__
                continue
        if type(r) is not list or len(r) != 3:
            raise _bad(f"receipts[{i}]: expected [queue, offset, token]")
        fields = dict(zip(("queue", "offset", "token"), r, strict=True))
        receipts.append(
            Receipt(
                _uint(fields, "queue", MAX_U32, f"receipts[{i}]."),
                _uint(fields, "offset", MAX_U64, f"receipts[{i}]."),
                _uint(fields, "token", MAX_U64, f"receipts[{i}]."),
            )
        )
    return {
        "v": VERSION,
        "op": op,
        "now_ms": _uint(obj, "now_ms", MAX_TIME_MS, ""),
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "receipts": receipts,
        "epoch": _optional_uint(obj, "epoch", ""),
        "delay_ms": _optional_duration(obj, "delay_ms", "") if op == "nack" else None,
        "visibility_ms": _positive(obj, "visibility_ms", MAX_DURATION_MS) if op == "extend" else 0,
    }


def _deliver_tick(obj: dict[str, Any]) -> DeliverTickCommand:
    _object(obj, {"now_ms", "max"})
    return {
        "v": VERSION,
        "op": "deliver_tick",
        "now_ms": _uint(obj, "now_ms", MAX_TIME_MS, ""),
        "max": _positive(obj, "max", MAX_TICK_ITEMS),
    }


def _lock(obj: dict[str, Any]) -> LockCommand:
    _object(obj, {"now_ms", "group", "topic_id", "queue", "consumer", "lease_ms"})
    return {
        "v": VERSION,
        "op": "lock",
        "now_ms": _uint(obj, "now_ms", MAX_TIME_MS, ""),
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "queue": _uint(obj, "queue", MAX_U32, ""),
        "consumer": _name(obj, "consumer", ""),
        "lease_ms": _positive(obj, "lease_ms", MAX_DURATION_MS),
    }


def _unlock(obj: dict[str, Any]) -> UnlockCommand:
    _object(obj, {"group", "topic_id", "queue", "consumer", "epoch"})
    return {
        "v": VERSION,
        "op": "unlock",
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "queue": _uint(obj, "queue", MAX_U32, ""),
        "consumer": _name(obj, "consumer", ""),
        "epoch": _uint(obj, "epoch", MAX_U64, ""),
    }


def _commit_fenced(obj: dict[str, Any]) -> CommitFencedCommand:
    _object(obj, {"group", "topic_id", "offsets", "epoch"})
    epoch = _uint(obj, "epoch", MAX_U64, "")
    plain = _commit_offsets({k: v for k, v in obj.items() if k != "epoch"})
    return {
        "v": VERSION,
        "op": "commit_fenced",
        "group": plain["group"],
        "topic_id": plain["topic_id"],
        "offsets": plain["offsets"],
        "epoch": epoch,
    }


def _redrive(obj: dict[str, Any]) -> RedriveCommand:
    _object(obj, {"now_ms", "group", "topic_id", "dlq_topic_id", "queues", "max"})
    return {
        "v": VERSION,
        "op": "redrive",
        "now_ms": _uint(obj, "now_ms", MAX_TIME_MS, ""),
        "group": _name(obj, "group", ""),
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "dlq_topic_id": _uint(obj, "dlq_topic_id", MAX_U32, ""),
        "queues": _queue_list(obj, "queues"),
        "max": _positive(obj, "max", MAX_RECEIVE),
    }


_DELIVERY_DECODERS: dict[str, Callable[[dict[str, Any]], Command]] = {
    "subscribe": _subscribe,
    "receive": _receive,
    "ack": _receipts_command,
    "nack": _receipts_command,
    "extend": _receipts_command,
    "deliver_tick": _deliver_tick,
    "lock": _lock,
    "unlock": _unlock,
    "commit_fenced": _commit_fenced,
    "redrive": _redrive,
}
