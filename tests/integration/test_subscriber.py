"""The client's Subscriber (sync) and AsyncSubscriber over receive/ack (poll) and the push stream on
a real 3-node cluster: every message acked once, nacks and extends, a poison message reaching the
dead-letter topic through nacks, close giving back what was never handed out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client import AsyncSubscriber, ReceivedMessage, SubscribeMode, Subscriber, TopicNotFound

from .harness import Cluster

pytestmark = pytest.mark.timeout(240)

MAX_DELIVERIES = 3
BACKOFF_MS = 200
DELIVERY = f"[delivery]\nmax_deliveries = {MAX_DELIVERIES}\nbackoff_ms = [{BACKOFF_MS}]\ntick_ms = 100\n"
# Long enough that a slow machine acks every message (and extends m0) before it ends.
VISIBILITY_MS = 3000
MODES: list[SubscribeMode] = ["poll", "push"]


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("subscriber")
    with Cluster(tmp, nodes=3, extra_toml=DELIVERY) as cluster:
        cluster.start()
        cluster.wait_ready()
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def urls(c: Cluster) -> list[str]:
    return [c.url(n) for n in c.nodes]


def produce(c: Cluster, topic: str, values: list[str], queues: int) -> None:
    r = c.produce(topic, [{"value": v, "queue": i % queues} for i, v in enumerate(values)])
    assert r.status_code == 200, r.text


def all_finished(c: Cluster, topic: str, group: str) -> bool:
    """The group's committed offset is the high offset of every queue: every message was acked."""
    offsets = c.get(f"/v1/groups/{group}/offsets", params={"topic": topic}).json()["offsets"]
    highs = {str(q["queue"]): q["high_offset"] for q in c.get(f"/v1/topics/{topic}").json()["queues"]}
    return bool(offsets == highs)


