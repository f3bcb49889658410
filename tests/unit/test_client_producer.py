"""The producer's accumulator and retry rules, against a fake transport (no sockets)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from raftmq.client import (
    AsyncProducer,
    BufferFull,
    ClientClosed,
    ConnectionLost,
    DeliveryTimeout,
    MessageTooLarge,
    NotLeader,
    QueueNotFound,
    RaftmqError,
    RecordMetadata,
    Timeout,
    TopicNotFound,
    UnknownOutcome,
)
from raftmq.client._accumulator import Accumulator, encode_message
from raftmq.client._types import TopicDescription

TOPIC = {
    "id": 1,
    "name": "t",
    "queues": [
        {"queue": q, "group_id": q % 3, "leader": "n1", "replicas": ["n1"], "low_offset": 0, "high_offset": 0}
        for q in range(4)
    ],
    "queue_groups": [0, 1, 2, 0],
    "retention_ms": None,
    "retention_bytes": None,
    "max_message_bytes": 100,
    "created_ms": 0,
}


class FakeCluster:
    """Answers produce requests from a script of outcomes (an exception, or None for success)."""

    def __init__(self, script: list[RaftmqError | None] | None = None) -> None:
        self.script = list(script or [])
        self.produced: list[dict[str, Any]] = []  # bodies of every produce attempt
        self.stored: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (pid, q) -> (seq, base, n)
        self.high: dict[int, int] = {}
        self.gate: asyncio.Event | None = None

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if path == "/v1/topics/t" and method == "GET":
            return TOPIC
        if path == "/v1/cluster":
            return {"node_id": "n1", "nodes": [{"id": "n1", "http": "127.0.0.1:1", "raft": ""}], "groups": []}
        assert (method, path) == ("POST", "/v1/topics/t/messages"), (method, path)
        body = orjson.loads(kw["body"])
        self.produced.append(body)
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, RaftmqError) and outcome.definite:
            raise outcome
        queue = body["messages"][0]["queue"]
        assert all(m["queue"] == queue for m in body["messages"])
        key = (body.get("producer_id"), queue)
        remembered = {s: (b, n) for s, b, n in self.stored.get(key, [])}
        if body.get("producer_id") is not None and body["sequence"] in remembered:
            base, _ = remembered[body["sequence"]]
        else:
            base = self.high.get(queue, 0)
            self.high[queue] = base + len(body["messages"])
            self.stored.setdefault(key, []).append((body.get("sequence"), base, len(body["messages"])))
        if outcome is not None:
            raise outcome  # stored, but the answer is lost
        return {"results": [{"queue": queue, "offset": base + i} for i in range(len(body["messages"]))]}


async def _producer(fake: FakeCluster, **settings: Any) -> AsyncProducer:
    producer = AsyncProducer("127.0.0.1:1", retry_backoff_ms=1, retry_backoff_max_ms=5, **settings)
    await producer.start()
    core = producer._core
    assert core is not None
    core.transport.request = fake.request  # type: ignore[method-assign]
    core.metadata.update_topic(TopicDescription.from_wire(TOPIC), time.monotonic())
    return producer


def run(coro: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro(), 10))


def test_a_retried_batch_carries_the_same_producer_id_and_sequence_and_is_stored_once() -> None:
    fake = FakeCluster([ConnectionLost("reset after send"), Timeout("slow")])

    async def main() -> list[RecordMetadata]:
        async with await _producer(fake) as p:
            futures = [await p.send("t", f"v{i}", queue=2) for i in range(3)]
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(2, 0), (2, 1), (2, 2)]
    assert len(fake.produced) == 3 and fake.produced[0] == fake.produced[1] == fake.produced[2]
    assert fake.produced[0]["producer_id"].startswith("p-")
    assert fake.high == {2: 3}  # stored once


def test_each_queue_numbers_its_batches() -> None:
    fake = FakeCluster()

    async def main() -> None:
        async with await _producer(fake, linger_ms=0) as p:
            for _ in range(3):
                await (await p.send("t", "x", queue=1))
            await (await p.send("t", "x", queue=3))

    run(main)
    assert [(b["messages"][0]["queue"], b["sequence"]) for b in fake.produced] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (3, 0),
    ]


def test_without_idempotence_an_unknown_outcome_is_reported_not_resent() -> None:
    fake = FakeCluster([ConnectionLost("reset after send")])

    async def main() -> None:
        async with await _producer(fake, idempotent=False) as p:
            future = await p.send("t", "x", queue=0)
            with pytest.raises(ConnectionLost):
                await future

    run(main)
    assert len(fake.produced) == 1 and "producer_id" not in fake.produced[0]


def test_without_idempotence_definite_retriable_failures_are_still_retried() -> None:
    fake = FakeCluster([NotLeader("moved"), NotLeader("moved")])

    async def main() -> RecordMetadata:
        async with await _producer(fake, idempotent=False) as p:
            return await (await p.send("t", "x", queue=0))

    assert run(main).offset == 0
    assert len(fake.produced) == 3


def test_a_definite_failure_after_an_unknown_outcome_is_reported_as_unknown() -> None:
    fake = FakeCluster([Timeout("slow"), TopicNotFound("deleted meanwhile")])

    async def main() -> None:
        async with await _producer(fake) as p:
            with pytest.raises(UnknownOutcome):
                await (await p.send("t", "x", queue=0))

    run(main)


def test_callbacks_get_the_metadata_or_the_error() -> None:
    fake = FakeCluster([None, TopicNotFound("gone")])
    seen: list[tuple[RecordMetadata | None, RaftmqError | None]] = []

    async def main() -> None:
        async with await _producer(fake, linger_ms=0) as p:
            ok = await p.send("t", "a", queue=0, callback=lambda m, e: seen.append((m, e)))
            await asyncio.wait([ok])
            bad = await p.send("t", "b", queue=0, callback=lambda m, e: seen.append((m, e)))
            await asyncio.wait([bad])

    run(main)
    assert seen[0] == (RecordMetadata("t", 0, 0), None)
    assert seen[1][0] is None and isinstance(seen[1][1], TopicNotFound)


def test_one_batch_per_queue_is_in_flight_and_order_is_kept() -> None:
    fake = FakeCluster()
    fake.gate = asyncio.Event()

    async def main() -> list[RecordMetadata]:
        async with await _producer(fake, linger_ms=0) as p:
            first = await p.send("t", "a", queue=0)
            await asyncio.sleep(0.02)
            rest = [await p.send("t", v, queue=0) for v in "bcd"]
            await asyncio.sleep(0.02)
            assert len(fake.produced) == 1  # b, c, d wait behind a
            assert fake.gate is not None
            fake.gate.set()
            return list(await asyncio.gather(first, *rest))

    got = run(main)
    assert [m.offset for m in got] == [0, 1, 2, 3]
    assert [[m["value"] for m in b["messages"]] for b in fake.produced] == [["a"], ["b", "c", "d"]]


def test_messages_are_checked_before_they_are_buffered() -> None:
    async def main() -> None:
        async with await _producer(FakeCluster()) as p:
            with pytest.raises(QueueNotFound):
                await p.send("t", "x", queue=4)
            with pytest.raises(MessageTooLarge):  # the topic allows 100 bytes
                await p.send("t", "x" * 101)
            with pytest.raises(TypeError):
                await p.send("t", 5)  # type: ignore[arg-type]

    run(main)


def test_a_full_buffer_blocks_then_raises_buffer_full() -> None:
    fake = FakeCluster()
    fake.gate = asyncio.Event()  # nothing completes

    async def main() -> None:
        p = await _producer(fake, max_buffer_bytes=1_000, max_block_ms=50, linger_ms=0)
        with pytest.raises(BufferFull):
            for _ in range(100):
                await p.send("t", "x" * 50, queue=0)
        assert p._core is not None and p._core.acc.buffered_bytes <= 1_000
        assert fake.gate is not None
        fake.gate.set()
        await p.close()

    run(main)


def test_a_batch_that_cannot_be_stored_in_time_fails() -> None:
    fake = FakeCluster([NotLeader("moved")] * 1000)

    async def main() -> None:
        async with await _producer(fake, delivery_timeout_ms=100) as p:
            with pytest.raises(NotLeader):
                await (await p.send("t", "x", queue=0))

    run(main)


def test_close_waits_for_every_buffered_message() -> None:
    fake = FakeCluster()

    async def main() -> list[asyncio.Future[RecordMetadata]]:
        p = await _producer(fake, linger_ms=10_000)
        futures = [await p.send("t", f"v{i}") for i in range(50)]
        await p.close()
        return futures

    futures = run(main)
    assert all(f.done() and not f.exception() for f in futures)
    assert sum(len(b["messages"]) for b in fake.produced) == 50


# -- the accumulator alone ---------------------------------------------------------------------------


class _Sink:
    def resolve(self, metadata: RecordMetadata) -> None: ...

    def fail(self, error: RaftmqError) -> None: ...


def test_batches_are_sealed_by_count_and_sent_one_at_a_time_per_queue() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=1 << 20, max_batch_messages=5, max_buffer_bytes=1 << 20)
    encoded, _ = encode_message("x" * 20, None, None)
    for _ in range(12):
        acc.try_append("t", 0, 4, encoded, _Sink(), now_s=0.0)
    taken, _ = acc.ready(0.0)
    assert len(taken) == 1 and taken[0].sealed and len(taken[0].parts) == 5
    assert acc.ready(0.0)[0] == []  # the next full batch waits: one in flight per queue
    acc.complete(taken[0])
    taken, _ = acc.ready(0.0)
    assert len(taken[0].parts) == 5
    acc.complete(taken[0])
    taken, next_s = acc.ready(0.0)
    assert taken == [] and next_s == 1.0  # the last two linger
    taken, _ = acc.ready(1.0)
    assert len(taken[0].parts) == 2


def test_batches_are_sealed_by_size() -> None:
    acc = Accumulator(
        linger_s=1.0, max_batch_bytes=2_000, max_batch_messages=10_000, max_buffer_bytes=1 << 20
    )
    encoded, _ = encode_message("x" * 100, None, None)
    for _ in range(100):
        acc.try_append("t", 0, 4, encoded, _Sink(), now_s=0.0)
    sizes = []
    while True:
        taken, _ = acc.ready(5.0)
        if not taken:
            break
        sizes.append(len(taken[0].body(None)))
        acc.complete(taken[0])
    assert len(sizes) > 5 and max(sizes) <= 2_000


def test_a_message_larger_than_a_batch_travels_alone() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=200, max_batch_messages=10, max_buffer_bytes=1 << 20)
    big, _ = encode_message("x" * 500, None, None)
    acc.try_append("t", 0, 4, big, _Sink(), now_s=0.0)
    taken, _ = acc.ready(0.0)
    assert len(taken) == 1 and len(taken[0].parts) == 1


def test_a_batch_stuck_behind_its_queue_past_the_delivery_timeout_fails_unsent() -> None:
    fake = FakeCluster()
    fake.gate = asyncio.Event()

    async def main() -> None:
        async with await _producer(fake, linger_ms=0, delivery_timeout_ms=100) as p:
            first = await p.send("t", "a", queue=0)
            await asyncio.sleep(0.01)
            second = await p.send("t", "b", queue=0)
            await asyncio.sleep(0.2)
            assert fake.gate is not None
            fake.gate.set()
            assert (await first).offset == 0
            with pytest.raises(DeliveryTimeout):
                await second

    run(main)
    assert len(fake.produced) == 1


def test_buffered_bytes_return_to_zero() -> None:
    acc = Accumulator(linger_s=0.0, max_batch_bytes=1 << 20, max_batch_messages=100, max_buffer_bytes=10_000)
    encoded, _ = encode_message("y" * 100, "k", None)
    while acc.try_append("t", 1, 4, encoded, _Sink(), now_s=0.0) is not None:
        pass
    assert 9_000 < acc.buffered_bytes <= 10_000
    taken, _ = acc.ready(0.0, all_now=True)
    for b in taken:
        acc.complete(b)
    while True:
        taken, _ = acc.ready(0.0, all_now=True)
        if not taken:
            break
        for b in taken:
            acc.complete(b)
    assert acc.buffered_bytes == 0 and acc.empty()


def test_closing_with_a_timeout_fails_in_flight_batches_as_unknown_and_queued_ones_as_closed() -> None:
    fake = FakeCluster()
    fake.gate = asyncio.Event()  # the broker never answers

    async def main() -> None:
        p = await _producer(fake, linger_ms=0)
        in_flight = await p.send("t", "a", queue=0)
        await asyncio.sleep(0.02)
        queued = await p.send("t", "b", queue=0)  # waits behind the first batch of queue 0
        await p.close(timeout_s=0.1)
        with pytest.raises(UnknownOutcome):
            await in_flight
        with pytest.raises(ClientClosed):
            await queued
        with pytest.raises(ClientClosed):
            await p.send("t", "c")

    run(main)


@pytest.mark.parametrize("sync", [True, False])
def test_the_buffer_counts_what_a_buffered_message_holds_in_memory(sync: bool) -> None:
    """Issue 15: the buffer's bytes are the memory its messages hold, futures included (a small
    message's concurrent future is ~1.6 KB: counting the encoded bytes only, 32 MiB held a million
    small messages, and ``raftmq produce`` peaked at 1.27 GB)."""
    import asyncio
    import concurrent.futures
    import gc
    import tracemalloc

    from raftmq.client._accumulator import MESSAGE_BYTES, SYNC_MESSAGE_BYTES
    from raftmq.client._producer import _FutureDelivery

    limit = 4 << 20
    acc = Accumulator(
        linger_s=1.0,
        max_batch_bytes=256 * 1024,
        max_batch_messages=10_000,
        max_buffer_bytes=limit,
        message_bytes=SYNC_MESSAGE_BYTES if sync else MESSAGE_BYTES,
    )
    loop = asyncio.new_event_loop()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        appended = 0
        while True:  # as Producer.send does: a future and its delivery per message
            future: Any = concurrent.futures.Future() if sync else loop.create_future()
            encoded, _ = encode_message(str(appended), None, None)
            if acc.try_append("t", None, 4, encoded, _FutureDelivery(future, None), 0.0) is None:
                break
            appended += 1
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        loop.close()
    assert acc.buffered_bytes <= limit
    assert held <= limit * 1.25, (held, appended)  # the buffer's limit bounds the real memory
    assert appended >= limit // 2_500  # and still holds thousands of small messages
