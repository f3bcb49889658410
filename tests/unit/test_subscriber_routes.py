"""The subscriber sends each settlement straight to the leader of its message's queue group (as
``GET /v1/topics/{topic}`` and ``GET /v1/cluster`` name it), and to any node when that leader cannot
be reached (two real aiohttp servers speaking the routes involved)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from raftmq.client import AsyncSubscriber

PATH = "/v1/topics/t/subscriptions/g"


def wire(queue: int) -> dict[str, Any]:
    return {"queue": queue, "offset": 0, "value": "v", "receipt": f"1.{queue}.0.7", "attempt": 1,
            "deadline_ms": 2**62}  # fmt: skip


class FakeNode:
    """One node: answers the topic (queue q led by node ``leaders[q]``), the cluster (the nodes'
    addresses), a receive (once, a message of each queue) and acks (recorded)."""

    def __init__(self, name: str, leaders: list[str], urls: dict[str, str]) -> None:
        self.name, self.leaders, self.urls = name, leaders, urls
        self.acked: list[str] = []
        self.handed_out = False
        self.runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/v1/topics/t", self.topic)
        app.router.add_get("/v1/cluster", self.cluster)
        app.router.add_post(PATH + "/receive", self.receive)
        app.router.add_post(PATH + "/ack", self.ack)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def topic(self, request: web.Request) -> web.Response:
        queues = [{"queue": q, "group_id": q + 1, "leader": leader} for q, leader in enumerate(self.leaders)]
        return web.json_response({"name": "t", "id": 1, "queues": queues, "queue_groups": [1, 2]})

    async def cluster(self, request: web.Request) -> web.Response:
        nodes = [{"id": n, "http": url} for n, url in self.urls.items()]
        return web.json_response({"node_id": self.name, "nodes": nodes, "groups": []})

    async def receive(self, request: web.Request) -> web.Response:
        if self.handed_out:
            await asyncio.sleep(0.2)
            return web.json_response({"messages": []})
        self.handed_out = True
        return web.json_response({"messages": [wire(q) for q in range(len(self.leaders))]})

    async def ack(self, request: web.Request) -> web.Response:
        receipts = (await request.json())["receipts"]
        self.acked += receipts
        return web.json_response({"results": [{"receipt": r, "ok": True} for r in receipts]})


async def ack_all(bootstrap: str) -> AsyncSubscriber:
    async with AsyncSubscriber(bootstrap, topic="t", group="g", ack_interval_ms=0) as sub:
        core = sub._core
        assert core is not None
        deadline = time.monotonic() + 10
        while not core.metadata.node_urls:  # until the routes are known (loaded in the background)
            assert time.monotonic() < deadline, "the routes were never loaded"
            await asyncio.sleep(0.02)
        messages = await sub.receive(2, timeout_ms=10_000)
        assert len(messages) == 2
        for m in messages:
            m.ack()
    return sub


def test_each_ack_goes_to_the_leader_of_its_queue_group() -> None:
    async def main() -> None:
        urls: dict[str, str] = {}
        a, b = FakeNode("a", ["a", "b"], urls), FakeNode("b", ["a", "b"], urls)
        urls["a"] = f"http://127.0.0.1:{await a.start()}"
        urls["b"] = f"http://127.0.0.1:{await b.start()}"
        b.handed_out = True  # the receive is served by a
        try:
            sub = await ack_all(urls["a"])
            assert a.acked == ["1.0.0.7"]  # queue 0: led by a
            assert b.acked == ["1.1.0.7"]  # queue 1: led by b, though the subscriber talks to a
            assert sub.stats.acked == 2
        finally:
            for n in (a, b):
                assert n.runner is not None
                await n.runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_an_ack_whose_leader_cannot_be_reached_goes_to_another_node() -> None:
    async def main() -> None:
        urls: dict[str, str] = {}
        a = FakeNode("a", ["a", "gone"], urls)
        urls["a"] = f"http://127.0.0.1:{await a.start()}"
        gone = FakeNode("gone", [], urls)
        urls["gone"] = f"http://127.0.0.1:{await gone.start()}"
        assert gone.runner is not None
        await gone.runner.cleanup()  # nothing listens there now
        try:
            sub = await ack_all(urls["a"])
            assert sorted(a.acked) == ["1.0.0.7", "1.1.0.7"]
            assert sub.stats.acked == 2 and sub.stats.failed == 0
        finally:
            assert a.runner is not None
            await a.runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))
