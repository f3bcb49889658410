"""The producer's accumulator: batches sealed by count and size, shared requests per leader, frames
numbered per queue, timeouts, closing, and the buffer's memory accounting (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_producer_fakes import FakeCluster, append_message, binary_request, run, start_producer

from raftmq.client import (
    ClientClosed,
    ConnectionLost,
    DeliveryTimeout,
    NotLeader,
    RaftmqError,
    RecordMetadata,
    UnknownOutcome,
)
from raftmq.client._accumulator import LEADER_WAIT_S, Accumulator
from raftmq.client._producer_config import ProducerConfig
from raftmq.client._requests import in_requests


def test_batches_are_sealed_by_count_and_sent_one_at_a_time_per_queue() -> None:
    acc = Accumulator(linger_s=1.0, max_batch_bytes=1 << 20, max_batch_messages=5, max_buffer_bytes=1 << 20)
    for _ in range(12):
        append_message(acc, "x" * 20)
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
        async with await start_producer(fake, linger_ms=60_000) as p:
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
            async with await start_producer(fake, linger_ms=60_000, **settings) as p:
                futures = [await p.send("t", "x", queue=q) for q in range(4)]
                await p.flush()
                await asyncio.gather(*futures)

        run(main)
        assert fake.requests == [] and sorted(b["queue"] for b in fake.produced) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("error", "failing"),
    [(NotLeader("moved"), [1]), (NotLeader("moved"), [0, 2]), (ConnectionLost("reset after send"), [1])],
    ids=["one failed", "several failed", "unknown outcome"],
)
def test_a_request_s_failed_or_unknown_frames_are_sent_again_and_stored_once(
    error: RaftmqError, failing: list[int]
) -> None:
    """One failed frame takes the request's error as its own (a retry after backoff); several
    are each sent again at once, to learn their own outcome; an unknown outcome is each batch's,
    retried without duplicates."""
    fake = FakeCluster([type(error)(str(error)) if q in failing else None for q in range(4)])

    async def main() -> list[RecordMetadata]:
        async with await start_producer(fake, linger_ms=60_000) as p:
            futures = [await p.send("t", f"{q}", queue=q) for q in range(4)]
            await p.flush()
            return list(await asyncio.gather(*futures))

    got = run(main)
    assert [(m.queue, m.offset) for m in got] == [(q, 0) for q in range(4)]
    assert fake.requests == [[0, 1, 2, 3]]
    assert sorted(b["queue"] for b in fake.produced) == sorted([0, 1, 2, 3, *failing])  # sent again
    assert fake.high == dict.fromkeys(range(4), 1)  # each stored once


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_batches_are_sealed_by_size(wire: Any) -> None:
    acc = Accumulator(
        linger_s=1.0, max_batch_bytes=2_000, max_batch_messages=10_000, max_buffer_bytes=1 << 20, wire=wire
    )
    for _ in range(100):
        append_message(acc, "x" * 100)
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
    append_message(acc, "x" * 500)
    append_message(acc, "y")
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
            frames.append(binary_request(b.body("p-1")))
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
        async with await start_producer(fake, linger_ms=0, delivery_timeout_ms=100) as p:
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
        p = await start_producer(fake, linger_ms=0)
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


def _default_accumulator(
    max_batch_messages: int = 100, max_requests_per_leader: int | None = None
) -> Accumulator:
    """An accumulator with the producer's default ``linger_ms`` and ``max_requests_per_leader``
    (unless given), as :class:`ProducerCore` makes it."""
    defaults = ProducerConfig()
    return Accumulator(
        linger_s=defaults.linger_ms / 1000,
        max_batch_bytes=1 << 20,
        max_batch_messages=max_batch_messages,
        max_buffer_bytes=1 << 20,
        producer_id="p-1",
        max_requests_per_leader=max_requests_per_leader or defaults.max_requests_per_leader,
    )


def _leader(key: tuple[str, int]) -> str:
    return "a" if key[1] % 2 == 0 else "b"  # queues 0, 2, 4 led by a; 1, 3, 5 by b


def test_an_idle_queue_s_first_message_goes_at_once_by_default() -> None:
    acc = _default_accumulator()
    wakes: list[int] = []
    acc.on_wake = lambda: wakes.append(1)
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=10.0)
    assert wakes == [1]  # the sender is woken for it
    taken, _ = acc.ready(10.0, node_of=_leader)
    assert [b.queue for b in taken] == [0]  # in the same instant, no linger


def test_messages_that_arrive_while_their_leader_is_busy_go_together_when_it_answers() -> None:
    acc = _default_accumulator()
    wakes: list[int] = []
    acc.on_wake = lambda: wakes.append(1)
    acc.try_append("t", 0, 6, "a0", None, None, 2, None, now_s=0.0)
    (first,), _ = acc.ready(0.0, node_of=_leader)
    # While queue 0's request to leader a is in flight: more for queue 0, and for queues 2 and 4
    # (leader a) and 1 (leader b).
    for q, v in [(0, "a1"), (2, "c0"), (4, "e0"), (2, "c1")]:
        acc.try_append("t", q, 6, v, None, None, 2, None, now_s=0.001)
    assert wakes == [1]  # nothing of leader a can go: no wake-up per message
    acc.try_append("t", 1, 6, "b0", None, None, 2, None, now_s=0.001)
    assert wakes == [1, 1]  # leader b is idle: its queue goes at once
    taken, _ = acc.ready(0.001, node_of=_leader)
    assert [b.queue for b in taken] == [1]
    for now_s in (0.005, 0.02, 0.05):  # nothing for leader a: its answer, not a clock, sends them
        assert acc.ready(now_s, node_of=_leader)[0] == []
    acc.complete(first)
    together, _ = acc.ready(0.05, node_of=_leader)
    assert sorted((b.queue, b.count, b.sequence) for b in together) == [(0, 1, 1), (2, 2, 0), (4, 1, 0)]
    assert in_requests(together, _leader, 1 << 20, 100) == [together]  # one request
    values = {
        f["queue"]: [v for v, _, _ in f["values"]] for f in (binary_request(b.body("p-1")) for b in together)
    }
    assert values == {0: ["a1"], 2: ["c0", "c1"], 4: ["e0"]}


def test_a_retry_holds_its_queue_but_not_its_leader() -> None:
    """A first attempt answered with an error releases the leader: the leader's other queues go
    while the batch waits for its retry, and its own queue's next batch waits for that batch, so
    the queue's order is kept."""
    acc = _default_accumulator()
    acc.try_append("t", 0, 6, "a0", None, None, 2, None, now_s=0.0)
    (first,), _ = acc.ready(0.0, node_of=_leader)
    acc.try_append("t", 0, 6, "a1", None, None, 2, None, now_s=0.001)
    acc.try_append("t", 2, 6, "c0", None, None, 2, None, now_s=0.001)
    assert acc.ready(0.001, node_of=_leader)[0] == []
    assert acc.release([first]) and not acc.release([first])  # idle once, however often told
    taken, _ = acc.ready(0.002, node_of=_leader)
    assert [b.queue for b in taken] == [2]  # queue 0's next batch waits for the retried one
    acc.complete(taken[0])
    assert acc.ready(0.003, node_of=_leader)[0] == []
    acc.complete(first)
    (second,), _ = acc.ready(0.004, node_of=_leader)
    assert (second.queue, second.sequence, first.sequence) == (0, 1, 0)


