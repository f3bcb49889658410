"""Push delivery: a WebSocket stream per subscription with credits (``docs/delivery.md``, "Push").

Public route (any node answers)::

    GET /v1/topics/{topic}/subscriptions/{group}/stream?visibility_ms=&heartbeat_ms=

NSQ's protocol in JSON text frames. The client grants credit with ``{"op": "rdy", "n": N}``: the
node keeps at most N messages in flight *on this stream* (pushed, and neither finished, requeued
nor past their deadline) and pushes more as credit frees up. ``fin``, ``req`` and ``touch`` are
ack, nack and extend of receipts (of this stream or any other) and get one ``result`` or ``error``
frame each; ``ping`` gets a ``pong``. A frame that is not understood gets an ``error`` frame with
code ``bad_request`` and changes nothing.

The messages come from the receive coordinator of the subscription, wherever it is (internal
action ``take``, :meth:`SubscriptionsApi.take`), so a stream is one more receiver in its round
robin and its messages have the same deadlines, receipts, retries and dead letters as a receive.

Failure behaviour: messages pushed on a stream that dies stay in flight until their deadline and
are then redelivered (nothing is lost); messages taken for a stream that can no longer have them
(closed, or its credit lowered meanwhile) are given back at once (nack with ``delay_ms = 0``). A
take that fails hands nothing out: a retriable error, or ``internal`` (an unexpected error at the
coordinator, told to the client in a non-fatal error frame), is retried with backoff and the
stream stays open; an error for good (the topic is gone) ends it (error frame with ``fatal``).
Heartbeats are WebSocket pings: the node pings a stream that sent nothing for ``heartbeat_ms`` and
drops it if no pong comes within half of that.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import WSCloseCode, WSMsgType, hdrs, web

from raftmq.cluster import commands
from raftmq.cluster.api.validation import bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, RaftmqError, answerable
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.node import Node

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore
    from raftmq.cluster.api.handlers.subscriptions import SubscriptionsApi

__all__ = ["PushApi", "add_push_routes"]

log = structlog.get_logger(__name__)

STREAM_PATH = "/v1/topics/{topic}/subscriptions/{group}/stream"
# The long poll of one take (a stream takes again right after). Short, because a take of a stream
# that died meanwhile still waits in the coordinator's line and would take messages that it can
# only give back (with attempt + 1).
PULL_WAIT_MS = 1_000
DEFAULT_HEARTBEAT_MS = 5_000
MIN_HEARTBEAT_MS = 100
MAX_HEARTBEAT_MS = 60_000
MAX_OPS_IN_PROGRESS = 16  # fin/req/touch frames of one stream applied at once (then reading waits)
MAX_FRAME_ID_CHARS = 64
PUSH_FRAME_BYTES = 256 * 1024  # a "messages" frame holds messages up to this size (or one larger)
CLOSE_FATAL = 4000  # the stream ended after an error frame with "fatal": true
RETRY_MAX_S = 2.0

# op -> the fields it may carry besides "op" and "id"
FRAME_FIELDS: dict[str, frozenset[str]] = {
    "rdy": frozenset({"n"}),
    "fin": frozenset({"receipts"}),
    "req": frozenset({"receipts", "delay_ms"}),
    "touch": frozenset({"receipts", "visibility_ms"}),
    "ping": frozenset(),
}
SETTLE_OPS = {"fin": "ack", "req": "nack", "touch": "extend"}


def _error_frame(
    e: RaftmqError, op: str | None = None, frame_id: Any = None, fatal: bool = False
) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "error"}
    if op is not None:
        frame["op"] = op
    if frame_id is not None:
        frame["id"] = frame_id
    frame.update(e.body())
    if fatal:
        frame["fatal"] = True
    return frame


def _int(frame: dict[str, Any], name: str, lo: int, hi: int) -> int:
    value = frame.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad(f"'{name}' must be an integer from {lo} to {hi}")
    return value


class PushApi:
    """The stream handler; one instance per node. Streams open on this node are in ``streams``."""

    def __init__(self, node: Node, api: ApiCore, delivery: SubscriptionsApi) -> None:
        self.node = node
        self.api = api
        self.delivery = delivery
        self.streams: set[_Stream] = set()

    @property
    def max_rdy(self) -> int:
        return min(self.node.config.limits.max_fetch_messages, commands.MAX_RECEIVE)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        limits = self.node.config.limits
        topic = await self.api.topic(request.match_info["topic"])
        group = self.delivery.consumer_group(request, topic)
        query = request.query
        unknown = set(query) - {"visibility_ms", "heartbeat_ms"}
        if unknown:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        if hdrs.SEC_WEBSOCKET_PROTOCOL in request.headers:
            # aiohttp logs each subprotocol it does not know (twice, the header quoted whole): a
            # line per request for any token holder. None is spoken, and a client asking for one
            # fails a handshake that selects none anyway (RFC 6455, 4.1).
            raise bad("the stream speaks no WebSocket subprotocol: send no Sec-WebSocket-Protocol")
        visibility_ms = query_int(
            query, "visibility_ms", limits.default_visibility_ms, 1, limits.max_visibility_ms
        )
        heartbeat_ms = query_int(
            query, "heartbeat_ms", DEFAULT_HEARTBEAT_MS, MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS
        )
        # Here the token is known (the coordinator's takes are forwarded without it): a group over
        # the caps is refused before the upgrade (409 too_many_groups).
        await self.delivery.ensure_subscription(topic, group, request)
        ws = web.WebSocketResponse(
            heartbeat=heartbeat_ms / 1000,
            compress=False,
            max_msg_size=limits.max_request_bytes,
            decode_text=False,
        )
        if not ws.can_prepare(request).ok:
            raise bad("this route is a WebSocket stream: open it with an 'Upgrade: websocket' request")
        await ws.prepare(request)
        stream = _Stream(self, ws, topic, group, visibility_ms)
        self.streams.add(stream)
        log.debug("push_stream_opened", topic=topic.name, group=group, peer=request.remote)
        try:
            await stream.run(heartbeat_ms)
        finally:
            self.streams.discard(stream)
            log.debug("push_stream_closed", topic=topic.name, group=group, peer=request.remote)
        return ws

    async def take(self, topic: Topic, group: str, n: int, visibility_ms: int) -> list[dict[str, Any]]:
        """Up to ``n`` messages from the subscription's receive coordinator (long-polls)."""
        body = {
            "topic": topic.name,
            "topic_id": topic.id,
            "group": group,
            "max": n,
            "visibility_ms": visibility_ms,
            "wait_ms": PULL_WAIT_MS,
        }
        return await self.delivery.take_call(topic.queue_groups[0], body)

    async def close_all(self, app: web.Application) -> None:
        """On shutdown: close every stream (1001, going away); clients reconnect elsewhere."""
        await asyncio.gather(
            *(s.ws.close(code=WSCloseCode.GOING_AWAY, message=b"node shutting down") for s in self.streams),
            return_exceptions=True,
        )


