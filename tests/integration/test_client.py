"""The Python client against a real 3-node cluster: admin, produce, consume, failover."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Literal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    Message,
    OffsetOutOfRange,
    Producer,
    RecordMetadata,
    TopicExists,
    TopicNotFound,
    key_queue,
)

from .harness import Cluster, wait_until


def urls(c: Cluster) -> list[str]:
    return [n.url for n in c.nodes.values()]


def consume_all(c: Cluster, topic: str, count: int, member: str, timeout_s: float = 30) -> list[Message]:
    """``count`` messages of ``topic`` read by a broadcast consumer (acked)."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    with Consumer(
        urls(c), group="reader", topics=topic, mode="broadcast", member_id=member, wait_ms=200
    ) as cons:
        while len(out) < count and time.monotonic() < deadline:
            for m in cons.poll(timeout_ms=500):
                m.ack()
                out.append(m)
    return out


def test_admin_manages_topics_and_reports_the_cluster(cluster: Cluster) -> None:
    with Admin(urls(cluster)) as admin:
        created = admin.create_topic("admin-t", 3, retention_ms=3_600_000)
        assert (created.name, created.queues, created.info.retention_ms) == ("admin-t", 3, 3_600_000)
        assert [q.queue for q in created.queue_states] == [0, 1, 2]
        with pytest.raises(TopicExists):
            admin.create_topic("admin-t", 3)
        assert "admin-t" in {t.name for t in admin.list_topics()}
        described = admin.describe_topic("admin-t")
        assert all(q.leader in cluster.nodes and q.high_offset == 0 for q in described.queue_states)
        status = admin.cluster_status()
        assert {n.id for n in status.nodes} == set(cluster.nodes)
        assert all(g.leader is not None for g in status.groups)
        admin.delete_topic("admin-t")
        with pytest.raises(TopicNotFound):
            admin.describe_topic("admin-t")


def test_committing_past_the_high_offset_is_offset_out_of_range_with_bounds(cluster: Cluster) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topic("oor-t", 1)
        with pytest.raises(OffsetOutOfRange) as info:
            admin.commit_offsets("g", "oor-t", {0: 5})
        assert (info.value.low_offset, info.value.high_offset) == (0, 0)
        admin.commit_offsets("g", "oor-t", {0: 0})
        assert admin.committed_offsets("g", "oor-t") == {0: 0}


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_messages_round_trip_with_keys_headers_binary_values_and_explicit_queues(
    cluster: Cluster, wire: Literal["binary", "json"]
) -> None:
    """Both wires: record batches (the default) and the JSON API's messages (``wire="json"``)."""
    topic = f"rt-{wire}"
    with Admin(urls(cluster)) as admin:
        admin.create_topic(topic, 4)
    sent: dict[tuple[int, int], tuple[str | bytes, str | None]] = {}
    with Producer(urls(cluster), wire=wire) as producer:
        futures = []
        for i in range(200):
            value: str | bytes = f"text-{i}" if i % 3 else bytes([i % 256, 0, 255])
            key = f"key-{i % 7}" if i % 2 else None
            f = producer.send(topic, value, key=key, headers={"i": str(i)}, queue=3 if i % 10 == 0 else None)
            futures.append((f, value, key, i))
        producer.flush()
        for f, value, key, i in futures:
            meta = f.result()
            if i % 10 == 0:
                assert meta.queue == 3
            elif key is not None:
                assert meta.queue == key_queue(key, 4)
            sent[(meta.queue, meta.offset)] = (value, key)
        assert producer._core.wire == wire  # the node took the batches: no fallback to JSON
    got = consume_all(cluster, topic, 200, "m1")
    assert len(got) == 200
    for m in got:
        assert sent[(m.queue, m.offset)] == (m.value, m.key)
        assert m.headers["i"] and m.timestamp_ms > 0
    assert len({(m.queue, m.offset) for m in got}) == 200


def produce_requests(c: Cluster) -> float:
    """Produce requests (POST to a topic's messages) answered by all nodes so far."""
    total = 0.0
    for node in c.nodes:
        for family in text_string_to_metric_families(c.get("/metrics", node).text):
            for s in family.samples:
                labels = s.labels
                if (
                    s.name == "raftmq_http_requests_total"
                    and labels.get("method") == "POST"
                    and labels.get("route", "").endswith("/messages")
                ):
                    total += s.value
    return total


