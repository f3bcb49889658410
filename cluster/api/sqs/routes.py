"""The routes of the Amazon SQS API (the package docstring): ``POST /`` and ``POST /{account}/{queue}``,
and ``GET /v1/sqs/credentials`` (a token's SigV4 credentials)."""

from __future__ import annotations

import asyncio
import datetime

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.auth import PRINCIPAL
from raftmq.cluster.api.common import client_gone
from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi
from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.slow_clients import BodyTimeout
from raftmq.cluster.api.sqs import sigv4
from raftmq.cluster.api.sqs.access import authorize, bind_path_queue, refuse_unknown
from raftmq.cluster.api.sqs.errors import SqsError, from_raftmq_error
from raftmq.cluster.api.sqs.message_actions import SqsActions
from raftmq.cluster.api.sqs.messages import message_ids
from raftmq.cluster.api.sqs.move_tasks import MoveTasks
from raftmq.cluster.api.sqs.wire import (
    CREDENTIALS_PATH,
    QUEUE_PATH,
    error_answer,
    is_json_request,
    json_answer,
    query_answer,
    query_params,
)
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.config.keys import sqs_secret_key
from raftmq.cluster.config.tokens import TokenGrant
from raftmq.cluster.node.node import Node

__all__ = ["add_sqs_routes"]

log = structlog.get_logger(__name__)

_TARGET = "AmazonSQS."


class SqsHandler:
    def __init__(self, node: Node, actions: SqsActions) -> None:
        self.node = node
        self.actions = actions
        self._secrets: dict[str, tuple[str, TokenGrant]] | None = None  # built at first use

    def credentials(self, access_key_id: str) -> tuple[str, TokenGrant] | None:
        """The secret access key and grant of an access key id (a token's name)."""
        if self._secrets is None:
            key, grants = self.node.keys.sqs, self.node.config.security.tokens
            self._secrets = {g.name: (sqs_secret_key(key, g.name, g.digest), g) for g in grants}
        return self._secrets.get(access_key_id)

    async def _authenticate(self, request: web.Request) -> TokenGrant:
        """The token whose SigV4 signature the request carries (a cluster with tokens only)."""
        claimed = sigv4.check_claim(
            request.rel_url.raw_query_string,
            request.headers,
            datetime.datetime.now(datetime.UTC),
            self.node.config.sqs.region,
            self.credentials,
        )
        # Only a request with a known key, a fresh date and its headers signed gets its body read.
        # In time: the sender is not known yet (aiohttp keeps the bytes for the form or JSON reading).
        within_s = self.node.config.limits.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(within_s):
                body = await request.read()
        except TimeoutError:  # this timeout, or the body deadline's BodyTimeout
            late = f"The request body did not arrive within {within_s:g} s."
            raise SqsError("RequestTimeout", late) from None
        verified = sigv4.check_signature(
            claimed,
            request.method,
            request.rel_url.raw_path,
            lambda name: request.headers.getall(name, []),
            body,
        )
        return verified.principal

    async def credentials_route(self, request: web.Request) -> web.Response:
        """``GET /v1/sqs/credentials``: the calling token's SigV4 credentials (any valid token; the
        authentication middleware checked it). The secret goes to its own token's holder only."""
        region = self.node.config.sqs.region
        grant = request.get(PRINCIPAL)
        # A peer's request (the peer key, no token) gets no secret: only a token has one.
        answer: dict[str, object] = {"region": region, "signature_checked": self.node.config.security.enabled}
        if grant is not None:
            found = self.credentials(grant.name)
            assert found is not None  # every grant of the config has its secret
            answer.update(access_key_id=grant.name, secret_access_key=found[0])
        return web.Response(
            body=orjson.dumps(answer, option=orjson.OPT_APPEND_NEWLINE),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def handle(self, request: web.Request) -> web.Response:
        (request_id,) = message_ids(1)
        json_wire = is_json_request(request)
        action = ""
        try:
            grant = await self._authenticate(request) if self.node.config.security.enabled else None
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
                except (web.HTTPRequestEntityTooLarge, BodyTimeout):  # answered below as such
                    raise
                except Exception:  # a body aiohttp cannot read as a form (bad multipart, encoding)
                    raise SqsError("MalformedQueryString", "The request body is not a form.") from None
                fields = {k: v for k, v in request.query.items() if not k.startswith("X-Amz-")}
                fields.update({k: v for k, v in form.items() if isinstance(v, str)})
                action, params = query_params(fields)
            if "queue" in request.match_info:  # posted to a queue's URL (either wire): that queue only
                url = str(request.url.with_query(None))
                bind_path_queue(action, params, url, request.match_info["queue"])
            refuse_unknown(action)  # deny by default, with or without tokens
            if grant is not None:
                await authorize(action, params, grant, self.actions.api.permission_names)
                request[PRINCIPAL] = grant
            run = self.actions.actions.get(action)
            if run is None:
                raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
            result = await run(request, params)
        except SqsError as e:
            return error_answer(e, request_id, json_wire)
        except RaftmqError as e:  # a body trickled past its deadline (BodyTimeout) is RequestTimeout
            return error_answer(from_raftmq_error(e), request_id, json_wire)
        except web.HTTPRequestEntityTooLarge:
            e2 = SqsError("InvalidParameterValue", "The request is larger than the node's limit.")
            return error_answer(e2, request_id, json_wire)
        except web.RequestPayloadError:  # a body aiohttp could not read, signature not yet checked
            e5 = SqsError("MalformedQueryString", "The request body could not be read.")
            return error_answer(e5, request_id, json_wire)
        except Exception as e:
            if isinstance(e, ConnectionError) and client_gone(request):
                # It left mid-body, its signature not yet checked (common.client_gone): no traceback.
                e4 = SqsError("MalformedQueryString", "The request body was cut short.")
                return error_answer(e4, request_id, json_wire)
            log.exception("sqs_action_failed", action=action[:64], request_id=request_id)
            e3 = SqsError("InternalError", f"internal error; see the node's log (request {request_id})")
            return error_answer(e3, request_id, json_wire)
        return json_answer(result, request_id) if json_wire else query_answer(action, result, request_id)


def add_sqs_routes(app: web.Application, node: Node, api: TopicHandlers, delivery: SubscriptionsApi) -> None:
    actions = SqsActions(node, api, delivery)
    MoveTasks(actions).register(actions.actions)
    handler = SqsHandler(node, actions)
    app.router.add_post("/", handler.handle)
    app.router.add_post(QUEUE_PATH, handler.handle)
    app.router.add_get(CREDENTIALS_PATH, handler.credentials_route)