def http_receive(c: Cluster, topic: str, group: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/v1/topics/{topic}/subscriptions/{group}/receive", {"wait_ms": 0, **body})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


@pytest.mark.parametrize("mode", MODES)
def test_sync_subscriber_receives_every_message_and_acks_it_from_worker_threads(
    c: Cluster, mode: SubscribeMode
) -> None:
    topic = f"sync-{mode}"
    c.create_topic(topic, queues=3)
    sent = [f"m{i}" for i in range(300)]
    produce(c, topic, sent, 3)
    seen: Counter[str] = Counter()
    with (
        Subscriber(urls(c), topic=topic, group="g", mode=mode, max_in_flight=40) as subscriber,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        for message in subscriber:
            assert isinstance(message, ReceivedMessage) and message.topic == topic
            seen[str(message.value)] += 1
            pool.submit(message.ack)  # settled from another thread
            if len(seen) == len(sent):
                break
        pool.shutdown(wait=True)
        subscriber.flush()
        stats = subscriber.stats
    assert set(seen) == set(sent) and set(seen.values()) == {1}
    assert (stats.received, stats.acked, stats.stale, stats.failed) == (300, 300, 0, 0), stats
    assert all_finished(c, topic, "g")
    assert http_receive(c, topic, "g", wait_ms=300) == []


@pytest.mark.parametrize("mode", MODES)
def test_async_subscriber_redelivers_nacked_messages_and_keeps_extended_ones(
    c: Cluster, mode: SubscribeMode
) -> None:
    topic = f"async-{mode}"
    c.create_topic(topic, queues=2)
    sent = [f"m{i}" for i in range(40)]
    produce(c, topic, sent, 2)

    async def slow(message: ReceivedMessage) -> None:  # a long job: kept in flight past its deadline
        message.extend(30_000)
        await asyncio.sleep((VISIBILITY_MS + BACKOFF_MS) / 1000 + 1.0)
        message.ack()

    async def run() -> tuple[dict[str, list[int]], Any]:
        attempts: dict[str, list[int]] = {}
        jobs = []
        async with AsyncSubscriber(
            urls(c), topic=topic, group="g", mode=mode, visibility_ms=VISIBILITY_MS, max_in_flight=64
        ) as subscriber:
            async for message in subscriber:
                value = str(message.value)
                attempts.setdefault(value, []).append(message.attempt)
                if value == "m0":
                    jobs.append(asyncio.create_task(slow(message)))
                elif int(value[1:]) % 4 == 1 and message.attempt == 1:
                    message.nack(delay_ms=0)  # wanted again at once
                else:
                    message.ack()
                nacked = [a for v, a in attempts.items() if int(v[1:]) % 4 == 1]
                if len(attempts) == len(sent) and all(len(a) == 2 for a in nacked):
                    break
            await asyncio.gather(*jobs)
            await asyncio.sleep(0.6)  # m0's first deadline is long past: it did not come back
            assert await subscriber.receive(10, timeout_ms=0) == []
            await subscriber.flush()
            return attempts, subscriber.stats

    attempts, stats = asyncio.run(asyncio.wait_for(run(), 120))
    assert attempts["m0"] == [1]  # extended: not redelivered after its first deadline
    for value, seen in attempts.items():
        assert seen == ([1, 2] if int(value[1:]) % 4 == 1 else [1]), (value, seen)
    assert (stats.nacked, stats.extended, stats.acked, stats.failed) == (10, 1, 40, 0), stats
    assert all_finished(c, topic, "g")


@pytest.mark.parametrize("mode", MODES)
def test_a_poison_message_nacked_every_time_reaches_the_dead_letter_topic(
    c: Cluster, mode: SubscribeMode
) -> None:
    topic = f"poison-{mode}"
    c.create_topic(topic, queues=2)
    produce(c, topic, ["ok-1", "poison", "ok-2"], 2)
    poison_attempts: list[int] = []
    poison_times: list[tuple[int | None, int]] = []  # (first_delivery_ms, deadline_ms) per delivery
    with Subscriber(urls(c), topic=topic, group="workers", mode=mode) as subscriber:
        deadline = time.monotonic() + 30
        while len(poison_attempts) < MAX_DELIVERIES and time.monotonic() < deadline:
            for message in subscriber.receive(10, timeout_ms=1000):
                if message.value == "poison":
                    poison_attempts.append(message.attempt)
                    poison_times.append((message.first_delivery_ms, message.deadline_ms))
                    message.nack()  # the group's backoff (200 ms)
                else:
                    message.ack()
        subscriber.flush()
        assert subscriber.receive(10, timeout_ms=1000) == []  # it is gone from the topic
        stats = subscriber.stats
    assert poison_attempts == [1, 2, 3]
    # Its first receive's time on every attempt, before each delivery's deadline, the later ones'
    # deadlines a backoff and more after it.
    (first_ms,) = {first for first, _ in poison_times}
    assert first_ms is not None and abs(first_ms - time.time() * 1000) < 60_000
    deadlines = [d for _, d in poison_times]
    assert first_ms < deadlines[0] < deadlines[1] < deadlines[2]
    assert deadlines[1] - first_ms >= BACKOFF_MS
    assert stats.nacked == MAX_DELIVERIES and stats.acked == 2
    r = c.get(f"/v1/topics/{topic}/subscriptions/workers/dlq")
    (dead,) = r.json()["messages"]
    assert dead["value"] == "poison"
    assert dead["headers"]["raftmq-dlq-attempts"] == str(MAX_DELIVERIES)
    assert dead["headers"]["raftmq-dlq-reason"] == "nacked"
    assert all_finished(c, topic, "workers")


@pytest.mark.parametrize("mode", MODES)
def test_close_gives_back_at_once_what_was_never_handed_out(c: Cluster, mode: SubscribeMode) -> None:
    topic = f"close-{mode}"
    c.create_topic(topic, queues=1)
    produce(c, topic, [f"m{i}" for i in range(20)], 1)
    subscriber = Subscriber(
        urls(c), topic=topic, group="g", mode=mode, max_in_flight=20, visibility_ms=20_000
    )
    (kept,) = subscriber.receive(1, timeout_ms=15_000)
    deadline = time.monotonic() + 30
    while subscriber.stats.received < 20 and time.monotonic() < deadline:
        time.sleep(0.05)  # the rest arrives in the subscriber's buffer
    assert subscriber.stats.received == 20
    subscriber.close()
    stats = subscriber.stats
    assert stats.nacked == 19 and stats.acked == 0, stats
    # The 19 never handed out are back at once (attempt 2); the one handed out stays in flight.
    back = http_receive(c, topic, "g", max=100, wait_ms=15_000)
    assert sorted(m["offset"] for m in back) == sorted(set(range(20)) - {kept.offset})
    assert {m["attempt"] for m in back} == {2}
    assert subscriber.receive(1, timeout_ms=100) == []  # closed: nothing more


def test_a_subscriber_of_a_missing_topic_raises_topic_not_found(c: Cluster) -> None:
    with pytest.raises(TopicNotFound):
        Subscriber(urls(c), topic="no-such-topic", group="g")
    with pytest.raises(ValueError, match="max_in_flight"):
        Subscriber(urls(c), topic="x", group="g", max_in_flight=0)
