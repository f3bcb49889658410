"""Batch reads through the ``raftmq`` data source on a live 3-node cluster (Spark local[2])."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Cluster, wait_until

from .conftest import require_spark

require_spark()

pytestmark = pytest.mark.timeout(300)

TOML = """
[raft]
retention_check_ms = 300
leader_fallback_ms = 600000
[limits]
request_timeout_ms = 2000
[segments]
max_messages = 50
check_ms = 200
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # One queue group on three nodes; its leader never steps down (the uncommitted-tail test cuts
    # it off from its followers and still reads from it).
    tmp: Path = tmp_path_factory.mktemp("spark-batch")
    with Cluster(tmp, nodes=3, queue_groups=1, extra_toml=TOML) as cluster:
        cluster.start()
        cluster.wait_ready()
        yield cluster


def brokers(c: Cluster) -> str:
    return ",".join(c.url(n) for n in c.nodes if c.alive(n))


def read(spark: Any, c: Cluster, topic: str, **options: Any) -> Any:
    r = spark.read.format("raftmq").option("brokers", brokers(c)).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def manifest(c: Cluster, topic: str) -> dict[str, Any]:
    body: dict[str, Any] = c.get(f"/v1/topics/{topic}/segments").json()
    return body


def log_rows(c: Cluster, topic: str, queues: int) -> list[tuple[int, int, bytes | None, bytes]]:
    out = []
    for q in range(queues):
        for m in c.fetch_all(topic, q):
            key = None if m["key"] is None else m["key"].encode()
            out.append((q, m["offset"], key, m["value"].encode()))
    return sorted(out)


def test_batch_read_returns_every_committed_message_once_from_segments_and_the_tail(
    spark: Any, c: Cluster
) -> None:
    c.create_topic("sp-batch", queues=3)
    for i in range(4):
        msgs = [{"value": f"v{i}-{j}", "key": f"k{j % 7}", "queue": j % 3} for j in range(111)]
        msgs[0]["headers"] = {"trace": f"t{i}"}
        assert c.produce("sp-batch", msgs).status_code == 200
    # 148 per queue: segments [0,50) [50,100), the tail [100,148) stays unsealed.
    wait_until(
        lambda: all(q["sealed_end"] == 100 for q in manifest(c, "sp-batch")["queues"]), 30, what="sealed"
    )
    expected = log_rows(c, "sp-batch", 3)
    assert len(expected) == 444
    df = read(spark, c, "sp-batch", minPartitions=5)
    assert df.rdd.getNumPartitions() >= 5
    rows = sorted((r.partition, r.offset, r.key, r.value) for r in df.collect())
    assert rows == expected  # each committed message exactly once, with its offset
    first = df.filter("partition = 0 and offset = 0").collect()[0]
    assert (first.topic, first.timestampType) == ("sp-batch", 1)
    # Headers, and a range given as JSON offsets (endingOffsets is exclusive).
    h = read(
        spark,
        c,
        "sp-batch",
        includeHeaders="true",
        startingOffsets='{"sp-batch": {"0": 40, "1": -2}}',
        endingOffsets='{"sp-batch": {"0": 120, "1": 3, "2": -1}}',
    )
    got = sorted((r.partition, r.offset) for r in h.collect())
    assert got == sorted(
        [(0, o) for o in range(40, 120)] + [(1, o) for o in range(3)] + [(2, o) for o in range(148)]
    )
    with_headers = {(r.partition, r.offset): r.headers for r in h.filter("headers is not null").collect()}
    assert with_headers[(0, 111)] and with_headers[(0, 111)][0].key == "trace"
    # startingTimestamp: from the first message at or after a message's own timestamp.
    ts = df.filter("partition = 1 and offset = 75").collect()[0].timestamp
    ts_ms = int(ts.timestamp() * 1000)
    later = read(spark, c, "sp-batch", startingTimestamp=ts_ms).filter("partition = 1").collect()
    assert min(r.offset for r in later) <= 75 and all(
        int(r.timestamp.timestamp() * 1000) >= ts_ms for r in later
    )
    # Plain spark.read.parquet over the manifest's files gives the sealed rows with the same schema.
    paths = [s["parquet_path"] for q in manifest(c, "sp-batch")["queues"] for s in q["segments"]]
    plain = spark.read.parquet(*paths)
    assert sorted((r.partition, r.offset, r.key, r.value) for r in plain.collect()) == [
        r for r in expected if r[1] < 100
    ]


