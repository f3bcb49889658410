"""Binary produce (``Content-Type: application/vnd.raftmq.batch``, docs/format.md) against real nodes:
what is stored reads back as produced, JSON and binary produce leave byte-identical replicas, a
retried batch is stored once, delays and TTLs keep their meaning, and malformed input is a 4xx that
changes nothing and leaves the node alive."""

from __future__ import annotations

import contextlib
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq import batch as rb
from raftmq.storage import keys
from raftmq.storage.rocks import RocksStore

from .conftest import assert_error, describe, high_offsets, wait_applied_everywhere
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

HEADERS = {"Content-Type": rb.BATCH_MEDIA_TYPE}


def post_batches(
    c: Cluster, topic: str, frames: list[tuple[int | None, bytes]], node: str | None = None
) -> requests.Response:
    body = rb.join_frames([(q, None, b) for q, b in frames])
    return requests.post(f"{c.url(node)}/v1/topics/{topic}/messages", data=body, headers=HEADERS, timeout=30)


def sample_batch(producer_id: str | None = None, sequence: int = 0) -> bytes:
    b = rb.BatchBuilder(producer_id, sequence)
    b.append("plain")
    b.append(b"\x00\xffbinary", key="k-1")
    b.append("é text ✓", key="", headers={"trace": "a1", "ü": "\n"})
    b.append("expires later", ttl_ms=3_600_000)
    return b.finish()


def expected_json(offset: int) -> list[dict[str, Any]]:
    return [
        {"offset": offset, "value": "plain", "key": None},
        {"offset": offset + 1, "value_b64": "AP9iaW5hcnk=", "key": "k-1"},
        {"offset": offset + 2, "value": "é text ✓", "key": "", "headers": {"trace": "a1", "ü": "\n"}},
        {"offset": offset + 3, "value": "expires later", "key": None},
    ]


def leader_of_queue(c: Cluster, topic: str, queue: int) -> str:
    q = describe(c, topic)["queues"][queue]
    assert q["leader"], q
    return str(q["leader"])


def same_fields(got: dict[str, Any], want: dict[str, Any]) -> None:
    for field, value in want.items():
        assert got.get(field) == value, (field, got, want)
    assert (got.get("headers") or {}) == (want.get("headers") or {}), (got, want)


