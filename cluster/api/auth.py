"""Who may call what: the authentication middleware of the HTTP API.

Every request is classified by its route (:func:`route_rule`):

- ``/healthz``, ``/readyz``, ``/openapi.json``, the web console's files (``/ui``) and ``/`` (a
  redirect to ``/ui``): open.
- ``/internal/...``: peers only (the peer key in ``X-Raftmq-Peer-Key``); ``raftmq backup``'s three
  routes also take the backup key (``X-Raftmq-Backup-Key``); ``POST /internal/proof`` is open (a
  node being added proves it holds the peer key there; ``cluster/config/keys.py``).
- ``/metrics``: a token, unless ``security.metrics_open``; in full to a cluster admin or a token
  with ``metrics = true``, else only the token's topics and no Raft address (``visibility.py``).
- ``POST /`` and ``POST /{account}/{queue}``: the SQS API (``cluster/api/sqs/``), which authenticates
  its requests itself: open without tokens (any AWS credentials, as the emulators do); with tokens
  an AWS SigV4 signature by a token's SQS credentials, then the token's permissions on the queue
  (``cluster/api/sqs/access.py``). Neither a bearer token nor the peer key opens it: this
  middleware hands SQS requests to their handler before reading either.
- ``/v1/...``: with tokens configured, ``Authorization: Bearer <token>`` and the permission the route
  needs on its topic (the table in ``docs/security.md``); a route without a topic, and any route
  this module does not know, needs cluster admin (``admin = ["*"]``).

Forwarding: the node a client called (the entry node) checks the token; when it forwards the request
to a group's leader it sends the peer key instead (its peer session always does), and a request
carrying the right peer key is a peer's and passes. A request carrying a wrong key is refused (401):
a key header never falls back to a token, so without the key the header is worth nothing. The
backup key passes only ``BACKUP_ROUTES``. ``X-Raftmq-Secret`` (the raw secret, sent by raftmq before
the derived keys) is refused whatever it holds. Keys are compared with ``keys.same_credential``.

Dead-letter topics: a topic that records its source (``Topic.dead_letter_of``) is checked against
its source's name on every route (``TopicNames``, ``ApiCore.permission_names``), never against its
own ``<source>.<group>.dlq``; creating a topic needs admin on each existing topic it could be the
dead-letter topic of, too. The topic list shows a dead-letter topic to the tokens that see its source.
A topic's answers name no other topic the token has no right on (``visibility.py``).

Refusals: 401 ``unauthorized`` (no, malformed or unknown credentials; with ``WWW-Authenticate``),
403 ``forbidden`` (a valid token without the permission). Nothing here logs or returns a header's
value; refusals are logged with the reason and the token's name, at most ``LOG_BURST`` lines per
``LOG_WINDOW_S``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import hdrs, web

from raftmq.cluster.api.sqs.wire import CREDENTIALS_PATH, QUEUE_ROUTE
from raftmq.cluster.api.visibility import (
    TopicTable,
    grant_owns,
    grant_sees,
    visible_metrics,
    visible_topic_answer,
    visible_topic_list,
)
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, ErrorCode, error_body
from raftmq.cluster.config.keys import (
    BACKUP_HEADER,
    BACKUP_ROUTES,
    LEGACY_HEADER,
    PEER_HEADER,
    PROOF_PATH,
    ClusterKeys,
)
from raftmq.cluster.config.tokens import (
    ADMIN,
    CONSUME,
    PERMISSIONS,
    PRODUCE,
    BadCredentials,
    SecurityConfig,
    TokenGrant,
    bearer_token,
)

__all__ = ["CREATE_SOURCE", "PRINCIPAL", "Rule", "TopicNames", "auth_middleware", "route_rule"]

log = structlog.get_logger(__name__)

LOG_BURST = 20
LOG_WINDOW_S = 10.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The names a topic's permissions are checked against: (topic, creating it) -> names, each of which
# the token needs the permission on (ApiCore.permission_names).
TopicNames = Callable[[str, bool], Awaitable[list[str]]]
PRINCIPAL: web.RequestKey[TokenGrant] = web.RequestKey("raftmq_principal", TokenGrant)


@dataclass(frozen=True)
class Rule:
    """What a route needs. ``kind``: ``open``, ``peer``, ``metrics``, ``token`` (any valid token),
    ``cluster_admin`` or ``topic``; for ``topic``, every permission in ``needs`` (any one of them
    with ``any_of``) on each topic named by ``source``: ``path``, ``query:<field>``,
    ``body:<field>`` (a name or a list of names), :data:`CREATE_SOURCE` (a create's ``name``, or
    the ``name`` of each object of its ``topics``), or ``none`` (the permission on some topic)."""

    kind: str
    needs: tuple[str, ...] = ()
    source: str = "path"
    any_of: bool = False


CREATE_SOURCE = "body:name|topics"  # the topic a create names, or each of the topics it names
OPEN, PEER, METRICS, SQS = Rule("open"), Rule("peer"), Rule("metrics"), Rule("sqs")
TOKEN, CLUSTER_ADMIN = Rule("token"), Rule("cluster_admin")
LIST_TOPICS = Rule("token", source="list")  # any token; the answer lists only the token's topics


def _on_topic(*needs: str, source: str = "path", any_of: bool = False) -> Rule:
    return Rule("topic", needs, source, any_of)


_T, _G = "/v1/topics/{topic}", "/v1/groups/{group}"
# Every route by (method, pattern); HEAD counts as GET. A route missing here needs cluster admin (the
# safe default, meant for cluster changes under /v1/cluster/); tests/unit/test_auth.py fails for a
# missing route with a topic in its path, or outside /v1/cluster/.
ROUTES: dict[tuple[str, str], Rule] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/"): OPEN,  # a redirect to /ui
    ("GET", "/ui"): OPEN,  # the web console's files; the page then calls the API with a token
    ("GET", "/ui/"): OPEN,
    ("GET", "/ui/{file}"): OPEN,
    ("GET", "/metrics"): METRICS,
    ("POST", "/"): SQS,  # the SQS API (cluster/api/sqs/)
    ("POST", QUEUE_ROUTE): SQS,
    ("GET", CREDENTIALS_PATH): TOKEN,  # the calling token's own SQS credentials
    ("GET", "/v1/cluster"): TOKEN,  # clients read node addresses from it
    ("GET", "/v1/topics"): LIST_TOPICS,
    # One topic ({"name"}) or many ({"topics": [{"name"}, ...]}): admin on each name created.
    ("POST", "/v1/topics"): _on_topic(ADMIN, source=CREATE_SOURCE),
    ("GET", _T): _on_topic(*PERMISSIONS, any_of=True),
    ("GET", _T + "/groups"): _on_topic(
        CONSUME, ADMIN, any_of=True
    ),  # consumer lag (api/handlers/consumers.py)
    ("GET", _T + "/groups/lag"): _on_topic(CONSUME, ADMIN, any_of=True),  # its history, same rule
    # A group's members on the topic (api/handlers/groups.py): monitoring, as the lag is.
    ("GET", _T + "/groups/{group}/members"): _on_topic(CONSUME, ADMIN, any_of=True),
    ("DELETE", _T): _on_topic(ADMIN),
    ("PATCH", _T): _on_topic(ADMIN),  # a topic's attributes or retention
    ("POST", _T + "/messages"): _on_topic(PRODUCE),
    ("GET", _T + "/queues/{queue}/messages"): _on_topic(CONSUME),
    ("PUT", _G + "/offsets"): _on_topic(CONSUME, source="body:topic"),
    ("GET", _G + "/offsets"): _on_topic(CONSUME, source="query:topic"),
    ("POST", _G + "/members"): _on_topic(CONSUME, source="body:topics"),
    ("DELETE", _G + "/members/{member_id}"): _on_topic(CONSUME, source="none"),
    # Redrive appends the dead letters to the topic again: consuming and producing.
    ("POST", _T + "/subscriptions/{group}/dlq/redrive"): _on_topic(CONSUME, PRODUCE),
    # A subscription's settings outlive its consumers and create its dead-letter topic: admin.
    ("PUT", _T + "/subscriptions/{group}"): _on_topic(ADMIN),
}
# Any method, any route below these (receive/ack/nack/extend, dead letters, the push stream, queue
# locks, segments).
PREFIXES: tuple[tuple[str, Rule], ...] = (
    (_T + "/subscriptions/{group}", _on_topic(CONSUME)),
    (_T + "/queues/{queue}/locks/{group}", _on_topic(CONSUME)),
    (_T + "/segments", _on_topic(CONSUME)),
)


def route_rule(method: str, canonical: str | None, path: str) -> Rule:
    """The rule of a request: ``canonical`` is its route's pattern (None: no route matched)."""
    if canonical is None:
        return PEER if path.startswith("/internal/") else TOKEN  # then 404/405 from the handler
    if canonical.startswith("/internal/"):
        return OPEN if (method, canonical) == ("POST", PROOF_PATH) else PEER
    rule = ROUTES.get(("GET" if method == "HEAD" else method, canonical))
    if rule is not None:
        return rule
    for prefix, prefix_rule in PREFIXES:
        if canonical == prefix or canonical.startswith(prefix + "/"):
            return prefix_rule
    return CLUSTER_ADMIN


