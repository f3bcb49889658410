"""Consumers outlive a node's death (issue 21, item 1): offset consumers and receive/ack
subscribers, sync and asyncio, started against the survivors right after ``kill -9`` of a group's
leader, read every message without an error.

The race the issue saw (a forward to the dead node answered 500 ``internal``, which the client
rightly does not retry) is made deterministic: elections take 5-7 s here, so every request in the
first seconds after the kill that a survivor sends on to the dead leader finds it gone. The queue
group case failed before the fix (the committed offsets read at the dead leader of a queue group
became a 500); the metadata case covers the members and receive routes forwarded to the
metadata leader and the coordinator."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftmq.client import AsyncConsumer, AsyncSubscriber, Consumer, Subscriber

from .harness import Cluster

pytestmark = pytest.mark.timeout(240)

MESSAGES = 120
SLOW_ELECTIONS = "[raft]\nelection_min_ms = 5000\nelection_max_ms = 7000\n"


def _sync_consumer(nodes: list[str], group: str) -> set[str]:
    seen: set[str] = set()
    with Consumer(nodes, group=group, topics="lines", wait_ms=500) as consumer:
        deadline = time.monotonic() + 60
        while len(seen) < MESSAGES and time.monotonic() < deadline:
            for m in consumer.poll(timeout_ms=1000):
                seen.add(str(m.value))
                m.ack()
        consumer.commit()
    return seen


def _async_consumer(nodes: list[str], group: str) -> set[str]:
    async def run() -> set[str]:
        seen: set[str] = set()
        async with AsyncConsumer(nodes, group=group, topics=["lines"], wait_ms=500) as consumer:
            deadline = time.monotonic() + 60
            while len(seen) < MESSAGES and time.monotonic() < deadline:
                for m in await consumer.getmany(timeout_ms=1000):
                    seen.add(str(m.value))
                    m.ack()
            await consumer.commit()
        return seen

    return asyncio.run(run())


def _sync_subscriber(nodes: list[str], group: str) -> set[str]:
    seen: set[str] = set()
    with Subscriber(nodes, topic="lines", group=group) as subscriber:
        deadline = time.monotonic() + 60
        while len(seen) < MESSAGES and time.monotonic() < deadline:
            for m in subscriber.receive(50, timeout_ms=1000):
                seen.add(str(m.value))
                m.ack()
    return seen


def _async_subscriber(nodes: list[str], group: str) -> set[str]:
    async def run() -> set[str]:
        seen: set[str] = set()
        async with AsyncSubscriber(nodes, topic="lines", group=group) as subscriber:
            deadline = time.monotonic() + 60
            while len(seen) < MESSAGES and time.monotonic() < deadline:
                for m in await subscriber.receive(50, timeout_ms=1000):
                    seen.add(str(m.value))
                    m.ack()
        return seen

    return asyncio.run(run())


READERS: dict[str, Callable[[list[str], str], set[str]]] = {
    "consumer": _sync_consumer,
    "async-consumer": _async_consumer,
    "subscriber": _sync_subscriber,
    "async-subscriber": _async_subscriber,
}


def _run_all(nodes: list[str], suffix: str) -> dict[str, Any]:
    """Each reader in a thread of its own, at once; its messages or the exception it raised."""
    results: dict[str, Any] = {}

    def one(name: str, read: Callable[[list[str], str], set[str]]) -> None:
        try:
            results[name] = read(nodes, f"{name}-{suffix}")
        except Exception as e:  # reported below with the reader's name
            results[name] = e

    threads = [threading.Thread(target=one, args=item) for item in READERS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    return results


@pytest.mark.parametrize("kind", ["queue group", "metadata"])
def test_consumers_started_after_a_leader_kill_read_everything_without_an_error(
    tmp_path: Path, kind: str
) -> None:
    with Cluster(tmp_path, nodes=3, extra_toml=SLOW_ELECTIONS) as c:
        c.start()
        c.wait_ready(timeout_s=60)
        c.wait_balanced(timeout_s=60)
        topic = c.create_topic("lines", queues=3)
        r = c.produce("lines", [{"value": f"m{i}", "queue": i % 3} for i in range(MESSAGES)])
        assert r.status_code == 200, r.text
        meta_leader = c.wait_leader("meta")
        if kind == "metadata":
            victim = meta_leader
        else:  # a queue group's leader that is not the metadata leader (joining still works)
            leaders = {c.wait_leader(str(g)) for g in topic["queue_groups"]}
            victim = sorted(leaders - {meta_leader})[0]
        survivors = [c.nodes[n].http for n in c.nodes if n != victim]
        c.kill(victim)
        results = _run_all(survivors, kind.replace(" ", "-"))
        failures = {name: repr(v) for name, v in results.items() if not isinstance(v, set)}
        assert not failures, failures
        expected = {f"m{i}" for i in range(MESSAGES)}
        short = {name: len(expected - v) for name, v in results.items() if v != expected}
        assert not short, f"messages missing per reader: {short}"
