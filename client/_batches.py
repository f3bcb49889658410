"""The consumer's binary fetch: stored record batches as the node sends them, decoded lazily.

A fetch with ``Accept: application/vnd.raftmq.batch`` answers frames of stored v2 batches
(docs/format.md, "Frames"; docs/api.md, "Fetch messages") and the positions in headers. The
consumer checks each batch once (:func:`raftmq.batch.read`: CRCs, lengths, UTF-8; no message is
built) and keeps the :class:`~raftmq.batch.BatchView` in its buffer as a :class:`BatchRun`;
:class:`~raftmq.client.Message` objects are made only as the application takes them, a slice at a
time (:meth:`BatchRun.take`), so what is never read is never decoded.

Expiry is the JSON fetch's rule, applied here from the answer's ``X-Raftmq-Now-Ms`` (the queue
group's time) and ``X-Raftmq-Max-Age-Ms`` (the topic's retention): a record whose TTL ran out
(``append_time + delay + ttl <= now``) or whose batch is older than the retention is not
delivered, as the JSON answer leaves it out; its offset counts as finished.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import Any

import aiohttp
import numpy as np
import orjson

from raftmq.batch import (
    BATCH_MEDIA_TYPE,
    RECORD_BINARY,
    RECORD_KEY,
    RECORD_TTL,
    BadBatch,
    BatchView,
    read,
    split_frames,
)
from raftmq.errors import RaftmqError

from ._transport import _NOT_SENT, Transport, _describe
from ._types import _EMPTY, Message
from ._window import OffsetWindow
from .errors import ConnectionFailed, ConnectionLost, UnexpectedResponse, error_from_body

__all__ = ["BatchRun", "Batches", "NotAccepted", "batch_runs", "get_batches"]

log = logging.getLogger("raftmq.client.consumer")

_MAX_FRAMES = 1 << 30  # an answer's batches are bounded by its size, not by a count


class NotAccepted(RaftmqError):
    """The node does not offer the binary answer (415 or 406): fetch JSON from now on."""


@dataclass(frozen=True, slots=True)
class Batches:
    """A binary fetch answer: the batches (checked, in offset order) and the headers' positions."""

    views: list[BatchView]
    next_offset: int
    low_offset: int
    high_offset: int
    now_ms: int
    max_age_ms: int | None


