"""What the two fetch answers share: the JSON one (``Api.fetch``) and the Arrow IPC stream
(``SegmentsApi.fetch_arrow``, ``Accept: application/vnd.apache.arrow.stream``).

Both check the path and the query the same way and in the same order (so a request gets the
same error whichever answer it asks for), decide the same way whether this node reads or the
queue group's leader must, and long-poll the same way; they differ in their defaults for
``max`` and ``max_bytes`` and in how they read and encode the messages.

Bounded work on the event loop: a fetch answer may hold 64 MiB. The JSON answer is read a
record batch at a time (:func:`read_steps`), encoded in slices of about
:data:`ENCODE_SLICE_BYTES` (:func:`encode_fetch`) with the loop free between slices, and written
part by part as the socket drains (:func:`write_parts`), so ``/healthz`` and other requests are
answered while large fetches run (``tests/bench/bench_fetch_load.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.common import message_item
from raftmq.cluster.api.validation import MAX_FETCH_BYTES, MAX_OFFSET, MAX_QUEUE_NUMBER, bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.storage.records import Message
from raftmq.storage.store import Store, StoreClosed

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore
    from raftmq.cluster.machines.metadata import Topic
    from raftmq.cluster.node.node import Node

__all__ = [
    "ENCODE_SLICE_BYTES",
    "FETCH_PARAMS",
    "FetchQuery",
    "encode_fetch",
    "fetch_query",
    "long_poll",
    "only_params",
    "queue_number",
    "read_steps",
    "write_parts",
]

log = structlog.get_logger(__name__)

FETCH_PARAMS = frozenset({"offset", "max", "wait_ms", "read_from", "max_bytes"})
ENCODE_SLICE_BYTES = 256 * 1024  # message bytes encoded between two turns of the event loop
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


async def fetch_query(
    api: ApiCore, request: web.Request, *, default_max: int, max_max: int, default_bytes: int
) -> FetchQuery:
    """Check ``GET /v1/topics/{topic}/queues/{queue}/messages`` and decide where it is read."""
    topic = await api.topic(request.match_info["topic"])
    q = queue_number(topic, request.match_info["queue"])
    query = request.query
    only_params(request, FETCH_PARAMS)
    offset = query_int(query, "offset", None, 0, MAX_OFFSET)
    max_messages = query_int(query, "max", default_max, 1, max_max)
    wait_ms = query_int(query, "wait_ms", 0, 0, api.limits.max_wait_ms)
    max_bytes = query_int(query, "max_bytes", default_bytes, 1, MAX_FETCH_BYTES)
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
    elif api.router.leads(str(g)):
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
    while True:
        # An offset outside the queue raises storage's OffsetOutOfRange, which the error
        # middleware answers as it is: 416 offset_out_of_range with low_offset and high_offset.
        got = await loop.run_in_executor(None, read) if in_executor else read()
        remaining = deadline - time.monotonic()
        if has_data(got) or remaining <= 0:
            return got
        await node.wait_for_messages(f.topic.id, f.queue, remaining)


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
    written one at a time (:func:`write_parts`): joining them would copy 64 MiB in one step."""
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


async def write_parts(
    request: web.Request,
    parts: Sequence[bytes],
    *,
    content_type: str = "application/json",
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """A JSON answer (or the binary fetch's frames: ``content_type``, ``headers``) written part by
    part, waiting for the socket to drain between parts (a ``web.Response`` of 64 MiB copies it
    into the transport's buffer in one step). The body and its ``Content-Length`` are what
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
