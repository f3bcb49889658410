"""The fetch core: one path for ``GET /v1/topics/{topic}/queues/{queue}/messages`` whichever wire
the answer takes (:func:`serve_fetch`). It checks the path and the query once and in one order (so a
request gets the same error whichever answer it asks for), decides once whether this node reads
(the queue group's leader once it serves reads, ``leader_reads.py``, or any replica with
``read_from=local``) or forwards the request to the leader (``ApiCore.forward``: one hop, the
leader's answer returned unchanged), long-polls once, reads the queue's bounds after the read,
counts the messages fetched (``raftmq_fetched_messages_total``) and writes the answer part by part
(:func:`write_parts`).

What differs per wire is an :class:`Encoder`: its media type (``Accept``), its defaults and maximum
for ``max`` and ``max_bytes``, the headers a forwarding node passes on, and a :class:`Reading` that
reads the store and encodes the answer. The three (``cluster/api/handlers/fetch.py`` picks one by
``Accept``): JSON (``fetch_json.py``), stored record batches as frames (``fetch_batches.py``) and an
Arrow IPC stream (``fetch_arrow.py``).

Bounded work on the event loop: a fetch answer may hold 64 MiB. A reading takes one step (a record
batch) in :meth:`Reading.read` and the rest in :meth:`Reading.rest` with the loop free between
steps; the answer is written part by part as the socket drains, so ``/healthz`` and other requests
are answered while large fetches run (``tests/bench/bench_fetch_load.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog
from aiohttp import web

from raftmq.cluster.api.core import ApiCore
from raftmq.cluster.api.validation import MAX_FETCH_BYTES, MAX_OFFSET, MAX_QUEUE_NUMBER, bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.waiters import until_woken
from raftmq.storage.queues import queue_bounds
from raftmq.storage.store import Store

__all__ = [
    "FETCH_PARAMS",
    "NEXT_OFFSET",
    "POSITION_HEADERS",
    "Answer",
    "Encoder",
    "FetchBounds",
    "FetchQuery",
    "Reading",
    "encoder_for",
    "fetch_query",
    "long_poll",
    "only_params",
    "position_headers",
    "queue_number",
    "serve_fetch",
    "write_parts",
]

log = structlog.get_logger(__name__)

FETCH_PARAMS = frozenset({"offset", "max", "wait_ms", "read_from", "max_bytes"})
# The positions of a binary or Arrow answer (the JSON answer has them in its body).
NEXT_OFFSET = "X-Raftmq-Next-Offset"
LOW_OFFSET = "X-Raftmq-Low-Offset"
HIGH_OFFSET = "X-Raftmq-High-Offset"
POSITION_HEADERS = (NEXT_OFFSET, LOW_OFFSET, HIGH_OFFSET)
# A forwarded fetch may long-poll at the leader: its call waits for that and a margin.
FORWARD_MARGIN_S = 30.0
T = TypeVar("T")


def queue_number(topic: Topic, raw: str) -> int:
    """The queue a path names; ``queue_not_found`` above the topic's queues."""
    q = query_int({"queue": raw}, "queue", None, 0, MAX_QUEUE_NUMBER)
    if q >= topic.queues:
        raise ApiError(
            errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has {topic.queues} queues, no queue {q}"
        )
    return q


def only_params(request: web.Request, allowed: set[str] | frozenset[str]) -> None:
    """Refuse query parameters other than ``allowed`` (all of them named, sorted)."""
    unknown = set(request.query) - allowed
    if unknown:
        raise bad(f"unknown query parameter(s): {', '.join(sorted(unknown))}")


@dataclass(frozen=True, slots=True)
class FetchBounds:
    """An answer's default and largest ``max`` (messages or rows) and its default ``max_bytes``."""

    default_max: int
    max_max: int
    default_bytes: int


@dataclass(frozen=True, slots=True)
class FetchQuery:
    """A checked fetch request."""

    topic: Topic
    queue: int
    group: int  # the queue group holding ``queue``
    offset: int
    max_messages: int
    wait_ms: int
    max_bytes: int
    # The local replica to read (the leader's, or any with read_from=local); None: this node
    # does not lead the queue group, and the request goes to its leader.
    store: Store | None


async def fetch_query(api: ApiCore, request: web.Request, bounds: FetchBounds) -> FetchQuery:
    """Check ``GET /v1/topics/{topic}/queues/{queue}/messages`` and decide where it is read."""
    topic = await api.topic(request.match_info["topic"])
    q = queue_number(topic, request.match_info["queue"])
    query = request.query
    only_params(request, FETCH_PARAMS)
    offset = query_int(query, "offset", None, 0, MAX_OFFSET)
    max_messages = query_int(query, "max", bounds.default_max, 1, bounds.max_max)
    wait_ms = query_int(query, "wait_ms", 0, 0, api.limits.max_wait_ms)
    max_bytes = query_int(query, "max_bytes", bounds.default_bytes, 1, MAX_FETCH_BYTES)
    read_from = query.get("read_from", "leader")
    if read_from not in ("leader", "local"):
        raise bad("read_from must be 'leader' or 'local'")
    g = topic.queue_groups[q]
    local = api.node.queue_group(g)
    store: Store | None = None
    if read_from == "local":
        if local is None:
            raise bad(f"node {api.node.me.id} hosts no replica of queue group {g}; read_from=local needs one")
        store = local.machine.store
    elif await api.router.reads_here(str(g)):
        # A leader that serves reads (leader_reads.py): its replica holds every acknowledged
        # message, so an offset a producer was given is never out of range here.
        assert local is not None
        store = local.machine.store
    return FetchQuery(topic, q, g, offset, max_messages, wait_ms, max_bytes, store)


