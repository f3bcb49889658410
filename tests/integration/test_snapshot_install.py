"""Snapshot installs with real node processes: a follower whose checkpoint fetches fail applies
nothing it did not verify, and catches up once a fetch succeeds (issue 12, item 3).

See docs/architecture.md, "Snapshots are manifests; state moves out of band".
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, wait_until
from .test_replication import assert_all_present, produce_batches, start

pytestmark = pytest.mark.timeout(300)

# Compaction after 20 entries, so the survivors' snapshot passes the point where the old leader's
# log forks; an isolated leader keeps believing it leads for 20 s; proposals time out after 1 s.
TOML = (
    "[raft]\ncompaction_min_entries = 20\ncompaction_min_time_s = 1\nleader_fallback_ms = 20000\n"
    "[limits]\nrequest_timeout_ms = 1000\n"
)
UNCOMMITTED = 80  # entries the isolated leader appends that never commit


def _group(c: Cluster, nid: str) -> dict[str, Any]:
    status: dict[str, Any] = c.status(nid)["groups"]["0"]
    return status


def _compacted(c: Cluster, nid: str) -> bool:
    return bool(_group(c, nid)["journal_entries"] < 10)


def _failed_fetches(c: Cluster, nid: str) -> int:
    """Lines of group 0's checkpoint fetches failed by the fault on ``nid`` (the metadata group's
    installs fail too, and are not what this test waits for)."""
    return sum(
        1 for ln in c.log(nid).splitlines() if "test_fault_checkpoint_fetch" in ln and "group=0 " in ln
    )


def _propose_uncommitted(c: Cluster, leader: str, count: int) -> None:
    """``count`` entries appended by ``leader`` alone (its peers are down): they never commit."""

    def propose(i: int) -> None:
        r = c.internal("POST", "/internal/groups/0/propose", leader, data=f"uncommitted-{i}".encode())
        assert r.status_code == 200, r.text
        assert r.json()["error"] == "timeout", r.text

    threads = [threading.Thread(target=propose, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_failing_checkpoint_fetches_apply_nothing_unverified_then_catch_up(tmp_path: Path) -> None:
    with start(tmp_path, extra_toml=TOML) as c:
        c.create_topic("t", queues=2)
        acked = produce_batches(c, "t", batches=10, size=20)
        old = c.wait_leader("0")
        others = [n for n in c.nodes if n != old]
        # The leader alone: its log grows by entries that never commit (the fork).
        before = _group(c, old)
        for nid in others:
            c.kill(nid)
        _propose_uncommitted(c, old, UNCOMMITTED)
        forked = _group(c, old)
        assert forked["journal_entries"] >= before["journal_entries"] + UNCOMMITTED // 2, forked
        assert forked["state_index"] == before["state_index"]
        c.kill(old)
        # The others go on without it and compact past the fork: it can only come back through a
        # snapshot, and its own log beyond the fork is not the committed one.
        for nid in others:
            c.start(nid)
        c.wait_leader("0", timeout_s=60)
        acked |= produce_batches(c, "t", batches=30, size=20, tag="after", node=others[0])
        for nid in others:
            wait_until(functools.partial(_compacted, c, nid), 60, what=f"compaction on {nid}")
        # Back with every checkpoint fetch failing, and a proxy in its environment that answers nothing.
        fault = tmp_path / "checkpoint-fetch-fault"
        fault.write_text("fail\n")
        dead_proxy = "http://127.0.0.1:9"
        c.start(
            old,
            env={
                "RAFTMQ_FAULTS_CHECKPOINT_FETCH_FAULT_FILE": str(fault),
                "HTTP_PROXY": dead_proxy,
                "http_proxy": dead_proxy,
                "HTTPS_PROXY": dead_proxy,
                "https_proxy": dead_proxy,
                "NO_PROXY": "",
                "no_proxy": "",
            },
        )
        # Each attempt asks every other replica (two lines). Until a second attempt has failed too,
        # or the state moved (what happened before the fix: the first failure let it apply its log).
        wait_until(lambda: _failed_fetches(c, old) >= 2, 90, what="a failed fetch")
        wait_until(
            lambda: _failed_fetches(c, old) >= 4 or _group(c, old)["state_index"] != before["state_index"],
            90,
            what="a second failed fetch",
        )
        # The fetches begin as soon as a group starts, before the node's HTTP server listens (once
        # every group has started): on a loaded machine they can fail before the node answers.
        wait_until(
            lambda: not c.alive(old) or c.get("/healthz", old, timeout=5).ok, 60, what=f"{old} answering"
        )
        assert c.alive(old), f"{old} exited:\n{c.log(old)[-3000:]}"
        # Nothing of its own unchecked log was applied while no checkpoint could be had.
        held = _group(c, old)
        assert held["state_index"] == before["state_index"], held
        assert held["commit_index"] <= before["commit_index"], held
        assert "snapshot_install_done" not in c.log(old)
        # The fault ends: the next fetch (past the proxy, straight to a peer) installs the snapshot.
        fault.unlink()
        c.wait_replicas_equal("0", timeout_s=120)
        assert "snapshot_install_done" in c.log(old)
        assert_all_present(c, "t", acked, old, read_from="local")
        metrics = c.get("/metrics", old).text
        installs = [
            ln for ln in metrics.splitlines() if ln.startswith("raftmq_raft_snapshot_installs_total{")
        ]
        assert any('group_id="0"' in ln and float(ln.rsplit(" ", 1)[1]) >= 1 for ln in installs), installs
