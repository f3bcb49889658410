"""Retention by age and by size, driven by the leader's ticks, on a live cluster."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftmq.client import Admin
from raftmq.storage import blob_gc

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(120)

CLI = [sys.executable, "-m", "raftmq.cluster.cli.main"]


def queue_bounds(c: Cluster, topic: str, queue: int) -> tuple[int, int]:
    q = c.get(f"/v1/topics/{topic}").json()["queues"][queue]
    # null while no leader of the queue's group serves reads (a leadership moving): "not yet" to
    # wait_until, a failure elsewhere
    assert q["low_offset"] is not None and q["high_offset"] is not None, q
    return q["low_offset"], q["high_offset"]


def test_retention_by_age_and_by_size_removes_whole_batches_and_moves_low_offset(tmp_path: Path) -> None:
    with Cluster(tmp_path, queue_groups=1, extra_toml="[raft]\nretention_check_ms = 200\n") as c:
        c.start()
        c.wait_ready()
        c.create_topic("aged", queues=1, retention_ms=1500)
        c.create_topic("sized", queues=1, retention_bytes=5_000)
        keep = c.create_topic("kept", queues=1)
        assert keep["retention_ms"] is None
        for i in range(10):
            for topic in ("aged", "sized", "kept"):
                r = c.produce(topic, [{"value": f"{topic}-{i}-{j}-" + "v" * 100} for j in range(10)])
                assert r.status_code == 200, r.text

        # Size (~13 kB written): the oldest batches go until at most 5 kB remain; the newest stays.
        wait_until(lambda: queue_bounds(c, "sized", 0)[0] > 0, 20, what="size retention")
        # A tick may have run while the batches were written, and the next one removes more: read
        # the low offset once, from the refusal of offset 0, and check that one reading.
        r = c.get("/v1/topics/sized/queues/0/messages", params={"offset": 0})
        assert r.status_code == 416, r.text
        low, high = r.json()["error"]["low_offset"], r.json()["error"]["high_offset"]
        assert high == 100 and low % 10 == 0 and 0 < low < high  # whole batches of 10 removed
        newest = c.get("/v1/topics/sized/queues/0/messages", params={"offset": 99}).json()["messages"]
        assert newest[0]["value"].startswith("sized-9-9-")

        # Age: after 1.5 s every batch is old enough to go; the queue keeps its high offset.
        assert wait_until(lambda: queue_bounds(c, "aged", 0) == (100, 100), 30, what="age retention")
        r = c.produce("aged", [{"value": "fresh"}])
        assert r.json()["results"] == [{"queue": 0, "offset": 100}]

        # Without retention nothing is removed, and every replica agrees on all of it.
        assert queue_bounds(c, "kept", 0) == (0, 100)
        c.wait_replicas_equal("0")


def test_retention_turned_on_later_frees_the_backlog_on_every_replica_and_off_keeps_the_rest(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, queue_groups=1, extra_toml="[raft]\nretention_check_ms = 200\n") as c:
        c.start()
        c.wait_ready()
        c.create_topic("backlog", queues=1)
        for i in range(10):
            r = c.produce("backlog", [{"value": f"{i}-{j}-" + "v" * 100} for j in range(10)])
            assert r.status_code == 200, r.text
        # Turned on with the CLI, through each node in turn (the metadata leader's and others'):
        # the queue group's leader removes the oldest whole batches at its next look, keeps the newest.
        for nid in c.nodes:
            command = [*CLI, "topic", "retention", "backlog", "--retention-bytes", "5000", "--json"]
            done = subprocess.run([*command, "--url", c.url(nid)], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            topic = json.loads(done.stdout)
            assert (topic["retention_bytes"], topic["retention_ms"]) == (5_000, None)
        wait_until(lambda: queue_bounds(c, "backlog", 0)[0] > 0, 20, what="retention turned on")
        low, high = queue_bounds(c, "backlog", 0)
        assert high == 100 and low % 10 == 0 and low < high
        for nid in c.nodes:  # every node's metadata replica shows the change
            assert c.get("/v1/topics/backlog", nid).json()["retention_bytes"] == 5_000

        # With the Python client, one bound at a time (one left out keeps its value), then off
        # again (None: no bound): what is left stays, and so does what comes next.
        with Admin([c.url()]) as admin:
            desc = admin.set_topic_retention("backlog", retention_ms=86_400_000)
            assert (desc.info.retention_bytes, desc.info.retention_ms) == (5_000, 86_400_000)
            desc = admin.set_topic_retention("backlog", retention_bytes=None)
            assert (desc.info.retention_bytes, desc.info.retention_ms) == (None, 86_400_000)
            desc = admin.set_topic_retention("backlog", retention_ms=None)
        assert (desc.info.retention_bytes, desc.info.retention_ms) == (None, None)
        for nid in c.nodes:
            wait_until(lambda nid=nid: c.get("/v1/topics/backlog", nid).json()["retention_bytes"] is None, 10)
        # A retention look of the leader that read the bound before it went was proposed before
        # this produce (the leader's metadata replica has applied the change), so it has applied
        # once the produce is answered.
        assert c.produce("backlog", [{"value": "m" * 100}] * 10).status_code == 200
        low_after_off = queue_bounds(c, "backlog", 0)[0]
        for _ in range(10):
            assert c.produce("backlog", [{"value": "w" * 100}] * 10).status_code == 200
        time.sleep(1.0)  # five looks: with the bound still on, about half of this would go
        assert queue_bounds(c, "backlog", 0) == (low_after_off, 210)
        c.wait_replicas_equal("0")

        # A bad change is 400 and changes nothing; an unknown topic 404.
        for body in ({"retention_bytes": 0}, {"retention_ms": 5, "attributes": {"a": "1"}}, {}):
            r = c.session.patch(c.url() + "/v1/topics/backlog", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (body, r.text)
        assert c.get("/v1/topics/backlog").json()["retention_bytes"] is None
        r = c.session.patch(c.url() + "/v1/topics/nope", json={"retention_ms": 5}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "topic_not_found", r.text


def _fill_30_mb(c: Cluster, topic: str) -> None:
    """A topic of one queue in group 0 with 30 MB of incompressible values (past a 16 MiB
    memtable, into files), on every replica."""
    c.create_topic(topic, queues=1)
    for _ in range(60):
        values = [{"value": base64.b64encode(os.urandom(768)).decode()} for _ in range(500)]
        assert c.produce(topic, values).status_code == 200
    c.wait_replicas_equal("0")


def _state_bytes(c: Cluster, nid: str, group: str) -> int:
    """Bytes the state store of ``nid``'s replica of ``group`` takes on disk (``du``)."""
    root = c.data_dir / nid / "groups" / group / "state"
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            # A compaction may delete a file between the listing and its lstat: it holds nothing.
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def test_retention_frees_the_disk_of_every_replica_not_only_the_messages(tmp_path: Path) -> None:
    # RocksDB keeps what a range deletion covers in its files until a compaction rewrites them,
    # and a store that stops growing never runs one by itself: the node compacts what retention
    # removed (cluster/node/compactor.py).
    with Cluster(tmp_path, queue_groups=1, extra_toml="[raft]\nretention_check_ms = 200\n") as c:
        c.start()
        c.wait_ready()
        _fill_30_mb(c, "backlog")
        filled = {nid: _state_bytes(c, nid, "0") for nid in c.nodes}
        assert all(size > 24_000_000 for size in filled.values()), filled
        r = c.session.patch(c.url() + "/v1/topics/backlog", json={"retention_bytes": 1_000_000}, timeout=30)
        assert r.status_code == 200, r.text
        wait_until(lambda: queue_bounds(c, "backlog", 0)[0] > 0, 20, what="retention turned on")

        def freed() -> dict[str, int] | None:
            sizes = {nid: _state_bytes(c, nid, "0") for nid in c.nodes}
            return sizes if all(size < filled[nid] // 4 for nid, size in sizes.items()) else None

        wait_until(freed, 30, interval_s=0.5, what=f"the state stores freed from {filled}")
        low, high = queue_bounds(c, "backlog", 0)
        assert high == 30_000 and 0 < low < high
        c.wait_replicas_equal("0")


def test_a_dropped_topic_is_freed_on_the_disk_of_a_replica_killed_before_it_compacted(tmp_path: Path) -> None:
    # The compaction runs COMPACT_DELAY_S (2 s) after the apply; a replica killed in between has
    # applied the drop, and its restart's replay skips the entry: the skipped entry reports what
    # it freed again (cluster/machines/freed.py), so the restarted node compacts it.
    with Cluster(tmp_path, queue_groups=1) as c:
        c.start()
        c.wait_ready()
        _fill_30_mb(c, "dropped")
        leader = c.wait_leader("0")
        victim = next(nid for nid in c.nodes if nid != leader)
        filled = _state_bytes(c, victim, "0")
        assert filled > 24_000_000, filled
        r = c.session.delete(c.url(leader) + "/v1/topics/dropped", timeout=30)
        assert r.status_code in (200, 204), r.text  # answered once the queue group's leader applied the drop
        dropped_at = c.status(leader)["groups"]["0"]["state_index"]
        wait_until(
            lambda: c.status(victim)["groups"]["0"]["state_index"] >= dropped_at,
            10,
            interval_s=0.02,
            what="the drop applied on the victim",
        )
        c.kill(victim)
        assert _state_bytes(c, victim, "0") > filled // 2, "compacted before the kill: nothing to prove"
        c.start(victim)
        c.wait_ready([victim])
        wait_until(
            lambda: _state_bytes(c, victim, "0") < filled // 4,
            30,
            interval_s=0.5,
            what=f"the victim's state store freed from {filled} after its restart",
        )


def test_a_blob_garbage_rewrite_a_restart_cut_short_goes_on_when_the_store_opens(tmp_path: Path) -> None:
    """A state store's rewrite of its blob garbage keeps where it goes on in the store's directory
    (storage/blob_gc.py); a node restarted with one under way goes on with it as the replica
    starts, not at the group's next removal of messages (there may be none for good)."""
    with Cluster(tmp_path, queue_groups=1) as c:
        c.start()
        c.wait_ready()
        c.create_topic("kept", queues=1)
        assert c.produce("kept", [{"value": f"{i}-" + "v" * 5000} for i in range(20)]).status_code == 200
        c.wait_replicas_equal("0")
        nid = next(iter(c.nodes))
        cursor = c.data_dir / nid / "groups" / "0" / "state" / blob_gc.CURSOR_FILE
        c.terminate(nid)
        cursor.write_text("\n")  # under way from the store's first key, as a stop leaves it
        c.start(nid)
        c.wait_ready([nid])
        wait_until(
            lambda: not cursor.exists(), 30, interval_s=0.2, what="the rewrite finished after the restart"
        )
        assert "freed_ranges_compacted" in c.log(nid)
        c.wait_replicas_equal("0")