class _Stream:
    """One open stream: reads client frames, pushes within the credit."""

    def __init__(
        self, owner: PushApi, ws: web.WebSocketResponse, topic: Topic, group: str, visibility_ms: int
    ) -> None:
        self.owner = owner
        self.ws = ws
        self.topic = topic
        self.group = group
        self.visibility_ms = visibility_ms
        self.rdy = 0
        # Invariant: in_flight holds the receipts pushed here and not yet finished or requeued by a
        # frame of this stream; entries past their deadline no longer count (and are dropped).
        self.in_flight: dict[str, int] = {}  # receipt -> deadline_ms (the leader's clock)
        self.changed = asyncio.Event()  # credit or in-flight changed, or the stream is closing
        self.closing = False
        self.send_lock = asyncio.Lock()
        self.op_slots = asyncio.Semaphore(MAX_OPS_IN_PROGRESS)
        self.tasks: set[asyncio.Task[Any]] = set()

    async def run(self, heartbeat_ms: int) -> None:
        await self.send(
            {
                "type": "hello",
                "topic": self.topic.name,
                "group": self.group,
                "node": self.owner.node.me.id,
                "visibility_ms": self.visibility_ms,
                "heartbeat_ms": heartbeat_ms,
                "max_rdy": self.owner.max_rdy,
            }
        )
        pusher = asyncio.create_task(self._push())
        try:
            await self._read()
        finally:
            self.closing = True
            self.changed.set()
            # A take in progress ends within its long poll (what it got is given back); acks the
            # client sent before closing are still applied. The pusher first: its last take may
            # start give-backs, which are waited for too (not cancelled).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + PULL_WAIT_MS / 1000 + self.owner.api.leader_wait_s + 5
            await asyncio.wait({pusher}, timeout=deadline - loop.time())
            if self.tasks:
                await asyncio.wait(set(self.tasks), timeout=max(0.0, deadline - loop.time()))
            for task in {pusher, *self.tasks}:
                task.cancel()  # (nothing for a task that is done)
            with contextlib.suppress(Exception):
                await self.ws.close()

    # -- sending ----------------------------------------------------------------------------------

    async def send(self, frame: dict[str, Any]) -> bool:
        return await self.send_raw(orjson.dumps(frame))

    async def send_raw(self, data: bytes) -> bool:
        """Send one text frame; False if the stream is gone."""
        if self.ws.closed:
            return False
        try:
            async with self.send_lock:
                await self.ws.send_frame(data, WSMsgType.TEXT)
        except (ConnectionError, RuntimeError):
            self.closing = True
            self.changed.set()
            return False
        return True

    async def _send_messages(self, messages: list[dict[str, Any]]) -> None:
        """Messages in frames of about ``PUSH_FRAME_BYTES`` (a larger message alone)."""
        parts: list[bytes] = []
        size = 0
        for m in messages:
            encoded = orjson.dumps(m)
            if parts and size + len(encoded) > PUSH_FRAME_BYTES:
                await self.send_raw(b'{"type":"messages","messages":[' + b",".join(parts) + b"]}")
                parts, size = [], 0
            parts.append(encoded)
            size += len(encoded) + 1
        if parts:
            await self.send_raw(b'{"type":"messages","messages":[' + b",".join(parts) + b"]}")

    # -- reading ----------------------------------------------------------------------------------

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type is WSMsgType.TEXT:
                await self._frame(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await self.send(
                    _error_frame(bad("binary frames are not part of the protocol: send JSON text"))
                )
            else:  # ERROR: the connection failed (or the client stopped answering pings)
                return

    async def _frame(self, data: bytes | str) -> None:
        try:
            frame = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            await self.send(_error_frame(bad(f"the frame is not JSON: {e}")))
            return
        if not isinstance(frame, dict):
            await self.send(_error_frame(bad("a frame is a JSON object with an 'op'")))
            return
        frame_id = frame.get("id")
        if frame_id is not None and not (
            (isinstance(frame_id, int) and not isinstance(frame_id, bool) and abs(frame_id) < 2**53)
            or (isinstance(frame_id, str) and len(frame_id) <= MAX_FRAME_ID_CHARS)
        ):
            await self.send(
                _error_frame(bad(f"'id' must be an integer or a string of at most {MAX_FRAME_ID_CHARS}"))
            )
            return
        op = frame.get("op")
        try:
            if not isinstance(op, str) or op not in FRAME_FIELDS:
                op = None
                raise bad(f"'op' must be one of {', '.join(FRAME_FIELDS)}")
            unknown = set(frame) - FRAME_FIELDS[op] - {"op", "id"}
            if unknown:
                raise bad(f"{op}: unknown field(s) {', '.join(map(repr, sorted(unknown)))}")
            if op == "rdy":
                self.rdy = _int(frame, "n", 0, self.owner.max_rdy)
                self.changed.set()
                return
            if op == "ping":
                await self.send({"type": "pong", **({} if frame_id is None else {"id": frame_id})})
                return
            receipts, fields = self._settle_args(op, frame)
        except RaftmqError as e:
            await self.send(_error_frame(e, op, frame_id))
            return
        if op != "touch":  # the credit frees up when the frame is read (as NSQ does)
            for r in receipts:
                self.in_flight.pop(r, None)
            self.changed.set()
        await self.op_slots.acquire()
        self._spawn(self._settle(op, frame_id, receipts, fields)).add_done_callback(
            lambda _: self.op_slots.release()
        )

    def _settle_args(self, op: str, frame: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        receipts = frame.get("receipts")
        if (
            not isinstance(receipts, list)
            or not 1 <= len(receipts) <= commands.MAX_RECEIPTS
            or not all(isinstance(r, str) for r in receipts)
        ):
            raise bad(f"'receipts' must be a list of 1 to {commands.MAX_RECEIPTS} receipts")
        limits = self.owner.node.config.limits
        fields: dict[str, Any] = {}
        if op == "req" and "delay_ms" in frame:
            fields["delay_ms"] = _int(frame, "delay_ms", 0, limits.max_delay_ms)
        if op == "touch":
            fields["visibility_ms"] = (
                _int(frame, "visibility_ms", 1, limits.max_visibility_ms)
                if "visibility_ms" in frame
                else self.visibility_ms
            )
        return receipts, fields

    async def _settle(self, op: str, frame_id: Any, receipts: list[str], fields: dict[str, Any]) -> None:
        try:
            results = await self.owner.delivery.settle(
                self.topic, self.group, SETTLE_OPS[op], receipts, fields
            )
        except RaftmqError as e:
            await self.send(_error_frame(e, op, frame_id))
            return
        except Exception:
            log.exception("push_settle_failed", topic=self.topic.name, group=self.group, op=op)
            await self.send(
                _error_frame(ApiError(errors.INTERNAL, "internal error; see the node's log"), op, frame_id)
            )
            return
        if op == "touch":
            for r in results:
                if r.get("ok") and r["receipt"] in self.in_flight:
                    self.in_flight[r["receipt"]] = r["deadline_ms"]
            self.changed.set()
        reply: dict[str, Any] = {"type": "result", "op": op}
        if frame_id is not None:
            reply["id"] = frame_id
        reply["results"] = results
        await self.send(reply)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("push_give_back_failed", topic=self.topic.name, error=repr(task.exception()))

    # -- pushing ----------------------------------------------------------------------------------

    def _credit(self) -> int:
        """Credit left: RDY minus the messages in flight here (those past their deadline drop out)."""
        now = now_ms()
        expired = [r for r, deadline in self.in_flight.items() if deadline <= now]
        for r in expired:
            del self.in_flight[r]
        return self.rdy - len(self.in_flight)

    async def _wait_for_credit(self) -> None:
        timeout = None
        if self.in_flight:  # the earliest deadline frees credit
            timeout = max(0.001, (min(self.in_flight.values()) - now_ms()) / 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    async def _push(self) -> None:
        failures = 0
        while not self.closing:
            self.changed.clear()
            room = self._credit()
            if room <= 0:
                await self._wait_for_credit()
                continue
            try:
                got = await self.owner.take(self.topic, self.group, room, self.visibility_ms)
                failures = 0
            except RaftmqError as caught:
                e = answerable(caught, write=True)
                if not (e.retriable or e.error is errors.INTERNAL):
                    await self.send(_error_frame(e, fatal=True))
                    await self.ws.close(code=CLOSE_FATAL, message=e.code.encode())
                    return
                failures += 1
                if e.error is errors.INTERNAL:  # a take that fails hands nothing out: try again
                    log.warning("push_take_failed", topic=self.topic.name, group=self.group, error=e.message)
                    if failures == 1:  # the client hears of it (once a streak); the stream goes on
                        await self.send(_error_frame(e))
                else:
                    log.info("push_take_failed", topic=self.topic.name, group=self.group, code=e.code)
                await asyncio.sleep(min(RETRY_MAX_S, 0.05 * 2**failures))
                continue
            except Exception:
                log.exception("push_take_failed", topic=self.topic.name, group=self.group)
                failures += 1
                await asyncio.sleep(RETRY_MAX_S)
                continue
            room = 0 if self.closing or self.ws.closed else max(0, self._credit())
            keep, surplus = got[:room], got[room:]
            if surplus:  # the credit went down (or the stream away) while taking: give them back now
                receipts = [m["receipt"] for m in surplus]
                self._spawn(
                    self.owner.delivery.settle(self.topic, self.group, "nack", receipts, {"delay_ms": 0})
                )
            if keep:
                for m in keep:
                    self.in_flight[m["receipt"]] = m["deadline_ms"]
                await self._send_messages(keep)


def add_push_routes(app: web.Application, node: Node, api: ApiCore, delivery: SubscriptionsApi) -> PushApi:
    """Register the stream route and the shutdown hook that closes open streams."""
    handlers = PushApi(node, api, delivery)
    app.router.add_get(STREAM_PATH, handlers.stream)
    app.on_shutdown.append(handlers.close_all)
    return handlers