def test_a_full_batch_goes_without_waiting_for_its_leader() -> None:
    acc = _default_accumulator(max_batch_messages=3)
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=0.0)
    (first,), _ = acc.ready(0.0, node_of=_leader)
    acc.try_append("t", 4, 6, "y", None, None, 1, None, now_s=0.001)
    for _ in range(3):
        acc.try_append("t", 2, 6, "z", None, None, 1, None, now_s=0.001)
    taken, _ = acc.ready(0.001, node_of=_leader)
    # queue 2's batch is full and goes; queue 4's rides along in its request
    assert sorted((b.queue, b.count) for b in taken) == [(2, 3), (4, 1)]
    acc.complete(first)
    acc.release(taken)
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=0.002)
    assert [b.queue for b in acc.ready(0.002, node_of=_leader)[0]] == [0]


def test_an_explicit_linger_still_holds_a_batch_that_long() -> None:
    acc = Accumulator(
        linger_s=0.005, max_batch_bytes=1 << 20, max_batch_messages=100, max_buffer_bytes=1 << 20
    )
    acc.try_append("t", 0, 6, "x", None, None, 1, None, now_s=0.0)
    assert acc.ready(0.004, node_of=_leader) == ([], 0.005)
    assert [b.queue for b in acc.ready(0.005, node_of=_leader)[0]] == [0]