def _header_int(headers: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = headers.get(name)
    if raw is None:
        if default is None:
            raise UnexpectedResponse(f"a binary fetch answer without {name}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UnexpectedResponse(f"a binary fetch answer with {name}: {raw!r}") from None


def parse_batches(body: bytes, headers: Mapping[str, str]) -> Batches:
    """The batches and positions of a binary fetch answer.

    Raises:
        UnexpectedResponse: a frame or batch that does not check (a damaged answer), or a
            position header missing.
    """
    views: list[BatchView] = []
    if body:
        try:
            views = [read(frame.batch) for frame in split_frames(body, _MAX_FRAMES)]
        except BadBatch as e:
            raise UnexpectedResponse(f"a damaged binary fetch answer: {e}") from None
    max_age = headers.get("X-Raftmq-Max-Age-Ms")
    return Batches(
        views,
        _header_int(headers, "X-Raftmq-Next-Offset"),
        _header_int(headers, "X-Raftmq-Low-Offset", 0),
        _header_int(headers, "X-Raftmq-High-Offset"),
        _header_int(headers, "X-Raftmq-Now-Ms"),
        None if max_age is None else _header_int(headers, "X-Raftmq-Max-Age-Ms"),
    )


async def get_batches(
    transport: Transport,
    path: str,
    params: Mapping[str, str | int],
    *,
    node_url: str | None,
    extra_timeout_ms: int,
) -> Batches | Any:
    """``GET path`` asking for the binary answer, with the transport's failover (a fetch is
    idempotent: any failure moves on to the next node).

    Returns:
        The :class:`Batches`, or the parsed JSON of a node that answered JSON anyway (one that
        does not know the binary answer and ignored ``Accept``).

    Raises:
        NotAccepted: 415 or 406 (the caller falls back to JSON).
        RaftmqError: as :meth:`Transport.request`.
    """
    session = transport._get_session()
    timeout = aiohttp.ClientTimeout(
        total=(transport.request_timeout_ms + extra_timeout_ms) / 1000,
        sock_connect=transport.connect_timeout_ms / 1000,
    )
    headers = {"Accept": BATCH_MEDIA_TYPE}
    sent_somewhere = False
    failures: list[Exception] = []
    for url, target in transport._reachable(node_url, failures):
        try:
            async with session.get(target + path, params=params, headers=headers, timeout=timeout) as resp:
                raw = await resp.read()
                status, content_type, answer_headers = resp.status, resp.content_type, resp.headers
        except _NOT_SENT as e:
            failures.append(e)
            transport._demote(url)
            continue
        except (aiohttp.ClientError, TimeoutError) as e:
            failures.append(e)
            sent_somewhere = True
            transport._demote(url)
            continue
        if status in (406, 415):
            raise NotAccepted(f"{url} answered {status} to a binary fetch")
        if 200 <= status < 300 and content_type == BATCH_MEDIA_TYPE:
            return parse_batches(raw, answer_headers)
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        if 200 <= status < 300 and body is not None:
            return body
        raise error_from_body(status, body)
    where = ", ".join(transport._candidates(node_url))
    last = _describe(failures[-1] if failures else None)
    if sent_somewhere:
        raise ConnectionLost(f"GET {path}: no answer from any node ({where}): {last}")
    raise ConnectionFailed(f"GET {path}: cannot reach any node ({where}): {last}")


def expired_offsets(view: BatchView, now_ms: int, max_age_ms: int | None) -> range | list[int]:
    """The offsets of ``view`` the JSON answer would leave out at ``now_ms``: every one when the
    batch is older than ``max_age_ms`` (one append time per batch), else those whose TTL ran out
    (computed over the TTL records with numpy; nothing for a batch without TTLs)."""
    if max_age_ms is not None and view.append_time_ms + max_age_ms <= now_ms:
        return range(view.base_offset, view.end_offset)
    if not len(view.ttls):
        return []
    has_ttl = (view.attributes & RECORD_TTL) != 0
    expires = view.append_time_ms + view.delay_ms() + view.ttl_ms()
    return (np.flatnonzero(has_ttl & (expires <= now_ms)) + view.base_offset).tolist()


class BatchRun:
    """The records of one fetched batch not handed out yet: ``offset`` .. ``end`` - 1 (offsets
    in ``skip`` are expired and never handed out)."""

    __slots__ = ("end", "offset", "queue", "skip", "topic", "view", "window")

    def __init__(
        self,
        topic: str,
        queue: int,
        view: BatchView,
        offset: int,
        window: OffsetWindow | None,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.topic = topic
        self.queue = queue
        self.view = view
        self.offset = offset
        self.end = view.end_offset
        self.window = window
        self.skip = skip

    def __len__(self) -> int:
        return self.end - self.offset

    def take(self, n: int) -> list[Message]:
        """The next up to ``n`` records as messages (fewer when some are expired), built now."""
        first = self.offset
        last = min(self.end, first + n)
        self.offset = last
        out = make_messages(self.topic, self.queue, self.view, first, last, self.window)
        if self.skip:
            skip = self.skip
            out = [m for m in out if m.offset not in skip]
        return out


def make_messages(
    topic: str, queue: int, view: BatchView, first: int, last: int, window: OffsetWindow | None
) -> list[Message]:
    """Messages for offsets ``first`` .. ``last`` - 1 of ``view``: ``value`` ``str`` for text and
    ``bytes`` for binary, the key, the headers, and ``timestamp_ms`` the append time.

    Plain text batches (no keys, headers or binary values, all ASCII: the common case) cost one
    copy and one decode of the values' bytes, then C-level slicing; anything else goes through
    :meth:`BatchView.records`."""
    if first >= last:
        return []
    i0, i1 = first - view.base_offset, last - view.base_offset
    attrs = view.attributes[i0:i1]
    ts = view.append_time_ms
    plain = not (attrs & (RECORD_BINARY | RECORD_KEY)).any()
    if plain:
        h = view.header_starts
        plain = h[i1] == h[i0]
    messages: list[Message]
    if plain:
        starts = view.value_starts[i0 : i1 + 1]
        v0 = view.sections["values"][0]
        a, b = int(starts[0]), int(starts[-1])
        raw = bytes(view.buffer[v0 + a : v0 + b])
        cuts = (starts - a).tolist()
        if raw.isascii():
            text = raw.decode("ascii")  # str offsets are byte offsets
            values: Any = map(text.__getitem__, map(slice, cuts, cuts[1:]))
        else:
            values = (str(raw[x:y], "utf-8") for x, y in pairwise(cuts))
        topics, queues, offsets, keys = repeat(topic), repeat(queue), range(first, last), repeat(None)
        messages = list(
            map(Message, topics, queues, offsets, values, keys, repeat(_EMPTY), repeat(ts), repeat(window))
        )
    else:
        messages = [
            Message(
                topic,
                queue,
                r.offset,
                r.value if r.binary else str(r.value, "utf-8"),
                r.key,
                r.headers or _EMPTY,
                ts,
                window,
            )
            for r in view.records(first, last - first)
        ]
    return messages


def batch_runs(
    topic: str, queue: int, answer: Batches, start: int, window: OffsetWindow
) -> tuple[list[BatchRun], int, int]:
    """The :class:`BatchRun` of each batch of ``answer`` holding offsets at or above ``start``
    (the records below are skipped), ``(runs, first offset, end offset)``; expired offsets are
    acked into ``window`` once added (the caller adds ``first .. end - 1`` first: see
    :func:`ack_expired`)."""
    runs: list[BatchRun] = []
    for view in answer.views:
        if view.end_offset <= start:
            continue
        gone = expired_offsets(view, answer.now_ms, answer.max_age_ms)
        offset = max(view.base_offset, start)
        runs.append(BatchRun(topic, queue, view, offset, window, frozenset(gone) if gone else frozenset()))
    if not runs:
        return runs, start, start
    return runs, runs[0].offset, runs[-1].end


def ack_expired(runs: list[BatchRun], window: OffsetWindow) -> None:
    """Mark the expired offsets of ``runs`` finished (they are never handed out)."""
    for run in runs:
        for offset in sorted(run.skip):
            if offset >= run.offset:
                window.ack(offset)
