"""The binary ``append`` command: record batches (format v2, docs/format.md) carried as bytes.

Unlike every other queue-group command, ``append`` is not JSON: its payload is the producers'
batches verbatim, so no replica builds a Python object per message to replicate or store them::

    command := op u8 (0xA2) | version u8 (1) | reserved u16 (0) | now_ms u64 | count u32 | item{count}
    item    := topic_id u32 | queue u32 | batch (its own batch_length says where it ends)

All integers little-endian, like the batch. The first byte tells it from a JSON command (``{``).
Building it is one ``bytes.join``; decoding is :func:`raftmq.batch.read` per batch (the CRCs and
one vectorised pass over the record table), never a loop over records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Literal, NamedTuple, TypedDict

from raftmq import batch as rb
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import BadCommand
from raftmq.storage.keys import MAX_U64

__all__ = [
    "APPEND_OP",
    "AppendBatch",
    "AppendCommand",
    "AppendItem",
    "append",
    "decode_append",
    "is_append",
    "split_append",
]

APPEND_OP = 0xA2
_VERSION = 1
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


def is_append(data: bytes) -> bool:
    """Whether the command bytes ``data`` are an ``append`` (else JSON)."""
    return len(data) > 0 and data[0] == APPEND_OP


def append(now_ms: int, items: Sequence[tuple[int, int, bytes | memoryview]]) -> bytes:
    """The ``append`` command of ``(topic_id, queue, batch)`` items, stamped ``now_ms``."""
    parts: list[bytes | memoryview] = [_HEAD.pack(APPEND_OP, _VERSION, 0, now_ms, len(items))]
    pack = _ITEM.pack
    for topic_id, queue, data in items:
        parts.append(pack(topic_id, queue))
        parts.append(data)
    return b"".join(parts)


AppendItem = tuple[int, int, memoryview]
"""One batch of an ``append`` as bytes: ``(topic_id, queue, batch)``."""


def split_append(data: bytes) -> tuple[int, list[AppendItem]]:
    """The ``now_ms`` and the items of an ``append`` command, its framing checked (header, item
    bounds, no trailing bytes) but not its batches: what a leader takes from a peer that checked
    them (``raftmq.batch.validate`` at the node the client sent them to).

    Raises:
        BadCommand: the framing is broken (``bad_request``).
    """
    view = memoryview(data)
    if len(data) < _HEAD.size:
        raise BadCommand(errors.BAD_REQUEST, "append command shorter than its header")
    op, version, reserved, now_ms, count = _HEAD.unpack_from(data, 0)
    if op != APPEND_OP or version != _VERSION or reserved:
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
    if pos != len(data):
        raise BadCommand(errors.BAD_REQUEST, f"append command: {len(data) - pos} trailing bytes")
    return now_ms, items


def decode_append(data: bytes) -> tuple[AppendCommand, int]:
    """Parse and check an ``append`` command: its framing (:func:`split_append`) and each batch
    whole (:func:`raftmq.batch.read`: the CRCs, the structure, UTF-8). Returns the command and its
    ``now_ms`` as stamped (the state machine replaces the command's ``now_ms`` with the group's
    time).

    Raises:
        BadCommand: malformed (``bad_request``), or a batch fails :func:`raftmq.batch.read`
            (``bad_batch``).
    """
    now_ms, items = split_append(data)
    batches = []
    for i, (topic_id, queue, batch) in enumerate(items):
        try:
            batches.append(AppendBatch(topic_id, queue, rb.read(batch)))
        except rb.BadBatch as e:
            raise BadCommand(errors.BAD_BATCH, f"batches[{i}]: {e.reason}: {e.message}") from None
    return {"v": _VERSION, "op": "append", "now_ms": now_ms, "batches": batches}, now_ms
