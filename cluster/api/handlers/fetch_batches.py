"""The binary fetch answer: ``GET /v1/topics/{topic}/queues/{queue}/messages`` with ``Accept:
application/vnd.raftmq.batch`` (``raftmq.batch.BATCH_MEDIA_TYPE``).

The answer is the stored record batches themselves, as frames (docs/format.md, "Frames": the
queue, ``topic_len`` 0): a v2 value is sent verbatim, with no work per message; a value stored
before v2 (format v1) is converted by ``raftmq.batch.v1_to_v2`` first, the only per-message work,
and only for old data. Whole batches: the first may begin before the requested offset (the client
skips the records below it) and always comes; later ones come while the records at or above the
offset stay within ``max`` and the batches' bytes within ``max_bytes``
(``storage/queues.raw_batches``).

An encoder of the fetch core (``fetch_core.py``): everything else is the JSON fetch's, the same
query parameters and checks in the same order, the same errors (JSON bodies), long polling,
``read_from=local`` and forwarding to the queue group's leader. The positions travel in headers
(:data:`BATCH_HEADERS`): ``X-Raftmq-Next-Offset``, ``X-Raftmq-Low-Offset``,
``X-Raftmq-High-Offset``, and for expiry ``X-Raftmq-Now-Ms`` (the queue group's time at the replica
read, ``group_now``: the bounded time receive and retention use, not the node's clock, which may run
ahead) and ``X-Raftmq-Max-Age-Ms`` (the topic's ``retention_ms``, absent without one): the JSON
answer leaves out messages expired at the node's ``now`` (TTL, or older than ``retention_ms``); a
binary answer carries them, and the client leaves them out by the same rule
(``client/_batches.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from raftmq.batch import BATCH_MEDIA_TYPE, BadBatch, frame_prefix, v1_to_v2
from raftmq.cluster.api.handlers.fetch_core import (
    POSITION_HEADERS,
    Answer,
    FetchBounds,
    FetchQuery,
    position_headers,
)
from raftmq.cluster.api.validation import DEFAULT_FETCH_BYTES
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.apply import group_now
from raftmq.storage.queues import raw_batches
from raftmq.storage.records import CorruptRecord
from raftmq.storage.store import Store, StoreClosed

__all__ = ["BATCHES", "BATCH_HEADERS", "BatchEncoder", "as_v2"]

NOW_MS = "X-Raftmq-Now-Ms"
MAX_AGE_MS = "X-Raftmq-Max-Age-Ms"
BATCH_HEADERS = (*POSITION_HEADERS, NOW_MS, MAX_AGE_MS)
"""The headers of a binary fetch answer (a forwarding node passes them on)."""


def as_v2(value: bytes) -> bytes:
    """A stored value as a v2 batch: itself, or a v1 value converted (per-message work)."""
    if value[:1] == b"\x02":
        return value
    try:
        return v1_to_v2(value)
    except BadBatch as e:
        raise CorruptRecord(f"a stored v1 batch cannot be read: {e}") from None


class BatchEncoder:
    """The binary answer (see the module docstring)."""

    media_type = BATCH_MEDIA_TYPE
    headers = BATCH_HEADERS
    in_executor = False

    def bounds(self, limits: Limits) -> FetchBounds:
        return FetchBounds(limits.default_fetch_messages, limits.max_fetch_messages, DEFAULT_FETCH_BYTES)

    def reading(self, f: FetchQuery, store: Store) -> _BatchReading:
        return _BatchReading(f, store)


BATCHES = BatchEncoder()


class _BatchReading:
    def __init__(self, f: FetchQuery, store: Store) -> None:
        self.f, self.store = f, store
        self.first: tuple[int, int, bytes] | None = None
        self.batches: Iterator[tuple[int, int, bytes]] = iter(())
        self.parts: list[bytes] = []
        self.next_offset, self.records = f.offset, 0

    def read(self) -> bool:
        f = self.f
        self.batches = raw_batches(self.store, f.topic.id, f.queue, f.offset, f.max_messages, f.max_bytes)
        self.first = next(self.batches, None)
        return self.first is not None

    async def rest(self) -> None:
        prefix, offset, got = frame_prefix(self.f.queue), self.f.offset, self.first
        try:
            while got is not None:  # a batch a step: the loop is free between steps
                base, end, value = got
                self.parts += (prefix, as_v2(value))
                self.records += end - max(base, offset)
                self.next_offset = end
                await asyncio.sleep(0)
                got = next(self.batches, None)
        except StoreClosed:
            pass  # a snapshot install replaced the store meanwhile: what was read is still right

    async def answer(self, low: int, high: int) -> Answer:
        headers = position_headers(self.next_offset, low, high)
        headers[NOW_MS] = str(group_now(self.store, now_ms()))
        if self.f.topic.retention_ms is not None:
            headers[MAX_AGE_MS] = str(self.f.topic.retention_ms)
        return Answer(self.parts, self.records, headers)