def test_a_binary_batch_reads_back_as_produced_from_leader_and_non_leader(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-rt", queues=2)
    leader = leader_of_queue(c, "bin-rt", 0)
    other = next(n for n in c.nodes if n != leader)
    r1 = post_batches(c, "bin-rt", [(0, sample_batch())], node=leader)
    assert r1.status_code == 200, r1.text
    assert r1.json() == {"results": [{"queue": 0, "base_offset": 0, "count": 4}]}
    r2 = post_batches(c, "bin-rt", [(0, sample_batch())], node=other)  # forwarded to the leader
    assert r2.status_code == 200, r2.text
    assert r2.json() == {"results": [{"queue": 0, "base_offset": 4, "count": 4}]}
    got = c.fetch_all("bin-rt", 0)
    want = expected_json(0) + expected_json(4)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        same_fields(g, w)


def test_json_and_binary_produce_leave_replicas_byte_identical(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-mixed", queues=3)
    for round_ in range(3):
        r = c.produce("bin-mixed", [{"value": f"json {round_} {i}", "key": f"k{i}"} for i in range(20)])
        assert r.status_code == 200, r.text
        frames = [(q, sample_batch()) for q in range(3)] + [(None, sample_batch())]
        r = post_batches(c, "bin-mixed", frames)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["count"] for x in results] == [4, 4, 4, 4]
        assert all(x["queue"] in range(3) for x in results)
    wait_applied_everywhere(c, "bin-mixed")  # the same store digest on every replica
    assert sum(high_offsets(c, "bin-mixed")) == 3 * (20 + 16)


def test_a_retried_binary_batch_is_stored_once(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-idem", queues=1)
    first = post_batches(c, "bin-idem", [(0, sample_batch("p-1", 7))])
    assert first.status_code == 200, first.text
    again = post_batches(c, "bin-idem", [(0, sample_batch("p-1", 7))])
    assert again.status_code == 200, again.text
    assert again.json()["results"] == [{"queue": 0, "base_offset": 0, "count": 4, "duplicate": True}]
    nxt = post_batches(c, "bin-idem", [(0, sample_batch("p-1", 8))])
    assert nxt.json()["results"] == [{"queue": 0, "base_offset": 4, "count": 4}]
    assert high_offsets(c, "bin-idem") == [8]


def test_delayed_records_of_a_binary_batch_come_later_and_the_others_at_once(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-delay", queues=1)
    b = rb.BatchBuilder()
    b.append("now-0")
    b.append("later", delay_ms=1_500, ttl_ms=3_600_000)
    b.append("now-1", ttl_ms=1)  # expired by the time it is fetched
    b.append("now-2")
    r = post_batches(c, "bin-delay", [(0, b.finish())])
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{"queue": 0, "base_offset": 0, "count": 3, "delayed": 1}]
    wait_until(lambda: high_offsets(c, "bin-delay") == [4], 20, what="the delayed record appended")
    values = [m.get("value") for m in c.fetch_all("bin-delay", 0)]
    assert values == ["now-0", "now-2", "later"]  # now-1's TTL passed: skipped by fetch


def test_malformed_binary_input_is_a_4xx_that_changes_nothing(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-bad", queues=2)
    good = sample_batch()
    flipped = bytearray(good)
    flipped[-3] ^= 0x40
    r = post_batches(c, "bin-bad", [(0, good), (1, bytes(flipped))])
    e = assert_error(r, 400, "bad_batch")
    assert (e["reason"], e["batch"]) == ("crc_mismatch", 1)
    assert_error(post_batches(c, "bin-bad", [(5, good)]), 404, "queue_not_found")
    body = rb.join_frames([(0, "another-topic", good)])
    r = requests.post(f"{c.url()}/v1/topics/bin-bad/messages", data=body, headers=HEADERS, timeout=10)
    assert_error(r, 400, "bad_request")
    r = requests.post(f"{c.url()}/v1/topics/bin-bad/messages", data=b"", headers=HEADERS, timeout=10)
    assert_error(r, 400, "bad_batch")
    too_long = rb.BatchBuilder()
    too_long.append("x" * 2_000_000)
    e = assert_error(post_batches(c, "bin-bad", [(0, too_long.finish())]), 400, "bad_batch")
    assert e["reason"] == "message_too_large" and e["record"] == 0
    assert high_offsets(c, "bin-bad") == [0, 0]


def test_fuzzed_batches_against_a_live_node_are_refused_and_apply_nothing(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("bin-fuzz", queues=1)
    rng = random.Random(14)
    base = rb.join_frames([(0, None, sample_batch("p-f", 1)), (0, None, sample_batch())])
    statuses: dict[int, int] = {}
    for _ in range(300):
        body = bytearray(base)
        kind = rng.randrange(3)
        if kind == 0:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut short
            body = body[: rng.randrange(len(body))]
        else:  # random bytes spliced in
            at = rng.randrange(len(body))
            body[at:at] = rng.randbytes(rng.randint(1, 16))
        if bytes(body) == base:
            continue
        r = requests.post(
            f"{c.url()}/v1/topics/bin-fuzz/messages", data=bytes(body), headers=HEADERS, timeout=10
        )
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert high_offsets(c, "bin-fuzz") == [0]
    assert all(c.alive(n) for n in c.nodes)
    assert statuses  # the loop sent requests


def test_a_group_with_a_v1_only_voter_gets_json_commands_and_v1_values(tmp_path: Path) -> None:
    """Rolling upgrade: while a voter advertises format 1 only, leaders propose the JSON command
    (stored values are v1 on every replica); the client's binary request still succeeds."""
    with Cluster(tmp_path, nodes=3, extra_toml='[faults]\nv1_only_node = "n2"\n') as c:
        c.start()
        c.wait_ready()
        c.create_topic("bin-upgrade", queues=1)
        r = post_batches(c, "bin-upgrade", [(0, sample_batch("p-u", 1))])
        assert r.status_code == 200, r.text
        r = post_batches(c, "bin-upgrade", [(0, sample_batch("p-u", 1))])
        assert r.json()["results"][0].get("duplicate") is True
        got = c.fetch_all("bin-upgrade", 0)
        for g, w in zip(got, expected_json(0), strict=True):
            same_fields(g, w)
        wait_applied_everywhere(c, "bin-upgrade")
        group = describe(c, "bin-upgrade")["queues"][0]["group_id"]
        topic_id = describe(c, "bin-upgrade")["id"]
        # Forwarded to the "old" node as leader: it refuses the binary append (invalid_json, as
        # the version before did), and the forwarding node sends the JSON command's batches.
        c.wait_balanced()
        c.create_topic("bin-old-leader", queues=3)
        queues = describe(c, "bin-old-leader")["queues"]
        on_old = next(q["queue"] for q in queues if q["leader"] == "n2")
        for n in ("n1", "n3"):
            r = post_batches(c, "bin-old-leader", [(on_old, sample_batch())], node=n)
            assert r.status_code == 200, r.text
        assert high_offsets(c, "bin-old-leader")[on_old] == 8
        c.stop()
        for n in c.nodes:
            assert stored_versions(c, n, group, topic_id) == [1], n


def stored_versions(c: Cluster, node: str, group: int, topic_id: int) -> list[int]:
    store = RocksStore.open(str(c.data_dir / node / "groups" / str(group) / "state"))
    try:
        start, end = keys.queue_range(keys.RECORD, topic_id, 0)
        return [value[0] for _, value in store.scan(start, end)]
    finally:
        store.close()


def test_a_group_of_current_voters_stores_binary_batches_verbatim(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.create_topic("bin-v2", queues=1)
        sent = sample_batch("p-v", 3)
        for _ in range(20):  # the first ones may go as JSON until the peers' formats are known
            assert post_batches(c, "bin-v2", [(0, sent)]).status_code == 200
            sent = sample_batch("p-v", rb.read(sent).base_sequence + 1)
        wait_applied_everywhere(c, "bin-v2")
        group = describe(c, "bin-v2")["queues"][0]["group_id"]
        topic_id = describe(c, "bin-v2")["id"]
        c.stop()
        per_node = {n: stored_versions(c, n, group, topic_id) for n in c.nodes}
        assert all(v == per_node["n1"] for v in per_node.values()), per_node
        assert per_node["n1"][-1] == 2, per_node


def retry_until_stored(c: Cluster, topic: str, batch: bytes, nodes: list[str]) -> dict[str, Any]:
    """Send ``batch`` to ``nodes`` in turn until one answers 200 (what an idempotent producer
    does across a failover); returns the answer's result."""

    def attempt() -> dict[str, Any] | None:
        for n in nodes:
            try:
                r = post_batches(c, topic, [(0, batch)], node=n)
            except requests.RequestException:
                continue
            if r.status_code == 200:
                result: dict[str, Any] = r.json()["results"][0]
                return result
            assert r.json()["error"]["retriable"], r.text  # only a passing condition may fail it
        return None

    return dict(wait_until(attempt, 60, interval_s=0.2, what="the batch stored"))


def test_an_idempotent_binary_batch_retried_across_a_leader_failover_is_stored_once(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.create_topic("bin-failover", queues=1)
        first = sample_batch("p-fo", 1)
        assert post_batches(c, "bin-failover", [(0, first)]).status_code == 200
        # 1: the answer arrived, then the leader died; the retry at the new leader is a duplicate.
        leader = leader_of_queue(c, "bin-failover", 0)
        c.kill(leader)
        others = [n for n in c.nodes if n != leader]
        again = retry_until_stored(c, "bin-failover", first, others)
        assert again == {"queue": 0, "base_offset": 0, "count": 4, "duplicate": True}
        c.start(leader)
        c.wait_ready()
        # 2: the leader dies while the request is in flight (its outcome unknown to the client),
        # and the client retries the same bytes until some node stores or remembers them.
        second = sample_batch("p-fo", 2)
        leader = leader_of_queue(c, "bin-failover", 0)
        body = rb.join_frames([(0, None, second)])
        url = f"{c.url(leader)}/v1/topics/bin-failover/messages"
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(requests.post, url, data=body, headers=HEADERS, timeout=30)
            c.kill(leader)
            with contextlib.suppress(requests.RequestException):
                pending.result()
        result = retry_until_stored(c, "bin-failover", second, [n for n in c.nodes if n != leader])
        assert (result["base_offset"], result["count"]) == (4, 4)
        got = c.fetch_all("bin-failover", 0, node=next(n for n in c.nodes if n != leader))
        assert [m["offset"] for m in got] == list(range(8))  # each batch once, no gap
        for g, w in zip(got, expected_json(0) + expected_json(4), strict=True):
            same_fields(g, w)
