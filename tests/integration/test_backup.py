"""``raftmq backup`` and ``raftmq restore`` with real node processes: back up a running cluster,
write more, stop and wipe every node, restore each from the file, and find exactly the backed-up
state (topics, messages at their offsets, committed offsets); then the cluster takes new writes
where the old log left off, and its replicas agree."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from .harness import Cluster, wait_until

TOPICS = {"orders": 4, "audit": 2}


def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args], capture_output=True, text=True, timeout=180
    )


def snapshot_of(c: Cluster) -> dict[str, Any]:
    """Everything a restore must bring back, read through the public API."""
    state: dict[str, Any] = {"topics": sorted(t["name"] for t in c.get("/v1/topics").json()["topics"])}
    for topic, queues in TOPICS.items():
        for q in range(queues):
            state[f"{topic}/{q}"] = [(m["offset"], m["key"], m["value"]) for m in c.fetch_all(topic, q)]
    state["offsets"] = c.get("/v1/groups/billing/offsets", params={"topic": "orders"}).json()
    return state


def produce(c: Cluster, prefix: str, count: int) -> None:
    for start in range(0, count, 100):
        batch = [{"key": f"k{i % 13}", "value": f"{prefix}-{i}"} for i in range(start, start + 100)]
        for topic in TOPICS:
            r = c.produce(topic, batch)
            assert r.status_code == 200, r.text


def test_backup_wipe_restore_brings_back_exactly_the_backup(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        for topic, queues in TOPICS.items():
            c.create_topic(topic, queues=queues)
        produce(c, "before", 600)
        r = c.session.put(
            c.url() + "/v1/groups/billing/offsets", json={"topic": "orders", "offsets": {"0": 7}}
        )
        assert r.status_code == 200, r.text
        c.internal("POST", "/internal/groups/0/compact", c.wait_leader("0"))  # a compacted journal too
        expected = snapshot_of(c)
        indexes = {g: c.status(c.wait_leader(g))["groups"][g]["state_index"] for g in ("meta", "0", "1", "2")}

        backup = tmp_path / "backup.tar"
        done = raftmq("backup", "--config", str(c.config_path), "-o", str(backup))
        assert done.returncode == 0, done.stderr
        assert "backup of 4 groups written" in done.stdout
        with tarfile.open(backup) as tar:
            assert {"raftmq-backup.json", "groups/meta.tar", "groups/0.tar"} <= set(tar.getnames())

        produce(c, "after", 200)  # not in the backup: the restore must not bring these back

        # A running node is not restored, nor a node whose data directory is in use.
        refused = raftmq("restore", "--config", str(c.config_path), "--node", "n1", str(backup))
        assert refused.returncode != 0 and "stop it first" in refused.stderr, refused.stderr

        for nid in c.nodes:
            assert c.terminate(nid) == 0
        refused = raftmq("restore", "--config", str(c.config_path), "--node", "n1", str(backup))
        assert refused.returncode != 0 and "is not empty" in refused.stderr, refused.stderr
        for nid in c.nodes:
            c.wipe(nid)
            done = raftmq("restore", "--config", str(c.config_path), "--node", nid, str(backup))
            assert done.returncode == 0, done.stderr
            assert "restored groups" in done.stdout

        c.start()
        c.wait_ready(timeout_s=60)
        assert snapshot_of(c) == expected

        # New writes continue the old Raft log (no index reused) and every replica agrees.
        for g, index in indexes.items():
            assert c.status(c.wait_leader(g))["groups"][g]["state_index"] >= index
        produce(c, "restored", 100)
        orders_0 = c.fetch_all("orders", 0)
        assert [m["offset"] for m in orders_0] == list(range(len(orders_0)))
        assert orders_0[-1]["value"].startswith("restored-")
        for g in ("meta", "0", "1", "2"):
            c.wait_replicas_equal(g)

        # A node wiped after the restore catches up from the others (snapshot install).
        c.kill("n3")
        c.wipe("n3")
        c.start("n3")
        c.wait_ready(["n3"], timeout_s=60)
        wait_until(
            lambda: all(
                len(c.fetch_all(t, q, node="n3", read_from="local")) > 0 for t in TOPICS for q in range(2)
            ),
            60,
            what="n3 caught up",
        )
        for g in ("0", "1", "2"):
            c.wait_replicas_equal(g, timeout_s=60)
