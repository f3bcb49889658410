"""Segment sealing, the manifest, segment bytes and the Arrow fetch on a live 3-node cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from crc32c import crc32c

from raftmq.storage.columns import SCHEMA

from .conftest import assert_error
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(180)

ARROW = "application/vnd.apache.arrow.stream"
SEGMENTS_TOML = """
[raft]
retention_check_ms = 300
[segments]
max_messages = 50
check_ms = 200
gc_interval_ms = 300
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("segments")
    with Cluster(tmp, nodes=3, extra_toml=SEGMENTS_TOML) as cluster:
        cluster.start()
        cluster.wait_ready()
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), cluster.log(nid)[-3000:]


def manifest(c: Cluster, topic: str, node: str | None = None) -> dict[str, Any]:
    r = c.get(f"/v1/topics/{topic}/segments", node)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def arrow_fetch(
    c: Cluster, topic: str, queue: int, offset: int, node: str | None = None, **params: Any
) -> Any:
    r = c.get(
        f"/v1/topics/{topic}/queues/{queue}/messages",
        node,
        params={"offset": offset, **params},
        headers={"Accept": ARROW},
    )
    return r


def test_sealing_manifest_files_and_arrow_fetch_agree_with_the_log(c: Cluster) -> None:
    c.create_topic("seg", queues=2)
    for i in range(3):
        batch = [{"value": f"v{i}-{j}", "queue": j % 2, "key": f"k{j % 3}"} for j in range(100)]
        batch[0]["headers"] = {"h": "x"}
        assert c.produce("seg", batch).status_code == 200
    # 150 messages per queue: three segments of 50 each, sealed by count.
    m = wait_until(
        lambda: (m := manifest(c, "seg")) and all(q["sealed_end"] == 150 for q in m["queues"]) and m,
        30,
        what="segments sealed",
    )
    for q in m["queues"]:
        assert [(s["base"], s["end"]) for s in q["segments"]] == [(0, 50), (50, 100), (100, 150)]
        assert q["high_offset"] == 150 and q["low_offset"] == 0
        json_msgs = c.fetch_all("seg", q["queue"])
        rows: list[dict[str, Any]] = []
        for s in q["segments"]:
            assert s["rows"] == 50
            data = Path(s["arrow_path"]).read_bytes()
            assert crc32c(data) == s["crc32c"]
            table = ipc.open_file(pa.py_buffer(data)).read_all()
            assert table.schema == SCHEMA
            rows += table.to_pylist()
            # Any node serves the same bytes (the writer's file, proxied if need be).
            for nid in c.nodes:
                r = c.get(f"/v1/topics/seg/segments/{q['queue']}/{s['base']}", nid)
                assert r.status_code == 200 and r.content == data
                assert r.headers["X-Raftmq-Crc32c"] == str(s["crc32c"])
            parquet = pq.read_table(s["parquet_path"])
            assert parquet.to_pylist() == table.to_pylist()
            assert not [n for n in os.listdir(os.path.dirname(s["arrow_path"])) if n.endswith(".tmp")]
        assert [r["offset"] for r in rows] == list(range(150))
        assert [r["value"].decode() for r in rows] == [m["value"] for m in json_msgs]
        assert [r["key"].decode() for r in rows] == [m["key"] for m in json_msgs]
        assert {r["partition"] for r in rows} == {q["queue"]} and {r["topic"] for r in rows} == {"seg"}
        assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [
            m["timestamp_ms"] for m in json_msgs
        ]
        assert [dict((h["key"], h["value"].decode()) for h in r["headers"] or []) for r in rows] == [
            m["headers"] for m in json_msgs
        ]
        # The Arrow fetch returns the same rows from any node, from any offset.
        for nid in c.nodes:
            r = arrow_fetch(c, "seg", q["queue"], 37, nid, max=1000)
            assert r.status_code == 200 and r.headers["Content-Type"].startswith(ARROW)
            got = ipc.open_stream(r.content).read_all()
            assert got.schema == SCHEMA
            assert got.to_pylist() == rows[37:]
            assert (r.headers["X-Raftmq-Next-Offset"], r.headers["X-Raftmq-High-Offset"]) == ("150", "150")
    # Every replica recorded the same segments.
    for g in sorted({q["group_id"] for q in m["queues"]}):
        c.wait_replicas_equal(str(g))


