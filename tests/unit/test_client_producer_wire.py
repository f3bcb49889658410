"""What the producer's send returns (one light handle per message, one outcome per batch) and its
wires: binary by default, JSON when asked or when a node does not take batches (no sockets)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from client_producer_fakes import TOPIC, FakeCluster, json_request, run, start_producer

from raftmq.batch import BATCH_MEDIA_TYPE
from raftmq.client import (
    AsyncProducer,
    FutureRecord,
    RecordMetadata,
)
from raftmq.client._accumulator import Accumulator
from raftmq.client._types import TopicDescription

# -- what send returns: one light handle per message, one outcome per batch ---------------------------


def test_send_returns_light_handles_that_share_their_batch_s_one_outcome() -> None:
    """No future per message: a handle is two slots over its batch's outcome, and offers what the
    asyncio future did (await, done, result, exception, add_done_callback, asyncio.wait/gather)."""
    fake = FakeCluster()
    called: list[tuple[int, int]] = []

    async def main() -> None:
        async with await start_producer(fake, linger_ms=10_000) as p:
            handles = [await p.send("t", f"v{i}", queue=1) for i in range(3)]
            assert all(type(h) is FutureRecord for h in handles)
            assert not hasattr(handles[0], "__dict__")
            assert handles[0]._batch is handles[1]._batch is handles[2]._batch
            assert not handles[0].done()
            with pytest.raises(asyncio.InvalidStateError):  # blocking in the loop would hang it
                handles[0].result()
            handles[2].add_done_callback(lambda h: called.append((1, h.result().offset)))
            await p.flush()
            done, pending = await asyncio.wait(handles)
            assert len(done) == 3 and not pending
            assert [m.offset for m in await asyncio.gather(*handles)] == [0, 1, 2]
            assert (await handles[1]) == RecordMetadata("t", 1, 1) == handles[1].result()
            assert handles[0].exception() is None and handles[0].done()
            handles[0].add_done_callback(lambda h: called.append((2, h.result().offset)))  # at once

    run(main)
    assert called == [(1, 2), (2, 0)]
    assert len(fake.produced) == 1 and fake.produced[0]["wire"] == "binary"


def test_sending_creates_no_future_per_message() -> None:
    import concurrent.futures
    import gc

    def futures() -> int:
        return sum(isinstance(o, asyncio.Future | concurrent.futures.Future) for o in gc.get_objects())

    fake = FakeCluster()

    async def main() -> int:
        async with await start_producer(fake, linger_ms=10_000) as p:
            gc.collect()
            before = futures()
            handles = [await p.send("t", "x", queue=0) for _ in range(1_000)]
            gc.collect()
            assert len(handles) == 1_000
            return futures() - before

    made = run(main)
    assert made <= 2, made  # a thousand sends, not a thousand futures


def test_the_sync_producer_s_handles_block_until_their_batch_is_stored() -> None:
    import threading

    from raftmq.client import Producer

    fake = FakeCluster()
    fake.gate = asyncio.Event()  # the node answers when the test says so
    p = Producer("127.0.0.1:1", linger_ms=0, retry_backoff_ms=1)
    try:
        core = p._core
        core.transport.request = fake.request  # type: ignore[method-assign]
        core.metadata.update_topic(TopicDescription.from_wire(TOPIC), time.monotonic())
        seen: list[tuple[bool, int]] = []
        handles = [p.send("t", f"v{i}", queue=1) for i in range(3)]
        handles[1].add_done_callback(
            lambda h: seen.append((threading.current_thread() is threading.main_thread(), h.result().offset))
        )
        with pytest.raises(TimeoutError):
            handles[0].result(timeout=0.05)
        assert not handles[0].done()
        p._io.loop.call_soon_threadsafe(fake.gate.set)
        assert [h.result(timeout=10).offset for h in handles] == [0, 1, 2]
        assert handles[2].exception(timeout=0) is None
        assert seen == [(False, 1)]  # on the producer's I/O thread
    finally:
        p.close()


def test_callbacks_are_kept_only_for_messages_that_have_one() -> None:
    fake = FakeCluster()
    seen: list[int] = []

    async def main() -> None:
        async with await start_producer(fake, linger_ms=10_000) as p:
            await p.send("t", "a", queue=0)
            await p.send("t", "b", queue=0, callback=lambda m, e: seen.append(m.offset if m else -1))
            await p.send("t", "c", queue=0)
            assert p._core is not None
            (batch,) = p._core.acc.unfinished()
            assert [i for i, _ in batch.outcome.callbacks] == [1]

    run(main)
    assert seen == [1]


# -- the wire: binary by default, JSON when asked or when a node does not take batches ---------------


def test_a_node_that_refuses_the_binary_format_gets_the_same_messages_as_json() -> None:
    """A node older than the binary format answers a batch with invalid_json (a newer one that
    does not take it, 415): nothing was stored, so the producer resends the batch as JSON at once,
    with the same sequence, and sends JSON from then on."""
    fake = FakeCluster(binary=False)
    sent: list[tuple[str | bytes, str | None, dict[str, str] | None]] = [
        ("text é", "k1", {"h": "1"}),
        (b"\x00\xff binary", None, None),
        ("", "", {}),
    ]

    async def main() -> list[RecordMetadata]:
        async with await start_producer(fake, linger_ms=10_000) as p:
            handles = [await p.send("t", v, key=k, headers=h, queue=2) for v, k, h in sent]
            await p.flush()
            handles.append(await p.send("t", "later", queue=2))
            await p.flush()
            return list(await asyncio.gather(*handles))

    got = run(main)
    assert [m.offset for m in got] == [0, 1, 2, 3]
    assert fake.refused == 1 and [b["wire"] for b in fake.produced] == ["json", "json"]
    assert [b["sequence"] for b in fake.produced] == [0, 1]
    assert fake.produced[0]["values"] == [(v, k, h or None) for v, k, h in sent]
    assert fake.produced[1]["values"] == [("later", None, None)]


def test_wire_json_sends_the_json_api_s_messages() -> None:
    fake = FakeCluster()

    async def main() -> RecordMetadata:
        async with await start_producer(fake, wire="json") as p:
            return await p.send_and_wait("t", b"\x01", key="k", headers={"a": "b"}, queue=3)

    assert run(main) == RecordMetadata("t", 3, 0)
    assert [(b["wire"], b["values"]) for b in fake.produced] == [("json", [(b"\x01", "k", {"a": "b"})])]
    with pytest.raises(ValueError, match="wire"):
        AsyncProducer("127.0.0.1:1", wire="xml")  # type: ignore[arg-type]


def test_an_answer_that_does_not_fit_the_batch_fails_it_as_unexpected() -> None:
    from raftmq.client import UnexpectedResponse

    class Miscounting(FakeCluster):
        async def request(self, method: str, path: str, **kw: Any) -> Any:
            answer = await super().request(method, path, **kw)
            if method == "POST":
                answer["results"][0]["count"] += 1
            return answer

    async def main() -> None:
        async with await start_producer(Miscounting()) as p:
            with pytest.raises(UnexpectedResponse):
                await p.send_and_wait("t", "x", queue=0)

    run(main)


def test_over_http_a_415_to_the_batch_media_type_falls_back_to_json() -> None:
    """The real transport against a real aiohttp server that takes only JSON: the Content-Type
    of each attempt, and the fallback after the 415."""
    from aiohttp import web
    from fake_node import run as run_node
    from fake_node import serve

    types: list[str] = []

    async def cluster(request: web.Request) -> web.Response:
        node = {"id": "n1", "http": f"http://{request.host}", "raft": ""}
        return web.json_response({"node_id": "n1", "nodes": [node], "groups": []})

    async def topic(request: web.Request) -> web.Response:
        return web.json_response(TOPIC)

    async def produce(request: web.Request) -> web.Response:
        types.append(request.content_type)
        if request.content_type != "application/json":
            error = {
                "code": "unsupported_media_type",
                "message": "JSON only",
                "retriable": False,
                "definite": True,
            }
            return web.json_response({"error": error}, status=415)
        body = await request.json()
        return web.json_response({"results": [{"queue": m["queue"], "offset": 7} for m in body["messages"]]})

    async def main() -> RecordMetadata:
        routes = (web.get("/v1/cluster", cluster), web.get("/v1/topics/t", topic))
        async with (
            serve(*routes, web.post("/v1/topics/t/messages", produce)) as node,
            AsyncProducer(node, retry_backoff_ms=1) as p,
        ):
            return await p.send_and_wait("t", "x", queue=1)

    assert run_node(main()) == RecordMetadata("t", 1, 7)
    assert types == [BATCH_MEDIA_TYPE, "application/json"]


def test_a_message_sized_for_the_binary_wire_joins_a_json_batch_opened_after_the_fallback() -> None:
    """The fallback to JSON happens on the I/O thread while an application thread appends: a
    message read the wire as binary, then found the queue's new batch opened as JSON (it raised
    AttributeError on the batch's missing writer)."""

    class FallingBack(Accumulator):
        def _new_batch(self, qkey: Any, now_s: float) -> Any:
            self.wire = "json"  # the I/O thread's fallback, between the two reads
            return super()._new_batch(qkey, now_s)

    acc = FallingBack(linger_s=0.0, max_batch_bytes=1 << 20, max_batch_messages=100, max_buffer_bytes=1 << 20)
    handle = acc.try_append("t", 1, 4, "v", "k", None, 2, None, now_s=0.0)
    assert handle is not None
    (batch,) = acc.unfinished()
    assert json_request(batch.body(None))["values"] == [("v", "k", None)]


def test_an_answer_without_offsets_resolves_with_none() -> None:
    """The test-only fault ack_before_replication answers before an offset exists; the messages
    are acknowledged all the same (the chaos suite's mutation test counts them)."""

    class NoOffsets(FakeCluster):
        async def request(self, method: str, path: str, **kw: Any) -> Any:
            answer = await super().request(method, path, **kw)
            if method == "POST":
                answer["results"][0]["base_offset"] = None
            return answer

    async def main() -> RecordMetadata:
        async with await start_producer(NoOffsets()) as p:
            return await p.send_and_wait("t", "x", queue=0)

    assert run(main) == RecordMetadata("t", 0, None)  # type: ignore[arg-type]
