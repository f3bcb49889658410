"""The producer's accumulator and retry rules, against a fake transport (no sockets)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from raftmq.batch import BATCH_MEDIA_TYPE, Limits, join_frames, split_frames, validate
from raftmq.client import (
    AsyncProducer,
    BufferFull,
    ClientClosed,
    ConnectionLost,
    DeliveryTimeout,
    FutureRecord,
    InvalidJson,
    MessageTooLarge,
    NotLeader,
    QueueNotFound,
    RaftmqError,
    RecordMetadata,
    Timeout,
    TopicNotFound,
    UnknownOutcome,
)
from raftmq.client._accumulator import Accumulator
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
    """Answers produce requests from a script of outcomes (an exception, or None for success).

    It takes both wires as a node does: a binary body is split and validated with
    ``raftmq.batch`` (the format's own reader), a JSON body parsed; either is recorded in one
    shape in ``produced``: ``{"wire", "queue", "producer_id", "sequence", "values", "raw"}``.
    """

    def __init__(self, script: list[RaftmqError | None] | None = None, *, binary: bool = True) -> None:
        self.script = list(script or [])
        self.binary = binary  # False: refuse binary bodies as a node older than the format does
        self.produced: list[dict[str, Any]] = []  # every produce attempt
        self.refused = 0
        self.stored: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (pid, q) -> (seq, base, n)
        self.high: dict[int, int] = {}
        self.gate: asyncio.Event | None = None
        self.requests: list[list[int | None]] = []  # the queues of each request of several frames

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if path == "/v1/topics/t" and method == "GET":
            return TOPIC
        if path == "/v1/cluster":
            return {"node_id": "n1", "nodes": [{"id": "n1", "http": "127.0.0.1:1", "raft": ""}], "groups": []}
        assert (method, path) == ("POST", "/v1/topics/t/messages"), (method, path)
        binary = kw["content_type"] == BATCH_MEDIA_TYPE
        if binary and not self.binary:
            self.refused += 1
            raise InvalidJson("the body is not valid JSON")
        if binary and len(frames := split_frames(kw["body"])) > 1:
            return await self._frames(frames, kw)
        got = _binary_request(kw["body"]) if binary else _json_request(kw["body"])
        self.produced.append(got)
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, RaftmqError) and outcome.definite:
            raise outcome
        queue, n = got["queue"], len(got["values"])
        key = (got["producer_id"], queue)
        remembered = {s: (b, n) for s, b, n in self.stored.get(key, [])}
        duplicate = got["producer_id"] is not None and got["sequence"] in remembered
        if duplicate:
            base, _ = remembered[got["sequence"]]
        else:
            base = self.high.get(queue, 0)
            self.high[queue] = base + n
            self.stored.setdefault(key, []).append((got["sequence"], base, n))
        if outcome is not None:
            raise outcome  # stored, but the answer is lost
        if binary:
            r = {
                "queue": queue,
                "base_offset": base,
                "count": n,
                **({"duplicate": True} if duplicate else {}),
            }
            return {"results": [r]}
        return {"results": [{"queue": queue, "offset": base + i} for i in range(n)]}

    async def _frames(self, frames: list[Any], kw: dict[str, Any]) -> Any:
        """A request of several frames, as a node answers it: one result per frame (None where
        it failed), and the first failure as the error, with the results in its details. Each
        frame takes the script's next outcome, in order."""
        self.requests.append([f.queue for f in frames])
        results: list[Any] = []
        failure: RaftmqError | None = None
        for frame in frames:
            single = {**kw, "body": join_frames([(frame.queue, None, frame.batch)])}
            try:
                results.append((await self.request("POST", "/v1/topics/t/messages", **single))["results"][0])
            except RaftmqError as e:
                results.append(None)
                failure = failure or e
        if failure is not None:
            raise type(failure)(failure.message, {"results": results})
        return {"results": results}


def _binary_request(body: bytes) -> dict[str, Any]:
    (frame,) = split_frames(body)  # the producer sends one frame per request
    view = validate(frame.batch, Limits())
    assert frame.queue is not None and frame.topic is None
    values = [
        (bytes(r.value) if r.binary else str(r.value, "utf-8"), r.key, r.headers) for r in view.records()
    ]
    return {
        "wire": "binary",
        "queue": frame.queue,
        "producer_id": view.producer_id,
        "sequence": view.base_sequence if view.producer_id is not None else None,
        "values": values,
        "raw": body,
    }


def _json_request(body: bytes) -> dict[str, Any]:
    parsed = orjson.loads(body)
    queue = parsed["messages"][0]["queue"]
    assert all(m["queue"] == queue for m in parsed["messages"])
    values = [
        (m["value"] if "value" in m else base64.b64decode(m["value_b64"]), m.get("key"), m.get("headers"))
        for m in parsed["messages"]
    ]
    return {
        "wire": "json",
        "queue": queue,
        "producer_id": parsed.get("producer_id"),
        "sequence": parsed.get("sequence"),
        "values": values,
        "raw": body,
    }


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
    assert [(b["queue"], b["sequence"]) for b in fake.produced] == [
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
    assert len(fake.produced) == 1 and fake.produced[0]["producer_id"] is None


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
    assert [[v for v, _, _ in b["values"]] for b in fake.produced] == [["a"], ["b", "c", "d"]]


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
        p = await _producer(fake, max_buffer_bytes=10_000, max_block_ms=50, linger_ms=0)
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
        async with await _producer(fake, delivery_timeout_ms=100) as p:
            with pytest.raises(NotLeader):
                await (await p.send("t", "x", queue=0))

    run(main)


def test_close_waits_for_every_buffered_message() -> None:
    fake = FakeCluster()

    async def main() -> list[FutureRecord]:
        p = await _producer(fake, linger_ms=10_000)
        futures = [await p.send("t", f"v{i}") for i in range(50)]
        await p.close()
        return futures

    futures = run(main)
    assert all(f.done() and not f.exception() for f in futures)
    assert sum(len(b["values"]) for b in fake.produced) == 50


# -- the accumulator alone ---------------------------------------------------------------------------


def _append(acc: Accumulator, value: str | bytes, queue: int | None = 0, key: str | None = None) -> Any:
    return acc.try_append("t", queue, 4, value, key, None, len(value), None, now_s=0.0)


def test_batches_are_sealed_by_count_and_sent_one_at_a_time_per_queue() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=1 << 20, max_batch_messages=5, max_buffer_bytes=1 << 20)
    for _ in range(12):
        _append(acc, "x" * 20)
    taken, _ = acc.ready(0.0)
    assert len(taken) == 1 and taken[0].sealed and taken[0].count == 5
    assert acc.ready(0.0)[0] == []  # the next full batch waits: one in flight per queue
    acc.complete(taken[0])
    taken, _ = acc.ready(0.0)
    assert taken[0].count == 5
    acc.complete(taken[0])
    taken, next_s = acc.ready(0.0)
    assert taken == [] and next_s == 1.0  # the last two linger
    taken, _ = acc.ready(1.0)
    assert taken[0].count == 2


def test_a_ready_batch_takes_the_waiting_batches_of_queues_with_its_leader_along() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=1 << 20, max_batch_messages=100, max_buffer_bytes=1 << 20)
    for q, now_s in [(0, -1.0), (1, 0.0), (2, 0.5), (3, 0.6), (4, 0.7)]:
        acc.try_append("t", q, 6, "x", None, None, 1, None, now_s=now_s)

    def leader(key: tuple[str, int]) -> str:
        return "a" if key[1] % 2 == 0 else "b"

    (first,), _ = acc.ready(0.0)  # queue 0 lingered; without node_of nothing goes along
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=0.7)
    taken, next_s = acc.ready(1.0, node_of=leader)
    # Queue 1 lingered (leader b): queue 3 (b) goes along, queue 0 is in flight, 2 and 4 (a) wait.
    assert sorted(b.queue for b in taken) == [1, 3] and all(b.sealed for b in taken)
    assert next_s == 1.5 and first.queue == 0
    acc.complete(first)
    taken, next_s = acc.ready(1.5, node_of=leader)
    assert sorted(b.queue for b in taken) == [0, 2, 4] and next_s is None