def auth_middleware(
    keys: ClusterKeys,
    security: SecurityConfig,
    names: TopicNames,
    table: TopicTable,
    max_topics: int = 1000,
) -> Any:
    """The middleware for a node with the cluster's keys ``keys`` and tokens ``security``;
    ``names`` maps a topic to the names its permissions are checked against, ``table`` gives every
    topic at once (for ``/metrics``, which weighs many names per request). A request naming more
    than ``max_topics`` topics (``limits.max_topics_per_request``) has none of them looked up and
    is refused here (413 ``request_too_large``; 403 for a token with the permission on no topic),
    whatever limit its handler has: no request reaches a handler with a topic left unchecked."""
    refusals = _RefusalLog()
    # Read once: the configuration is frozen, and a route's rule depends on its method and pattern
    # only (a matched route's methods are the registered ones: few keys).
    tokens_on, metrics_open = security.enabled, security.metrics_open
    rules: dict[tuple[str, str], Rule] = {}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        match = request.match_info
        resource = match.route.resource
        canonical = None if match.http_exception is not None or resource is None else resource.canonical
        rule = None if canonical is None else rules.get((request.method, canonical))
        if rule is None:
            rule = route_rule(request.method, canonical, request.path)
            if canonical is not None and request.method in hdrs.METH_ALL:  # only the methods there are
                rules[request.method, canonical] = rule
        if rule is SQS:  # before the peer key: only a SigV4 signature opens SQS (checked by its handler)
            return await handler(request)
        if LEGACY_HEADER in request.headers:
            return refusals.refuse(
                request,
                errors.UNAUTHORIZED,
                "legacy_secret_header",
                f"{LEGACY_HEADER} is not accepted: peers send a key derived from the cluster secret "
                "(every node must run a raftmq version with derived keys; see docs/operations.md)",
            )
        if PEER_HEADER in request.headers:
            if not keys.authorizes(request.headers):
                return refusals.refuse(request, errors.UNAUTHORIZED, "bad_peer_key", "wrong peer key")
            return await handler(request)  # a peer: the entry node checked the caller
        if BACKUP_HEADER in request.headers:
            action = match.get("action") if canonical is not None else None
            route = (request.method, canonical, action if action == "barrier" else None)
            if route not in BACKUP_ROUTES or not keys.authorizes(request.headers, backup=True):
                return refusals.refuse(
                    request, errors.UNAUTHORIZED, "bad_backup_key", "wrong backup key, or not a backup route"
                )
            return await handler(request)
        if rule is PEER:
            return refusals.refuse(
                request, errors.UNAUTHORIZED, "no_peer_key", "internal endpoints need the peer key"
            )
        if rule is OPEN or not tokens_on or (rule is METRICS and metrics_open):
            return await handler(request)
        try:
            grant = security.authenticate(bearer_token(request.headers.get("Authorization")))
        except BadCredentials as e:
            return refusals.refuse(request, errors.UNAUTHORIZED, "bad_credentials", str(e))
        if grant is None:
            return refusals.refuse(request, errors.UNAUTHORIZED, "unknown_token", "invalid token")
        missing = await _missing_permission(rule, grant, request, names, max_topics)
        if missing is not None:
            return refusals.refuse(request, errors.FORBIDDEN, "forbidden", missing, token=grant.name)
        request[PRINCIPAL] = grant
        response = await handler(request)
        if rule is LIST_TOPICS:
            return await visible_topic_list(response, grant, grant_sees(grant, names))
        if rule is METRICS:
            return await visible_metrics(response, grant, table)
        if canonical == _T and request.method in ("GET", "HEAD", "PATCH") and not grant.cluster_admin:
            owner = await grant_owns(grant, names, request.match_info["topic"])
            return await visible_topic_answer(response, grant_sees(grant, names), owner)
        return response

    return middleware