def group_terms(c: Cluster) -> dict[str, int]:
    """Each group's term at every node."""
    return {f"{nid}/{g}": s["term"] for nid in c.nodes for g, s in c.status(nid)["groups"].items()}


def test_batches_of_queues_with_one_leader_share_a_request(cluster: Cluster) -> None:
    """Batches ready together whose queues have the same leader go as one request of several
    frames (one per queue): one request per leader node, each message stored once, in order."""
    topic = "together"
    with Admin(urls(cluster)) as admin:
        admin.create_topic(topic, 6)
    with Producer(urls(cluster), linger_ms=60_000) as producer:
        assert producer._core is not None
        core = producer._core
        first = producer.send(topic, "first", queue=0)  # loads the topic's leaders
        assert producer.flush(10)
        first.result()
        # A try that an election crossed (a loaded machine's) is not counted: the batches of a
        # queue whose leader moved are sent again, a request more. Tried again, three times at most.
        tried = 0
        while True:
            terms = group_terms(cluster)
            before = produce_requests(cluster)
            futures = [producer.send(topic, f"v{q}-{i}", queue=q) for i in range(3) for q in range(6)]
            assert producer.flush(10)
            metas = [f.result() for f in futures]
            after = produce_requests(cluster)
            leaders = {core.metadata.leader_url(topic, q) for q in range(6)}
            if group_terms(cluster) == terms:
                break
            tried += 1
            assert tried < 3, "an election crossed each of three tries"
    assert after - before == len(leaders) < 6, (after - before, leaders)
    offsets = [(0, 1 + 3 * tried)] + [(q, 3 * tried) for q in range(1, 6)]
    assert [(m.queue, m.offset) for m in metas[:6]] == offsets
    count = 1 + 18 * (tried + 1)
    got = consume_all(cluster, topic, count, "m1")
    stored = {(m.queue, m.offset): m.value for m in got}
    assert len(stored) == count
    for (q, i), m in zip([(q, i) for i in range(3) for q in range(6)], metas, strict=True):
        assert stored[(m.queue, m.offset)] == f"v{q}-{i}" and m.queue == q


def test_the_client_and_the_broker_route_a_key_to_the_same_queue(cluster: Cluster) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topic("routing", 8)
    keys = [f"user-{i}" for i in range(40)]
    r = cluster.produce("routing", [{"value": k, "key": k} for k in keys])  # routed by the broker
    assert r.status_code == 200, r.text
    broker = [res["queue"] for res in r.json()["results"]]
    with Producer(urls(cluster)) as producer:
        client = [producer.send("routing", k, key=k).result().queue for k in keys]
    assert client == broker == [key_queue(k, 8) for k in keys]


def test_async_producer_and_consumer_round_trip(cluster: Cluster) -> None:
    async def main() -> tuple[list[RecordMetadata], list[Message]]:
        async with AsyncAdmin(urls(cluster)) as admin:
            await admin.create_topic("async-rt", 4)
        async with AsyncProducer(urls(cluster), linger_ms=2) as producer:
            futures = [await producer.send("async-rt", f"v{i}", key=f"k{i}") for i in range(500)]
            metas = list(await asyncio.gather(*futures))
            one = await producer.send_and_wait("async-rt", "last", queue=0)
            metas.append(one)
        got: list[Message] = []
        async with AsyncConsumer(
            urls(cluster), group="async-g", topics=["async-rt"], wait_ms=200
        ) as consumer:
            async for m in consumer:
                m.ack()
                got.append(m)
                if len(got) == 501:
                    break
        return metas, got

    metas, got = asyncio.run(asyncio.wait_for(main(), 60))
    assert {(m.queue, m.offset) for m in metas} == {(m.queue, m.offset) for m in got}
    assert sorted(m.value for m in got) == sorted([f"v{i}" for i in range(500)] + ["last"])


