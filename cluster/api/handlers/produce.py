"""Produce over the HTTP API v1 (``POST /v1/topics/{topic}/messages``): messages routed to queues
(explicit queue, else the key's queue, else one queue per request chosen round-robin), one batch
per queue, each queue group's batches sent to its leader's group committer.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import crc32c
from aiohttp import web

from raftmq import batch as rb
from raftmq.cluster.api.common import json_response
from raftmq.cluster.api.core import ApiCore
from raftmq.cluster.api.validation import (
    MAX_HEADERS,
    MAX_KEY_BYTES,
    ProduceRequest,
    parse_json,
    parse_produce,
)
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, RaftmqError, answerable, error_body
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.node import Node

__all__ = [
    "ProduceHandlers",
    "bad_batch",
    "json_batches",
    "json_results",
    "key_queue",
    "refuse_reserved_headers",
    "split_frames_or_400",
]


def bad_batch(e: rb.BadBatch, batch: int | None = None) -> ApiError:
    """The 400 ``bad_batch`` answer of a malformed binary batch: ``reason``, ``record`` (the first
    bad record's index, or null) and ``batch`` (the frame's index) say where. A reserved header
    name is ``reserved_header``, as on the JSON wire, with the same ``record`` and ``batch``."""
    where = e.batch if batch is None else batch
    code = errors.RESERVED_HEADER if e.reason == "reserved_header" else errors.BAD_BATCH
    return ApiError(code, e.message, reason=e.reason, record=e.record, batch=where)


def split_frames_or_400(body: bytes, max_frames: int) -> list[rb.Frame]:
    try:
        return rb.split_frames(body, max_frames=max_frames)
    except rb.BadBatch as e:
        raise bad_batch(e) from None


def refuse_reserved_headers(batches: Any) -> None:
    """400 ``reserved_header`` when a message of JSON produce batches a peer forwarded (the
    ``produce`` action) carries a header of the broker's own; the forwarding node of this
    release refused it already."""
    for i, b in enumerate(batches if isinstance(batches, list) else []):
        for j, m in enumerate(b.get("messages") or [] if isinstance(b, dict) else []):
            headers = m.get("headers") if isinstance(m, dict) else None
            for name in headers if isinstance(headers, dict) else {}:
                if isinstance(name, str) and rb.is_reserved_header(name):
                    raise ApiError(
                        errors.RESERVED_HEADER,
                        f"batch {i} message {j}: header {name!r} is the broker's own",
                        index=j,
                        header=name,
                    )


def key_queue(key: str, queues: int) -> int:
    """The queue a keyed message goes to: CRC32C of the UTF-8 key, mixed with murmur3's fmix32,
    modulo the queue count. The Python client computes the same, so it can batch per queue."""
    h = int(crc32c.crc32c(key.encode()))
    # murmur3's fmix32: CRC is linear, so keys differing in one character differ only in a few
    # low bits; the finalizer spreads every input bit over the result before the modulo.
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h % queues


# Where a JSON message went: (queue, its position among the queue's undelayed messages of the
# request, or None for a delayed one, then its due time).
Placement = tuple[int, int | None, int | None]


def json_batches(
    req: ProduceRequest, queues: int, sticky: int, now: int
) -> tuple[dict[int, bytes], list[Placement]]:
    """The checked messages of a JSON produce as one record batch per queue (format v2,
    docs/format.md), proposed as the binary path's are: the replicas then check and store them
    without a Python step per message. Routing: the message's queue (``queue_not_found`` past the
    topic's), else its key's, else ``sticky`` (a request's unkeyed messages stay together: one
    entry, one batch)."""
    placed: list[Placement] = []
    undelayed: dict[int, int] = defaultdict(int)
    builders: dict[int, rb.BatchBuilder] = {}
    for i, (value, key, q, _, headers, deliver_at_ms, ttl_ms) in enumerate(req.messages):
        if q is None:
            q = sticky if key is None else key_queue(key, queues)
        elif q >= queues:
            raise ApiError(errors.QUEUE_NOT_FOUND, f"messages[{i}].queue {q}: topic has {queues} queues")
        batch = builders.get(q)
        if batch is None:
            batch = builders[q] = rb.BatchBuilder(
                req.producer_id, req.sequence or 0, base_timestamp_ms=now, timestamps=False
            )
        if deliver_at_ms is None:
            placed.append((q, undelayed[q], None))
            undelayed[q] += 1
            batch.append(value, key, headers, ttl_ms=ttl_ms)
        else:
            placed.append((q, None, deliver_at_ms))
            # A due time is in the future (parse_produce); as a delay it counts from the
            # leader's append time, a few ms later at most: never earlier than asked.
            batch.append(value, key, headers, delay_ms=deliver_at_ms - now, ttl_ms=ttl_ms)
    return {q: b.finish() for q, b in builders.items()}, placed


def json_results(
    placed: list[Placement], by_queue: dict[int, dict[str, Any] | RaftmqError | None]
) -> list[dict[str, Any] | None]:
    """One result per JSON message, in the request's order, from its queue's batch's outcome:
    its offset (the batch's base offset plus its position), or its due time when it is delayed,
    or None when its batch failed."""
    results: list[dict[str, Any] | None] = []
    for q, pos, deliver_at_ms in placed:
        r = by_queue[q]
        if not isinstance(r, dict):
            results.append(None)
        elif pos is None:
            results.append({"queue": q, "offset": None, "deliver_at_ms": deliver_at_ms})
        else:
            base = r["base_offset"]  # None only under the ack_before_replication test fault
            results.append({"queue": q, "offset": None if base is None else base + pos})
    return results


class ProduceHandlers(ApiCore):
    """The produce handler, mixed into ``Api`` (``cluster/api/app.py``)."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        # The batch limits of a topic's max_message_bytes (None: the node's): built once each.
        self._limits_by_max: dict[int | None, rb.Limits] = {}

    async def produce(self, request: web.Request) -> web.Response:
        # The Producer's exact header first: parsing it (``content_type``) costs more than the rest.
        raw_type = request.headers.get("Content-Type")
        if raw_type == rb.BATCH_MEDIA_TYPE or request.content_type == rb.BATCH_MEDIA_TYPE:
            return await self._produce_batches(request)
        topic = await self.topic(request.match_info["topic"])
        max_bytes = topic.max_message_bytes or self.limits.max_message_bytes
        now = now_ms()
        req = parse_produce(parse_json(await request.read()), self.limits, max_bytes, now)
        sticky = next(self._sticky) % topic.queues
        batches, placed = json_batches(req, topic.queues, sticky, now)
        queues = list(batches)
        outcome = await self._append(topic, [(topic.id, q, batches[q]) for q in queues])
        results = json_results(placed, dict(zip(queues, outcome, strict=True)))
        return self._answer(outcome, results, len(results))

    async def _produce_batches(self, request: web.Request) -> web.Response:
        """Binary produce: frames of v2 record batches (docs/format.md), each checked whole
        (``raftmq.batch.validate``: no per-message objects), proposed as bytes; one result per
        frame. Nothing is proposed unless every frame is valid."""
        topic = await self.topic(request.match_info["topic"])
        body = await request.read()
        limits = self._batch_limits(topic.max_message_bytes)
        frames = split_frames_or_400(body, self.limits.max_messages_per_request)
        sticky = next(self._sticky) % topic.queues
        items: list[tuple[int, int, memoryview]] = []
        total = 0
        for i, frame in enumerate(frames):
            if frame.topic is not None and frame.topic != topic.name:
                raise ApiError(
                    errors.BAD_REQUEST,
                    f"batch {i} names topic {frame.topic!r}: a request produces to the topic of its path",
                )
            try:
                view = rb.validate(frame.batch, limits)
            except rb.BadBatch as e:
                raise bad_batch(e, i) from None
            total += view.count
            if total > self.limits.max_messages_per_request:
                raise ApiError(
                    errors.REQUEST_TOO_LARGE,
                    f"more than {self.limits.max_messages_per_request} messages in one request",
                )
            q = sticky if frame.queue is None else frame.queue
            if q >= topic.queues:
                raise ApiError(
                    errors.QUEUE_NOT_FOUND, f"batch {i}: queue {q}: topic has {topic.queues} queues"
                )
            items.append((topic.id, q, frame.batch))
        outcome = await self._append(topic, items)
        results = [
            {k: v for k, v in r.items() if k != "topic_id"} if isinstance(r, dict) else None for r in outcome
        ]
        return self._answer(outcome, results, total)

    async def _append(
        self, topic: Topic, items: Sequence[tuple[int, int, bytes | memoryview]]
    ) -> list[dict[str, Any] | RaftmqError | None]:
        """The tail of both wires: checked record batches ``(topic_id, queue, batch)`` sent to
        the leaders of their queue groups (here or forwarded as bytes, ``LeaderRouter``), one
        ``append`` per group, all groups at once. One outcome per item, in order: the apply's
        result, or its error (the group failed, or refused the batch) as a :class:`RaftmqError`."""
        by_group: dict[int, list[int]] = defaultdict(list)
        for i, (_, q, _) in enumerate(items):
            by_group[topic.queue_groups[q]].append(i)
        outcome: list[dict[str, Any] | RaftmqError | None] = [None] * len(items)
        if len(by_group) == 1:  # the common case: in this task (gather would make one per group)
            answers = [await self._to_group(items, *next(iter(by_group.items())))]
        else:
            answers = await asyncio.gather(
                *(self._to_group(items, g, which) for g, which in by_group.items())
            )
        for pairs in answers:
            for i, r in pairs:
                if isinstance(r, dict) and "error" in r:
                    r = ApiError.from_body(r["error"])
                outcome[i] = r
        return outcome

    async def _to_group(
        self, items: Sequence[tuple[int, int, bytes | memoryview]], g: int, which: list[int]
    ) -> list[tuple[int, dict[str, Any] | RaftmqError]]:
        """The items ``which`` of ``items`` appended at group ``g``'s leader: ``(index, outcome)``."""
        part = [items[i] for i in which]
        try:
            result = await self.router.group_call(
                g, "append", {"items": part}, size_hint=sum(len(b) for _, _, b in part)
            )
        except RaftmqError as e:
            failed = answerable(e, write=True)
            return [(i, failed) for i in which]
        return list(zip(which, result["results"], strict=True))

    def _answer(
        self,
        outcome: list[dict[str, Any] | RaftmqError | None],
        results: list[dict[str, Any] | None],
        count: int,
    ) -> web.Response:
        """The answer of a produce: ``results``, or the first failure with what was stored
        (other queue groups may have stored their part)."""
        failures = [r for r in outcome if isinstance(r, RaftmqError)]
        if failures:
            first = failures[0]
            body = error_body(first.error, first.message, results=results, **first.details)
            return json_response(body, status=first.status)
        self.metrics.produced.inc(count)
        return json_response({"results": results})

    def _batch_limits(self, topic_max_message_bytes: int | None) -> rb.Limits:
        limits = self._limits_by_max.get(topic_max_message_bytes)
        if limits is None:
            limits = self._limits_by_max[topic_max_message_bytes] = self._new_batch_limits(
                topic_max_message_bytes
            )
        return limits

    def _new_batch_limits(self, topic_max_message_bytes: int | None) -> rb.Limits:
        lim = self.limits
        return rb.Limits(
            max_message_bytes=topic_max_message_bytes or lim.max_message_bytes,
            max_batch_bytes=lim.max_request_bytes,
            max_records=lim.max_messages_per_request,
            max_key_bytes=MAX_KEY_BYTES,
            max_headers=MAX_HEADERS,
            max_delay_ms=lim.max_delay_ms,
            max_ttl_ms=lim.max_ttl_ms,
        )