async def _missing_permission(
    rule: Rule, grant: TokenGrant, request: web.Request, names: TopicNames, max_topics: int
) -> str | None:
    """None when ``grant`` may make the request, else why not (without any secret); a request
    naming more than ``max_topics`` topics raises ``request_too_large`` once the token passes."""
    if rule.kind in ("token", "metrics"):
        return None
    if rule.kind != "topic":
        if grant.cluster_admin:
            return None
        return f'token {grant.name!r} lacks cluster admin (admin = ["*"]) for {request.method} {request.path}'
    creating = rule.source == CREATE_SOURCE
    topics = await _topics(rule.source, request)
    count = len(topics)
    if count > max_topics:  # none is looked up, and the request goes no further (below)
        topics = [None]
    checked: list[tuple[str | None, str | None]] = []  # (the topic asked for, a name checked)
    for topic in topics:
        found = [None] if topic is None else await names(topic, creating)
        checked.extend((topic, n) for n in found)
    for asked, topic in checked:
        granted = [p for p in rule.needs if grant.allows(p, topic)]
        if (rule.any_of and not granted) or (not rule.any_of and len(granted) < len(rule.needs)):
            return _refusal(grant, rule, asked)
    if count > max_topics:  # refused here, whatever the handler's own limit: no topic goes unchecked
        raise ApiError(
            errors.REQUEST_TOO_LARGE,
            f"{count} topics in one request; the limit is {max_topics}",
            limit=max_topics,
        )
    return None


