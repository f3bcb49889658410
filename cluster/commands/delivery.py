"""Receive/ack, delayed messages and locks: the builders (leader side) and decoders (every
replica) of those commands (``cluster/commands/__init__.py``, ``docs/delivery.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

import orjson

from raftmq.cluster.commands.fields import (
    _bad,
    _list,
    _name,
    _object,
    _optional_duration,
    _optional_uint,
    _positive,
    _queue_list,
    _uint,
)
from raftmq.cluster.commands.produce import _commit_offsets
from raftmq.cluster.commands.shapes import (
    MAX_BACKOFF_LEVELS,
    MAX_DURATION_MS,
    MAX_RECEIPTS,
    MAX_RECEIVE,
    MAX_TICK_ITEMS,
    MAX_TIME_MS,
    VERSION,
    AckReceiveCommand,
    Command,
    CommitFencedCommand,
    Receipt,
    ReceiptsCommand,
    ReceiveCommand,
    SubscribeCommand,
    TouchSubscriptionsCommand,
)
from raftmq.storage.keys import MAX_U32, MAX_U64


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
    checked: bool = False,
    configured: bool = False,
    now_ms: int | None = None,
    creator: str | None = None,
    max_topic_groups: int | None = None,
    max_token_groups: int | None = None,
) -> bytes:
    """Store the subscription settings of ``group`` on ``topic_id``. Without ``overwrite`` an
    existing subscription keeps its ``max_deliveries`` and ``backoff_ms``; ``overwrite`` (a
    subscription ``PUT``, admin) marks it configured. ``checked``: ``dlq_topic_id`` was read from
    the dead-letter topic's record in the metadata group and replaces the stored one (None
    clears it). ``configured``: made by an admin's receive (as ``overwrite`` marks it).
    ``now_ms``: the subscription is in use (idle unconfigured ones expire).
    ``creator``, ``max_topic_groups``, ``max_token_groups``: a new subscription is refused
    (``too_many_groups``) when the topic, or ``creator``'s token, already has that many."""
    return _command(
        "subscribe",
        group=group,
        topic_id=topic_id,
        topic=topic,
        dlq_topic_id=dlq_topic_id,
        max_deliveries=max_deliveries,
        backoff_ms=list(backoff_ms),
        overwrite=overwrite,
        checked=checked or None,
        configured=configured or None,
        now_ms=now_ms,
        creator=creator,
        max_topic_groups=max_topic_groups,
        max_token_groups=max_token_groups,
    )


def expire_subscriptions(
    now_ms: int, idle_ms: int, max_items: int, *, offset_retention_ms: int | None = None
) -> bytes:
    """Drop unconfigured subscriptions not used for ``idle_ms`` with their receive/ack state
    (``cluster/machines/delivery/expiry.py``); at most ``max_items`` subscriptions per command.
    ``offset_retention_ms``: the offsets the offset API wrote go too, with their group, once it is
    unused this long (written only once every voter applies ``expire_subscriptions.offsets``);
    None: they stay, as before the field."""
    return _command(
        "expire_subscriptions",
        now_ms=now_ms,
        idle_ms=idle_ms,
        max=max_items,
        offset_retention_ms=offset_retention_ms,
    )


MAX_TOUCH_GROUPS = 1000
"""Most groups one ``touch_subscriptions`` names (a leader with more sends several)."""


def touch_subscriptions(now_ms: int, groups: Sequence[tuple[int, str]]) -> bytes:
    """Mark the stored unconfigured subscriptions of ``groups`` (``(topic_id, group)``, each once,
    1 to :data:`MAX_TOUCH_GROUPS`) used at ``now_ms``: consumer groups with a live member, whose
    offsets must not expire while it is idle (``cluster/machines/delivery/expiry.py``). Creates
    nothing."""
    return _command("touch_subscriptions", now_ms=now_ms, groups=[[t, g] for t, g in groups])


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
    ordered: bool = False,
    delay_ms: int | None = None,
) -> bytes:
    """Hand out up to ``max_messages`` messages of ``queues`` (due retries first); ``ordered``:
    ``receive_ordered``, a message's key being its message group (``delivery/ordered.py``), and
    ``delay_ms`` (ordered only; the field level ``receive_ordered.delay``): a message is handed out
    first no earlier than its timestamp plus ``delay_ms`` (an SQS FIFO queue's DelaySeconds)."""
    if delay_ms is not None and not ordered:
        raise ValueError("delay_ms is a field of receive_ordered only")
    return _command(
        "receive_ordered" if ordered else "receive",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        queues=list(queues),
        max=max_messages,
        visibility_ms=visibility_ms,
        epoch=epoch,
        max_age_ms=max_age_ms,
        delay_ms=delay_ms,
    )


