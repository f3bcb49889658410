"""Rebalancing with real node processes: after ``add-node``, a rebalance moves the new node its
share of replicas while a producer keeps writing, and nothing acknowledged is lost. The planner
itself is tested in ``tests/unit/test_rebalance.py``."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.base.groups import port_offset

from .cluster_changes import QUEUES, TOPIC, Traffic, placement, run_change, wait_for_end
from .conftest import assert_error
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def joining(tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes, three queue groups (replication 3) and n4 (``join = true``): it runs, but is
    not in the placement yet."""
    c = Cluster(tmp_path, nodes=4, queue_groups=3, node_toml=lambda n: "join = true" if n == "n4" else "")
    with c:
        c.start()
        c.wait_ready()
        wait_until(lambda: placement(c)["placement"], 30, what="the placement recorded")
        c.create_topic(TOPIC, queues=QUEUES)
        yield c


@pytest.fixture
def cluster(joining: Cluster) -> Iterator[Cluster]:
    """As ``joining``, with n4 added: it is in the placement, but hosts nothing."""
    c = joining
    n4 = c.nodes["n4"]
    r = c.post("/v1/cluster/nodes", {"id": "n4", "http": n4.http, "raft": f"127.0.0.1:{n4.raft_base}"})
    assert r.status_code == 202, r.text
    wait_for_end(c, r.json()["change"]["id"])
    yield c


def replica_counts(groups: dict[str, list[str]]) -> Counter[str]:
    counts = Counter({n: 0 for n in ("n1", "n2", "n3", "n4")})
    counts.update(i for ids in groups.values() for i in ids)
    return counts


def voters(c: Cluster, group: str) -> set[str]:
    """The node ids of ``group``'s voters, as its leader reports them."""
    leader = c.wait_leader(group, timeout_s=30)
    addrs = set(c.status(leader)["groups"][group]["members"])
    offset = port_offset(group)
    return {n.id for n in c.nodes.values() if f"127.0.0.1:{n.raft_base + offset}" in addrs}


def cli(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "raftmq.cluster.cli.main", "cluster", *args, "--url", c.url()]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_rebalance_gives_an_added_node_its_share_while_producing(cluster: Cluster) -> None:
    c = cluster
    before = placement(c)["placement"]
    dry = c.post("/v1/cluster/rebalance", {"dry_run": True})
    assert dry.status_code == 200, dry.text
    planned = dry.json()["plan"]
    # 12 replicas (3 queue groups and meta, 3 each) over 4 nodes: n4 takes 3, all queue groups'.
    assert [m["target"] for m in planned["moves"]] == ["n4", "n4", "n4"], planned
    assert {m["group"] for m in planned["moves"]} == {"0", "1", "2"}
    assert placement(c)["placement"] == before and placement(c)["change"] is None  # nothing recorded

    with Traffic(c, ["n1", "n2", "n3"]) as traffic:
        traffic.wait_for(100)
        r = c.session.post(c.url() + "/v1/cluster/rebalance", timeout=30)  # no body
        assert r.status_code == 202, r.text
        change = r.json()["change"]
        assert change["kind"] == "rebalance" and r.json()["plan"] == planned
        # One change at a time: another rebalance is refused while this one runs.
        e = assert_error(c.post("/v1/cluster/rebalance", {}), 409, "change_in_progress")
        assert e["change"]["id"] == change["id"]
        record = wait_for_end(c, change["id"])
        assert record["outcome"] == "done", record
        traffic.wait_for(100)
    acked = dict(traffic.acked)
    print(f"acknowledged {len(acked)}, failed requests {len(traffic.failures)}: {traffic.failures[-3:]}")

    groups = placement(c)["placement"]["groups"]
    counts = replica_counts(groups)
    assert counts["n4"] == 3 and max(counts.values()) - min(counts.values()) <= 1, counts
    assert groups["meta"] == before["groups"]["meta"]  # the metadata group counts but stays
    leaders = Counter(ids[0] for g, ids in groups.items() if g != "meta")
    assert max(leaders.values()) == 1, groups  # three queue groups, three different preferred leaders
    for g, ids in groups.items():
        assert len(ids) == 3 and voters(c, g) == set(ids), (g, ids)
    # Every acknowledged message is there, on every replica of its group.
    queue_groups = c.get(f"/v1/topics/{TOPIC}").json()["queue_groups"]
    for g in ("0", "1", "2"):
        c.wait_replicas_equal(g, groups[g], timeout_s=60)
    for q in range(QUEUES):
        want = {o: v for (qq, o), v in acked.items() if qq == q}
        for nid in groups[str(queue_groups[q])]:
            got = {m["offset"]: m["value"] for m in c.fetch_all(TOPIC, q, node=nid, read_from="local")}
            missing = [o for o, v in want.items() if got.get(o) != v]
            assert not missing, f"queue {q} on {nid}: {len(missing)} acknowledged messages missing"
            assert sorted(got) == list(range(len(got))), f"queue {q} on {nid}: offsets not dense"

    # Balanced now: the dry run plans nothing, and a rebalance ends at once.
    dry = c.post("/v1/cluster/rebalance", {"dry_run": True})
    assert dry.status_code == 200 and dry.json()["plan"]["moves"] == [], dry.text
    assert dry.json()["plan"]["leader_changes"] == []
    shown = cli(c, "rebalance")
    assert shown.returncode == 0, shown.stderr
    assert "already balanced" in shown.stdout and ": done" in shown.stderr, (shown.stdout, shown.stderr)
    assert placement(c)["placement"]["groups"] == groups
    # The leader balancer hands each queue group's leadership to its preferred leader.
    for g in ("0", "1", "2"):
        wait_until(lambda g=g: c.leader(g) == groups[g][0], 30, what=f"{groups[g][0]} leading group {g}")


