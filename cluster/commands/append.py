"""The binary ``append`` command: record batches (format v2, docs/format.md) carried as bytes.

Unlike every other queue-group command, ``append`` is not JSON: its payload is the producers'
batches verbatim, so no replica builds a Python object per message to replicate or store them::

    command := op u8 (0xA2) | version u8 (1 or 2) | reserved u16 (0) | now_ms u64 | count u32 | item{count}
               [take]  (version 2 only)
    item    := topic_id u32 | queue u32 | batch (its own batch_length says where it ends)
    take    := length u32 | JSON object of length bytes (``delivery.TAKE_FIELDS``)

Version 2 (the field level ``append.take``, written only once every voter applies it) carries a
take-along: after the batches, the apply hands out messages to a receive waiting at the leader
(``cluster/machines/delivery/take_along.py``); a replica of an earlier release refuses it whole.

All integers little-endian, like the batch. The first byte tells it from a JSON command (``{``).
Building it is one ``bytes.join``; decoding is :func:`raftmq.batch.read` per batch (the CRCs and
one vectorised pass over the record table), never a loop over records.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict

import orjson

from raftmq import batch as rb
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.base.limits import MAX_DURATION_MS, MAX_NAME_BYTES, MAX_RECEIVE
from raftmq.storage.keys import MAX_U32, MAX_U64

__all__ = [
    "APPEND_OP",
    "AppendBatch",
    "AppendCommand",
    "AppendItem",
    "TakeAlong",
    "append",
    "decode_append",
    "has_take",
    "is_append",
    "split_append",
]

APPEND_OP = 0xA2
_VERSION = 1
_TAKE_VERSION = 2  # version 1 and a take-along after the batches
_HEAD = struct.Struct("<BBHQI")
_ITEM = struct.Struct("<II")
_LENGTH = struct.Struct("<I")  # a batch's batch_length, at its byte 4
_MAX_NOW_MS = (1 << 63) - 1


class AppendBatch(NamedTuple):
    """One batch of an ``append``: where it goes and the checked view of its bytes."""

    topic_id: int
    queue: int
    view: rb.BatchView


class AppendCommand(TypedDict):
    v: int
    op: Literal["append"]
    now_ms: int
    batches: list[AppendBatch]
    take: NotRequired[TakeAlong]  # version 2 only


class TakeAlong(TypedDict):
    """An ``append``'s take-along: a ``receive`` of no epoch at the append's ``now_ms`` (so no
    locked queue), its fields checked as a receive's are."""

    group: str
    topic_id: int
    queues: list[int]
    max: int
    visibility_ms: int
    max_age_ms: int | None


_TAKE_FIELDS = frozenset(TakeAlong.__annotations__)


def is_append(data: bytes) -> bool:
    """Whether the command bytes ``data`` are an ``append`` (else JSON)."""
    return len(data) > 0 and data[0] == APPEND_OP


def append(
    now_ms: int,
    items: Sequence[tuple[int, int, bytes | memoryview]],
    take: Mapping[str, Any] | None = None,
) -> bytes:
    """The ``append`` command of ``(topic_id, queue, batch)`` items, stamped ``now_ms``; ``take``
    (the fields of ``delivery.TAKE_FIELDS``; the field level ``append.take``): version 2, whose
    apply also takes up to ``take["max"]`` messages along for a waiting receive."""
    version = _VERSION if take is None else _TAKE_VERSION
    parts: list[bytes | memoryview] = [_HEAD.pack(APPEND_OP, version, 0, now_ms, len(items))]
    pack = _ITEM.pack
    for topic_id, queue, data in items:
        parts.append(pack(topic_id, queue))
        parts.append(data)
    if take is not None:
        wire = orjson.dumps(dict(take))
        parts += [_LENGTH.pack(len(wire)), wire]
    return b"".join(parts)


def has_take(data: bytes) -> bool:
    """Whether the ``append`` command bytes ``data`` carry a take-along (version 2)."""
    return len(data) > 1 and data[0] == APPEND_OP and data[1] == _TAKE_VERSION


AppendItem = tuple[int, int, memoryview]
"""One batch of an ``append`` as bytes: ``(topic_id, queue, batch)``."""


def split_append(data: bytes) -> tuple[int, list[AppendItem]]:
    """The ``now_ms`` and the items of an ``append`` command of version 1, its framing checked
    (header, item bounds, no trailing bytes) but not its batches: what a leader takes from a peer
    that checked them (``raftmq.batch.validate`` at the node the client sent them to). A peer never
    forwards a take-along (only a leader writes one, for a receive waiting there).

    Raises:
        BadCommand: the framing is broken, or a take-along (``bad_request``).
    """
    now_ms, items, _ = _split(data, take_ok=False)
    return now_ms, items