def test_a_new_batch_wakes_the_sender_only_when_it_is_due_before_the_sender_wakes_anyway() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=1 << 20, max_batch_messages=3, max_buffer_bytes=1 << 20)
    wakes: list[int] = []
    acc.on_wake = lambda: wakes.append(1)
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=0.0)
    assert len(wakes) == 1  # the sender had no wake-up of its own
    assert acc.ready(0.0) == ([], 1.0)
    for q in (1, 2):  # due at 1.1 and 1.2: the sender wakes at 1.0 and sees them then
        acc.try_append("t", q, 6, "x", None, None, 1, None, now_s=0.1 * q)
    assert len(wakes) == 1
    for _ in range(2):  # a batch that fills wakes it at once
        acc.try_append("t", 1, 6, "x", None, None, 1, None)
    assert len(wakes) == 2
    taken, next_s = acc.ready(1.0)
    assert sorted(b.queue for b in taken) == [0, 1] and next_s == 1.2
    acc.try_append("t", 3, 6, "x", None, None, 1, None, now_s=0.15)  # due at 1.15, before 1.2
    assert len(wakes) == 3


def test_batches_ready_together_for_one_leader_share_a_request() -> None:
    fake = FakeCluster()

    async def main() -> list[RecordMetadata]:
        async with await _producer(fake, linger_ms=60_000) as p:
            futures = [await p.send("t", f"{q}{i}", queue=q) for i in range(2) for q in range(4)]
            await p.flush()
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert fake.requests == [[0, 1, 2, 3]]  # one request of four frames, not four requests
    assert [(m.queue, m.offset) for m in got] == [(q, i) for i in range(2) for q in range(4)]
    assert sorted((b["queue"], [v for v, _, _ in b["values"]]) for b in fake.produced) == [
        (q, [f"{q}0", f"{q}1"]) for q in range(4)
    ]