def test_arrow_fetch_limits_long_poll_and_errors(c: Cluster) -> None:
    c.create_topic("seg-fetch", queues=1)
    assert c.produce("seg-fetch", [{"value": "x" * 1000} for _ in range(10)]).status_code == 200
    r = arrow_fetch(c, "seg-fetch", 0, 0, max=3)
    assert ipc.open_stream(r.content).read_all().num_rows == 3 and r.headers["X-Raftmq-Next-Offset"] == "3"
    r = arrow_fetch(c, "seg-fetch", 0, 2, max_bytes=2500)
    assert ipc.open_stream(r.content).read_all().column("offset").to_pylist() == [2, 3]
    r = arrow_fetch(c, "seg-fetch", 0, 10, wait_ms=200)  # at the end: an empty stream after the wait
    assert r.status_code == 200 and ipc.open_stream(r.content).read_all().num_rows == 0
    assert_error(arrow_fetch(c, "seg-fetch", 0, 11), 416, "offset_out_of_range")
    assert_error(arrow_fetch(c, "seg-fetch", 0, 0, max=65_537), 400, "bad_request")
    assert_error(arrow_fetch(c, "seg-fetch", 1, 0), 404, "queue_not_found")
    assert_error(c.get("/v1/topics/seg-fetch/segments/0/0"), 404, "not_found")
    assert_error(c.get("/v1/topics/seg-fetch/segments/0/x"), 400, "bad_request")
    assert_error(c.get("/v1/topics/nope/segments"), 404, "topic_not_found")


def test_retention_and_drop_remove_sealed_files(c: Cluster) -> None:
    c.create_topic("seg-ret", queues=1, retention_bytes=20_000)
    c.create_topic("seg-drop", queues=1)
    for _ in range(4):
        assert c.produce("seg-ret", [{"value": "r" * 100} for _ in range(50)]).status_code == 200
        assert c.produce("seg-drop", [{"value": "d" * 100} for _ in range(50)]).status_code == 200
    first = wait_until(
        lambda: (m := manifest(c, "seg-drop"))["queues"][0]["sealed_end"] == 200 and m, 30, what="sealed"
    )
    paths = [s["arrow_path"] for s in first["queues"][0]["segments"]]
    assert all(os.path.exists(p) for p in paths)
    # Retention keeps ~20 kB: the oldest segments disappear from the manifest and from disk.
    m = wait_until(
        lambda: (m := manifest(c, "seg-ret"))["queues"][0]["low_offset"] > 0 and m, 30, what="retention"
    )
    low = m["queues"][0]["low_offset"]
    assert all(s["end"] > low for s in m["queues"][0]["segments"])
    ret_dir = (
        os.path.dirname(m["queues"][0]["segments"][-1]["arrow_path"]) if m["queues"][0]["segments"] else None
    )

    def old_files_gone() -> bool:
        if ret_dir is None:
            return True
        ends = [int(n.split("-")[2].split(".")[0]) for n in os.listdir(ret_dir) if not n.startswith(".")]
        return all(e > low for e in ends)

    wait_until(old_files_gone, 30, what="files below low_offset deleted")
    # Dropping a topic deletes its files.
    assert c.session.delete(c.url() + "/v1/topics/seg-drop").status_code == 200
    wait_until(lambda: not any(os.path.exists(p) for p in paths), 30, what="dropped topic's files deleted")


def test_leader_change_keeps_segments_contiguous(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3, queue_groups=1, extra_toml=SEGMENTS_TOML) as c:
        c.start()
        c.wait_ready()
        c.create_topic("seg-fail", queues=1)
        assert c.produce("seg-fail", [{"value": str(i)} for i in range(120)]).status_code == 200
        wait_until(lambda: manifest(c, "seg-fail")["queues"][0]["sealed_end"] == 100, 30, what="sealed")
        leader = c.wait_leader("0")
        c.kill(leader)
        c.wait_leader("0", exclude=leader)
        survivor = next(n for n in c.nodes if n != leader)
        assert (
            c.produce("seg-fail", [{"value": str(i)} for i in range(120, 200)], node=survivor).status_code
            == 200
        )
        m = wait_until(
            lambda: (m := manifest(c, "seg-fail", survivor))["queues"][0]["sealed_end"] == 200 and m,
            30,
            what="sealed by the new leader",
        )
        segs = m["queues"][0]["segments"]
        assert [(s["base"], s["end"]) for s in segs] == [(0, 50), (50, 100), (100, 150), (150, 200)]
        assert {s["node"] for s in segs[2:]} != {leader}
        # A segment written by the dead node is still served... by nobody: 503, not a 5xx crash.
        r = c.get(f"/v1/topics/seg-fail/segments/0/{segs[0]['base']}", survivor)
        assert r.status_code in (200, 503), r.text
