"""The replicated core with real node processes: commits, kill -9, restarts, snapshots, repairs.

Each test names the durability property it proves (see docs/architecture.md for the hazards).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

# One queue group (group "0") on three nodes keeps each test about one group's log.
ONE_GROUP = {"queue_groups": 1}


def start(tmp_path: Path, extra_toml: str = "", **kw: Any) -> Cluster:
    c = Cluster(tmp_path, extra_toml=extra_toml, **{**ONE_GROUP, **kw})
    c.start()
    c.wait_ready()
    return c


def produce_batches(
    c: Cluster, topic: str, batches: int, size: int = 100, node: str | None = None, tag: str = "m"
) -> dict[tuple[int, int], str]:
    """Produce ``batches`` requests of ``size`` messages; returns acknowledged (queue, offset) -> value."""
    acked: dict[tuple[int, int], str] = {}
    for b in range(batches):
        values = [f"{tag}-{b}-{i}-" + "x" * 80 for i in range(size)]
        r = c.produce(topic, [{"value": v} for v in values], node=node)
        assert r.status_code == 200, r.text
        for v, res in zip(values, r.json()["results"], strict=True):
            acked[(res["queue"], res["offset"])] = v
    return acked


def assert_all_present(
    c: Cluster, topic: str, acked: dict[tuple[int, int], str], node: str, read_from: str
) -> None:
    by_queue: dict[int, dict[int, str]] = {}
    for q in {q for q, _ in acked}:
        by_queue[q] = {m["offset"]: m["value"] for m in c.fetch_all(topic, q, node=node, read_from=read_from)}
    missing = [(q, o) for (q, o), v in acked.items() if by_queue[q].get(o) != v]
    assert not missing, f"{len(missing)} acknowledged messages missing or different on {node}: {missing[:5]}"


def test_three_replicas_commit_batches_and_hold_identical_stores(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=2)
        acked = produce_batches(c, "t", batches=20)
        assert len(acked) == 2000
        digest = c.wait_replicas_equal("0")
        assert digest["keys"] > 0
        for nid in c.nodes:
            assert_all_present(c, "t", acked, nid, read_from="local")


def test_kill_leader_elects_new_leader_and_produce_continues(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=1)
        acked = produce_batches(c, "t", batches=5)
        old = c.wait_leader("0")
        c.kill(old)
        killed_at = time.monotonic()
        # Election timeouts are 1-2 s; the deadline allows for split votes on a loaded machine
        # (how fast is a benchmark's business, not this test's).
        new = c.wait_leader("0", exclude=old, timeout_s=30)
        print(f"new leader {new} seen {time.monotonic() - killed_at:.1f} s after the kill")
        assert new != old
        survivor = next(n for n in c.nodes if c.alive(n))
        acked |= produce_batches(c, "t", batches=5, node=survivor, tag="after")
        c.wait_replicas_equal("0")  # a follower applies once it learns the commit index
        for nid in (n for n in c.nodes if c.alive(n)):
            assert_all_present(c, "t", acked, nid, read_from="local")

        # The killed node comes back, catches up and holds exactly the same store.
        c.start(old)
        c.wait_ready([old], timeout_s=60)
        c.wait_replicas_equal("0", timeout_s=60)
        assert_all_present(c, "t", acked, old, read_from="local")


def test_kill_all_nodes_at_once_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=3)
        acked: dict[tuple[int, int], str] = {}
        stop = threading.Event()
        errors: list[str] = []

        def producer() -> None:
            i = 0
            while not stop.is_set():
                values = [f"p-{i}-{j}" for j in range(50)]
                try:
                    r = c.produce("t", [{"value": v} for v in values], node="n1")
                except Exception as e:  # the cluster is being killed under us
                    errors.append(repr(e))
                    return
                if r.status_code == 200:
                    for v, res in zip(values, r.json()["results"], strict=True):
                        acked[(res["queue"], res["offset"])] = v
                i += 1

        t = threading.Thread(target=producer)
        t.start()
        wait_until(lambda: len(acked) >= 3000, 60, what="3000 acknowledged messages")
        for nid in list(c.nodes):
            c.nodes[nid].proc.kill()  # type: ignore[union-attr]
        stop.set()
        t.join(30)
        for nid in c.nodes:
            c.nodes[nid].proc.wait(10)  # type: ignore[union-attr]
        snapshot = dict(acked)
        c.start()
        c.wait_ready(timeout_s=60)
        c.wait_replicas_equal("0", timeout_s=60)
        for nid in c.nodes:
            assert_all_present(c, "t", snapshot, nid, read_from="local")


def test_wiped_follower_rejoins_from_a_snapshot_checkpoint(tmp_path: Path) -> None:
    toml = "[raft]\ncompaction_min_entries = 20\ncompaction_min_time_s = 1\n"
    with start(tmp_path, extra_toml=toml) as c:
        c.create_topic("t", queues=2)
        acked = produce_batches(c, "t", batches=60, size=20)
        leader = c.wait_leader("0")
        follower = next(n for n in c.nodes if n != leader)
        # Both other journals were compacted past the start, so the follower can only come back
        # via a snapshot, whichever of them leads when it does.
        for nid in (n for n in c.nodes if n != follower):
            wait_until(
                lambda nid=nid: c.status(nid)["groups"]["0"]["journal_entries"] < 60,
                30,
                what=f"compaction on {nid}",
            )
        c.kill(follower)
        c.wipe(follower)
        acked |= produce_batches(c, "t", batches=5, size=20, tag="while-down")
        c.start(follower)
        c.wait_ready([follower], timeout_s=60)
        c.wait_replicas_equal("0", timeout_s=60)
        assert "snapshot_install_done" in c.log(follower)
        assert_all_present(c, "t", acked, follower, read_from="local")


def test_crash_between_snapshot_and_journal_compaction_loses_nothing(tmp_path: Path) -> None:
    toml = "[raft]\ncompaction_min_entries = 20\ncompaction_min_time_s = 1\n"
    with start(tmp_path, extra_toml=toml) as c:
        c.create_topic("t", queues=1)
        acked = produce_batches(c, "t", batches=10, size=10)
        victim = "n3"
        c.kill(victim)
        # Restart it with the fault: it exits right after renaming its snapshot into place and
        # before compacting its journal (pysyncobj's crash window, hazard 2).
        c.start(victim, env={"RAFTMQ_FAULTS_CRASH_AFTER_SNAPSHOT": "true"})
        acked |= produce_batches(c, "t", batches=40, size=10, tag="more", node="n1")
        proc = c.nodes[victim].proc
        assert proc is not None
        wait_until(lambda: proc.poll() is not None, 60, what="the crash after snapshot")
        assert proc.returncode == 137, c.log(victim)[-2000:]
        assert "test_fault_crash_after_snapshot" in c.log(victim)
        c.start(victim)
        c.wait_ready([victim], timeout_s=60)
        c.wait_replicas_equal("0", timeout_s=60)
        assert_all_present(c, "t", acked, victim, read_from="local")


def test_torn_journal_tail_is_cut_and_refetched_not_a_crash_loop(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=1)
        acked = produce_batches(c, "t", batches=10, size=10)
        leader = c.wait_leader("0")
        victim = next(n for n in c.nodes if n != leader)
        c.wait_replicas_equal("0")
        c.kill(victim)
        journal = RocksStore.open(str(c.data_dir / victim / "groups" / "0" / "raft"))
        last_key, last_value = next(journal.scan(b"E", b"F", reverse=True, limit=1))
        batch = Batch()
        batch.put(last_key, last_value[:-3] + bytes(b ^ 0xFF for b in last_value[-3:]))  # torn record
        journal.write(batch, sync=True)
        journal.close()
        c.start(victim)
        c.wait_ready([victim], timeout_s=60)
        assert "journal_tail_repaired" in c.log(victim)
        acked |= produce_batches(c, "t", batches=3, size=10, tag="after")
        c.wait_replicas_equal("0", timeout_s=60)
        assert_all_present(c, "t", acked, victim, read_from="local")


def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args], capture_output=True, text=True, timeout=180
    )


def test_corrupt_middle_of_journal_refuses_to_start_until_repaired_then_catches_up(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=1)
        acked = produce_batches(c, "t", batches=10, size=10)
        leader = c.wait_leader("0")
        victim = next(n for n in c.nodes if n != leader)
        c.wait_replicas_equal("0")
        c.kill(victim)
        path = str(c.data_dir / victim / "groups" / "0" / "raft")
        journal = RocksStore.open(path)
        keys = [k for k, _ in journal.scan(b"E", b"F")]
        assert len(keys) >= 5, keys
        key = keys[len(keys) // 2]  # good entries before and after it: not a torn tail
        value = journal.get(key)
        assert value is not None
        batch = Batch()
        batch.put(key, value[:-3] + bytes(b ^ 0xFF for b in value[-3:]))  # a flipped command tail
        journal.write(batch, sync=True)
        journal.close()
        index = int.from_bytes(key[1:], "big")

        log = c.start_refused(victim)
        assert f"group 0: the Raft journal is corrupt at index {index}" in log, log[-3000:]
        assert "raftmq repair-journal" in log
        assert "journal_tail_repaired" not in log

        args = ["repair-journal", "--config", str(c.config_path), "--node", victim, "--group", "0"]
        dry = raftmq(*args)
        assert dry.returncode == 0, dry.stderr
        assert f"fails its checksum at index {index}" in dry.stdout and "Dry run" in dry.stdout, dry.stdout
        check = RocksStore.open(path)
        assert [k for k, _ in check.scan(b"E", b"F")] == keys  # the dry run changed nothing
        check.close()
        done = raftmq(*args, "--yes")
        assert done.returncode == 0, done.stderr
        removed = len(keys) - keys.index(key)
        assert f"deleted {removed} records (entries {index}.." in done.stdout, done.stdout

        c.start(victim)
        c.wait_ready([victim], timeout_s=60)
        acked |= produce_batches(c, "t", batches=3, size=10, tag="after")
        c.wait_replicas_equal("0", timeout_s=60)
        assert_all_present(c, "t", acked, victim, read_from="local")


def test_command_that_cannot_apply_returns_error_and_group_keeps_applying(tmp_path: Path) -> None:
    with start(tmp_path) as c:
        c.create_topic("t", queues=1)
        poison = [
            b"not json",
            b"[]",
            json.dumps({"v": 1, "op": "produce", "now_ms": 1, "batches": "oops"}).encode(),
            json.dumps(
                {"v": 1, "op": "commit_offsets", "group": "g", "topic_id": 1, "offsets": {"0": 10**12}}
            ).encode(),
            json.dumps({"v": 99, "op": "produce"}).encode(),
        ]

        def propose(raw: bytes) -> dict[str, Any] | None:
            """The outcome of ``raw`` proposed at the leader; None when the leadership moved
            meanwhile (proposed again: an invalid command changes nothing, however often)."""
            r = c.internal("POST", "/internal/groups/0/propose", c.wait_leader("0"), data=raw)
            if r.status_code == 421:  # not_leader: it moved after wait_leader looked
                return None
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body if body["error"] is None else None

        for raw in poison:
            body = wait_until(lambda raw=raw: propose(raw), 30, what=f"{raw!r} applied")
            assert "error" in body["result"], body
        acked = produce_batches(c, "t", batches=3, size=10)
        c.wait_replicas_equal("0")
        for nid in c.nodes:
            assert_all_present(c, "t", acked, nid, read_from="local")
