"""The routes of the Amazon SQS API (the package docstring): ``POST /`` and ``POST /{account}/{queue}``."""

from __future__ import annotations

import uuid

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi
from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.api.sqs.message_actions import SqsActions
from raftmq.cluster.api.sqs.wire import (
    QUEUE_PATH,
    is_json_request,
    json_answer,
    json_error,
    query_answer,
    query_error,
    query_params,
    sqs_refusal,
)
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.node.node import Node

__all__ = ["add_sqs_routes"]

log = structlog.get_logger(__name__)

_TARGET = "AmazonSQS."


def _from_api_error(e: RaftmqError) -> SqsError:
    """A raftmq error met while running an action, in SQS's terms."""
    if e.error is errors.TOPIC_NOT_FOUND:
        return SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if e.error in (errors.MESSAGE_TOO_LARGE, errors.REQUEST_TOO_LARGE, errors.BAD_REQUEST, errors.BAD_BATCH):
        return SqsError("InvalidParameterValue", e.message)
    if e.error is errors.TOO_MANY_REQUESTS:
        return SqsError("RequestThrottled", e.message)
    if e.retriable and e.definite:
        return SqsError("ServiceUnavailable", e.message)
    # internal, unknown_outcome, timeout: the write may have happened; a retry may duplicate it
    # (at least once, as SQS).
    return SqsError("InternalError", e.message)


class SqsHandler:
    def __init__(self, node: Node, actions: SqsActions) -> None:
        self.node = node
        self.actions = actions

    async def handle(self, request: web.Request) -> web.Response:
        request_id = str(uuid.uuid4())
        json_wire = is_json_request(request)
        action = ""
        try:
            if self.node.config.security.enabled:  # also refused by the auth middleware
                return sqs_refusal(request)
            if json_wire:
                target = request.headers.get("X-Amz-Target", "")
                if not target.startswith(_TARGET):
                    raise SqsError("InvalidAction", "The X-Amz-Target header must name an AmazonSQS action.")
                action = target[len(_TARGET) :]
                raw = await request.read()
                try:
                    params = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError:
                    raise SqsError("SerializationException", "The body is not valid JSON.") from None
                if not isinstance(params, dict):
                    raise SqsError("SerializationException", "The body must be a JSON object.")
            else:
                try:
                    form = await request.post()
                except web.HTTPRequestEntityTooLarge:
                    raise
                except Exception:  # a body aiohttp cannot read as a form (bad multipart, encoding)
                    raise SqsError("MalformedQueryString", "The request body is not a form.") from None
                action, params = query_params({k: v for k, v in form.items() if isinstance(v, str)})
                if "queue" in request.match_info:
                    params.setdefault("QueueUrl", str(request.url))
            run = self.actions.actions.get(action)
            if run is None:
                raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
            result = await run(request, params)
        except SqsError as e:
            return json_error(e, request_id) if json_wire else query_error(e, request_id)
        except RaftmqError as e:
            mapped = _from_api_error(e)
            return json_error(mapped, request_id) if json_wire else query_error(mapped, request_id)
        except web.HTTPRequestEntityTooLarge:
            e2 = SqsError("InvalidParameterValue", "The request is larger than the node's limit.")
            return json_error(e2, request_id) if json_wire else query_error(e2, request_id)
        except Exception:
            log.exception("sqs_action_failed", action=action[:64], request_id=request_id)
            e3 = SqsError("InternalError", f"internal error; see the node's log (request {request_id})")
            return json_error(e3, request_id) if json_wire else query_error(e3, request_id)
        return json_answer(result, request_id) if json_wire else query_answer(action, result, request_id)


def add_sqs_routes(app: web.Application, node: Node, api: TopicHandlers, delivery: SubscriptionsApi) -> None:
    handler = SqsHandler(node, SqsActions(node, api, delivery))
    app.router.add_post("/", handler.handle)
    app.router.add_post(QUEUE_PATH, handler.handle)