def _refusal(grant: TokenGrant, rule: Rule, asked: str | None) -> str:
    """Why ``grant`` may not: naming the topic asked for, never the name checked, which for a
    dead-letter topic is its source where it exists and the name itself where it does not (a
    token with no right on either would tell an existing dead-letter topic from a missing one)."""
    what = " or ".join(rule.needs) if rule.any_of else " and ".join(rule.needs)
    if asked is None:
        return f"token {grant.name!r} lacks {what} permission on any topic"
    why = " (a dead-letter topic goes by its source topic's permissions)" if asked.endswith(".dlq") else ""
    return f"token {grant.name!r} lacks {what} permission on topic {asked!r}{why}"


async def _topics(source: str, request: web.Request) -> list[str | None]:
    """The topics a request acts on; [None] when they cannot be read (the handler then refuses the
    malformed request, if the token has the permission on some topic)."""
    if source == CREATE_SOURCE:
        return _created_topics(await _body(request))
    kind, _, name = source.partition(":")
    value: Any = None
    if kind == "path":
        value = request.match_info.get("topic")
    elif kind == "query":
        value = request.query.get(name)
    elif kind == "body":
        body = await _body(request)
        value = body.get(name) if isinstance(body, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return [None]


async def _body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())  # aiohttp keeps the bytes for the handler
    except orjson.JSONDecodeError:
        return None


def _created_topics(body: Any) -> list[str | None]:
    """The topics a create names: its ``name``, or the ``name`` of each object in its ``topics``
    (None for one that names none: the handler refuses the request)."""
    if not isinstance(body, dict):
        return [None]
    specs = body.get("topics")
    if "name" in body or not isinstance(specs, list) or not specs:
        name = body.get("name")
        return [name if isinstance(name, str) else None]
    found: list[str | None] = []
    for spec in specs:
        name = spec.get("name") if isinstance(spec, dict) else None
        found.append(name if isinstance(name, str) else None)
    return found


class _RefusalLog:
    """Answers refused requests and logs them, at most LOG_BURST lines per LOG_WINDOW_S (a flood
    of bad requests must not flood the log); the count of unlogged ones follows later."""

    def __init__(self) -> None:
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0

    def refuse(
        self, request: web.Request, code: ErrorCode, reason: str, message: str, token: str | None = None
    ) -> web.Response:
        now = time.monotonic()
        if now - self._window_start >= LOG_WINDOW_S:
            if self._suppressed:
                log.warning("requests_refused_unlogged", count=self._suppressed, window_s=LOG_WINDOW_S)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < LOG_BURST:
            self._logged += 1
            log.warning(
                "request_refused",
                status=code.status,
                reason=reason,
                token=token,
                method=request.method,
                path=request.path,
                remote=request.remote,
            )
        else:
            self._suppressed += 1
        headers = {}
        if code is errors.UNAUTHORIZED:
            error = ', error="invalid_token"' if reason == "unknown_token" else ""
            headers["WWW-Authenticate"] = f'Bearer realm="raftmq"{error}'
        return web.Response(
            body=orjson.dumps(error_body(code, message), option=orjson.OPT_APPEND_NEWLINE),
            status=code.status,
            content_type="application/json",
            headers=headers,
        )