def test_not_idempotent_or_json_producers_send_one_batch_per_request() -> None:
    for settings in ({"idempotent": False}, {"wire": "json"}):
        fake = FakeCluster()

        async def main(fake: FakeCluster = fake, settings: dict[str, Any] = settings) -> None:
            async with await _producer(fake, linger_ms=60_000, **settings) as p:
                futures = [await p.send("t", "x", queue=q) for q in range(4)]
                await p.flush()
                await asyncio.gather(*futures)

        run(main)
        assert fake.requests == [] and sorted(b["queue"] for b in fake.produced) == [0, 1, 2, 3]


@pytest.mark.parametrize("failing", [[1], [0, 2]])
def test_a_request_s_failed_frames_are_sent_again_alone_and_stored_once(failing: list[int]) -> None:
    """One failed frame takes the request's error as its own (a retry after backoff); several
    are each sent again at once, to learn their own outcome."""
    fake = FakeCluster([NotLeader("moved") if q in failing else None for q in range(4)])

    async def main() -> list[RecordMetadata]:
        async with await _producer(fake, linger_ms=60_000) as p:
            futures = [await p.send("t", f"{q}", queue=q) for q in range(4)]
            await p.flush()
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(q, 0) for q in range(4)]
    assert fake.requests == [[0, 1, 2, 3]]
    assert sorted(b["queue"] for b in fake.produced) == sorted([0, 1, 2, 3, *failing])
    assert fake.high == dict.fromkeys(range(4), 1)  # each stored once


def test_a_request_s_unknown_outcome_is_each_batch_s_and_retried_without_duplicates() -> None:
    fake = FakeCluster([None, ConnectionLost("reset after send"), None, None])

    async def main() -> list[RecordMetadata]:
        async with await _producer(fake, linger_ms=60_000) as p:
            futures = [await p.send("t", f"{q}", queue=q) for q in range(4)]
            await p.flush()
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(q, 0) for q in range(4)]
    assert fake.requests == [[0, 1, 2, 3]]
    assert sorted(b["queue"] for b in fake.produced) == [0, 1, 1, 2, 3]  # queue 1 sent again
    assert fake.high == dict.fromkeys(range(4), 1)  # and stored once


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_batches_are_sealed_by_size(wire: Any) -> None:
    acc = Accumulator(
        linger_s=1.0, max_batch_bytes=2_000, max_batch_messages=10_000, max_buffer_bytes=1 << 20, wire=wire
    )
    for _ in range(100):
        _append(acc, "x" * 100)
    sizes = []
    while True:
        taken, _ = acc.ready(5.0)
        if not taken:
            break
        sizes.append(len(taken[0].body(None)))
        acc.complete(taken[0])
    assert len(sizes) > 5 and max(sizes) <= 2_000
    assert max(sizes) > 1_500  # and filled: the size counted is close to the body's


def test_a_message_larger_than_a_batch_travels_alone() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=200, max_batch_messages=10, max_buffer_bytes=1 << 20)
    _append(acc, "x" * 500)
    _append(acc, "y")
    taken, _ = acc.ready(0.0)
    assert len(taken) == 1 and taken[0].count == 1


