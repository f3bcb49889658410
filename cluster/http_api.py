"""The public HTTP API v1 (aiohttp + orjson). Any node answers any request.

Writes go to the leader of the group concerned: served here when this node leads it, otherwise
forwarded to the leader (one hop; a forwarded request is never forwarded again). Every error has
the stable body ``{"error": {"code", "message", "retriable", "definite", ...}}``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import crc32c
import orjson
import structlog
from aiohttp import web

from raftmq.storage.queues import queue_bounds, read_messages

from . import commands, errors
from .errors import error_body
from .fetch_common import fetch_query, long_poll
from .group_commit import ProduceFailed
from .metadata import Topic, validate_topic_name
from .node import META, Node, now_ms
from .openapi import openapi_spec
from .segments_api import wants_arrow
from .validation import (
    DEFAULT_FETCH_BYTES,
    ApiError,
    bad,
    parse_create_topic,
    parse_json,
    parse_produce,
)

if TYPE_CHECKING:
    from .cluster_api import ClusterApi
    from .segments_api import SegmentsApi
    from .subscriptions_api import SubscriptionsApi

__all__ = ["create_app", "key_queue"]

log = structlog.get_logger(__name__)

FORWARDED = "X-Raftmq-Forwarded"
# Peer-call failures where the request certainly never left this node (no connection was made):
# definite, so safe to retry at the next leader.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)
API_KEY: web.AppKey[Api] = web.AppKey("api", object)  # type: ignore[arg-type]


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


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(e: ApiError) -> web.Response:
    return json_response(error_body(e.code, e.message, **e.extra), status=e.code.status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
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
    except Exception:
        log.exception("request_failed", method=request.method, path=request.path)
        return error_response(ApiError(errors.INTERNAL, "internal error; see the node's log"))


def _raft_error(code: str, message: str, definite: bool) -> ApiError:
    known = errors.BY_CODE.get(code, errors.UNKNOWN_OUTCOME)
    if known.definite and not definite:
        known = errors.UNKNOWN_OUTCOME
    return ApiError(known, message)


def _body_error(status: int, data: bytes) -> ApiError:
    """An ApiError from a peer's error response."""
    try:
        e = orjson.loads(data)["error"]
        code = errors.BY_CODE.get(e["code"], errors.INTERNAL)
        extra = {k: v for k, v in e.items() if k not in ("code", "message", "retriable", "definite")}
        return ApiError(code, e.get("message", ""), **extra)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ApiError(errors.UNKNOWN_OUTCOME, f"peer answered HTTP {status}")


