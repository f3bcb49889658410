"""What every HTTP handler module shares: JSON answers, the error middleware (every error has the
stable body ``{"error": {"code", "message", "retriable", "definite", ...}}``) and the consumer-group
name of a path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from raftmq.cluster import commands
from raftmq.cluster.api.validation import bad
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.node.messages import message_item
from raftmq.cluster.node.router import peer_error
from raftmq.storage.store import StoreClosed

__all__ = [
    "Handler",
    "ResponseAborted",
    "client_gone",
    "error_middleware",
    "error_response",
    "group_name",
    "json_response",
    "message_item",
    "read_unknown_sender",
]

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(data: Any, status: int = 200) -> web.Response:
    """A JSON answer; its body ends with a newline (``curl`` leaves the shell prompt on a line of
    its own, and JSON-lines tools take it whole)."""
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE),
        status=status,
        content_type="application/json",
    )


def error_response(e: RaftmqError) -> web.Response:
    """The answer of a catalogued error: its body (:meth:`RaftmqError.body`) and its status."""
    return json_response(e.body(), status=e.status)


class ResponseAborted(RaftmqError):
    """A streamed answer failed after its status and headers were sent: no error answer can follow
    (it would land inside the body), so the connection is dropped and the client sees the body cut
    short (aiohttp closes it when a handler raises after ``prepare``)."""


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one way from an error to an answer: any catalogued error a handler raises (an
    ``ApiError``, a state machine's ``Refused``, storage's ``OffsetOutOfRange``, a ``BadBatch``)
    is answered with its own body and status; an error that is no answer (status 0) or any other
    exception is a 500 ``internal`` whose detail stays in the node's log."""
    try:
        return await handler(request)
    except ResponseAborted:
        raise
    except StoreClosed as e:
        # A group's store closed under the request: a snapshot install replaced it, or a storage
        # failure stopped the group. The node's state, not a bug: retriable, never a 500. A read
        # did nothing; a write may have been proposed before the close, so its outcome is unknown.
        log.warning("store_closed_under_request", method=request.method, path=request.path, error=str(e))
        code = errors.UNAVAILABLE if request.method in ("GET", "HEAD") else errors.UNKNOWN_OUTCOME
        return error_response(ApiError(code, "the queue group's store was closed under the request; retry"))
    except RaftmqError as e:
        if not e.status:
            log.exception("request_failed", method=request.method, path=request.path)
            return error_response(ApiError(errors.INTERNAL, "internal error; see the node's log"))
        return error_response(e)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(ApiError(errors.REQUEST_TOO_LARGE, str(e.text or "request body too large")))
    except web.HTTPNotFound:
        return error_response(ApiError(errors.NOT_FOUND, f"no route {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(
            ApiError(errors.METHOD_NOT_ALLOWED, f"{request.method} is not allowed on {request.path}")
        )
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(ApiError(errors.BAD_REQUEST, e.reason))
    except asyncio.CancelledError:
        raise
    except web.RequestPayloadError:  # a body aiohttp could not read (a broken gzip stream, chunk)
        return error_response(ApiError(errors.BAD_REQUEST, "the request body could not be read"))
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
        if client_gone(request):  # it left mid-body: nobody to answer, and nothing to warn about
            return error_response(ApiError(errors.BAD_REQUEST, "the request was cut short"))
        # A call to another node that its handler did not map (router.peer_call does): the peer is
        # gone or slow, which is the cluster's state, not a bug; never a 500 ``internal``, which
        # clients rightly do not retry.
        log.warning("peer_call_failed", method=request.method, path=request.path, error=repr(e))
        return error_response(peer_error(e, request.method, "another node"))
    except Exception:
        log.exception("request_failed", method=request.method, path=request.path)
        return error_response(ApiError(errors.INTERNAL, "internal error; see the node's log"))


def client_gone(request: web.Request) -> bool:
    """Whether the client's connection is closed or closing (it left before its request was read
    whole). A reset of the request's own connection is no peer's failure and no bug: logging it
    would let anyone who reaches the port add a line to the log per connection, unauthenticated
    on the open routes and on the SQS API, which reads a body before its signature."""
    transport = request.transport
    return transport is None or transport.is_closing()


def group_name(request: web.Request) -> str:
    group = request.match_info["group"]
    try:
        size = len(group.encode())
    except UnicodeEncodeError:  # a lone surrogate
        size = 0
    if not 1 <= size <= commands.MAX_NAME_BYTES:
        raise bad(f"consumer group names are 1-{commands.MAX_NAME_BYTES} UTF-8 bytes")
    return group


async def read_unknown_sender(request: web.Request, within_s: float, max_bytes: int | None = None) -> bytes:
    """The body of a request whose sender is not known yet (an open route), within ``within_s``
    (``limits.request_timeout_ms``) and, given ``max_bytes``, of a ``Content-Length`` of at most
    that: a stranger can neither hold the request open by trickling its body nor make the node
    buffer more than the route needs.

    Raises:
        ApiError: ``request_too_large`` over ``max_bytes`` (or no length given where it is
            required), ``bad_request`` when the body did not arrive in time.
    """
    length = request.content_length
    if max_bytes is not None and (length is None or length > max_bytes):
        raise ApiError(
            errors.REQUEST_TOO_LARGE, f"this route takes a body with a Content-Length of at most {max_bytes}"
        )
    try:
        async with asyncio.timeout(within_s):
            return await request.read()
    except TimeoutError:
        raise bad(f"the request body did not arrive within {within_s:g} s") from None
