"""A push Subscriber through node kills: the leader coordinating its subscription, then the node
serving its stream. It keeps receiving, and every produced message is acked at least once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from raftmq.client import DeliveryCallback, Producer, RaftmqError, RecordMetadata, Subscriber

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)


class Workload:
    """A producer thread (a message every 10 ms, recorded once stored) and a subscriber thread that
    acks everything it receives."""

    def __init__(self, c: Cluster) -> None:
        urls = [c.url(n) for n in c.nodes]
        self.urls = urls
        self.produced: set[str] = set()
        self.received: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.subscriber = Subscriber(urls, topic="jobs", group="workers", mode="push", visibility_ms=2000)
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _stored(self, value: str) -> DeliveryCallback:
        def callback(meta: RecordMetadata | None, error: RaftmqError | None) -> None:
            if error is None:
                with self.lock:
                    self.produced.add(value)

        return callback

    def _produce(self) -> None:
        with Producer(self.urls, linger_ms=2) as producer:
            i = 0
            while not self.stop.is_set():
                value = f"job-{i}"
                producer.send("jobs", value, key=value, callback=self._stored(value))
                i += 1
                time.sleep(0.01)
            producer.flush()

    def _consume(self) -> None:
        for message in self.subscriber:
            with self.lock:
                self.received[str(message.value)] += 1
            message.ack()

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def wait_more(self, n: int, what: str) -> None:
        before = self.count()
        wait_until(lambda: self.count() >= before + n, 40, what=what)

    def close(self) -> None:
        self.stop.set()
        self.threads[0].join(60)
        self.subscriber.close()  # ends the iteration of the consumer thread
        self.threads[1].join(30)


def test_a_push_subscriber_keeps_receiving_through_leader_kills_and_acks_every_message(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, nodes=3, extra_toml="[delivery]\ntick_ms = 100\n") as c:
        c.start()
        c.wait_ready()
        c.create_topic("jobs", queues=3)
        work = Workload(c)
        try:
            wait_until(lambda: work.count() >= 100, 30, what="first messages")
            coordinator = str(c.get("/v1/topics/jobs").json()["queue_groups"][0])
            victims = [c.wait_leader(coordinator)]
            stream_node = work.subscriber.node
            if stream_node is not None and stream_node != victims[0]:
                victims.append(stream_node)
            for victim in victims:
                c.kill(victim)
                # It keeps receiving while the node is down (messages produced after the kill too).
                work.wait_more(100, f"receiving without {victim}")
                c.start(victim)
                c.wait_ready(timeout_s=60)
            # Enough traffic to mean something, waited for (a slow machine produces less per second).
            wait_until(lambda: len(work.produced) > 300, 60, what="300 messages produced")
            work.stop.set()
            work.threads[0].join(60)
            with work.lock:
                expected = set(work.produced)
            wait_until(
                lambda: expected <= set(work.received),
                60,
                interval_s=0.2,
                what="every produced message received",
            )
            work.subscriber.flush()
            stats = work.subscriber.stats
            assert stats.reconnects >= 1, stats  # the stream's node was killed at least once

            def all_acked() -> bool:  # the committed offset reached the end of every queue
                offsets = c.get("/v1/groups/workers/offsets", params={"topic": "jobs"}).json()["offsets"]
                highs = {str(q["queue"]): q["high_offset"] for q in c.get("/v1/topics/jobs").json()["queues"]}
                return bool(offsets == highs)

            wait_until(all_acked, 60, interval_s=0.2, what="every message acked")
        finally:
            work.close()
        assert not work.threads[1].is_alive()
