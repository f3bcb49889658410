"""The binary fetch (``Accept: application/vnd.raftmq.batch``, docs/api.md) against real nodes: the
answer is the stored batches themselves (v2 verbatim, v1 converted by ``v1_to_v2``), the same from
the leader, a forwarding node and every replica; whole batches that may begin below the offset;
the JSON fetch's parameters, limits and errors; and the client's ``Consumer`` on that path (a group
of 3 across a rebalance, TTL-expired messages left out as the JSON answer leaves them out)."""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq import batch as rb
from raftmq.client import Consumer, Message
from raftmq.cluster.api.handlers.fetch_batches import as_v2
from raftmq.storage.queues import raw_batches
from raftmq.storage.rocks import RocksStore

from .conftest import assert_error, describe, wait_applied_everywhere
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

ACCEPT = {"Accept": rb.BATCH_MEDIA_TYPE}


def fetch_binary(
    c: Cluster, topic: str, queue: int, node: str | None = None, **params: Any
) -> requests.Response:
    return requests.get(
        f"{c.url(node)}/v1/topics/{topic}/queues/{queue}/messages", params=params, headers=ACCEPT, timeout=30
    )


def views(r: requests.Response) -> list[rb.BatchView]:
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == rb.BATCH_MEDIA_TYPE
    if not r.content:
        return []
    frames = rb.split_frames(r.content)
    assert all(f.queue is not None and f.topic is None for f in frames)
    return [rb.read(f.batch) for f in frames]


def post_binary(c: Cluster, topic: str, batch: bytes, queue: int = 0, retry_503: bool = False) -> None:
    """Produce ``batch``. ``retry_503``: sent again while the answer is a 503, for a caller right
    after a restart (the groups elect, and a produce an election crosses is answered 503,
    ``unknown_outcome`` or ``not_leader``) that compares what was stored with what is read, so a
    batch stored twice changes nothing it checks."""
    deadline = time.monotonic() + (30 if retry_503 else 0)
    while True:
        r = requests.post(
            f"{c.url()}/v1/topics/{topic}/messages",
            data=rb.join_frames([(queue, None, batch)]),
            headers={"Content-Type": rb.BATCH_MEDIA_TYPE},
            timeout=30,
        )
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text


def json_messages(c: Cluster, topic: str) -> list[dict[str, Any]]:
    r = c.get(f"/v1/topics/{topic}/queues/0/messages", params={"offset": 0, "max": 10_000})
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["messages"]
    return out


def as_json(view: rb.BatchView, record: rb.Record) -> dict[str, Any]:
    """A decoded record in the JSON answer's shape (the timestamp is the batch's append time)."""
    out: dict[str, Any] = {"offset": record.offset, "key": record.key, "timestamp_ms": view.append_time_ms}
    if record.binary:
        out["value_b64"] = base64.b64encode(record.value).decode()
    else:
        out["value"] = record.value.decode()
    out["headers"] = record.headers or {}
    return out


def same_as_json(got: list[rb.BatchView], messages: list[dict[str, Any]]) -> None:
    records = [as_json(v, r) for v in got for r in v.records()]
    assert len(records) == len(messages)
    for r, m in zip(records, messages, strict=True):
        want = {k: m[k] for k in ("offset", "key", "value", "value_b64", "timestamp_ms") if k in m}
        want.setdefault("key", None)
        want["headers"] = m.get("headers") or {}
        assert r == want, (r, m)