def test_produce_to_consume_latency_is_sane(cluster: Cluster) -> None:
    """A sanity check, not a benchmark: messages arrive promptly through long polling.

    The fetches long-poll for 15 s (the most a node allows). A message is woken up by its commit
    and arrives in milliseconds; without that it would wait for the end of the poll it came
    during, and the second-worst of 100 would take about 15 s. The bound in between (10 s) tells
    the two apart and leaves a slow CI machine plenty (the latency figures are in the benchmarks).
    """
    with Admin(urls(cluster)) as admin:
        admin.create_topic("latency", 2)
    latencies: list[float] = []
    sent_at: dict[str, float] = {}
    with (
        Consumer(urls(cluster), group="lat", topics="latency", wait_ms=15_000, reset="latest") as consumer,
        Producer(urls(cluster), linger_ms=0) as producer,
    ):
        for i in range(100):
            value = f"m{i}"
            sent_at[value] = time.monotonic()
            producer.send("latency", value)
            for m in consumer.poll(timeout_ms=5_000):
                latencies.append(time.monotonic() - sent_at[str(m.value)])
                m.ack()
        deadline = time.monotonic() + 60
        while len(latencies) < 100 and time.monotonic() < deadline:
            for m in consumer.poll(timeout_ms=1_000):
                latencies.append(time.monotonic() - sent_at[str(m.value)])
                m.ack()
    assert len(latencies) == 100, "messages stopped arriving"
    latencies.sort()
    p50, p99 = latencies[49], latencies[98]
    print(f"produce->consume latency p50={p50 * 1000:.1f} ms p99={p99 * 1000:.1f} ms")
    assert p99 < 10.0  # woken by the commit, not by the end of a 15 s poll


@pytest.mark.parametrize(
    ("settings", "queues"),
    [({"linger_ms": 2}, 1), ({}, 3), ({"max_requests_per_leader": 5}, 6)],
    ids=["linger-2ms-one-queue", "defaults-three-queues", "requests-per-leader-two-queues-each"],
)
def test_a_producer_retrying_through_a_leader_failover_stores_each_batch_once(
    tmp_path: Path, settings: dict[str, int], queues: int
) -> None:
    """With the defaults (no linger: a batch waits only for its leader's request in flight), over
    queues whose groups have different leaders, with two requests in flight to one leader at once
    (``max_requests_per_leader``, two queues per leader), as with a linger on one queue: across
    the kill of a leader every acknowledged message is stored once, in the order sent, per
    queue."""
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        with Admin(urls(c)) as admin:
            desc = admin.create_topic("failover", max(3, queues))
        group = str(desc.queue_states[0].group_id)
        leader = c.wait_leader(group)
        acked: list[tuple[str, RecordMetadata]] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def produce() -> None:
            with Producer(urls(c), request_timeout_ms=5_000, **settings) as producer:
                i = 0
                pending = []
                while not stop.is_set():
                    value = f"v{i}"
                    pending.append((value, producer.send("failover", value, queue=i % queues)))
                    i += 1
                    if i % 50 == 0:
                        time.sleep(0.01)
                producer.flush()
                for value, f in pending:
                    try:
                        acked.append((value, f.result()))
                    except Exception as e:
                        errors.append(e)

        def high(node: str | None = None) -> int:
            # null while the queue's group has no leader serving reads (a leader elected late, say):
            # an AssertionError, "not yet" to wait_until
            value = c.get("/v1/topics/failover", node).json()["queues"][0]["high_offset"]
            assert value is not None, "no leader answered"
            return int(value)

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            wait_until(lambda: high() > 2_000, 30, what="producing before the failover")
            c.kill(leader)
            c.wait_leader(group, exclude=leader)
            survivor = next(n for n in c.nodes if n != leader)
            base = wait_until(lambda: high(survivor), 30, what="the new leader's high offset")
            wait_until(lambda: high(survivor) > base + 2_000, 60, what="producing after the failover")
        finally:
            stop.set()
            worker.join(120)
        assert not worker.is_alive()
        assert errors == []
        for q in range(queues):
            stored = [m["value"] for m in c.fetch_all("failover", q, node=survivor)]
            duplicates = [v for v, n in Counter(stored).items() if n > 1]
            assert duplicates == []
            in_queue = [(v, m) for v, m in acked if m.queue == q]
            assert {v for v, _ in in_queue} <= set(stored)
            assert len(stored) == len(in_queue)  # nothing was stored that was not acknowledged
            assert [m.offset for _, m in in_queue] == list(range(len(in_queue)))  # order kept across retries
            assert stored == [v for v, _ in in_queue]  # in the order sent