def _with_receipts(
    op: str,
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    epoch: int | None,
    **extra: int | None,
) -> bytes:
    """An ack, nack or extend: ``receipts`` as ``[queue, offset, token]``, then ``extra``, then ``epoch``."""
    wire = [[queue, offset, token] for queue, offset, token in receipts]
    return _command(op, now_ms=now_ms, group=group, topic_id=topic_id, receipts=wire, **extra, epoch=epoch)


def ack(
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    *,
    epoch: int | None = None,
) -> bytes:
    """Finish the messages of ``receipts`` (``(queue, offset, token)``)."""
    return _with_receipts("ack", now_ms, group, topic_id, receipts, epoch)


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
    return _with_receipts("nack", now_ms, group, topic_id, receipts, epoch, delay_ms=delay_ms)


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
    return _with_receipts("extend", now_ms, group, topic_id, receipts, epoch, visibility_ms=visibility_ms)


def release(now_ms: int, group: str, topic_id: int, receipts: Sequence[tuple[int, int, int]]) -> bytes:
    """Give the messages of ``receipts`` back as if that delivery never happened: visible again at
    once, their delivery count one less (a node's read-ahead nobody received, ``delivery/__init__.py``)."""
    return _with_receipts("release", now_ms, group, topic_id, receipts, None)


def ack_receive(
    now_ms: int,
    group: str,
    topic_id: int,
    receipts: Sequence[tuple[int, int, int]],
    queues: Sequence[int],
    max_messages: int,
    visibility_ms: int,
    *,
    max_age_ms: int | None = None,
) -> bytes:
    """The ``ack`` of ``receipts`` and then a ``receive`` of up to ``max_messages`` from ``queues``
    (no epoch), in one entry: a delete that takes its receiver's next messages along."""
    wire = [[queue, offset, token] for queue, offset, token in receipts]
    return _command(
        "ack_receive",
        now_ms=now_ms,
        group=group,
        topic_id=topic_id,
        receipts=wire,
        queues=list(queues),
        max=max_messages,
        visibility_ms=visibility_ms,
        max_age_ms=max_age_ms,
    )


def deliver_tick(now_ms: int, max_items: int, *, expiry_backoff: bool = False) -> bytes:
    """Release due delayed messages and expire in-flight deadlines, at most ``max_items`` each.

    An expired delivery is available again at once; ``expiry_backoff`` makes it wait its group's
    backoff first, as releases before issue 21 did. That older rule is the command without the
    field (which older replicas refuse), so a replayed old entry applies as it did."""
    if expiry_backoff:
        return _command("deliver_tick", now_ms=now_ms, max=max_items)
    return _command("deliver_tick", now_ms=now_ms, max=max_items, expiry_backoff=False)


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


def commit_fenced(
    group: str, topic_id: int, offsets: Mapping[int, int], epoch: int, *, advance: bool = False
) -> bytes:
    """Like :func:`commit_offsets`, refused unless every queue's lock has ``epoch``."""
    wire_offsets = {str(queue): offset for queue, offset in offsets.items()}
    fields = {"group": group, "topic_id": topic_id, "offsets": wire_offsets, "epoch": epoch}
    return _command("commit_fenced", **fields, advance=advance or None)


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


# -- decoding -----------------------------------------------------------------------------------