class Api:
    """Request handlers. One instance per node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.config.limits
        self._sticky = itertools.count()
        self.metrics: Any = None  # set by create_app
        self.delivery: SubscriptionsApi | None = None  # set by create_app
        self.segments: SegmentsApi | None = None  # set by create_app
        self.changes: ClusterApi | None = None  # set by create_app (cluster changes)
        # How long a request may wait for a group to elect a leader: two election timeouts, and at
        # least 3 s (a split vote can take a second round).
        self.leader_wait_s = max(3.0, 2 * node.config.raft.election_max_ms / 1000)

    # -- helpers ----------------------------------------------------------------------------------

    async def _wait_leader(self, name: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.node.leader_of(name)
            if leader is not None:
                return leader
            if time.monotonic() >= deadline:
                raise ApiError(errors.UNAVAILABLE, f"group {name} has no leader right now")
            if name not in self.node.groups:
                await self.node.refresh_peer_status()
            await asyncio.sleep(0.05)

    def _leads(self, name: str) -> bool:
        local = self.node.groups.get(name)
        return local is not None and local.raft.is_leader()

    async def _forward(self, request: web.Request, name: str, body: bytes | None = None) -> web.Response:
        """Proxy ``request`` to the leader of group ``name`` and return its answer unchanged.

        A ``not_leader`` answer (leadership moved on; nothing was done) is retried against the
        newly known leader until ``leader_wait_s`` has passed, as ``_group_call`` does for writes.
        """
        if request.headers.get(FORWARDED):
            raise ApiError(errors.NOT_LEADER, f"this node ({self.node.me.id}) does not lead group {name}")
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            response = await self._forward_once(request, name, body)
            if response.status != errors.NOT_LEADER.status or time.monotonic() >= deadline:
                return response
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _forward_once(self, request: web.Request, name: str, body: bytes | None) -> web.Response:
        leader = await self._wait_leader(name, self.leader_wait_s)
        if leader.id == self.node.me.id:
            raise ApiError(errors.UNAVAILABLE, f"group {name} is electing a leader")
        session = self.node._session
        assert session is not None
        try:
            async with session.request(
                request.method,
                leader.http_url + request.path_qs,
                data=body,
                headers={FORWARDED: self.node.me.id, "Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(
                    total=self.limits.request_timeout_ms / 1000 + 16, sock_connect=1.0
                ),
            ) as resp:
                data = await resp.read()
                return web.Response(body=data, status=resp.status, content_type=resp.content_type)
        except NOT_SENT:
            raise ApiError(
                errors.UNAVAILABLE, f"cannot reach the leader {leader.id} of group {name}"
            ) from None
        except (TimeoutError, aiohttp.ClientError):
            raise ApiError(errors.UNKNOWN_OUTCOME, f"lost the answer of the leader {leader.id}") from None

    async def topic(self, name: str, *, fresh: bool = False) -> Topic:
        """The topic, from the local metadata replica; a miss is re-checked at the leader."""
        if validate_topic_name(name):  # no such topic can exist; and never put it into a URL
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        machine = self.node.metadata
        if machine is not None and not fresh:
            t = machine.topic(name)
            if t is not None:
                return t
        t = await self._topic_linearizable(name)
        if t is None:
            raise ApiError(errors.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return t

    async def _topic_linearizable(self, name: str) -> Topic | None:
        if self._leads(META):
            outcome = await self.node.propose(META, commands.noop())  # barrier: see all earlier writes
            if outcome.error:
                raise _raft_error(outcome.error, "metadata barrier failed", outcome.definite)
            assert self.node.metadata is not None
            return self.node.metadata.topic(name)
        leader = await self._wait_leader(META, 3.0)
        status, data, _ = await self.node.peer_request(
            "GET", leader, f"/internal/topics/{urllib.parse.quote(name, safe='')}"
        )
        if status == 404:
            return None
        if status != 200:
            raise _body_error(status, data)
        return Topic.from_json(orjson.loads(data))

    # -- health and cluster -----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "node_id": self.node.me.id})

    async def readyz(self, request: web.Request) -> web.Response:
        missing = [name for name, g in self.node.groups.items() if g.raft.leader() is None]
        if missing:
            return json_response(
                error_body(
                    errors.UNAVAILABLE,
                    "groups without a leader: " + ", ".join(sorted(missing)),
                    groups=missing,
                ),
                status=503,
            )
        return json_response({"status": "ready", "node_id": self.node.me.id})

    async def cluster(self, request: web.Request) -> web.Response:
        peers = await self.node.refresh_peer_status()
        statuses = {self.node.me.id: self.node.local_status(), **peers}
        nodes = [
            {"id": n.id, "http": n.http, "raft": n.raft, "reachable": n.id in statuses}
            for n in self.node.config.nodes
        ]
        groups: dict[str, dict[str, Any]] = {}
        for node_id, status in statuses.items():
            for name, g in status["groups"].items():
                entry = groups.setdefault(name, {"group_id": name, "leader": None, "term": 0, "replicas": []})
                entry["replicas"].append({"node_id": node_id, **{k: g[k] for k in g if k != "replicas"}})
                if g["is_leader"] and g["term"] >= entry["term"]:
                    entry["leader"], entry["term"] = node_id, g["term"]
        ordered = sorted(groups.values(), key=lambda g: (g["group_id"] != META, g["group_id"].zfill(4)))
        for g in ordered:
            g["replicas"].sort(key=lambda r: r["node_id"])
        return json_response({"node_id": self.node.me.id, "nodes": nodes, "groups": ordered})

    # -- topics -----------------------------------------------------------------------------------

    async def create_topic(self, request: web.Request) -> web.Response:
        body = await request.read()
        spec = parse_create_topic(parse_json(body), self.limits)
        if not self._leads(META):
            return await self._forward(request, META, body)
        command = orjson.dumps(
            {
                "v": 1,
                "op": "create_topic",
                "now_ms": now_ms(),
                "group_count": self.node.config.queue_groups,
                **spec,
            }
        )
        result = await self._propose_checked(META, command)
        topic = Topic.from_json(result["topic"])
        return json_response(await self._describe(topic), status=201)

    async def _propose_checked(self, name: str, command: bytes) -> dict[str, Any]:
        outcome = await self.node.propose(name, command)
        if outcome.error:
            raise _raft_error(outcome.error, f"group {name}: {outcome.error}", outcome.definite)
        result: dict[str, Any] = outcome.result
        if "error" in result:
            e = result["error"]
            extra = {k: v for k, v in e.items() if k not in ("code", "message", "retriable", "definite")}
            raise ApiError(errors.BY_CODE.get(e["code"], errors.INTERNAL), e["message"], **extra)
        return result

    async def list_topics(self, request: web.Request) -> web.Response:
        if self._leads(META):
            await self._propose_checked(META, commands.noop())
            assert self.node.metadata is not None
            topics = [t.to_json() for t in self.node.metadata.topics()]
            return json_response({"topics": topics})
        return await self._forward(request, META)

    async def get_topic(self, request: web.Request) -> web.Response:
        topic = await self.topic(request.match_info["topic"])
        return json_response(await self._describe(topic))

    async def _describe(self, topic: Topic) -> dict[str, Any]:
        by_group: dict[int, list[int]] = defaultdict(list)
        for q, g in enumerate(topic.queue_groups):
            by_group[g].append(q)
        bounds: dict[int, tuple[int, int] | None] = {}

        async def fetch(g: int) -> None:
            local = self.node.queue_group(g)
            leader = self.node.leader_of(str(g))
            if local is not None and (leader is None or leader.id == self.node.me.id):
                for q in by_group[g]:
                    bounds[q] = queue_bounds(local.machine.store, topic.id, q)
                return
            target = leader or (self.node.config.group_replicas(g)[0])
            try:
                status, data, _ = await self.node.peer_request(
                    "GET", target, f"/internal/groups/{g}/bounds?topic_id={topic.id}", timeout_s=2.0
                )
                if status == 200:
                    got = orjson.loads(data)["queues"]
                    for q in by_group[g]:
                        low, high = got.get(str(q), (0, 0))
                        bounds[q] = (low, high)
            except (TimeoutError, aiohttp.ClientError, OSError):
                for q in by_group[g]:
                    bounds[q] = None

        await asyncio.gather(*(fetch(g) for g in by_group))
        queues = []
        for q, g in enumerate(topic.queue_groups):
            leader = self.node.leader_of(str(g))
            b = bounds.get(q)
            queues.append(
                {
                    "queue": q,
                    "group_id": g,
                    "leader": leader.id if leader else None,
                    "replicas": [r.id for r in self.node.config.group_replicas(g)],
                    "low_offset": b[0] if b else None,
                    "high_offset": b[1] if b else None,
                }
            )
        return {**topic.to_json(), "queues": queues}

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not self._leads(META):
            return await self._forward(request, META)
        result = await self._propose_checked(META, orjson.dumps({"v": 1, "op": "delete_topic", "name": name}))
        topic = Topic.from_json(result["deleted"])
        # Free the data; topic ids are never reused, so a failure here only leaves garbage.
        for g in sorted(set(topic.queue_groups)):
            try:
                await self._group_call(g, "drop", {"topic_id": topic.id})
            except ApiError as e:
                log.warning("drop_topic_failed", group=g, topic_id=topic.id, error=e.message)
        return json_response({"deleted": name})

    # -- produce ----------------------------------------------------------------------------------

    async def produce(self, request: web.Request) -> web.Response:
        topic = await self.topic(request.match_info["topic"])
        max_bytes = topic.max_message_bytes or self.limits.max_message_bytes
        req = parse_produce(parse_json(await request.read()), self.limits, max_bytes, now_ms())
        sticky = next(self._sticky) % topic.queues
        # per message: (queue, position among the batch's undelayed messages, or its due time)
        placed: list[tuple[int, int | None, int | None]] = []
        undelayed: dict[int, int] = defaultdict(int)
        batches: dict[int, dict[str, Any]] = {}
        sizes: dict[int, int] = defaultdict(int)
        for i, m in enumerate(req.messages):
            if m.queue is not None:
                if m.queue >= topic.queues:
                    raise ApiError(
                        errors.QUEUE_NOT_FOUND,
                        f"messages[{i}].queue {m.queue}: topic has {topic.queues} queues",
                    )
                q = m.queue
            elif m.key is not None:
                q = key_queue(m.key, topic.queues)
            else:
                q = sticky  # unkeyed messages of one request stay together: one entry, one batch
            batch = batches.get(q)
            if batch is None:
                batch = batches[q] = {"topic_id": topic.id, "queue": q, "messages": []}
                if req.producer_id is not None:
                    batch["producer_id"], batch["sequence"] = req.producer_id, req.sequence
            if m.deliver_at_ms is None:
                placed.append((q, undelayed[q], None))
                undelayed[q] += 1
            else:
                placed.append((q, None, m.deliver_at_ms))
            batch["messages"].append(m.body)
            sizes[q] += m.size + 32
        by_group: dict[int, list[int]] = defaultdict(list)
        for q in batches:
            by_group[topic.queue_groups[q]].append(q)

        async def to_group(g: int, queues: list[int]) -> dict[int, dict[str, Any] | ApiError]:
            try:
                results = await self._produce_to_group(
                    g, [batches[q] for q in queues], sum(sizes[q] for q in queues)
                )
                return dict(zip(queues, results, strict=True))
            except ApiError as e:
                return dict.fromkeys(queues, e)

        outcome: dict[int, dict[str, Any] | ApiError] = {}
        for part in await asyncio.gather(*(to_group(g, qs) for g, qs in by_group.items())):
            outcome.update(part)
        failures = [e for e in outcome.values() if isinstance(e, ApiError)]
        failures += [
            ApiError(errors.BY_CODE.get(r["error"]["code"], errors.INTERNAL), r["error"]["message"])
            for r in outcome.values()
            if isinstance(r, dict) and "error" in r
        ]
        results: list[dict[str, Any] | None] = []
        for q, pos, deliver_at_ms in placed:
            r = outcome[q]
            if isinstance(r, dict) and "base_offset" in r and pos is None:
                results.append({"queue": q, "offset": None, "deliver_at_ms": deliver_at_ms})
            elif isinstance(r, dict) and "base_offset" in r:
                base = r["base_offset"]  # None only under the ack_before_replication test fault
                results.append({"queue": q, "offset": None if base is None else base + pos})
            else:
                results.append(None)
        if failures:
            first = failures[0]
            # Other queue groups may have stored their part: report what was stored.
            body = error_body(first.code, first.message, results=results, **first.extra)
            return json_response(body, status=first.code.status)
        self.metrics.produced.inc(len(results))
        return json_response({"results": results})

    async def _produce_to_group(
        self, g: int, batches: list[dict[str, Any]], size: int
    ) -> list[dict[str, Any]]:
        # Through _group_call even when this node leads: a leadership change in the middle is then
        # retried at the new leader like any other definite failure.
        result = await self._group_call(g, "produce", {"batches": batches}, size_hint=size)
        results: list[dict[str, Any]] = result["results"]
        return results

    async def _group_call(
        self, g: int | str, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        """Run an internal write ``action`` at the leader of queue group ``g`` (here or remote).

        Failures that certainly did nothing (the leader was unreachable, or is no longer the
        leader) are retried against the newly known leader until ``leader_wait_s`` has passed, so
        a client sees one slow answer across an election instead of an error.
        """
        name = str(g)
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            try:
                return await self._group_call_once(name, action, body, size_hint)
            except ApiError as e:
                if not (e.code.retriable and e.code.definite) or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _group_call_once(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None
    ) -> dict[str, Any]:
        if self._leads(name):
            return await self.internal_action(name, action, body, size_hint)
        leader = await self._wait_leader(name, self.leader_wait_s)
        if leader.id == self.node.me.id:
            raise ApiError(errors.UNAVAILABLE, f"group {name} is electing a leader")
        try:
            status, data, _ = await self.node.peer_request(
                "POST",
                leader,
                f"/internal/groups/{name}/{action}",
                body=body,
                timeout_s=self.limits.request_timeout_ms / 1000 + 5,
            )
        except NOT_SENT:
            raise ApiError(
                errors.UNAVAILABLE, f"cannot reach the leader {leader.id} of group {name}"
            ) from None
        except (TimeoutError, aiohttp.ClientError):
            raise ApiError(errors.UNKNOWN_OUTCOME, f"lost the answer of the leader {leader.id}") from None
        if status != 200:
            raise _body_error(status, data)
        result: dict[str, Any] = orjson.loads(data)
        return result

    async def internal_action(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        """A write at this node as leader of queue group ``name``."""
        local = self.node.groups.get(name)
        if local is None or not local.raft.is_leader():
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not lead group {name}")
        if action == "produce":
            if local.committer is None:
                raise ApiError(errors.BAD_REQUEST, "not a queue group")
            size = size_hint if size_hint is not None else len(orjson.dumps(body["batches"]))
            try:
                results = await asyncio.wait_for(
                    local.committer.produce(body["batches"], size), self.limits.request_timeout_ms / 1000
                )
            except TimeoutError:
                raise ApiError(errors.TIMEOUT, f"queue group {name} did not commit in time") from None
            except ProduceFailed as e:
                raise _raft_error(e.code, f"queue group {name}: {e}", e.definite) from None
            return {"results": results}
        if action == "drop":
            return await self._propose_checked(name, commands.drop_topic(int(body["topic_id"])))
        if action == "commit":
            return await self._propose_checked(
                name,
                commands.commit_offsets(
                    body["group"], int(body["topic_id"]), {int(k): v for k, v in body["offsets"].items()}
                ),
            )
        if action == "barrier":
            return await self._propose_checked(name, commands.noop())
        if self.changes is not None and action in self.changes.actions:
            return await self.changes.internal_action(name, action, body)
        if self.delivery is not None and action in self.delivery.actions:
            return await self.delivery.internal_action(name, action, body)
        raise ApiError(errors.NOT_FOUND, f"unknown action {action}")

    # -- fetch ------------------------------------------------------------------------------------

    async def fetch(self, request: web.Request) -> web.StreamResponse:
        if self.segments is not None and wants_arrow(request):  # Arrow IPC: cluster/segments_api.py
            return await self.segments.fetch_arrow(request)
        f = await fetch_query(
            self,
            request,
            default_max=self.limits.default_fetch_messages,
            max_max=self.limits.max_fetch_messages,
            default_bytes=DEFAULT_FETCH_BYTES,
        )
        if f.store is None:
            return await self._forward(request, str(f.group))
        store, topic, q, offset = f.store, f.topic, f.queue, f.offset
        messages = await long_poll(
            self.node,
            f,
            lambda: read_messages(store, topic.id, q, offset, f.max_messages, f.max_bytes),
            bool,
        )
        low, high = queue_bounds(store, topic.id, q)
        out = []
        now = now_ms()
        for m in messages:
            if m.expired(now, topic.retention_ms):  # TTL: skipped, next_offset still moves past it
                continue
            item: dict[str, Any] = {
                "offset": m.offset,
                "key": m.key,
                "timestamp_ms": m.timestamp_ms,
                "headers": m.headers or {},
            }
            if m.binary:
                item["value_b64"] = base64.b64encode(m.value).decode()
            else:
                item["value"] = m.value.decode()
            out.append(item)
        self.metrics.fetched.inc(len(messages))
        next_offset = messages[-1].offset + 1 if messages else offset
        return json_response(
            {"messages": out, "next_offset": next_offset, "low_offset": low, "high_offset": high}
        )

    # -- consumer group offsets -------------------------------------------------------------------

    async def put_offsets(self, request: web.Request) -> web.Response:
        group = _group_name(request)
        body = parse_json(await request.read())
        if not isinstance(body, dict) or set(body) - {"topic", "offsets", "epoch"}:
            raise bad('body must be {"topic": str, "offsets": {"<queue>": offset}, "epoch"?: int}')
        epoch = body.get("epoch")  # an ordered consumer's lock epoch: the commit is fenced
        if "epoch" in body and (
            not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 2**63
        ):
            raise bad("'epoch' must be a non-negative integer")
        name = body.get("topic")
        if not isinstance(name, str):
            raise bad("'topic' must be a topic name")
        topic = await self.topic(name)
        offsets = body.get("offsets")
        if not isinstance(offsets, dict) or not offsets:
            raise bad("'offsets' must be a non-empty object of queue -> offset")
        by_group: dict[int, dict[str, int]] = defaultdict(dict)
        for k, v in offsets.items():
            # ASCII digits only (str.isdigit() also accepts e.g. "²", which int() refuses), and
            # few of them (int() refuses more than 4300 digits).
            if not (k.isascii() and k.isdigit() and len(k) <= 10) or int(k) >= topic.queues:
                raise ApiError(errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has no queue {k!r}")
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**63:
                raise bad(f"offset for queue {k} must be a non-negative integer")
            by_group[topic.queue_groups[int(k)]][str(int(k))] = v
        if len(by_group) > 1:
            # One commit per queue group: check every offset first, so that a request is not
            # half-applied when a later group refuses its part. high_offset only grows, so an
            # offset accepted here is still in range when its commit applies.
            await self._check_offsets(
                topic, {int(q): o for offs in by_group.values() for q, o in offs.items()}
            )
        for g, offs in by_group.items():
            commit = {"group": group, "topic_id": topic.id, "offsets": offs}
            if epoch is None:
                await self._group_call(g, "commit", commit)
            else:
                await self._group_call(g, "commit_fenced", {**commit, "epoch": epoch})
        return json_response({"ok": True})

    async def _check_offsets(self, topic: Topic, offsets: dict[int, int]) -> None:
        described = await self._describe(topic)
        for q, offset in offsets.items():
            info = described["queues"][q]
            low, high = info["low_offset"], info["high_offset"]
            if high is None:
                raise ApiError(errors.UNAVAILABLE, f"cannot read the bounds of queue {q} now")
            if offset > high:
                raise ApiError(
                    errors.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is above high_offset {high} of queue {q}",
                    queue=q,
                    offset=offset,
                    low_offset=low,
                    high_offset=high,
                )

    async def get_offsets(self, request: web.Request) -> web.Response:
        from raftmq.storage.queues import committed_offset

        group = _group_name(request)
        if not request.query.get("topic"):
            raise bad("query parameter 'topic' is required")
        topic = await self.topic(request.query["topic"])
        result: dict[str, int | None] = {}
        for g in sorted(set(topic.queue_groups)):
            name = str(g)
            queues = [q for q, qg in enumerate(topic.queue_groups) if qg == g]
            if self._leads(name):
                await self._propose_checked(name, commands.noop())  # linearizable: barrier first
                store = self.node.groups[name].machine.store
                for q in queues:
                    result[str(q)] = committed_offset(store, group, topic.id, q)
            else:
                leader = await self._wait_leader(name, 3.0)
                query = urllib.parse.urlencode({"group": group, "topic_id": topic.id})
                status, data, _ = await self.node.peer_request(
                    "GET", leader, f"/internal/groups/{name}/offsets?{query}"
                )
                if status != 200:
                    raise _body_error(status, data)
                got = orjson.loads(data)["offsets"]
                for q in queues:
                    result[str(q)] = got.get(str(q))
        return json_response({"group": group, "topic": topic.name, "offsets": result})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_spec(self.limits))


def _group_name(request: web.Request) -> str:
    group = request.match_info["group"]
    try:
        size = len(group.encode())
    except UnicodeEncodeError:  # a lone surrogate
        size = 0
    if not 1 <= size <= commands.MAX_NAME_BYTES:
        raise bad(f"consumer group names are 1-{commands.MAX_NAME_BYTES} UTF-8 bytes")
    return group


def create_app(node: Node) -> web.Application:
    """The node's aiohttp application: public API v1 plus the internal peer API."""
    from .auth import auth_middleware
    from .cluster_api import add_cluster_routes
    from .console import add_console_routes
    from .consumers_api import add_consumer_routes
    from .groups_api import add_group_routes
    from .internal_api import add_internal_routes
    from .metrics import METRICS_KEY, Metrics, metrics_handler, metrics_middleware
    from .push_api import add_push_routes
    from .segments_api import add_segment_routes
    from .subscriptions_api import add_subscription_routes

    app = web.Application(
        client_max_size=node.config.limits.max_request_bytes,
        middlewares=[
            metrics_middleware,
            error_middleware,
            auth_middleware(node.config.secret, node.config.security),
        ],
    )
    api = Api(node)
    app[METRICS_KEY] = api.metrics = Metrics(node)
    app[NODE_KEY] = node
    app[API_KEY] = api
    r = app.router
    r.add_get("/healthz", api.healthz)
    r.add_get("/readyz", api.readyz)
    r.add_get("/v1/cluster", api.cluster)
    r.add_post("/v1/topics", api.create_topic)
    r.add_get("/v1/topics", api.list_topics)
    r.add_get("/v1/topics/{topic}", api.get_topic)
    r.add_delete("/v1/topics/{topic}", api.delete_topic)
    r.add_post("/v1/topics/{topic}/messages", api.produce)
    r.add_get("/v1/topics/{topic}/queues/{queue}/messages", api.fetch)
    r.add_put("/v1/groups/{group}/offsets", api.put_offsets)
    r.add_get("/v1/groups/{group}/offsets", api.get_offsets)
    r.add_get("/openapi.json", api.openapi)
    r.add_get("/metrics", metrics_handler)
    add_internal_routes(app, node, api)
    add_group_routes(app, node, api)
    api.delivery = add_subscription_routes(app, node, api)
    add_push_routes(app, node, api, api.delivery)
    api.segments = add_segment_routes(app, node, api)
    api.changes = add_cluster_routes(app, node, api)
    add_consumer_routes(app, node, api)  # GET /v1/topics/{topic}/groups (cluster/consumers_api.py)
    add_console_routes(app)  # the web console: /ui (cluster/console.py)
    return app