def test_the_answer_is_the_stored_batches_from_leader_followers_and_a_forwarding_node(tmp_path: Path) -> None:
    # A rolling upgrade: while n2 reads format v1 only, every produce is stored as v1; once it is
    # upgraded (restarted without the fault), new batches are stored as v2.
    with Cluster(tmp_path, nodes=3, extra_toml='[faults]\nv1_only_node = "n2"\n') as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        c.create_topic("bf", queues=1)
        for i in range(3):
            r = c.produce(
                "bf",
                [
                    {"value": f"text {i}"},
                    {"value_b64": base64.b64encode(bytes([0, 255, i])).decode(), "key": f"k{i}"},
                    {"value": "é ✓", "key": "", "headers": {"h": str(i), "ü": "\n"}},
                    {"value": "expires later", "ttl_ms": 3_600_000},
                ],
            )
            assert r.status_code == 200, r.text
        wait_applied_everywhere(c, "bf")
        c.config_path.write_text(c.config_path.read_text().replace('v1_only_node = "n2"', ""))
        c.terminate("n2")
        c.start("n2")
        c.wait_ready()
        for i in range(20):  # until the leader knows every voter reads v2 again
            b = rb.BatchBuilder()
            b.append(f"bin {i}")
            b.append(b"\x00\x01", key="kk", headers={"a": "b"})
            post_binary(c, "bf", b.finish(), retry_503=True)
            time.sleep(0.1)
        wait_applied_everywhere(c, "bf")
        high = describe(c, "bf")["queues"][0]["high_offset"]
        leader = describe(c, "bf")["queues"][0]["leader"]
        others = [n for n in c.nodes if n != leader]

        from_leader = fetch_binary(c, "bf", 0, leader, offset=0, max=10_000)
        assert from_leader.headers["X-Raftmq-Next-Offset"] == str(high)
        assert from_leader.headers["X-Raftmq-High-Offset"] == str(high)
        assert from_leader.headers["X-Raftmq-Low-Offset"] == "0"
        int(from_leader.headers["X-Raftmq-Now-Ms"])
        forwarded = fetch_binary(c, "bf", 0, others[0], offset=0, max=10_000)
        assert forwarded.content == from_leader.content
        assert forwarded.headers["X-Raftmq-Next-Offset"] == str(high)
        for node in c.nodes:
            local = fetch_binary(c, "bf", 0, node, offset=0, max=10_000, read_from="local")
            assert local.content == from_leader.content, node
        got = views(from_leader)
        same_as_json(got, json_messages(c, "bf"))
        topic_id = describe(c, "bf")["id"]
        group = describe(c, "bf")["queues"][0]["group_id"]
        c.stop()

        # What each replica stored, read from its RocksDB: the answer is those values as frames,
        # v2 ones verbatim and v1 ones through v1_to_v2.
        for node in c.nodes:
            store = RocksStore.open(str(c.data_dir / node / "groups" / str(group) / "state"))
            try:
                stored = [value for _, _, value in raw_batches(store, topic_id, 0, 0, 1 << 30)]
            finally:
                store.close()
            assert {v[0] for v in stored} == {1, 2}, f"{node}: both versions stored"
            frames = rb.split_frames(from_leader.content)
            assert len(frames) == len(stored)
            for frame, value in zip(frames, stored, strict=True):
                if value[0] == rb.MAGIC:
                    assert bytes(frame.batch) == value  # sent verbatim
                else:
                    assert bytes(frame.batch) == rb.v1_to_v2(value) == as_v2(value)
                    assert [r[:6] for r in rb.read(frame.batch).records()] == [
                        (r.offset, r.timestamp_ms, r.key, r.value, r.binary, r.headers)
                        for r in rb.read_v1(value).records
                    ]