async def long_poll(
    node: Node,
    f: FetchQuery,
    read: Callable[[], T],
    has_data: Callable[[T], bool],
    *,
    in_executor: bool = False,
) -> T:
    """``read()`` until ``has_data`` or ``f.wait_ms`` has passed, waking when the queue grows on
    this replica. An offset outside the queue is ``offset_out_of_range`` with the queue's bounds."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + f.wait_ms / 1000
    with node.waiters.watch():  # before the first read: an apply after it wakes the loop
        while True:
            # Listening before the read: a wake for an apply after it is not lost, though it may
            # run while the read is still in the executor (cluster/node/waiters.py).
            with node.waiters.listen([(f.topic.id, f.queue)]) as grown:
                # An offset outside the queue raises storage's OffsetOutOfRange, which the error
                # middleware answers as it is: 416 offset_out_of_range with low_offset and high_offset.
                got = await loop.run_in_executor(None, read) if in_executor else read()
                remaining = deadline - time.monotonic()
                if has_data(got) or remaining <= 0:
                    return got
                await until_woken(grown, remaining)


async def write_parts(
    request: web.Request,
    parts: Sequence[bytes],
    *,
    content_type: str = "application/json",
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """An answer (``content_type``, ``headers``; JSON by default) written part by part, waiting
    for the socket to drain between parts (a ``web.Response`` of 64 MiB copies it into the
    transport's buffer in one step). The body and its ``Content-Length`` are what
    ``json_response`` gives for the same bytes. A client that hangs up mid-answer (a reader gone, a
    forwarding peer killed) ends the answer quietly: the rest has nowhere to go, and a failed write
    is no error of the node's."""
    response = web.StreamResponse(headers=headers)
    response.content_type = content_type
    response.content_length = sum(len(p) for p in parts)
    try:
        await response.prepare(request)  # fails too when the client left during a long poll
        for part in parts:
            await response.write(part)
        await response.write_eof()
    except ConnectionError:  # reset, pipe broken, "Connection lost" (aiohttp raises all three)
        log.debug("fetch_client_gone", path=request.path)
    return response


# -- encoders -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """A fetch answer as its encoder made it."""

    parts: Sequence[bytes]  # the body, written one part at a time
    count: int  # the messages (rows) read, for raftmq_fetched_messages_total
    headers: Mapping[str, str] | None = None


class Reading(Protocol):
    """One fetch's read of a replica's store, made by :meth:`Encoder.reading`."""

    def read(self) -> bool:
        """Read the first step from the query's offset; True when it found anything. Called again
        each time the queue grows during a long poll (an offset outside the queue raises storage's
        ``OffsetOutOfRange``)."""
        ...

    async def rest(self) -> None:
        """Read the remaining steps, with the event loop free between them."""
        ...

    async def answer(self, low: int, high: int) -> Answer:
        """The answer to what was read; ``low`` and ``high``: the queue's bounds after the read."""
        ...


class Encoder(Protocol):
    """One wire of the fetch answer."""

    @property
    def media_type(self) -> str:
        """What ``Accept`` names to ask for it, and its ``Content-Type``."""
        ...

    @property
    def headers(self) -> tuple[str, ...]:
        """The headers of its answer a forwarding node passes on (the positions)."""
        ...

    @property
    def in_executor(self) -> bool:
        """:meth:`Reading.read` runs in a thread (a whole read at once) rather than on the loop."""
        ...

    def bounds(self, limits: Limits) -> FetchBounds: ...

    def reading(self, f: FetchQuery, store: Store) -> Reading: ...


def encoder_for(request: web.Request, encoders: Sequence[Encoder], default: Encoder) -> Encoder:
    """The first of ``encoders`` whose media type ``Accept`` names, else ``default``."""
    accept = request.headers.get("Accept", "")
    return next((e for e in encoders if e.media_type in accept), default)


def position_headers(next_offset: int, low: int, high: int) -> dict[str, str]:
    """The positions of an answer as headers (:data:`POSITION_HEADERS`)."""
    return {NEXT_OFFSET: str(next_offset), LOW_OFFSET: str(low), HIGH_OFFSET: str(high)}


async def serve_fetch(api: ApiCore, request: web.Request, encoder: Encoder) -> web.StreamResponse:
    """The fetch, answered by ``encoder`` (see the module docstring)."""
    f = await fetch_query(api, request, encoder.bounds(api.limits))
    if f.store is None:
        return await api.forward(
            request,
            str(f.group),
            accept=encoder.media_type,
            keep_headers=encoder.headers,
            timeout_s=api.limits.max_wait_ms / 1000 + FORWARD_MARGIN_S,
        )
    store = f.store
    reading = encoder.reading(f, store)
    await long_poll(api.node, f, reading.read, bool, in_executor=encoder.in_executor)
    await reading.rest()
    # After the read: the positions never say less than what the answer holds.
    low, high = queue_bounds(store, f.topic.id, f.queue)
    answer = await reading.answer(low, high)
    api.metrics.fetched.inc(answer.count)
    return await write_parts(request, answer.parts, content_type=encoder.media_type, headers=answer.headers)