def test_a_batch_waits_for_a_slow_leader_s_answer_no_longer_than_the_leader_wait() -> None:
    """A request held up (one queue group of the leader without a quorum, say) does not hold the
    leader's other queues for the whole request timeout: the sender wakes by then, and they go."""
    acc = _default_accumulator()
    acc.try_append("t", 0, 6, "a0", None, None, 2, None, now_s=0.0)
    (stuck,), next_s = acc.ready(0.0, node_of=_leader)
    assert next_s == LEADER_WAIT_S  # the sender looks again by then without being woken
    acc.try_append("t", 2, 6, "c0", None, None, 2, None, now_s=0.01)
    assert acc.ready(0.05, node_of=_leader) == ([], 0.01 + LEADER_WAIT_S)
    (late,), _ = acc.ready(0.01 + LEADER_WAIT_S, node_of=_leader)
    assert late.queue == 2 and not stuck.done


def test_with_requests_per_leader_a_queue_s_batch_goes_while_its_leader_serves_another() -> None:
    """``max_requests_per_leader`` above 1: a batch waits for its own queue's batch in flight, not
    for its leader's requests for other queues (below the limit)."""
    acc = _default_accumulator(max_requests_per_leader=5)
    wakes: list[int] = []
    acc.on_wake = lambda: wakes.append(1)
    acc.try_append("t", 0, 6, "a0", None, None, 2, None, now_s=0.0)
    (first,), _ = acc.ready(0.0, node_of=_leader)
    acc.try_append("t", 2, 6, "c0", None, None, 2, None, now_s=0.001)
    assert wakes == [1, 1]  # queue 2 is idle: the sender is woken for it
    acc.try_append("t", 0, 6, "a1", None, None, 2, None, now_s=0.001)
    assert wakes == [1, 1]  # queue 0 waits for its batch in flight: no wake-up
    (second,), _ = acc.ready(0.001, node_of=_leader)
    assert (second.queue, first.done) == (2, False)  # a second request to leader a
    assert acc.ready(0.05, node_of=_leader)[0] == []
    acc.complete(first)
    (third,), _ = acc.ready(0.05, node_of=_leader)
    assert (third.queue, third.sequence, [third.count]) == (0, 1, [1])


def test_a_leader_at_its_limit_of_requests_holds_new_batches_until_one_is_answered() -> None:
    """A request of several batches counts once against its leader's limit and frees it when the
    first attempt of each of them is answered."""
    acc = _default_accumulator(max_requests_per_leader=2)
    acc.try_append("t", 0, 6, "a0", None, None, 2, None, now_s=0.0)
    acc.try_append("t", 2, 6, "c0", None, None, 2, None, now_s=0.0)
    shared, _ = acc.ready(0.0, node_of=_leader)
    assert sorted(b.queue for b in shared) == [0, 2]  # one request to leader a
    acc.try_append("t", 4, 6, "e0", None, None, 2, None, now_s=0.001)
    (alone,), _ = acc.ready(0.001, node_of=_leader)
    assert alone.queue == 4  # the second request to leader a
    wakes: list[int] = []
    acc.on_wake = lambda: wakes.append(1)
    acc.try_append("t", 2, 6, "c1", None, None, 2, None, now_s=0.002)  # queue 2 is in flight
    acc.try_append("t", 1, 6, "b0", None, None, 2, None, now_s=0.002)  # leader b is idle
    assert wakes == [1]
    queue_2 = next(b for b in shared if b.queue == 2)
    acc.complete(queue_2)  # queue 2 is free; its request still holds leader a (queue 0's frame)
    taken, next_s = acc.ready(0.003, node_of=_leader)
    assert [b.queue for b in taken] == [1]  # queue 2's next batch waits: leader a has 2 requests
    assert next_s == 0.002 + LEADER_WAIT_S
    queue_0 = next(b for b in shared if b.queue == 0)
    assert acc.release([queue_0])  # the shared request is answered: leader a is below its limit
    assert not acc.release([queue_0])  # once, however often told
    (later,), _ = acc.ready(0.004, node_of=_leader)
    assert (later.queue, later.sequence, later.count) == (2, 1, 1)