def _subscribe(obj: dict[str, Any]) -> SubscribeCommand:
    _object(obj, _SUBSCRIBE_FIELDS)
    backoff = _list(obj, "backoff_ms", "")
    if len(backoff) > MAX_BACKOFF_LEVELS:
        raise _bad(f"backoff_ms: more than {MAX_BACKOFF_LEVELS} levels")
    overwrite = obj.get("overwrite", False)
    if type(overwrite) is not bool:
        raise _bad("overwrite: expected true or false")
    dlq = obj.get("dlq_topic_id")
    checked, configured = obj.get("checked", False), obj.get("configured", False)
    if type(checked) is not bool or type(configured) is not bool:
        raise _bad("checked, configured: expected true or false")
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
        "checked": checked,
        "configured": configured,
        "now_ms": None if obj.get("now_ms") is None else _time(obj, "now_ms"),
        "creator": None if obj.get("creator") is None else _name(obj, "creator", ""),
        "max_topic_groups": _optional_uint(obj, "max_topic_groups", ""),
        "max_token_groups": _optional_uint(obj, "max_token_groups", ""),
    }


_SUBSCRIBE_FIELDS = {
    "group",
    "topic_id",
    "topic",
    "dlq_topic_id",
    "max_deliveries",
    "backoff_ms",
    "overwrite",
    # Since dead-letter records and group limits (issue 19); absent in older entries.
    "checked",
    "configured",
    "now_ms",
    "creator",
    "max_topic_groups",
    "max_token_groups",
}


def _touch_subscriptions(obj: dict[str, Any]) -> TouchSubscriptionsCommand:
    _object(obj, {"now_ms", "groups"})
    raw = _list(obj, "groups", "")
    if len(raw) > MAX_TOUCH_GROUPS:
        raise _bad(f"groups: more than {MAX_TOUCH_GROUPS}")
    groups: list[tuple[int, str]] = []
    for i, item in enumerate(raw):
        if type(item) is not list or len(item) != 2:
            raise _bad(f"groups[{i}]: expected [topic_id, group]")
        pair = {"topic_id": item[0], "group": item[1]}
        groups.append(
            (_uint(pair, "topic_id", MAX_U32, f"groups[{i}]."), _name(pair, "group", f"groups[{i}]."))
        )
    if len(set(groups)) != len(groups):
        raise _bad("groups: a group is named twice")
    return {"v": VERSION, "op": "touch_subscriptions", "now_ms": _time(obj, "now_ms"), "groups": groups}


_tuple_new = tuple.__new__


def _receipts_command(obj: dict[str, Any]) -> ReceiptsCommand:
    op = obj["op"]
    extra = {"delay_ms"} if op == "nack" else {"visibility_ms"} if op == "extend" else set()
    # A release is never fenced (the machine does not check an epoch for it): one is refused.
    fence = set() if op == "release" else {"epoch"}
    _object(obj, {"now_ms", "group", "topic_id", "receipts", *fence, *extra})
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


def _ack_receive(obj: dict[str, Any]) -> AckReceiveCommand:
    _object(obj, {"now_ms", "group", "topic_id", "receipts", "queues", "max", "visibility_ms", "max_age_ms"})
    acked = _receipts_command(
        {k: obj[k] for k in ("op", "now_ms", "group", "topic_id", "receipts") if k in obj}
    )
    fields = {k: v for k, v in obj.items() if k != "receipts"}
    received = cast(ReceiveCommand, _plain(fields | {"op": "receive"}))
    return {
        "v": VERSION,
        "op": "ack_receive",
        "now_ms": acked["now_ms"],
        "group": acked["group"],
        "topic_id": acked["topic_id"],
        "receipts": acked["receipts"],
        "queues": received["queues"],
        "max": received["max"],
        "visibility_ms": received["visibility_ms"],
        "max_age_ms": received["max_age_ms"],
    }


def _commit_fenced(obj: dict[str, Any]) -> CommitFencedCommand:
    _object(obj, {"group", "topic_id", "offsets", "epoch", "advance"})
    epoch = _uint(obj, "epoch", MAX_U64, "")
    plain = _commit_offsets({k: v for k, v in obj.items() if k != "epoch"})
    return {
        "v": VERSION,
        "op": "commit_fenced",
        "group": plain["group"],
        "topic_id": plain["topic_id"],
        "offsets": plain["offsets"],
        "epoch": epoch,
        "advance": plain["advance"],
    }