def test_each_batch_is_one_valid_frame_numbered_per_queue_from_when_it_opens() -> None:
    """The body the producer sends is one frame for the batch's queue, holding a batch the
    format's own validation accepts, with the producer id and that queue's next sequence."""
    acc = Accumulator(
        linger_s=0.0,
        max_batch_bytes=1 << 20,
        max_batch_messages=2,
        max_buffer_bytes=1 << 20,
        producer_id="p-1",
    )
    for i in range(5):
        added = acc.try_append("t", 2, 4, f"v{i}", f"k{i}", {"h": str(i)}, 4, None, now_s=0.0)
        assert added is not None
    added = acc.try_append("t", 3, 4, b"\x00\xff", None, None, 2, None, now_s=0.0)
    assert added is not None
    frames = []
    while True:
        taken, _ = acc.ready(0.0)
        if not taken:
            break
        for b in taken:
            frames.append(_binary_request(b.body("p-1")))
            acc.complete(b)
    assert sorted((f["queue"], f["sequence"], f["producer_id"]) for f in frames) == [
        (2, 0, "p-1"),
        (2, 1, "p-1"),
        (2, 2, "p-1"),
        (3, 0, "p-1"),
    ]
    values = [v for f in sorted(frames, key=lambda f: (f["queue"], f["sequence"])) for v in f["values"]]
    assert values == [(f"v{i}", f"k{i}", {"h": str(i)}) for i in range(5)] + [(b"\x00\xff", None, None)]


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
    while acc.try_append("t", 1, 4, "y" * 100, "k", None, 101, print, now_s=0.0) is not None:
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


@pytest.mark.parametrize(
    ("wire", "callback", "value_bytes"),
    [
        ("binary", False, 4),
        ("binary", True, 4),
        ("binary", False, 100),
        ("json", False, 4),
        ("json", True, 100),
    ],
)
def test_the_buffer_counts_what_a_buffered_message_holds_in_memory(
    wire: Any, callback: bool, value_bytes: int
) -> None:
    """Issue 15: the buffer's bytes are the memory its messages hold (counting only the encoded
    bytes once let 32 MiB hold a million messages and ``raftmq produce`` peak at 1.27 GB). Now a
    message holds its bytes in the batch, a callback if given, and nothing for its outcome (the
    handle ``send`` returns is the caller's; here it is dropped at once, as ``raftmq produce``
    does): the limit still bounds the real memory, and is not so cautious that it wastes it."""
    import gc
    import tracemalloc

    limit = 4 << 20
    acc = Accumulator(
        linger_s=1.0, max_batch_bytes=256 * 1024, max_batch_messages=10_000, max_buffer_bytes=limit, wire=wire
    )
    callbacks = [_Stored() for _ in range(2)]  # as raftmq produce: a small object per message
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        appended = 0
        while True:
            value = str(appended).rjust(value_bytes, "x")
            cb = _Stored() if callback else None
            if acc.try_append("t", None, 4, value, None, None, len(value), cb, 0.0) is None:
                break
            appended += 1
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert callbacks and acc.buffered_bytes <= limit
    print(f"{wire} callback={callback} {value_bytes} B: {appended} messages, {held / appended:.1f} B each")
    assert held <= limit * 1.25, (held, appended)  # the buffer's limit bounds the real memory
    assert held >= limit * 0.6, (held, appended)  # and the count is not far above the real memory


class _Stored:
    """A delivery callback as ``raftmq produce``'s: one small object per message."""

    __slots__ = ("size",)

    def __init__(self) -> None:
        self.size = 1

    def __call__(self, metadata: RecordMetadata | None, error: RaftmqError | None) -> None: ...


# -- what send returns: one light handle per message, one outcome per batch ---------------------------


def test_send_returns_light_handles_that_share_their_batch_s_one_outcome() -> None:
    """No future per message: a handle is two slots over its batch's outcome, and offers what the
    asyncio future did (await, done, result, exception, add_done_callback, asyncio.wait/gather)."""
    fake = FakeCluster()
    called: list[tuple[int, int]] = []

    async def main() -> None:
        async with await _producer(fake, linger_ms=10_000) as p:
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
        async with await _producer(fake, linger_ms=10_000) as p:
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
        async with await _producer(fake, linger_ms=10_000) as p:
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
        async with await _producer(fake, linger_ms=10_000) as p:
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
        async with await _producer(fake, wire="json") as p:
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
        async with await _producer(Miscounting()) as p:
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
    assert _json_request(batch.body(None))["values"] == [("v", "k", None)]


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
        async with await _producer(NoOffsets()) as p:
            return await p.send_and_wait("t", "x", queue=0)

    assert run(main) == RecordMetadata("t", 0, None)  # type: ignore[arg-type]
