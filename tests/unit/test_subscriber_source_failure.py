"""A subscriber whose source meets an answer that is not raftmq's stops with an error instead of
waiting forever (against a real aiohttp server that speaks the routes wrongly)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from fake_node import run, serve

from raftmq.client import AsyncSubscriber, ReceivedMessage, UnexpectedResponse
from raftmq.client._subscriber_config import SubscribeMode

PATH = "/v1/topics/t/subscriptions/g"


async def topic(request: web.Request) -> web.Response:
    return web.json_response({"name": "t", "queues": 1})


TOPIC = web.get("/v1/topics/t", topic)  # the subscriber checks its topic on start


async def broken_receive(request: web.Request) -> web.Response:
    return web.json_response({"not": "messages"})  # 200, but no "messages"


async def broken_stream(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await ws.send_str("this is not a JSON frame")
    async for _ in ws:  # keep the stream open: the client must stop on its own
        pass
    return ws


@pytest.mark.parametrize("mode", ["poll", "push"])
def test_a_broken_answer_stops_the_subscriber_with_an_error(mode: str) -> None:
    async def main() -> None:
        routes = (web.post(PATH + "/receive", broken_receive), web.get(PATH + "/stream", broken_stream))
        async with (
            serve(TOPIC, *routes) as node,
            AsyncSubscriber(node, topic="t", group="g", mode=mode) as sub,  # type: ignore[arg-type]
        ):
            with pytest.raises(UnexpectedResponse):
                await sub.receive(timeout_ms=5_000)

    run(main())


def test_a_stream_that_opens_while_the_subscriber_closes_gets_no_credit() -> None:
    """close() sends the queued acks (slow here) while a stream is being opened: that stream must
    not be given credit, or the node would push messages nobody takes until their deadline."""
    upgrading = asyncio.Event()
    frames: list[str] = []

    async def slow_stream(request: web.Request) -> web.WebSocketResponse:
        upgrading.set()
        await asyncio.sleep(1.0)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str('{"type":"hello","node":"n1"}')
        async for msg in ws:
            frames.append(msg.data)
        return ws

    async def slow_ack(request: web.Request) -> web.Response:
        receipts = (await request.json())["receipts"]
        await asyncio.sleep(1.5)
        return web.json_response({"results": [{"receipt": r, "ok": True} for r in receipts]})

    async def main() -> None:
        routes = (web.get(PATH + "/stream", slow_stream), web.post(PATH + "/ack", slow_ack))
        async with serve(TOPIC, *routes) as node:
            sub = AsyncSubscriber(node, topic="t", group="g", mode="push")
            await sub.start()
            await upgrading.wait()
            wire = {"queue": 0, "offset": 0, "value": "v", "receipt": "r1", "attempt": 1, "deadline_ms": 0}
            message = ReceivedMessage.from_wire("t", wire, sub._core)
            message.ack()
            await sub.close()
            assert sub.stats.acked == 1

    run(main())
    assert not [f for f in frames if '"rdy"' in f and '"n":0' not in f], frames


def test_a_new_stream_gets_only_the_credit_the_unsettled_messages_of_the_old_one_leave() -> None:
    """The first stream pushes max_in_flight messages and breaks; they stay unsettled, so the next
    stream gets RDY 0, raised as they are acked: never more than max_in_flight in flight in total."""
    rdys: list[list[int]] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str('{"type":"hello","node":"n1"}')
        mine: list[int] = []
        rdys.append(mine)
        async for msg in ws:
            frame = json.loads(msg.data)
            if frame["op"] == "rdy":
                mine.append(frame["n"])
                if len(rdys) == 1 and frame["n"] > 0:  # the first stream: push its credit, break
                    messages = [wire(f"r{i}") for i in range(frame["n"])]
                    await ws.send_str(json.dumps({"type": "messages", "messages": messages}))
                    await ws.close()
            elif frame["op"] in ("fin", "req", "touch"):
                results = [{"receipt": r, "ok": True} for r in frame["receipts"]]
                await ws.send_str(json.dumps({"type": "result", "id": frame["id"], "results": results}))
            elif frame["op"] == "ping":
                await ws.send_str(json.dumps({"type": "pong", "id": frame["id"]}))
        return ws

    async def main() -> None:
        async with (
            serve(TOPIC, web.get(PATH + "/stream", stream)) as node,
            AsyncSubscriber(
                node, topic="t", group="g", mode="push", max_in_flight=4, ack_interval_ms=0
            ) as sub,
        ):
            got = await sub.receive(4, timeout_ms=5_000)
            assert len(got) == 4
            await wait_for(lambda: len(rdys) == 2 and rdys[1] == [0])
            got[0].ack()
            got[1].nack(0)
            await wait_for(lambda: rdys[1][-1] == 2)
            got[2].ack()
            got[3].ack()
            await wait_for(lambda: rdys[1][-1] == 4)
            assert sub.stats.reconnects == 1

    run(main())
    assert rdys[0] == [4]
    assert rdys[1][:3] == [0, 2, 4] or rdys[1][:4] == [0, 1, 2, 4], rdys  # then 0 (the drain)


def wire(receipt: str) -> dict[str, Any]:
    far = int(time.time() * 1000) + 60_000
    return {"queue": 0, "offset": 0, "value": "v", "receipt": receipt, "attempt": 1, "deadline_ms": far}


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode", ["poll", "push"])
def test_an_internal_error_of_a_receive_is_retried(mode: SubscribeMode) -> None:
    """A receive (poll) or stream (push, as an older node ends it: fatal frame, close 4000) that
    fails with ``internal`` handed nothing out: the subscriber tries again and gets the message."""
    internal = {"code": "internal", "message": "boom", "retriable": False, "definite": False}
    attempts = 0

    async def receive(request: web.Request) -> web.Response:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            return web.json_response({"error": internal}, status=500)
        return web.json_response({"messages": [wire("r1")] if attempts == 2 else []})

    async def stream(request: web.Request) -> web.WebSocketResponse:
        nonlocal attempts
        attempts += 1
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str('{"type":"hello","node":"n1"}')
        if attempts == 1:
            await ws.send_str(json.dumps({"type": "error", "error": internal, "fatal": True}))
            await ws.close(code=4000, message=b"internal")
            return ws
        await ws.send_str(json.dumps({"type": "messages", "messages": [wire("r1")]}))
        async for msg in ws:
            frame = json.loads(msg.data)
            if frame["op"] == "ping":  # the drain on close
                await ws.send_str(json.dumps({"type": "pong", "id": frame["id"]}))
        return ws

    async def main() -> None:
        routes = (web.post(PATH + "/receive", receive), web.get(PATH + "/stream", stream))
        async with (
            serve(TOPIC, *routes) as node,
            AsyncSubscriber(node, topic="t", group="g", mode=mode, wait_ms=100) as sub,
        ):
            got = await sub.receive(timeout_ms=10_000)
            assert [m.receipt for m in got] == ["r1"]

    run(main())
    assert attempts >= 2
