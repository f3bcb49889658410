"""The consumers' ``address_map`` on a real 3-node cluster: a consumer whose bootstrap addresses
exist only in its map (as the chaos harness's ``http://n1:8080`` behind docker port mappings)
joins its group, fetches every message and commits, with every request placed by the map."""

from __future__ import annotations

import asyncio
import threading

from raftmq.client import Admin, AsyncConsumer, Consumer, Producer

from .harness import Cluster, wait_until


class Aliases:
    """``http://alias-<id>:8080`` -> the node's real address; records every address asked for."""

    def __init__(self, c: Cluster) -> None:
        self.real = {f"http://alias-{i}:8080": n.url for i, n in c.nodes.items()}
        self.advertised = {n.url for n in c.nodes.values()}
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, url: str) -> str | None:
        with self.lock:
            self.asked.append(url)
        return self.real.get(url, url if url in self.advertised else None)


def setup_topic(c: Cluster, topic: str, values: list[str]) -> None:
    urls = [n.url for n in c.nodes.values()]
    with Admin(urls) as admin:
        admin.create_topic(topic, 3)
    with Producer(urls) as producer:
        for v in values:
            producer.send(topic, v)
        producer.flush()


def committed_all(c: Cluster, group: str, topic: str) -> bool:
    with Admin([n.url for n in c.nodes.values()]) as admin:
        committed = admin.committed_offsets(group, topic)
        high = [q.high_offset for q in admin.describe_topic(topic).queue_states]
    return [committed[q] for q in range(3)] == high


def test_an_async_consumer_reaches_the_cluster_only_through_its_address_map(cluster: Cluster) -> None:
    values = [f"a{i}" for i in range(300)]
    setup_topic(cluster, "mapped-async", values)
    aliases = Aliases(cluster)

    async def consume() -> list[str]:
        got: list[str] = []
        async with AsyncConsumer(
            list(aliases.real), group="mapped", topics="mapped-async", wait_ms=200,
            auto_commit_interval_ms=200, address_map=aliases,
        ) as consumer:  # fmt: skip
            while len(got) < len(values):
                for m in await consumer.getmany(timeout_ms=10_000):
                    got.append(str(m.value))
                    m.ack()
        return got

    got = asyncio.run(asyncio.wait_for(consume(), 60))
    assert sorted(got) == sorted(values)
    assert committed_all(cluster, "mapped", "mapped-async")  # the close committed through the map
    assert set(aliases.asked) & set(aliases.real)  # the bootstrap aliases were placed by the map
    assert set(aliases.asked) & aliases.advertised  # so were the leaders' advertised addresses


def test_a_sync_consumer_takes_the_same_address_map(cluster: Cluster) -> None:
    values = [f"s{i}" for i in range(300)]
    setup_topic(cluster, "mapped-sync", values)
    aliases = Aliases(cluster)
    got: list[str] = []
    with Consumer(
        list(aliases.real), group="mapped", topics="mapped-sync", wait_ms=200,
        auto_commit_interval_ms=200, address_map=aliases,
    ) as consumer:  # fmt: skip
        for m in consumer:
            got.append(str(m.value))
            m.ack()
            if len(got) == len(values):
                break
    assert sorted(got) == sorted(values)
    wait_until(lambda: committed_all(cluster, "mapped", "mapped-sync"), 10)
    assert set(aliases.asked) & set(aliases.real)