def test_retention_below_starting_offsets_fails_clearly_unless_data_loss_is_accepted(
    spark: Any, c: Cluster
) -> None:
    c.create_topic("sp-lost", queues=1, retention_bytes=3000)
    for _ in range(5):
        assert c.produce("sp-lost", [{"value": "x" * 100} for _ in range(10)]).status_code == 200
    low = wait_until(lambda: manifest(c, "sp-lost")["queues"][0]["low_offset"], 30, what="retention")
    df = read(spark, c, "sp-lost", startingOffsets='{"sp-lost": {"0": 0}}')
    with pytest.raises(Exception, match="no longer retained") as e:
        df.collect()
    assert "failOnDataLoss" in str(e.value)
    lenient = read(spark, c, "sp-lost", startingOffsets='{"sp-lost": {"0": 0}}', failOnDataLoss="false")
    offsets = sorted(r.offset for r in lenient.collect())
    assert offsets[0] >= low and offsets[-1] == 49


def test_replay_jobs_copy_count_and_republish(spark: Any, c: Cluster, tmp_path: Path) -> None:
    from raftmq.spark import replay

    c.create_topic("sp-src", queues=2)
    c.create_topic("sp-dst", queues=2)
    msgs = [{"value": f"v{i}", "key": f"k{i % 3}", "headers": {"n": str(i)}} for i in range(90)]
    assert c.produce("sp-src", msgs).status_code == 200
    common = ["--brokers", brokers(c), "--topic", "sp-src"]
    p = replay._parser()
    assert replay.copy(spark, p.parse_args(["copy", *common, "--out", str(tmp_path / "copy")])) == 0
    assert spark.read.parquet(str(tmp_path / "copy")).count() == 90
    assert replay.count(spark, p.parse_args(["count", *common, "--out", str(tmp_path / "count")])) == 0
    counted = {r.key: r["count"] for r in spark.read.parquet(str(tmp_path / "count")).collect()}
    assert sum(counted.values()) == 90 and set(counted) == {"k0", "k1", "k2"}
    args = p.parse_args(["republish", *common, "--to", "sp-dst", "--keep-queue", "--chunk", "40"])
    assert replay.republish(spark, args) == 0
    assert replay.republish(spark, args) == 0  # a rerun is deduplicated (producer ids + sequences)
    dst = [(q, m) for q in range(2) for m in c.fetch_all("sp-dst", q)]
    src = [(q, m) for q in range(2) for m in c.fetch_all("sp-src", q)]
    got = sorted((q, m["key"], base64.b64decode(m["value_b64"]), m["headers"]["n"]) for q, m in dst)
    want = sorted((q, m["key"], m["value"].encode(), m["headers"]["n"]) for q, m in src)
    assert got == want


def test_an_uncommitted_tail_never_shows(spark: Any, c: Cluster) -> None:
    """Last in the module: it cuts the leader off from both followers."""
    c.create_topic("sp-tail", queues=1)
    assert c.produce("sp-tail", [{"value": f"c{i}"} for i in range(60)]).status_code == 200
    leader = c.wait_leader("0")
    followers = [n for n in c.nodes if n != leader]
    for n in followers:
        c.kill(n)
    r = c.produce("sp-tail", [{"value": f"u{i}"} for i in range(25)], node=leader)
    assert r.status_code == 504, r.text  # appended to the leader's log, never committed
    rows = read(spark, c, "sp-tail").collect()
    assert sorted(r.offset for r in rows) == list(range(60))
    assert all(r.value.startswith(b"c") for r in rows)
    for n in followers:
        c.start(n)
    # Two restarts (RocksDB and Raft replay) and the followers catching up on a slow machine.
    wait_until(lambda: manifest(c, "sp-tail")["queues"][0]["high_offset"] == 85, 90, what="tail committed")
    assert sorted(r.offset for r in read(spark, c, "sp-tail").collect()) == list(range(85))
