"""The producer's retry rules, idempotence, callbacks and buffer, against a fake transport (no
sockets). The accumulator alone: ``test_client_accumulator.py``; handles and wires:
``test_client_producer_wire.py``."""

from __future__ import annotations

import asyncio

import pytest
from client_producer_fakes import FakeCluster, run, start_producer

from raftmq.client import (
    AsyncProducer,
    BufferFull,
    ConnectionLost,
    FutureRecord,
    MessageTooLarge,
    NotLeader,
    QueueNotFound,
    RaftmqError,
    RecordMetadata,
    Timeout,
    TopicNotFound,
    UnknownOutcome,
)


def test_a_retried_batch_carries_the_same_producer_id_and_sequence_and_is_stored_once() -> None:
    fake = FakeCluster([ConnectionLost("reset after send"), Timeout("slow")])

    async def main() -> list[RecordMetadata]:
        async with await start_producer(fake) as p:
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
        async with await start_producer(fake, linger_ms=0) as p:
            for _ in range(3):
                await (await p.send("t", "x", queue=1))
            await (await p.send("t", "x", queue=3))

    run(main)
    assert [(b["queue"], b["sequence"]) for b in fake.produced] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (3, 0),
    ]


def test_without_idempotence_an_unknown_outcome_is_reported_not_resent() -> None:
    fake = FakeCluster([ConnectionLost("reset after send")])

    async def main() -> None:
        async with await start_producer(fake, idempotent=False) as p:
            future = await p.send("t", "x", queue=0)
            with pytest.raises(ConnectionLost):
                await future

    run(main)
    assert len(fake.produced) == 1 and fake.produced[0]["producer_id"] is None


def test_without_idempotence_definite_retriable_failures_are_still_retried() -> None:
    fake = FakeCluster([NotLeader("moved"), NotLeader("moved")])

    async def main() -> RecordMetadata:
        async with await start_producer(fake, idempotent=False) as p:
            return await (await p.send("t", "x", queue=0))

    assert run(main).offset == 0
    assert len(fake.produced) == 3


def test_a_definite_failure_after_an_unknown_outcome_is_reported_as_unknown() -> None:
    fake = FakeCluster([Timeout("slow"), TopicNotFound("deleted meanwhile")])

    async def main() -> None:
        async with await start_producer(fake) as p:
            with pytest.raises(UnknownOutcome):
                await (await p.send("t", "x", queue=0))

    run(main)


def test_callbacks_get_the_metadata_or_the_error() -> None:
    fake = FakeCluster([None, TopicNotFound("gone")])
    seen: list[tuple[RecordMetadata | None, RaftmqError | None]] = []

    async def main() -> None:
        async with await start_producer(fake, linger_ms=0) as p:
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
        async with await start_producer(fake, linger_ms=0) as p:
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
    assert [[v for v, _, _ in b["values"]] for b in fake.produced] == [["a"], ["b", "c", "d"]]


def test_messages_are_checked_before_they_are_buffered() -> None:
    async def main() -> None:
        async with await start_producer(FakeCluster()) as p:
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
        p = await start_producer(fake, max_buffer_bytes=10_000, max_block_ms=50, linger_ms=0)
        with pytest.raises(BufferFull):
            for _ in range(1_000):
                await p.send("t", "x" * 50, queue=0)
        assert p._core is not None and p._core.acc.buffered_bytes <= 10_000
        assert fake.gate is not None
        fake.gate.set()
        await p.close()

    run(main)


def test_a_batch_that_cannot_be_stored_in_time_fails() -> None:
    fake = FakeCluster([NotLeader("moved")] * 1000)

    async def main() -> None:
        async with await start_producer(fake, delivery_timeout_ms=100) as p:
            with pytest.raises(NotLeader):
                await (await p.send("t", "x", queue=0))

    run(main)


def test_close_waits_for_every_buffered_message() -> None:
    fake = FakeCluster()

    async def main() -> list[FutureRecord]:
        p = await start_producer(fake, linger_ms=10_000)
        futures = [await p.send("t", f"v{i}") for i in range(50)]
        await p.close()
        return futures

    futures = run(main)
    assert all(f.done() and not f.exception() for f in futures)
    assert sum(len(b["values"]) for b in fake.produced) == 50


def test_by_default_what_is_sent_while_the_leader_is_busy_goes_in_one_request_when_it_answers() -> None:
    """Default settings: the first message goes alone; the messages sent while its request is in
    flight (to its queue and the other queues of its leader) wait for its answer, not for a
    clock, and then go together in one request; flush sends them all, each stored once, in
    order per queue."""
    fake = FakeCluster()
    fake.gate = asyncio.Event()

    async def main() -> list[RecordMetadata]:
        async with await start_producer(fake) as p:
            futures = [await p.send("t", "a", queue=0)]
            for _ in range(1_000):
                if fake.produced:
                    break
                await asyncio.sleep(0.001)
            futures += [await p.send("t", v, queue=q) for v, q in [("b", 0), ("c", 1), ("d", 2), ("e", 1)]]
            await asyncio.sleep(0.05)  # ten default lingers of the old producer
            assert [b["values"][0][0] for b in fake.produced] == ["a"]
            assert fake.gate is not None
            fake.gate.set()
            assert await p.flush(5.0)
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1)]
    assert fake.requests == [[0, 1, 2]]  # after the first request, one request of three frames
    assert [(b["queue"], b["sequence"], [v for v, _, _ in b["values"]]) for b in fake.produced] == [
        (0, 0, ["a"]),
        (0, 1, ["b"]),
        (1, 0, ["c", "e"]),
        (2, 0, ["d"]),
    ]


def test_with_requests_per_leader_a_queue_s_messages_go_while_its_leader_answers_another() -> None:
    """``max_requests_per_leader=2``: while queue 0's request is in flight, the messages for the
    other queues of its leader go at once (one request for both queues), and queue 0's next batch
    waits for its own; each is stored once, in order per queue."""
    fake = FakeCluster()
    fake.gate = asyncio.Event()

    async def main() -> list[RecordMetadata]:
        async with await start_producer(fake, max_requests_per_leader=2) as p:
            futures = [await p.send("t", "a", queue=0)]
            for _ in range(1_000):
                if fake.produced:
                    break
                await asyncio.sleep(0.001)
            futures += [await p.send("t", v, queue=q) for v, q in [("b", 0), ("c", 1), ("d", 2), ("e", 1)]]
            for _ in range(50):  # well within LEADER_WAIT_S, after which any batch would go
                if fake.requests:
                    break
                await asyncio.sleep(0.001)
            assert fake.requests == [[1, 2]]  # sent while queue 0's first request is unanswered
            assert [b["queue"] for b in fake.produced] == [0, 1]  # queue 0's "b" not sent yet
            assert fake.gate is not None
            fake.gate.set()
            assert await p.flush(5.0)
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1)]
    assert fake.requests == [[1, 2]]
    assert sorted((b["queue"], b["sequence"], [v for v, _, _ in b["values"]]) for b in fake.produced) == [
        (0, 0, ["a"]),
        (0, 1, ["b"]),
        (1, 0, ["c", "e"]),
        (2, 0, ["d"]),
    ]


def test_a_producer_without_room_for_a_request_per_leader_is_refused() -> None:
    with pytest.raises(ValueError, match="max_requests_per_leader must be positive"):
        AsyncProducer("127.0.0.1:1", max_requests_per_leader=0)