# The ops whose fields are plain values: each field's reader, in the order the fields are checked
# (the first bad one is the error). Such an op has exactly these fields (besides "v" and "op").
_Reader = Callable[[dict[str, Any], str], Any]


_time = partial(_uint, max_value=MAX_TIME_MS, where="")
_u32 = partial(_uint, max_value=MAX_U32, where="")
_u64 = partial(_uint, max_value=MAX_U64, where="")
_text = partial(_name, where="")
_u64_or_none = partial(_optional_uint, where="")
_duration_or_none = partial(_optional_duration, where="")


def _flag_or_true(obj: dict[str, Any], name: str) -> bool:
    """An optional boolean, true when absent (the command as written before the field existed)."""
    value = obj.get(name, True)
    if type(value) is not bool:
        raise _bad(f"{name}: expected true or false, got {value!r}")
    return value


def _one_to(max_value: int) -> _Reader:
    return partial(_positive, max_value=max_value)


def _positive_or_none(obj: dict[str, Any], name: str) -> int | None:
    """An optional duration of at least 1 ms (absent or null: None)."""
    return None if obj.get(name) is None else _positive(obj, name, MAX_DURATION_MS)


_PLAIN_FIELDS: dict[str, dict[str, _Reader]] = {
    "receive": {
        "now_ms": _time,
        "group": _text,
        "topic_id": _u32,
        "queues": _queue_list,
        "max": _one_to(MAX_RECEIVE),
        "visibility_ms": _one_to(MAX_DURATION_MS),
        "epoch": _u64_or_none,
        "max_age_ms": _duration_or_none,
    },
    "deliver_tick": {"now_ms": _time, "max": _one_to(MAX_TICK_ITEMS), "expiry_backoff": _flag_or_true},
    "expire_subscriptions": {
        "now_ms": _time,
        "idle_ms": _one_to(MAX_DURATION_MS),
        "max": _one_to(MAX_TICK_ITEMS),
        "offset_retention_ms": _positive_or_none,
    },
    "lock": {
        "now_ms": _time,
        "group": _text,
        "topic_id": _u32,
        "queue": _u32,
        "consumer": _text,
        "lease_ms": _one_to(MAX_DURATION_MS),
    },
    "unlock": {"group": _text, "topic_id": _u32, "queue": _u32, "consumer": _text, "epoch": _u64},
    "redrive": {
        "now_ms": _time,
        "group": _text,
        "topic_id": _u32,
        "dlq_topic_id": _u32,
        "queues": _queue_list,
        "max": _one_to(MAX_RECEIVE),
    },
}
# delay_ms: the field level receive_ordered.delay (absent in the entries written before it).
_PLAIN_FIELDS["receive_ordered"] = {**_PLAIN_FIELDS["receive"], "delay_ms": _duration_or_none}
_PLAIN_ALLOWED = {op: set(fields) for op, fields in _PLAIN_FIELDS.items()}


def _plain(obj: dict[str, Any]) -> Command:
    """A receive, deliver_tick, lock, unlock or redrive command (``_PLAIN_FIELDS``)."""
    op = obj["op"]
    _object(obj, _PLAIN_ALLOWED[op])
    decoded: dict[str, Any] = {"v": VERSION, "op": op}
    for name, read in _PLAIN_FIELDS[op].items():
        decoded[name] = read(obj, name)
    return cast(Command, decoded)


_DELIVERY_DECODERS: dict[str, Callable[[dict[str, Any]], Command]] = {
    "subscribe": _subscribe,
    "receive": _plain,
    "receive_ordered": _plain,
    "ack": _receipts_command,
    "nack": _receipts_command,
    "extend": _receipts_command,
    "release": _receipts_command,
    "ack_receive": _ack_receive,
    "deliver_tick": _plain,
    "lock": _plain,
    "unlock": _plain,
    "commit_fenced": _commit_fenced,
    "redrive": _plain,
    "expire_subscriptions": _plain,
    "touch_subscriptions": _touch_subscriptions,
}
