"""Refusals made before the SQS handler runs, in the request's SQS wire (docs/sqs.md, "Errors").

The node's cap on requests (``limits.http_max_requests``, ``slow_clients.request_cap_middleware``)
refuses a request before any handler reads it. Its raftmq answer (a JSON 429 ``too_many_requests``)
was nothing an SQS client knows: botocore on the query protocol failed to parse it as XML (a
``ResponseParserError``, never retried), and on the JSON protocol, its retries spent, raised code
``'429'``. An SQS request gets it here as the handler answers its own refusals
(``errors.from_raftmq_error``: 403 ``RequestThrottled``, which botocore retries).

An SQS request is a ``POST`` to ``/`` or to a queue's URL: the routes only the SQS handler serves.
Its wire is the handler's choice, by ``Content-Type`` alone (nothing of the body is read for it).
"""

from __future__ import annotations

from aiohttp import web

from raftmq.cluster.api.common import Handler
from raftmq.cluster.api.sqs.errors import from_raftmq_error
from raftmq.cluster.api.sqs.messages import message_ids
from raftmq.cluster.api.sqs.wire import QUEUE_ROUTE, error_answer, is_json_request
from raftmq.cluster.base.errors import RaftmqError

__all__ = ["sqs_refusal_middleware"]

_SQS_ROUTES = frozenset({"/", QUEUE_ROUTE})


@web.middleware
async def sqs_refusal_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An answerable raftmq error raised by a middleware inside this one (the request cap) for an
    SQS request, answered in the request's SQS wire; any other request's errors go on to
    ``common.error_middleware``."""
    if not _is_sqs(request):
        return await handler(request)
    try:
        return await handler(request)
    except RaftmqError as e:
        if not e.status:  # no answer of its own: a bug, error_middleware logs it
            raise
        (request_id,) = message_ids(1)
        return error_answer(from_raftmq_error(e), request_id, is_json_request(request))


def _is_sqs(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    return request.method == "POST" and resource is not None and resource.canonical in _SQS_ROUTES