def test_whole_batches_from_the_one_holding_the_offset_within_max_and_max_bytes(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bf-range", queues=1)
    for i in range(3):  # batches [0, 10), [10, 20), [20, 30)
        r = c.produce("bf-range", [{"value": f"m{i * 10 + j}"} for j in range(10)])
        assert r.status_code == 200, r.text

    def spans(r: requests.Response) -> list[tuple[int, int]]:
        return [(v.base_offset, v.end_offset) for v in views(r)]

    r = fetch_binary(c, "bf-range", 0, offset=15, max=1)
    assert spans(r) == [(10, 20)]  # begins below the offset; the first batch always comes whole
    assert r.headers["X-Raftmq-Next-Offset"] == "20"
    assert [x.value for x in views(r)[0].records(from_offset=15)] == [f"m{i}".encode() for i in range(15, 20)]
    assert spans(fetch_binary(c, "bf-range", 0, offset=15, max=14)) == [(10, 20)]  # 5 + 10 > 14
    assert spans(fetch_binary(c, "bf-range", 0, offset=15, max=15)) == [(10, 20), (20, 30)]
    assert spans(fetch_binary(c, "bf-range", 0, offset=0)) == [(0, 10), (10, 20), (20, 30)]
    assert spans(fetch_binary(c, "bf-range", 0, offset=0, max_bytes=1)) == [(0, 10)]
    end = fetch_binary(c, "bf-range", 0, offset=30)
    assert end.content == b"" and views(end) == []
    assert end.headers["X-Raftmq-Next-Offset"] == "30" and end.headers["X-Raftmq-High-Offset"] == "30"


def test_bad_requests_get_the_json_fetchs_errors(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bf-bad", queues=2)
    assert c.produce("bf-bad", [{"value": "x"}]).status_code == 200
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("bf-bad/queues/0", {"offset": -1}, 400, "bad_request"),
        ("bf-bad/queues/0", {"offset": "x"}, 400, "bad_request"),
        ("bf-bad/queues/0", {"offset": 0, "max": 0}, 400, "bad_request"),
        ("bf-bad/queues/0", {"offset": 0, "max_bytes": 0}, 400, "bad_request"),
        ("bf-bad/queues/0", {"offset": 0, "what": 1}, 400, "bad_request"),
        ("bf-bad/queues/0", {"offset": 0, "read_from": "any"}, 400, "bad_request"),
        ("bf-bad/queues/0", {}, 400, "bad_request"),
        ("bf-bad/queues/9", {"offset": 0}, 404, "queue_not_found"),
        ("no-such-topic/queues/0", {"offset": 0}, 404, "topic_not_found"),
    ]
    for path, params, status, code in cases:
        url = f"{c.url()}/v1/topics/{path}/messages"
        binary = requests.get(url, params=params, headers=ACCEPT, timeout=30)
        plain = requests.get(url, params=params, timeout=30)
        assert assert_error(binary, status, code) == assert_error(plain, status, code), (path, params)
    high = describe(c, "bf-bad")["queues"][0]["high_offset"]
    e = assert_error(fetch_binary(c, "bf-bad", 0, offset=high + 1), 416, "offset_out_of_range")
    assert (e["low_offset"], e["high_offset"]) == (0, high)
    # An Accept without the batch type is the JSON answer, as before.
    url = f"{c.url()}/v1/topics/bf-bad/queues/0/messages"
    other = requests.get(url, params={"offset": 0}, headers={"Accept": "text/html"}, timeout=30)
    assert other.headers["Content-Type"].startswith("application/json")
    assert other.json()["messages"] == requests.get(url, params={"offset": 0}, timeout=30).json()["messages"]


def test_a_consumer_leaves_out_ttl_expired_messages_as_the_json_fetch_does(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bf-ttl", queues=1)
    r = c.produce(
        "bf-ttl", [{"value": "short", "ttl_ms": 1}, {"value": "kept"}, {"value": "short2", "ttl_ms": 1}]
    )
    assert r.status_code == 200, r.text
    b = rb.BatchBuilder()
    b.append("v2 short", ttl_ms=1)
    b.append("v2 kept", ttl_ms=3_600_000)
    post_binary(c, "bf-ttl", b.finish())
    time.sleep(0.05)
    kept = [m["value"] for m in json_messages(c, "bf-ttl")]
    assert kept == ["kept", "v2 kept"]
    for wire in ("binary", "json"):
        got: list[Message] = []
        urls = [n.url for n in c.nodes.values()]
        with Consumer(urls, group=f"ttl-{wire}", topics="bf-ttl", wire=wire, wait_ms=100) as consumer:
            deadline = time.monotonic() + 30
            while len(got) < 2 and time.monotonic() < deadline:
                got += consumer.poll(timeout_ms=200)
            for m in got:
                m.ack()
            consumer.commit()
            assert [m.value for m in got] == kept, wire
            assert consumer.poll(timeout_ms=300) == []
        # The expired offsets count as finished: the group commits past them. (Before, the JSON
        # path took the 2 messages for offsets 1 and 2, fetched offset 4 again and delivered it twice.)
        committed = c.get(f"/v1/groups/ttl-{wire}/offsets", params={"topic": "bf-ttl"})
        assert committed.json()["offsets"]["0"] == 5, wire


def test_a_group_of_three_consumers_reads_everything_once_across_a_rebalance(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bf-group", queues=6)
    urls = [n.url for n in c.nodes.values()]
    values = [f"v{i}" for i in range(3_000)]
    got: list[list[Message]] = [[], [], []]
    stop = threading.Event()

    def read(i: int, consumer: Consumer) -> None:
        while not stop.is_set():
            for m in consumer.poll(timeout_ms=100):
                assert isinstance(m.value, str) and m.timestamp_ms > 0
                got[i].append(m)
                m.ack()

    consumers = [Consumer(urls, group="bf-g", topics="bf-group", wait_ms=200, max_batch=100)]
    threads = [threading.Thread(target=read, args=(0, consumers[0]), daemon=True)]
    threads[0].start()
    try:
        wait_until(lambda: len(consumers[0].assignment()) == 6, 30, what="the first member owns every queue")
        for n in range(0, 3_000, 100):
            batch = [{"value": v, "queue": i % 6} for i, v in enumerate(values[n : n + 100])]
            assert c.produce("bf-group", batch).status_code == 200  # a batch of ~17 per queue
            if n == 1_000:  # two more members join mid-stream: the queues are rebalanced
                for i in (1, 2):
                    consumers.append(
                        Consumer(urls, group="bf-g", topics="bf-group", wait_ms=200, max_batch=100)
                    )
                    threads.append(threading.Thread(target=read, args=(i, consumers[i]), daemon=True))
                    threads[i].start()
        wait_until(
            lambda: sorted(len(x.assignment()) for x in consumers) == [2, 2, 2],
            30,
            what="3 members, 2 queues each",
        )
        wait_until(lambda: sum(len(g) for g in got) >= len(values), 60, what="every message consumed")
        time.sleep(0.5)
        assert all(x._core.fetcher.binary for x in consumers)  # the binary path all along
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for x in consumers:
            x.close()
    seen = Counter(str(m.value) for g in got for m in g)
    assert set(seen) == set(values)
    assert all(n == 1 for n in seen.values()), {v: n for v, n in seen.items() if n > 1}
    assert all(got), "every member consumed"


ADMIN = "admin-token-Bf3Kq8Lm2Xz7Wc4Rt"
READER = "reader-token-Pv6Hs1Ny9Gd5Ej0Ua"  # consume on "bf-auth" only
TOKENS = f"""
[security]
[[security.tokens]]
name = "admin"
token = "{ADMIN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "reader"
token = "{READER}"
consume = ["bf-auth"]
"""


def test_tokens_guard_the_binary_answer_as_the_json_one(tmp_path: Path) -> None:
    with Cluster(tmp_path, extra_toml=TOKENS) as c:
        c.session.headers["Authorization"] = f"Bearer {ADMIN}"
        c.start()
        c.wait_ready()
        c.wait_balanced()
        for topic in ("bf-auth", "bf-other"):
            c.create_topic(topic, queues=1)
            assert c.produce(topic, [{"value": f"{topic} {i}"} for i in range(5)]).status_code == 200
        leader = describe(c, "bf-auth")["queues"][0]["leader"]
        other = next(n for n in c.nodes if n != leader)

        def get(node: str, topic: str, token: str | None, binary: bool) -> requests.Response:
            headers = {
                **(ACCEPT if binary else {}),
                **({"Authorization": f"Bearer {token}"} if token else {}),
            }
            url = f"{c.url(node)}/v1/topics/{topic}/queues/0/messages"
            return requests.get(url, params={"offset": 0}, headers=headers, timeout=30)

        for node in (leader, other):  # the other node forwards with the peer key
            for topic, token, status, code in (
                ("bf-auth", None, 401, "unauthorized"),
                ("bf-auth", "wrong-token-Xy1Zz2Ww3Vv4Uu5", 401, "unauthorized"),
                ("bf-other", READER, 403, "forbidden"),
            ):
                assert assert_error(get(node, topic, token, True), status, code) == assert_error(
                    get(node, topic, token, False), status, code
                )
            got = views(get(node, "bf-auth", READER, True))
            assert [r.value for v in got for r in v.records()] == [f"bf-auth {i}".encode() for i in range(5)]
        urls = [n.url for n in c.nodes.values()]
        with Consumer(urls, group="bf-a", topics="bf-auth", token=READER, wait_ms=100) as consumer:
            seen: list[Message] = []
            deadline = time.monotonic() + 30
            while len(seen) < 5 and time.monotonic() < deadline:
                seen += consumer.poll(timeout_ms=200)
            assert [m.value for m in seen] == [f"bf-auth {i}" for i in range(5)]
            assert consumer._core.fetcher.binary
