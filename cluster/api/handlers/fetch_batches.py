"""The binary fetch answer: ``GET /v1/topics/{topic}/queues/{queue}/messages`` with ``Accept:
application/vnd.raftmq.batch`` (``raftmq.batch.BATCH_MEDIA_TYPE``).

The answer is the stored record batches themselves, as frames (docs/format.md, "Frames": the
queue, ``topic_len`` 0): a v2 value is sent verbatim, with no work per message; a value stored
before v2 (format v1) is converted by ``raftmq.batch.v1_to_v2`` first, the only per-message work,
and only for old data. Whole batches: the first may begin before the requested offset (the client
skips the records below it) and always comes; later ones come while the records at or above the
offset stay within ``max`` and the batches' bytes within ``max_bytes``
(``storage/queues.raw_batches``).

Everything else is the JSON fetch's: the same query parameters and checks in the same order
(``fetch_query``), the same errors (JSON bodies), long polling, ``read_from=local`` and
forwarding to the queue group's leader. The positions travel in headers (:data:`BATCH_HEADERS`):
``X-Raftmq-Next-Offset``, ``X-Raftmq-Low-Offset``, ``X-Raftmq-High-Offset``, and for expiry
``X-Raftmq-Now-Ms`` (the queue group's time at the replica read, ``group_now``: the bounded time
receive and retention use, not the node's clock, which may run ahead) and ``X-Raftmq-Max-Age-Ms`` (the topic's
``retention_ms``, absent without one): the JSON answer leaves out messages expired at the node's
``now`` (TTL, or older than ``retention_ms``); a binary answer carries them, and the client leaves
them out by the same rule (``client/_batches.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web

from raftmq.batch import BATCH_MEDIA_TYPE, BadBatch, frame_prefix, v1_to_v2
from raftmq.cluster.api.handlers.fetch_common import fetch_query, long_poll, write_parts
from raftmq.cluster.api.validation import DEFAULT_FETCH_BYTES
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.machines.apply import group_now
from raftmq.storage.queues import queue_bounds, raw_batches
from raftmq.storage.records import CorruptRecord
from raftmq.storage.store import StoreClosed

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["BATCH_HEADERS", "fetch_batches", "wants_batches"]

NEXT_OFFSET = "X-Raftmq-Next-Offset"
LOW_OFFSET = "X-Raftmq-Low-Offset"
HIGH_OFFSET = "X-Raftmq-High-Offset"
NOW_MS = "X-Raftmq-Now-Ms"
MAX_AGE_MS = "X-Raftmq-Max-Age-Ms"
BATCH_HEADERS = (NEXT_OFFSET, LOW_OFFSET, HIGH_OFFSET, NOW_MS, MAX_AGE_MS)
"""The headers of a binary fetch answer (a forwarding node passes them on)."""

_V2 = 2


def wants_batches(request: web.Request) -> bool:
    """The request asks for the binary answer (``Accept`` names the batch media type)."""
    return BATCH_MEDIA_TYPE in request.headers.get("Accept", "")


def as_v2(value: bytes) -> bytes:
    """A stored value as a v2 batch: itself, or a v1 value converted (per-message work)."""
    if value[:1] == b"\x02":
        return value
    try:
        return v1_to_v2(value)
    except BadBatch as e:
        raise CorruptRecord(f"a stored v1 batch cannot be read: {e}") from None


async def fetch_batches(api: ApiCore, request: web.Request) -> web.StreamResponse:
    """The binary fetch (see the module docstring)."""
    f = await fetch_query(
        api,
        request,
        default_max=api.limits.default_fetch_messages,
        max_max=api.limits.max_fetch_messages,
        default_bytes=DEFAULT_FETCH_BYTES,
    )
    if f.store is None:
        return await api.forward(
            request,
            str(f.group),
            accept=BATCH_MEDIA_TYPE,
            keep_headers=BATCH_HEADERS,
            timeout_s=api.limits.max_wait_ms / 1000 + 30,
        )
    store, topic, q, offset = f.store, f.topic, f.queue, f.offset
    rest: Iterator[tuple[int, int, bytes]] = iter(())

    def first() -> tuple[int, int, bytes] | None:
        nonlocal rest
        rest = raw_batches(store, topic.id, q, offset, f.max_messages, f.max_bytes)
        return next(rest, None)

    got = await long_poll(api.node, f, first, lambda x: x is not None)
    prefix = frame_prefix(q)
    parts: list[bytes] = []
    next_offset, records = offset, 0
    if got is not None:
        try:
            while got is not None:  # a batch a step: the loop is free between steps
                base, end, value = got
                parts += (prefix, as_v2(value))
                records += end - max(base, offset)
                next_offset = end
                await asyncio.sleep(0)
                got = next(rest, None)
        except StoreClosed:
            pass  # a snapshot install replaced the store meanwhile: what was read is still right
    low, high = queue_bounds(store, topic.id, q)
    api.metrics.fetched.inc(records)
    headers = {
        NEXT_OFFSET: str(next_offset),
        LOW_OFFSET: str(low),
        HIGH_OFFSET: str(high),
        NOW_MS: str(group_now(store, now_ms())),
    }
    if topic.retention_ms is not None:
        headers[MAX_AGE_MS] = str(topic.retention_ms)
    return await write_parts(request, parts, content_type=BATCH_MEDIA_TYPE, headers=headers)
