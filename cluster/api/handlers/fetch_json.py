"""The JSON fetch answer (the default wire of ``GET /v1/topics/{topic}/queues/{queue}/messages``):
``{"messages": [...], "next_offset", "low_offset", "high_offset"}``, an encoder of the fetch core
(``fetch_core.py``).

The messages are read a record batch at a time (``storage/queues.message_steps``, :func:`read_steps`)
and encoded in slices of about :data:`ENCODE_SLICE_BYTES` (:func:`encode_fetch`) with the event loop
free between steps and slices. Messages expired at the queue group's time (their TTL, or older than
the topic's ``retention_ms``) are left out; ``next_offset`` moves past them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from raftmq.cluster.api.common import message_item
from raftmq.cluster.api.handlers.fetch_core import Answer, FetchBounds, FetchQuery
from raftmq.cluster.api.validation import DEFAULT_FETCH_BYTES
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.apply import group_now
from raftmq.storage.queues import message_steps
from raftmq.storage.records import Message
from raftmq.storage.store import Store, StoreClosed

__all__ = ["ENCODE_SLICE_BYTES", "JSON", "JsonEncoder", "encode_fetch", "read_steps"]

ENCODE_SLICE_BYTES = 256 * 1024  # message bytes encoded between two turns of the event loop


class JsonEncoder:
    """The JSON answer."""

    media_type = "application/json"
    headers: tuple[str, ...] = ()  # the positions are in the body
    in_executor = False

    def bounds(self, limits: Limits) -> FetchBounds:
        return FetchBounds(limits.default_fetch_messages, limits.max_fetch_messages, DEFAULT_FETCH_BYTES)

    def reading(self, f: FetchQuery, store: Store) -> _JsonReading:
        return _JsonReading(f, store)


JSON = JsonEncoder()


class _JsonReading:
    def __init__(self, f: FetchQuery, store: Store) -> None:
        self.f, self.store = f, store
        self.messages: list[Message] = []
        self.steps: Iterator[list[Message]] = iter(())

    def read(self) -> bool:
        f = self.f
        self.steps = message_steps(self.store, f.topic.id, f.queue, f.offset, f.max_messages, f.max_bytes)
        self.messages = next(self.steps, [])
        return bool(self.messages)

    async def rest(self) -> None:
        # Up to 64 MiB: a record batch at a time with the event loop free in between.
        self.messages = await read_steps(self.messages, self.steps)

    async def answer(self, low: int, high: int) -> Answer:
        messages, f = self.messages, self.f
        next_offset = messages[-1].offset + 1 if messages else f.offset
        # Expired messages (TTL, or older than retention_ms) are skipped; next_offset moves past them.
        # Expired on the group's time, as receive and retention judge it, never on this node's
        # clock: a replica whose clock runs days ahead must not hide (and skip) what is kept.
        tail = {"next_offset": next_offset, "low_offset": low, "high_offset": high}
        now = group_now(self.store, now_ms())
        return Answer(await encode_fetch(messages, now, f.topic.retention_ms, tail), len(messages))


async def read_steps(first: list[Message], steps: Iterator[list[Message]]) -> list[Message]:
    """``first`` and the messages of the remaining ``steps`` (``storage/queues.message_steps``:
    one record batch each), with the event loop free between steps. Threads would not free it:
    a thread running Python competes with the loop for the GIL, and RocksDB's seeks hold it."""
    out = list(first)
    try:
        for step in steps:
            await asyncio.sleep(0)
            out += step
    except StoreClosed:
        pass  # a snapshot install replaced the store meanwhile: what was read is still right
    return out


async def encode_fetch(
    messages: Sequence[Message], now_ms: int, max_age_ms: int | None, tail: Mapping[str, Any]
) -> list[bytes]:
    """The JSON fetch answer ``{"messages": [...], **tail}`` in parts whose concatenation is byte
    for byte what ``json_response`` gives for it (``orjson.dumps`` and a newline, as every JSON
    answer ends), without the messages expired at ``now_ms`` (their TTL, or older than the
    topic's ``max_age_ms``).

    Encoded on the event loop in slices of about :data:`ENCODE_SLICE_BYTES` of values, yielding to
    the loop between slices: a 64 MiB answer never holds the loop (and the GIL) for more than one
    slice, which a thread could not promise (orjson holds the GIL). The parts are meant to be
    written one at a time (``fetch_core.write_parts``): joining them would copy 64 MiB in one step."""
    parts: list[bytes] = [b'{"messages":[']
    items: list[dict[str, Any]] = []
    size = 0
    for m in messages:
        if m.expired(now_ms, max_age_ms):
            continue
        items.append(message_item({}, m))
        size += len(m.value)
        if size >= ENCODE_SLICE_BYTES:
            parts += [b","] if len(parts) > 1 else []
            parts.append(orjson.dumps(items)[1:-1])  # the items without the list's brackets
            items, size = [], 0
            await asyncio.sleep(0)
    if items:
        parts += [b","] if len(parts) > 1 else []
        parts.append(orjson.dumps(items)[1:-1])
    rest = orjson.dumps(dict(tail))  # b'{"next_offset":...}'
    parts.append((b"]," + rest[1:] if tail else b"]}") + b"\n")
    return parts