def _split(data: bytes, *, take_ok: bool) -> tuple[int, list[AppendItem], memoryview | None]:
    """:func:`split_append`, and the take-along's JSON of a version 2 command when ``take_ok``."""
    view = memoryview(data)
    if len(data) < _HEAD.size:
        raise BadCommand(errors.BAD_REQUEST, "append command shorter than its header")
    op, version, reserved, now_ms, count = _HEAD.unpack_from(data, 0)
    versions = (_VERSION, _TAKE_VERSION) if take_ok else (_VERSION,)
    if op != APPEND_OP or version not in versions or reserved:
        raise BadCommand(errors.BAD_REQUEST, f"unsupported append command version {version}")
    if now_ms > min(MAX_U64, _MAX_NOW_MS):
        raise BadCommand(errors.BAD_REQUEST, "append command: now_ms out of range")
    if count == 0:
        raise BadCommand(errors.BAD_REQUEST, "append command without batches")
    pos, items = _HEAD.size, []
    for i in range(count):
        if pos + _ITEM.size + 8 > len(data):
            raise BadCommand(errors.BAD_REQUEST, f"append command: batches[{i}] is cut short")
        topic_id, queue = _ITEM.unpack_from(data, pos)
        pos += _ITEM.size
        (length,) = _LENGTH.unpack_from(data, pos + 4)
        if pos + length > len(data) or length < rb.HEADER_SIZE:
            raise BadCommand(errors.BAD_REQUEST, f"append command: batches[{i}] is cut short")
        items.append((topic_id, queue, view[pos : pos + length]))
        pos += length
    take = None
    if version == _TAKE_VERSION:
        if pos + _LENGTH.size > len(data):
            raise BadCommand(errors.BAD_REQUEST, "append command: its take-along is cut short")
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        if pos + length > len(data):
            raise BadCommand(errors.BAD_REQUEST, "append command: its take-along is cut short")
        take, pos = view[pos : pos + length], pos + length
    if pos != len(data):
        raise BadCommand(errors.BAD_REQUEST, f"append command: {len(data) - pos} trailing bytes")
    return now_ms, items, take


def decode_append(data: bytes) -> tuple[AppendCommand, int]:
    """Parse and check an ``append`` command: its framing (:func:`split_append`) and each batch
    whole (:func:`raftmq.batch.read`: the CRCs, the structure, UTF-8). Returns the command and its
    ``now_ms`` as stamped (the state machine replaces the command's ``now_ms`` with the group's
    time).

    Raises:
        BadCommand: malformed (``bad_request``), or a batch fails :func:`raftmq.batch.read`
            (``bad_batch``).
    """
    now_ms, items, take = _split(data, take_ok=True)
    batches = []
    for i, (topic_id, queue, batch) in enumerate(items):
        try:
            batches.append(AppendBatch(topic_id, queue, rb.read(batch)))
        except rb.BadBatch as e:
            raise BadCommand(errors.BAD_BATCH, f"batches[{i}]: {e.reason}: {e.message}") from None
    command: AppendCommand = {"v": _VERSION, "op": "append", "now_ms": now_ms, "batches": batches}
    if take is not None:
        try:
            obj = orjson.loads(take)
        except orjson.JSONDecodeError as e:
            raise BadCommand(errors.BAD_REQUEST, f"append command: its take-along is not JSON: {e}") from None
        command["take"] = _decode_take(obj)
    return command, now_ms


def _decode_take(obj: Any) -> TakeAlong:
    """A take-along's JSON object, checked as a receive's fields (``commands.delivery``)."""

    def bad(message: str) -> BadCommand:
        return BadCommand(errors.BAD_REQUEST, f"append command: take.{message}")

    def uint(name: str, low: int, high: int) -> int:
        value = obj.get(name)
        if type(value) is not int or not low <= value <= high:
            raise bad(f"{name}: expected an integer in [{low}, {high}], got {value!r}")
        return value

    if type(obj) is not dict or not set(obj) <= _TAKE_FIELDS:
        raise bad(f"expected an object of the fields {sorted(_TAKE_FIELDS)}")
    group = obj.get("group")
    if type(group) is not str or not group or len(group.encode()) > MAX_NAME_BYTES:
        raise bad(f"group: expected a name of 1 to {MAX_NAME_BYTES} bytes")
    queues = obj.get("queues")
    if (
        type(queues) is not list
        or not 1 <= len(queues) <= MAX_RECEIVE
        or not all(type(q) is int and 0 <= q <= MAX_U32 for q in queues)
        or len(set(queues)) != len(queues)
    ):
        raise bad("queues: expected a non-empty list of distinct queue numbers")
    max_age_ms = None if obj.get("max_age_ms") is None else uint("max_age_ms", 0, MAX_DURATION_MS)
    return {
        "group": group,
        "topic_id": uint("topic_id", 0, MAX_U32),
        "queues": queues,
        "max": uint("max", 1, MAX_RECEIVE),
        "visibility_ms": uint("visibility_ms", 1, MAX_DURATION_MS),
        "max_age_ms": max_age_ms,
    }
