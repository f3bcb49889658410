"""The push stream's node side (cluster/api/handlers/push.py) when a take fails: an ``internal`` error (an
unexpected error at the coordinator; a take that fails hands nothing out) gets a non-fatal error
frame and is retried with backoff, the stream stays open and pushes once a take succeeds; an error
for good (the topic is gone) still ends the stream. Real WebSockets (aiohttp server and client);
the receive coordinator is a stand-in, since a real one cannot be made to fail on demand."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from raftmq.cluster.api.handlers.push import CLOSE_FATAL, PushApi, _Stream
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.machines.metadata import Topic
from raftmq.storage.store import StoreClosed, StoreError

TOPIC = Topic(7, "t", 1, (1,), None, None, None, 0)
LIMITS = SimpleNamespace(max_fetch_messages=1_000, max_delay_ms=60_000, max_visibility_ms=60_000)
MESSAGE = {"queue": 0, "offset": 0, "value": "v", "receipt": "7.0.0.1", "attempt": 1, "deadline_ms": 2**50}


class Coordinator(PushApi):
    """Takes fail with ``errors`` first, then hand out one message, then nothing."""

    def __init__(self, failures: list[ApiError]) -> None:
        node = SimpleNamespace(me=SimpleNamespace(id="n1"), config=SimpleNamespace(limits=LIMITS))
        super().__init__(node, SimpleNamespace(leader_wait_s=1.0), None)  # type: ignore[arg-type]
        self.failures = failures
        self.served = False

    async def take(self, topic: Topic, group: str, n: int, visibility_ms: int) -> list[dict[str, Any]]:
        if self.failures:
            raise self.failures.pop(0)
        if not self.served:
            self.served = True
            return [MESSAGE]
        await asyncio.sleep(0.2)
        return []


async def frames_until_push_or_close(failures: list[ApiError]) -> tuple[list[dict[str, Any]], int | None]:
    owner = Coordinator(failures)

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await _Stream(owner, ws, TOPIC, "g", 30_000).run(5_000)
        return ws

    app = web.Application()
    app.router.add_get("/stream", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    frames: list[dict[str, Any]] = []
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"ws://127.0.0.1:{port}/stream") as ws,
        ):
            await ws.send_str(json.dumps({"op": "rdy", "n": 5}))
            async for msg in ws:
                frames.append(json.loads(msg.data))
                if frames[-1]["type"] == "messages":
                    break
            return frames, ws.close_code
    finally:
        await runner.cleanup()


def test_an_internal_error_of_a_take_is_retried_and_the_stream_stays_open() -> None:
    boom = ApiError(errors.INTERNAL, "internal error; see the node's log")
    frames, _ = asyncio.run(asyncio.wait_for(frames_until_push_or_close([boom, boom]), 30))
    kinds = [f["type"] for f in frames]
    assert kinds == ["hello", "error", "messages"], frames  # one error frame for the streak
    assert frames[1]["error"]["code"] == "internal" and not frames[1].get("fatal"), frames[1]
    assert frames[2]["messages"] == [MESSAGE]


def test_an_error_for_good_still_ends_the_stream() -> None:
    gone = ApiError(errors.TOPIC_NOT_FOUND, "no topic 't'")
    frames, code = asyncio.run(asyncio.wait_for(frames_until_push_or_close([gone]), 30))
    assert [f["type"] for f in frames] == ["hello", "error"] and frames[1]["fatal"] is True, frames
    assert code == CLOSE_FATAL


def test_a_store_error_of_a_take_is_no_fatal_close_and_the_stream_goes_on() -> None:
    # Storage's errors are RaftmqErrors of status 0 (no answer): a take failing with one is the
    # node's trouble, retried like a cluster condition, never the end of the consumer's stream.
    failures: list[Any] = [StoreClosed("store is closed"), StoreError("EIO")]
    frames, code = asyncio.run(asyncio.wait_for(frames_until_push_or_close(failures), 30))
    assert [f["type"] for f in frames][-1] == "messages", frames
    assert not any(f.get("fatal") for f in frames) and code != CLOSE_FATAL, frames
    assert {f["error"]["code"] for f in frames if f["type"] == "error"} <= {"internal", "unknown_outcome"}
