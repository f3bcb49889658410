"""Queue-group commands: the bytes carried by each Raft entry of a queue group.

A command is an orjson object ``{"v": 1, "op": <op>, ...}``, except ``append``: binary record
batches (format v2), first byte 0xA2 (``cluster/commands/append.py``). Commands are the replicated log
format: every replica, today and after an upgrade, must read old entries the same way. So op names
are never renamed or reused (see :data:`OPS`) and fields are never reinterpreted.

Produced messages are written as ``append``. ``produce`` is the JSON form of releases before
binary appends: a leader writes it only while a voter of its group cannot read record-batch format
2, or for a peer of such a release (``cluster/replication/upgrade.py``); both apply through the
same steps (``cluster/machines/append.py``), and logs holding it replay as before.

Wire shapes (``v`` is always 1; every listed field is required unless marked ``?``)::

    {"op": "noop"}
    {"op": "produce", "now_ms": u64, "batches": [
        {"topic_id": u32, "queue": u32, "producer_id"?: str, "sequence"?: u64,
         "messages": [{"value": str} | {"value_b64": str}, "key"?: str, "headers"?: {str: str},
                      "deliver_at_ms"?: time, "ttl_ms"?: duration]}]}
    {"op": "commit_offsets", "group": str, "topic_id": u32, "offsets": {"<queue>": u64},
     "advance"?: bool}
    {"op": "retain", "now_ms": u64, "queues": [
        {"topic_id": u32, "queue": u32, "max_age_ms"?: u64 | null, "max_bytes"?: u64 | null}],
     "max_jump_ms"?: duration, "max_batches"?: u32 >= 1}
    {"op": "drop_topic", "topic_id": u32}

Receive/ack, delayed messages and locks (``cluster/machines/delivery/__init__.py``, ``docs/delivery.md``); a
receipt is ``[queue u32, offset u64, token u64]``; ``time`` is a u64 up to 2**62 and ``duration`` a u64 up
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
    {"op": "touch_subscriptions", "now_ms": time, "groups": [[u32 topic_id, str group], ...]
     (distinct, 1..1000)}
    {"op": "receive_ordered", ... as receive ..., "delay_ms"?: duration}  (a message's key is its
     message group; delay_ms: first handed out no earlier than its timestamp plus delay_ms)
    {"op": "ack_receive", "now_ms": time, "group": str, "topic_id": u32, "receipts": [receipt, ...],
     "queues": [u32, ...] (distinct), "max": 1..10000, "visibility_ms": duration >= 1,
     "max_age_ms"?: duration}  (an ack, then a receive without epoch, in one entry)
    {"op": "release", ... as ack without epoch ...}  (visible again at once, one delivery less)

Deduplicated appends (``cluster/commands/dedup.py``, ``cluster/machines/dedup.py``)::

    {"op": "dedup_produce", "now_ms": time, "topic_id": u32, "queue": u32, "messages": [
        {... a produce message without deliver_at_ms ..., "dedup": str, "id": str}, ...] (1..100)}

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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.commands.append import (
    AppendBatch,
    AppendCommand,
    AppendItem,
    TakeAlong,
    append,
    decode_append,
    has_take,
    is_append,
    split_append,
)
from raftmq.cluster.commands.dedup import (
    MAX_DEDUP_BYTES,
    MAX_DEDUP_MESSAGES,
    DedupMessage,
    DedupProduceCommand,
    decode_dedup_produce,
    dedup_produce,
)

# Each op family lives in a module of cluster/commands/; its public names are importable from here.
from raftmq.cluster.commands.delivery import (
    _DELIVERY_DECODERS,
    MAX_TOUCH_GROUPS,
    ack,
    ack_receive,
    commit_fenced,
    deliver_tick,
    expire_subscriptions,
    extend,
    lock,
    nack,
    receive,
    redrive,
    release,
    subscribe,
    touch_subscriptions,
    unlock,
)
from raftmq.cluster.commands.fields import _fields, _uint
from raftmq.cluster.commands.produce import _commit_offsets, _produce, _retain
from raftmq.cluster.commands.producers import decode_expire_producers
from raftmq.cluster.commands.segments import decode_seal_segment
from raftmq.cluster.commands.shapes import (
    MAX_BACKOFF_LEVELS,
    MAX_DURATION_MS,
    MAX_NAME_BYTES,
    MAX_RECEIPTS,
    MAX_RECEIVE,
    MAX_TICK_ITEMS,
    MAX_TIME_MS,
    VERSION,
    AckReceiveCommand,
    BadCommand,
    Command,
    CommitFencedCommand,
    CommitOffsetsCommand,
    DeliverTickCommand,
    DropTopicCommand,
    ExpireSubscriptionsCommand,
    LockCommand,
    NoopCommand,
    ProduceBatch,
    ProduceCommand,
    Receipt,
    ReceiptsCommand,
    ReceiveCommand,
    RedriveCommand,
    RetainCommand,
    RetainQueue,
    SubscribeCommand,
    TouchSubscriptionsCommand,
    UnlockCommand,
)
from raftmq.storage.keys import MAX_U32

__all__ = [
    "FIELD_LEVELS",
    "MAX_BACKOFF_LEVELS",
    "MAX_DEDUP_BYTES",
    "MAX_DEDUP_MESSAGES",
    "MAX_DURATION_MS",
    "MAX_NAME_BYTES",
    "MAX_RECEIPTS",
    "MAX_RECEIVE",
    "MAX_TICK_ITEMS",
    "MAX_TIME_MS",
    "MAX_TOUCH_GROUPS",
    "OPS",
    "VERSION",
    "AckReceiveCommand",
    "AppendBatch",
    "AppendCommand",
    "AppendItem",
    "BadCommand",
    "Command",
    "CommitFencedCommand",
    "CommitOffsetsCommand",
    "DedupMessage",
    "DedupProduceCommand",
    "DeliverTickCommand",
    "DropTopicCommand",
    "ExpireSubscriptionsCommand",
    "LockCommand",
    "NoopCommand",
    "ProduceBatch",
    "ProduceCommand",
    "Receipt",
    "ReceiptsCommand",
    "ReceiveCommand",
    "RedriveCommand",
    "RetainCommand",
    "RetainQueue",
    "SubscribeCommand",
    "TakeAlong",
    "TouchSubscriptionsCommand",
    "UnlockCommand",
    "ack",
    "ack_receive",
    "append",
    "commit_fenced",
    "commit_offsets",
    "decode",
    "decode_stamped",
    "dedup_produce",
    "deliver_tick",
    "drop_topic",
    "expire_subscriptions",
    "extend",
    "has_take",
    "lock",
    "nack",
    "noop",
    "produce",
    "receive",
    "redrive",
    "release",
    "retain",
    "split_append",
    "subscribe",
    "touch_subscriptions",
    "unlock",
    "validate",
]


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
    "seal_segment",  # cluster/machines/segments.py
    "expire_producers",  # cluster/machines/producers.py
    "append",  # binary, not JSON: cluster/commands/append.py
    "expire_subscriptions",  # cluster/machines/delivery/expiry.py
    "touch_subscriptions",  # cluster/machines/delivery/expiry.py
    "dedup_produce",  # cluster/commands/dedup.py, cluster/machines/dedup.py
    "receive_ordered",  # cluster/machines/delivery/ordered.py (as receive, one message group at a time)
    "ack_receive",  # cluster/machines/delivery/__init__.py (an ack and a receive in one entry)
    "release",  # cluster/machines/delivery/__init__.py (a read-ahead given back uncounted)
)

# Fields added to an op after it shipped, named ``<op>.<level>`` (ONLY ADD TO THE END). A leader
# writes an op of OPS, or a level's fields, only when every voter of the group advertises it
# (cluster/replication/upgrade.py, docs/operations.md "rolling upgrades"): a replica of an older
# release refuses what it does not know, and the group's replicas would apply different things.
FIELD_LEVELS: tuple[str, ...] = (
    # checked, configured, now_ms, creator, max_topic_groups, max_token_groups (dead-letter records
    # and group limits)
    "subscribe.records",
    # deliver_tick's expiry_backoff: false (an expired delivery comes back at its deadline, issue
    # 21); an older replica refused the field
    "deliver_tick.expiry",
    # commit_offsets' and commit_fenced's advance: true (a queue's offset is stored only if it moves
    # forward, so a delayed copy of an older commit cannot undo a newer one); an older replica
    # refused the field
    "commit_offsets.advance",
    # expire_subscriptions' offset_retention_ms (the offset API's offsets of an unconfigured group
    # expire with it, and its receive/ack state first leaves the record dormant); an older replica
    # refused the field
    "expire_subscriptions.offsets",
    # receive_ordered's delay_ms (an SQS FIFO queue's DelaySeconds: a message is handed out first no
    # earlier than its timestamp plus the delay); an older replica refused the field
    "receive_ordered.delay",
    # expire_producers' max_states (the group's cap on live producer states: an append past it
    # forgets the least recently used); an older replica refused the field
    "expire_producers.max_states",
    # append's take-along (binary version 2: after the batches, a receive for a receive waiting at
    # the leader, cluster/machines/delivery take_along); an older replica refused the version
    "append.take",
)


# -- builders (leader side) -------------------------------------------------------------------


def produce(now_ms: int, batches: Sequence[Mapping[str, Any]]) -> bytes:
    """A produce command appending ``batches`` (wire shape, see the module docstring)."""
    return orjson.dumps({"v": VERSION, "op": "produce", "now_ms": now_ms, "batches": list(batches)})


def commit_offsets(group: str, topic_id: int, offsets: Mapping[int, int], *, advance: bool = False) -> bytes:
    """A command committing consumer group ``group``'s ``{queue: offset}`` on ``topic_id``;
    ``advance``: a queue's offset is stored only if it is above the stored one (a consumer's commit,
    written only once every voter applies ``commit_offsets.advance``), else as given (a rewind)."""
    wire_offsets = {str(queue): offset for queue, offset in offsets.items()}
    body: dict[str, Any] = {
        "v": VERSION,
        "op": "commit_offsets",
        "group": group,
        "topic_id": topic_id,
        "offsets": wire_offsets,
    }
    if advance:
        body["advance"] = True
    return orjson.dumps(body)


def retain(
    now_ms: int,
    queues: Sequence[Mapping[str, Any]],
    *,
    max_jump_ms: int | None = None,
    max_batches: int | None = None,
) -> bytes:
    """A command applying retention; each queue is ``{topic_id, queue, max_age_ms, max_bytes}``.

    ``max_jump_ms``: how far the group's retention clock may move in one step beyond what the
    stamps' own progress allows (``cluster/machines/queue_group.py``); ``max_batches``: the most record
    batches the command removes (the next ``retain`` goes on). None: unbounded, as entries
    written before these fields existed."""
    body: dict[str, Any] = {"v": VERSION, "op": "retain", "now_ms": now_ms, "queues": list(queues)}
    if max_jump_ms is not None:
        body["max_jump_ms"] = max_jump_ms
    if max_batches is not None:
        body["max_batches"] = max_batches
    return orjson.dumps(body)


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
    if is_append(data):
        return decode_append(data)[0]
    try:
        obj = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError) as e:
        raise BadCommand(errors.INVALID_JSON, f"command is not JSON: {e}") from None
    return validate(obj)


def decode_stamped(data: bytes, time_at: Callable[[int], int]) -> tuple[Command, int | None]:
    """:func:`decode` for the state machine: the command's stamp is replaced by
    ``time_at(stamp)``, the group's time it applies at (never lower than the group's applied time,
    bounded above: ``cluster/machines/apply.py``, ``advance``), before the command is validated,
    so what is computed from ``now_ms`` (a TTL's expiry) follows it.

    Returns:
        The command and its ``now_ms`` as stamped (None: the command carries no valid stamp).

    Raises:
        BadCommand: as :func:`decode`.
    """
    if is_append(data):
        command, appended = decode_append(data)
        command["now_ms"] = time_at(appended)
        return command, appended
    try:
        obj = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError) as e:
        raise BadCommand(errors.INVALID_JSON, f"command is not JSON: {e}") from None
    stamped = obj.get("now_ms") if type(obj) is dict else None
    if type(stamped) is not int or not 0 <= stamped <= MAX_TIME_MS:
        return validate(obj), None  # beyond any clock: each op's own range check answers
    obj["now_ms"] = time_at(stamped)
    return validate(obj), stamped


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
    if op == "dedup_produce":
        return decode_dedup_produce(obj)
    decoder = _DELIVERY_DECODERS.get(op) if type(op) is str else None
    if decoder is not None:
        return decoder(obj)
    raise BadCommand(errors.BAD_REQUEST, f"unknown op {op!r}")
