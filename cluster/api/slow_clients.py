"""What slow clients can make a node hold while their requests are served: a request body trickled
after the head (a token holder's, or a stranger's on an open route) is bounded in time here, and
the number of clients' requests in the application at once.

Once a request's head reaches the application its connection is no longer idle
(cluster/api/connections.py), so nothing else closes it: a handler awaiting a body sent a byte a
second, under a large ``Content-Length``, held a task, its buffers and a descriptor for as long as
the client liked. Every handler reads its body through the request's payload stream (``read()``,
``json()``, ``post()``, multipart), so one deadline on that stream covers them all.

Nothing capped the requests in the application: each holds a task and what its handler holds (a
body of up to ``max_request_bytes``, an answer being written), for as long as a slow client's body
is in time (:func:`body_deadline_s`) or its answer moves (``http_write_timeout_ms``), or a long
poll's wait, or a push stream's life.
"""

from __future__ import annotations

import asyncio

from aiohttp import StreamReader, web
from aiohttp.typedefs import Middleware

from raftmq.cluster.api.common import Handler, error_response
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.keys import PEER_HEADER, ClusterKeys

__all__ = [
    "MIN_BODY_BYTES_PER_S",
    "BodyTimeout",
    "body_deadline_middleware",
    "body_deadline_s",
    "request_cap_middleware",
]


class BodyTimeout(ApiError, TimeoutError):
    """``request_timeout``: set on a request's payload stream whose body did not all arrive in
    time, a handler's read raises it at once. A ``TimeoutError`` too, so aiohttp's discarding of the
    unread rest after the handler stops at once and closes the connection (it would wait 10 s for a
    trickle otherwise)."""


HEALTH_PATHS = frozenset({"/healthz", "/readyz"})  # never counted by the cap: _uncounted
MIN_BODY_BYTES_PER_S = 64 * 1024  # the slowest steady upload a body's deadline allows for


def body_deadline_s(within_s: float, declared: int | None, max_bytes: int) -> float:
    """The time a body of ``declared`` bytes (``Content-Length``; None when chunked) gets from its
    head: ``within_s`` (``limits.request_timeout_ms``) plus its size at ``MIN_BODY_BYTES_PER_S``.
    A fixed ``within_s`` made a 4 MiB body need 3.4 Mbit/s, so a slow but steady upload of a large
    body never completed. The size counts up to ``max_bytes`` (``limits.max_request_bytes``): a
    larger one is refused once read, and must not buy a trickle more time."""
    return within_s + min(declared or 0, max_bytes) / MIN_BODY_BYTES_PER_S


def body_deadline_middleware(within_s: float, max_bytes: int) -> Middleware:
    """A request's body must all arrive within :func:`body_deadline_s` from its head: a read of it
    past that answers 408 ``request_timeout`` and the connection is closed. A handler that reads
    no body is not cut (a long poll is not); its connection is closed after its answer, as the
    rest of the body is never waited for."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        payload = request.content
        if not request.body_exists or payload.is_eof():
            return await handler(request)
        deadline_s = body_deadline_s(within_s, request.content_length, max_bytes)
        late = BodyTimeout(errors.REQUEST_TIMEOUT, f"the request body did not arrive within {deadline_s:g} s")
        timer = asyncio.get_running_loop().call_later(deadline_s, _expire, payload, late)
        try:
            return await handler(request)
        except BodyTimeout as e:
            answer = error_response(e)
            answer.force_close()
            return answer
        finally:
            timer.cancel()

    return middleware


def _expire(payload: StreamReader, late: BodyTimeout) -> None:
    """Fail the reads of a body not all received (one received in time is left alone)."""
    if not payload.is_eof():
        payload.set_exception(late)


def request_cap_middleware(most: int, keys: ClusterKeys) -> Middleware:
    """At most ``most`` (``limits.http_max_requests``) clients' requests in the application at once:
    one more is answered 429 ``too_many_requests`` at once, nothing read or done. A peer's call
    (the peer key) is not counted nor refused: a node forwarding its clients' requests, or asking
    for a group's state, must not be stopped by another's clients (their requests count where they
    entered). Nor is a ``GET`` of ``/healthz`` or ``/readyz`` (:func:`_uncounted`): a node holding
    ``most`` long polls answered 429 to its own health check, and its orchestrator restarted it."""
    under_way = 0

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal under_way
        if _uncounted(request) or (PEER_HEADER in request.headers and keys.authorizes(request.headers)):
            return await handler(request)
        if under_way >= most:
            raise ApiError(
                errors.TOO_MANY_REQUESTS, f"this node serves at most {most} requests at once; retry later"
            )
        under_way += 1
        try:
            return await handler(request)
        finally:
            under_way -= 1

    return middleware


def _uncounted(request: web.Request) -> bool:
    """Whether ``request`` is a health or readiness check (``GET``/``HEAD`` ``/healthz`` or
    ``/readyz``), answered at once from what the node holds, so a node at its cap still tells its
    supervisor it lives. Everything else is counted: ``/metrics`` reads every led group's store in
    the executor, the console asks the peers (review: exempt, they were unbounded)."""
    if request.method not in ("GET", "HEAD"):
        return False
    match = request.match_info
    resource = match.route.resource
    if match.http_exception is not None or resource is None:
        return False
    return resource.canonical in HEALTH_PATHS
