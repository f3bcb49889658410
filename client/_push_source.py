"""The subscriber's push source: one WebSocket stream at a time (``docs/delivery.md``, "Push").

The stream is opened at any node (the first that accepts, in the transport's order); settlements
go over it (FIN/REQ/TOUCH, which frees its credit) while it is open. When it breaks, the source
opens another one (at the next node when the node is gone); messages received on the old stream
stay valid, their receipts work anywhere, and settlements whose answer was lost go again over HTTP
(settling is idempotent).

Credit: the node counts only the messages in flight on its stream, so a stream's RDY is
``max_in_flight`` less the messages received on earlier streams and not settled yet (0 if none is
left), raised as those are settled or pass their deadline: at most ``max_in_flight`` in total.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import aiohttp
import orjson
import structlog

from ._received import SettleOp
from ._retry import Backoff
from ._subscriber_config import SubscriberConfig, SubscriberStats, now_ms, receiving_may_retry, wait_event
from ._transport import Transport
from .errors import BadRequest, ConnectionLost, RaftmqError, error_from_body

__all__ = ["PushSource", "SubscriberView"]

log = structlog.get_logger(__name__)

FRAME_OPS: dict[SettleOp, str] = {"ack": "fin", "nack": "req", "extend": "touch"}
DRAIN_TIMEOUT_S = 5.0
STABLE_STREAM_S = 5.0  # a stream that lived this long resets the reconnect backoff

Socket = aiohttp.ClientWebSocketResponse[Literal[False]]


class SubscriberView(Protocol):
    """What the push source uses of its subscriber (``_subscriber_core.SubscriberCore``)."""

    config: SubscriberConfig
    transport: Transport
    backoff: Backoff
    stats: SubscriberStats
    unsettled: dict[str, int]
    room_changed: asyncio.Event
    closing: bool

    def deliver(self, messages: list[dict[str, Any]]) -> None: ...

    def room(self) -> int: ...

    async def back_off(self, error: RaftmqError, failures: int) -> bool: ...

    def fail(self, error: RaftmqError) -> None: ...


class PushSource:
    def __init__(self, core: SubscriberView) -> None:
        self.core = core
        self.ws: Socket | None = None
        self.node: str | None = None  # the node serving the current stream (from its hello)
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.current: set[str] = set()  # receipts received on the current stream (maybe settled)
        self.granted = 0  # the RDY last sent on the current stream

    async def run(self) -> None:
        """Keep a stream open until the subscriber closes or the cluster refuses it for good."""
        core, config = self.core, self.core.config
        params: dict[str, str | int] = {"heartbeat_ms": config.heartbeat_ms}
        if config.visibility_ms is not None:
            params["visibility_ms"] = config.visibility_ms
        failures = 0
        while not core.closing:
            try:
                ws = await core.transport.open_websocket(
                    config.path + "/stream", params=params, heartbeat_s=config.heartbeat_ms / 1000
                )
            except RaftmqError as e:
                failures += 1
                if await core.back_off(e, failures):
                    continue
                return
            if core.closing:  # close() began while this stream opened: give it no credit
                with contextlib.suppress(Exception):
                    await ws.close()
                return
            opened = time.monotonic()
            self.ws = ws
            self.current = set()
            self.granted = self._credit()
            raiser: asyncio.Task[None] | None = None
            try:
                await self._send({"op": "rdy", "n": self.granted})
                raiser = asyncio.create_task(self._raise_credit())
                fatal = await self._read(ws)
            except (ConnectionError, aiohttp.ClientError) as e:
                fatal = None
                log.info("push_stream_broke", node=self.node, error=repr(e))
            finally:
                if raiser is not None:
                    raiser.cancel()
                self.ws = None
                self._fail_replies(ConnectionLost("the push stream closed before the answer"))
                with contextlib.suppress(Exception):
                    await ws.close()
            if fatal is not None and not receiving_may_retry(fatal):
                core.fail(fatal)
                return
            if core.closing:
                return
            if fatal is not None:  # (an older node ends its stream on internal): back off, reconnect
                log.warning("push_stream_failed", node=self.node, error=repr(fatal))
            core.stats.reconnects += 1
            stable = fatal is None and time.monotonic() - opened > STABLE_STREAM_S
            failures = 0 if stable else failures + 1
            await asyncio.sleep(core.backoff.delay_s(failures) if failures else 0)

    async def _read(self, ws: Socket) -> RaftmqError | None:
        """Handle frames until the stream ends; a fatal error frame's error is returned."""
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                return None if msg.type is not aiohttp.WSMsgType.BINARY else BadRequest("binary frame")
            frame = orjson.loads(msg.data)
            kind = frame.get("type")
            if kind == "messages":
                self.core.deliver(frame["messages"])
                self.current.update(m["receipt"] for m in frame["messages"])
            elif kind in ("result", "pong"):
                reply = self._replies.pop(frame.get("id"), None)
                if reply is not None and not reply.done():
                    reply.set_result(frame)
            elif kind == "error":
                error = error_from_body(0, frame)
                reply = self._replies.pop(frame.get("id"), None)
                if reply is not None and not reply.done():
                    reply.set_exception(error)
                elif frame.get("fatal") or frame.get("op") == "rdy":
                    return error  # nothing will be pushed: the subscriber stops with it
                else:
                    log.warning("push_stream_error", node=self.node, error=repr(error))
            elif kind == "hello":
                self.node = frame.get("node")
        return None

    def _credit(self) -> int:
        """The RDY the current stream may have: ``max_in_flight`` less the messages of earlier
        streams that are unsettled and not past their deadline."""
        core = self.core
        core.room()  # drops the messages past their deadline
        self.current = {r for r in self.current if r in core.unsettled}
        return max(0, core.config.max_in_flight - (len(core.unsettled) - len(self.current)))

    async def _raise_credit(self) -> None:
        """Raise the stream's RDY as messages of earlier streams are settled or expire (until
        none is left, the stream breaks or the subscriber closes)."""
        core = self.core
        with contextlib.suppress(ConnectionError, aiohttp.ClientError, RaftmqError):
            while not core.closing and self.granted < core.config.max_in_flight:
                core.room_changed.clear()
                credit = self._credit()
                if credit > self.granted:
                    self.granted = credit
                    await self._send({"op": "rdy", "n": credit})
                    continue
                earlier = [d for r, d in core.unsettled.items() if r not in self.current]
                timeout = max(0.001, (min(earlier) - now_ms()) / 1000) if earlier else None
                await wait_event(core.room_changed, timeout)

    async def _send(self, frame: Mapping[str, Any]) -> None:
        ws = self.ws
        if ws is None or ws.closed:
            raise ConnectionLost("no push stream")
        await ws.send_frame(orjson.dumps(frame), aiohttp.WSMsgType.TEXT)

    async def _request(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``frame`` with a fresh id and wait for its reply.

        Raises:
            ConnectionLost: The stream is gone or broke, or no reply came in time.
            RaftmqError: The node's error frame for it.
        """
        frame_id = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[frame_id] = reply
        try:
            await self._send({**frame, "id": frame_id})
            return await asyncio.wait_for(reply, timeout_s)
        except (ConnectionError, aiohttp.ClientError, TimeoutError) as e:
            raise ConnectionLost(f"push stream: {type(e).__name__}: {e}") from e
        finally:
            self._replies.pop(frame_id, None)

    async def settle(
        self, op: SettleOp, receipts: list[str], fields: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """FIN, REQ or TOUCH over the stream; one result per receipt."""
        frame = {"op": FRAME_OPS[op], "receipts": receipts, **fields}
        reply = await self._request(frame, self.core.config.request_timeout_ms / 1000)
        results: list[dict[str, Any]] = reply["results"]
        return results

    async def drain(self) -> None:
        """Stop the pushes: RDY 0, then a ping; every message pushed before the node read the RDY
        arrives before the pong."""
        if self.ws is None:
            return
        try:
            await self._send({"op": "rdy", "n": 0})
            await self._request({"op": "ping"}, DRAIN_TIMEOUT_S)
        except RaftmqError as e:
            log.info("push_drain_failed", node=self.node, error=repr(e))

    def _fail_replies(self, error: RaftmqError) -> None:
        replies, self._replies = self._replies, {}
        for reply in replies.values():
            if not reply.done():
                reply.set_exception(error)

    async def close(self) -> None:
        ws = self.ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