def test_a_cancelled_rebalance_starts_no_further_move(cluster: Cluster) -> None:
    c = cluster
    shown = cli(c, "rebalance", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("to n4") == 3 and placement(c)["change"] is None, shown.stdout
    for body in ({"dry_run": "yes"}, {"dry": True}, [True], "x"):
        assert_error(c.post("/v1/cluster/rebalance", body), 400, "bad_request")
    assert_error(
        c.session.post(c.url() + "/v1/cluster/rebalance", data=b"{", timeout=30), 400, "invalid_json"
    )

    r = c.post("/v1/cluster/rebalance", {"dry_run": False})
    assert r.status_code == 202, r.text
    change_id = r.json()["change"]["id"]

    def under_way() -> dict[str, Any] | None:
        seen = placement(c)
        return seen if (seen["change"] or {}).get("group") else None

    # Usually the first move; on a fast machine one may have ended between two looks.
    seen = wait_until(under_way, 60, 0.2, what="a move under way")
    r = c.session.delete(c.url() + "/v1/cluster/change", timeout=30)
    assert r.status_code == 202 and r.json()["change"]["cancel"] is True, r.text
    at_cancel = r.json()["change"]  # the move under way when the cancel was recorded, if any
    record = wait_for_end(c, change_id, 60)
    assert (record["kind"], record["outcome"], record["cancel"]) == ("rebalance", "failed", True), record
    groups = placement(c)["placement"]["groups"]
    # n4 holds what it held when the move was seen under way, plus at most that move and the one
    # under way at the cancel (the same move, unless it ended in between): no other started.
    held_before = {g for g, ids in seen["placement"]["groups"].items() if "n4" in ids}
    may_end = {seen["change"]["group"], at_cancel.get("group")} - {None}
    held = {g for g, ids in groups.items() if "n4" in ids}
    assert held <= held_before | may_end, (held, held_before, may_end, at_cancel)
    for g, ids in groups.items():
        assert len(ids) == 3 and voters(c, g) == set(ids), (g, ids)
    # The next rebalance finishes the job.
    done = cli(c, "rebalance", "--timeout-s", "180")
    assert done.returncode == 0 and ": done" in done.stderr, done.stderr
    if replica_counts(groups)["n4"] < 3:
        assert "from n" in done.stderr  # progress lines name each move
    assert replica_counts(placement(c)["placement"]["groups"])["n4"] == 3


def test_a_rebalance_continues_when_its_coordinator_is_killed(cluster: Cluster) -> None:
    """The metadata leader dies during the first move: the next one carries the rebalance on from
    the recorded placement, leaving the dead node as it is; once it is back, a second rebalance
    evens it out."""
    c = cluster
    coordinator = c.wait_leader("meta")
    entry = next(n for n in ("n1", "n2", "n3") if n != coordinator)
    r = c.post("/v1/cluster/rebalance", node=entry)
    assert r.status_code == 202, r.text
    change_id = r.json()["change"]["id"]
    wait_until(lambda: (placement(c)["change"] or {}).get("group"), 60, 0.2, what="the first move")
    c.kill(coordinator)
    record = wait_for_end(c, change_id)
    assert record["outcome"] == "done", record
    groups = placement(c)["placement"]["groups"]
    for g, ids in groups.items():
        assert len(ids) == 3 and voters(c, g) == set(ids), (g, ids)
    c.start(coordinator)
    c.wait_ready([coordinator], timeout_s=60)
    run_change(c, "POST", "/v1/cluster/rebalance", {})  # retried while the metadata group elects
    groups = placement(c)["placement"]["groups"]
    counts = replica_counts(groups)
    assert counts["n4"] == 3 and max(counts.values()) - min(counts.values()) <= 1, counts
    for g, ids in groups.items():
        assert voters(c, g) == set(ids), (g, ids)


def test_add_node_with_rebalance_adds_the_node_then_gives_it_its_share(joining: Cluster) -> None:
    c = joining
    n4 = c.nodes["n4"]
    refused = cli(
        c,
        "add-node",
        "n4",
        "--http",
        n4.http,
        "--raft",
        f"127.0.0.1:{n4.raft_base}",
        "--rebalance",
        "--no-wait",
    )
    assert refused.returncode == 2 and "needs --wait" in refused.stderr, refused.stderr
    assert [n["id"] for n in placement(c)["placement"]["nodes"]] == ["n1", "n2", "n3"]  # nothing recorded
    with Traffic(c, ["n1", "n2", "n3"]) as traffic:
        traffic.wait_for(100)
        shown = cli(
            c, "add-node", "n4", "--http", n4.http, "--raft", f"127.0.0.1:{n4.raft_base}", "--rebalance"
        )
        assert shown.returncode == 0, shown.stderr
        traffic.wait_for(100)
    assert shown.stdout.count("to n4") == 3, shown.stdout  # the plan: one replica of each queue group
    assert shown.stderr.count(": done") == 2, shown.stderr  # the node added, then the rebalance
    groups = placement(c)["placement"]["groups"]
    counts = replica_counts(groups)
    assert counts["n4"] == 3 and max(counts.values()) - min(counts.values()) <= 1, counts
    acked = dict(traffic.acked)
    queue_groups = c.get(f"/v1/topics/{TOPIC}").json()["queue_groups"]
    for q in range(QUEUES):
        g = str(queue_groups[q])
        c.wait_replicas_equal(g, groups[g], timeout_s=60)
        want = {o: v for (qq, o), v in acked.items() if qq == q}
        got = {m["offset"]: m["value"] for m in c.fetch_all(TOPIC, q, node="n4", read_from="local")}
        assert all(got.get(o) == v for o, v in want.items()), (
            f"queue {q}: acknowledged messages missing on n4"
        )
