"""Cluster changes without downtime, with real node processes and traffic running during each one.

Every test runs a producer and a consumer in the background while the change runs, then kills every
node (SIGKILL), restarts them, and checks that every acknowledged message is at its (queue, offset)
on every replica of its group (``read_from=local``), that the replicas' stores are identical, and
that the consumer saw each queue in offset order. The adapter-level Raft tests are in
``test_raft_membership.py``; the pure placement ops in ``tests/unit/test_placement.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.base.groups import port_offset
from raftmq.cluster.config.keys import PEER_HEADER

from .cluster_changes import QUEUES, TOPIC, Traffic, placement, run_change
from .conftest import assert_error
from .harness import PEER_KEY, Cluster, wait_until

pytestmark = pytest.mark.timeout(420)

FAST_COMPACTION = "[raft]\ncompaction_min_entries = 200\ncompaction_min_time_s = 5\n"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes and three queue groups (replication 3), plus n4 in the cluster file with
    ``join = true``: it runs from the start but hosts nothing until replicas move to it."""
    c = Cluster(
        tmp_path,
        nodes=4,
        queue_groups=3,
        extra_toml=FAST_COMPACTION,
        node_toml=lambda n: "join = true" if n == "n4" else "",
    )
    with c:
        c.start()
        c.wait_ready()
        wait_until(lambda: placement(c)["placement"], 30, what="the placement recorded")
        c.create_topic(TOPIC, queues=QUEUES)
        yield c


def add_n4(c: Cluster) -> None:
    n4 = c.nodes["n4"]
    run_change(
        c, "POST", "/v1/cluster/nodes", {"id": "n4", "http": n4.http, "raft": f"127.0.0.1:{n4.raft_base}"}
    )


def restart_all_and_check(c: Cluster, traffic: Traffic, live: list[str]) -> None:
    """SIGKILL every node, restart them, and check every acknowledged message on every replica."""
    traffic.stop()
    acked = dict(traffic.acked)
    print(
        f"acknowledged {len(acked)}, consumed {sum(map(len, traffic.seen.values()))}, "
        f"failed requests {len(traffic.failures)}: {traffic.failures[-3:]}"
    )
    assert len(acked) > 100, (
        f"too little traffic: {len(acked)} acknowledged; failures {traffic.failures[-3:]}"
    )
    for nid in c.nodes:
        if c.alive(nid):
            c.kill(nid)
    for nid in live:
        c.start(nid)
    c.wait_ready(live, timeout_s=60)
    groups = placement(c)["placement"]["groups"]
    for g, replicas in groups.items():
        assert set(replicas) <= set(live), (g, replicas)
        digests = wait_until_equal(c, g, replicas)
        assert digests["keys"] > 0
    for q in range(QUEUES):
        g = str(queue_group(c, q))
        want = {o: v for (qq, o), v in acked.items() if qq == q}
        for nid in groups[g]:
            got = {m["offset"]: m["value"] for m in c.fetch_all(TOPIC, q, node=nid, read_from="local")}
            missing = [o for o, v in want.items() if got.get(o) != v]
            assert not missing, (
                f"queue {q} on {nid}: {len(missing)} acknowledged messages missing: {missing[:5]}"
            )
            assert sorted(got) == list(range(len(got))), f"queue {q} on {nid}: offsets not dense"
        seen = [o for o, _ in traffic.seen[q]]
        assert seen == list(range(len(seen))), f"queue {q}: the consumer saw offsets out of order"
        assert all(got.get(o) == v for o, v in traffic.seen[q]), f"queue {q}: consumed a different message"


def wait_until_equal(c: Cluster, group: str, replicas: list[str]) -> dict[str, Any]:
    return c.wait_replicas_equal(group, replicas, timeout_s=60)


def queue_group(c: Cluster, q: int) -> int:
    r = c.get(f"/v1/topics/{TOPIC}")
    assert r.status_code == 200, r.text
    return int(r.json()["queue_groups"][q])


def leader_of(c: Cluster, group: str) -> str:
    return c.wait_leader(group, timeout_s=30)


def members(c: Cluster, group: str) -> set[str]:
    """The node ids of group's voters, as its leader reports them."""
    leader = leader_of(c, group)
    addrs = set(c.status(leader)["groups"][group]["members"])
    offset = port_offset(group)
    return {n.id for n in c.nodes.values() if f"127.0.0.1:{n.raft_base + offset}" in addrs}


def group_dir(c: Cluster, node: str, group: str) -> Path:
    return c.data_dir / node / "groups" / group


# -- the tests ----------------------------------------------------------------------------------------


def test_transfer_leadership_with_traffic_running(cluster: Cluster) -> None:
    c = cluster
    with Traffic(c, ["n1", "n2", "n3"]) as traffic:
        traffic.wait_for(100)
        for group in ("0", "meta"):
            before = leader_of(c, group)
            target = next(n for n in ("n1", "n2", "n3") if n != before)
            run_change(c, "POST", f"/v1/cluster/groups/{group}/leader", {"node": target})
            # Done means the target led once; an election on a busy machine may follow, after
            # which the balancer hands it back to the target (now the preferred replica).
            wait_until(lambda group=group, target=target: leader_of(c, group) == target, 30, what=target)
            assert placement(c)["placement"]["groups"][group][0] == target  # now the preferred leader
            traffic.wait_for(100)
        time.sleep(4)  # the leader balancer must keep the new leader (it is the preferred one)
        # Waited for, not read once: a busy machine may see an election meanwhile, after which
        # the balancer hands the leadership back to the preferred replica. A balancer that moved
        # it back to the old leader would keep it there, and this would time out.
        preferred = placement(c)["placement"]["groups"]["0"][0]
        wait_until(lambda: leader_of(c, "0") == preferred, 30, what=f"{preferred} leading group 0")
        restart_all_and_check(c, traffic, ["n1", "n2", "n3"])


def test_move_a_replica_to_an_added_node_with_traffic_running(cluster: Cluster) -> None:
    c = cluster
    with Traffic(c, ["n1", "n2", "n3"]) as traffic:
        traffic.wait_for(200)
        add_n4(c)
        for nid in ("n1", "n2", "n3"):  # the new replica starts from a snapshot and a checkpoint
            r = c.internal("POST", "/internal/groups/0/compact", nid)
            assert r.status_code == 200, r.text
        traffic.wait_for(100)
        r = c.post("/v1/cluster/groups/0/move", {"from": "n1", "to": "n4"})
        assert r.status_code == 202, r.text
        change_id = r.json()["change"]["id"]
        # One change at a time: a second is refused while the move runs, and changes nothing.
        before = placement(c)["placement"]
        refused = c.post("/v1/cluster/groups/1/leader", {"node": "n4"})
        e = assert_error(refused, 409, "change_in_progress")
        assert e["change"]["id"] == change_id
        assert_error(
            c.session.delete(c.url() + "/v1/cluster/nodes/n3", timeout=30), 409, "change_in_progress"
        )
        wait_until(lambda: any(h["id"] == change_id for h in placement(c)["history"]), 180, 0.5, what="move")
        record = placement(c)["history"][-1]
        assert (record["id"], record["outcome"]) == (change_id, "done"), record
        after = placement(c)["placement"]
        assert after["groups"]["0"] == ["n4", "n2", "n3"]  # n4 took n1's place (the preferred leader)
        assert {g: ids for g, ids in after["groups"].items() if g != "0"} == {
            g: ids for g, ids in before["groups"].items() if g != "0"
        }
        assert members(c, "0") == {"n2", "n3", "n4"}
        wait_until(lambda: not group_dir(c, "n1", "0").exists(), 30, what="n1's replica of group 0 deleted")
        traffic.wait_for(200)
        for nid in ("n2", "n3", "n4"):  # the manifests now carry the new voters
            c.internal("POST", "/internal/groups/0/compact", nid)
        traffic.wait_for(100)
        restart_all_and_check(c, traffic, ["n1", "n2", "n3", "n4"])
    assert members(c, "0") == {"n2", "n3", "n4"}
    assert not group_dir(c, "n1", "0").exists()
    assert "snapshot_install_done" in c.log("n4")  # n4 started from a peer's checkpoint
    # n4 took n1's place as the preferred leader: the leader balancer hands it the leadership.
    wait_until(lambda: c.leader("0") == "n4", 30, what="n4 leading group 0")


def test_a_move_continues_when_its_coordinator_is_killed(cluster: Cluster) -> None:
    """The metadata leader (the coordinator) is killed right after the move is recorded: the next
    metadata leader carries the move on from the recorded phase."""
    c = cluster
    coordinator = leader_of(c, "meta")
    source = next(n for n in ("n1", "n2", "n3") if n != coordinator)
    others = [n for n in ("n1", "n2", "n3") if n != coordinator]
    with Traffic(c, others) as traffic:
        traffic.wait_for(100)
        add_n4(c)
        r = c.post("/v1/cluster/groups/1/move", {"from": source, "to": "n4"}, node=others[0])
        assert r.status_code == 202, r.text
        change_id = r.json()["change"]["id"]
        c.kill(coordinator)

        def ended() -> dict[str, Any] | None:
            r = c.get("/v1/cluster/placement", others[0])
            if r.status_code != 200:  # 503 while the metadata group elects its next leader
                return None
            return next((h for h in r.json()["history"] if h["id"] == change_id), None)

        record = wait_until(ended, 180, 0.5, what="the move to end under the next coordinator")
        assert record["outcome"] == "done", record
        groups = placement(c, others[0])["placement"]["groups"]
        assert source not in groups["1"] and "n4" in groups["1"]
        c.start(coordinator)
        c.wait_ready([coordinator], timeout_s=60)
        traffic.wait_for(200)
        restart_all_and_check(c, traffic, ["n1", "n2", "n3", "n4"])
    assert members(c, "1") == set(placement(c)["placement"]["groups"]["1"])


def test_remove_a_node_with_traffic_running(cluster: Cluster) -> None:
    """n1 hosts every group (three nodes, three replicas); with n4 added, removing n1 moves each of
    its replicas to n4, the metadata group's too, while n1 leads the metadata group (so the
    coordinator itself hands over half-way)."""
    c = cluster
    with Traffic(c, ["n2", "n3"]) as traffic:
        traffic.wait_for(200)
        add_n4(c)
        run_change(c, "POST", "/v1/cluster/groups/meta/leader", {"node": "n1"})
        record = run_change(c, "DELETE", "/v1/cluster/nodes/n1", timeout_s=300)
        assert record["kind"] == "remove_node"
        p = placement(c)["placement"]
        assert [n["id"] for n in p["nodes"]] == ["n2", "n3", "n4"]
        assert all("n1" not in ids and "n4" in ids for ids in p["groups"].values()), p["groups"]
        for group in p["groups"]:
            assert members(c, group) == {"n2", "n3", "n4"}, group
        wait_until(lambda: not os.listdir(c.data_dir / "n1" / "groups"), 60, what="n1's replicas deleted")
        traffic.wait_for(200)
        restart_all_and_check(c, traffic, ["n2", "n3", "n4"])
    assert placement(c)["placement"]["version"] == p["version"]


def test_remove_a_dead_node_evicts_it_first(cluster: Cluster) -> None:
    """A node that does not answer is removed from each group before its replacement is added, so
    the catching-up replica is never needed for a quorum while a voter is missing."""
    c = cluster
    with Traffic(c, ["n1", "n2"]) as traffic:
        traffic.wait_for(100)
        add_n4(c)
        c.kill("n3")
        traffic.wait_for(100)
        run_change(c, "DELETE", "/v1/cluster/nodes/n3", timeout_s=300)
        p = placement(c)["placement"]
        assert all(set(ids) == {"n1", "n2", "n4"} for ids in p["groups"].values()), p["groups"]
        traffic.wait_for(200)
        restart_all_and_check(c, traffic, ["n1", "n2", "n4"])


def test_a_move_stuck_on_a_dead_target_is_cancelled_and_rolled_back(cluster: Cluster) -> None:
    """The target dies before the move: it becomes a voter (the others make the quorum) but never
    catches up, so the move waits. Cancelling it removes the target again, and the next change
    is accepted."""
    c = cluster
    with Traffic(c, ["n1", "n2", "n3"]) as traffic:
        traffic.wait_for(100)
        add_n4(c)
        c.kill("n4")
        r = c.post("/v1/cluster/groups/2/move", {"from": "n3", "to": "n4"})
        assert r.status_code == 202, r.text
        change_id = r.json()["change"]["id"]
        wait_until(
            lambda: (placement(c)["change"] or {}).get("phase") == "catch_up", 60, 0.5, what="catch_up"
        )
        assert members(c, "2") == {"n1", "n2", "n3", "n4"}
        traffic.wait_for(100)  # writes go on: three of the four voters answer
        assert_error(
            c.session.delete(c.url() + "/v1/cluster/nodes/n4", timeout=30), 409, "change_in_progress"
        )
        r = c.session.delete(c.url() + "/v1/cluster/change", timeout=30)
        assert r.status_code == 202 and r.json()["change"]["cancel"] is True, r.text

        def ended() -> dict[str, Any] | None:
            return next((h for h in placement(c)["history"] if h["id"] == change_id), None)

        record = wait_until(ended, 60, 0.5, what="the cancelled move to end")
        assert (record["outcome"], record["error"]) == ("failed", "cancelled"), record
        assert placement(c)["placement"]["groups"]["2"] == ["n3", "n1", "n2"]
        assert members(c, "2") == {"n1", "n2", "n3"}
        assert_error(
            c.session.delete(c.url() + "/v1/cluster/change", timeout=30), 409, "no_change_in_progress"
        )
        run_change(c, "POST", "/v1/cluster/groups/2/leader", {"node": "n1"})  # the next change runs
        traffic.wait_for(100)
        restart_all_and_check(c, traffic, ["n1", "n2", "n3", "n4"])


def cli(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "raftmq.cluster.cli.main", "cluster", *args, "--url", c.url()]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_cli_makes_changes_and_follows_them(cluster: Cluster) -> None:
    c = cluster
    n4 = c.nodes["n4"]
    done = cli(c, "add-node", "n4", "--http", n4.http, "--raft", f"127.0.0.1:{n4.raft_base}")
    assert done.returncode == 0 and "add node n4" in done.stderr and ": done" in done.stderr, done.stderr
    done = cli(c, "move", "1", "--from", "n2", "--to", "n4")
    assert done.returncode == 0 and "move group 1 from n2 to n4" in done.stderr, done.stderr
    assert ": done" in done.stderr, done.stderr
    done = cli(c, "transfer-leader", "1", "--to", "n3")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: leader_of(c, "1") == "n3", 30, what="n3 leading group 1")  # as preferred now
    shown = cli(c, "placement", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["placement"]["groups"]["1"] == ["n3", "n4", "n1"] and data["change"] is None
    assert [h["kind"] for h in data["history"]] == ["add_node", "move", "transfer_leader"]
    table = cli(c, "placement")
    assert table.returncode == 0 and "no change in progress" in table.stdout, table.stdout
    refused = cli(c, "cancel")
    assert refused.returncode == 1 and "no_change_in_progress" in refused.stderr, refused.stderr
    refused = cli(c, "remove-node", "n9", "--yes")
    assert refused.returncode == 1 and "no node 'n9'" in refused.stderr, refused.stderr


def test_bad_changes_are_refused_and_change_nothing(cluster: Cluster) -> None:
    c = cluster
    before = placement(c)
    n4 = c.nodes["n4"]
    cases: list[tuple[str, str, Any, int, str]] = [
        ("POST", "/v1/cluster/groups/0/move", {"from": "n1", "to": "n2"}, 400, "bad_request"),  # n2 hosts 0
        ("POST", "/v1/cluster/groups/7/move", {"from": "n1", "to": "n4"}, 400, "bad_request"),
        ("POST", "/v1/cluster/groups/0/move", {"from": "n1"}, 400, "bad_request"),
        ("POST", "/v1/cluster/groups/0/move", {"from": "n1", "to": 4}, 400, "bad_request"),
        ("POST", "/v1/cluster/groups/0/leader", {"node": "n4"}, 400, "bad_request"),  # n4 hosts nothing
        ("DELETE", "/v1/cluster/nodes/n2", None, 400, "bad_request"),  # nowhere to move its replicas
        ("DELETE", "/v1/cluster/nodes/n9", None, 400, "bad_request"),
        (
            "POST",
            "/v1/cluster/nodes",
            {"id": "n4", "http": "127.0.0.1:1", "raft": "127.0.0.1:2"},
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/cluster/nodes",
            {"id": "n5", "http": n4.http, "raft": "127.0.0.1:2"},
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/cluster/nodes",
            {"id": "n1", "http": n4.http, "raft": "127.0.0.1:2"},
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/cluster/nodes",
            {"id": "n4", "http": n4.http, "raft": "127.0.0.1:2"},
            400,
            "bad_request",
        ),
        ("POST", "/v1/cluster/nodes", [1, 2], 400, "bad_request"),
    ]
    for method, path, body, status, code in cases:
        r = c.session.request(method, c.url() + path, json=body, timeout=30)
        assert_error(r, status, code)
    r = c.session.post(c.url() + "/v1/cluster/nodes", data=b"{", timeout=30)
    assert_error(r, 400, "invalid_json")
    after = placement(c)
    assert after["placement"] == before["placement"] and after["change"] is None
    # Peers only: the placement of a metadata replica needs the peer key.
    assert c.get("/internal/placement").status_code == 401
    r = c.get("/internal/placement", headers={PEER_HEADER: PEER_KEY})
    assert r.status_code == 200 and r.json()["placement"] == before["placement"]


def test_retention_runs_where_a_queue_groups_leader_has_no_metadata_replica(tmp_path: Path) -> None:
    """Group 0 moves to n4, which holds no metadata replica, and n4 leads it: its retention ticks
    still run (n4 reads the topics from a node that has them)."""
    c = Cluster(
        tmp_path,
        nodes=4,
        queue_groups=3,
        extra_toml="[raft]\nretention_check_ms = 300\n",
        node_toml=lambda n: "join = true" if n == "n4" else "",
    )
    with c:
        c.start()
        c.wait_ready()
        wait_until(lambda: placement(c)["placement"], 30, what="the placement recorded")
        add_n4(c)
        run_change(c, "POST", "/v1/cluster/groups/0/move", {"from": "n1", "to": "n4"})
        wait_until(lambda: c.leader("0") == "n4", 30, what="n4 leading group 0")
        assert not group_dir(c, "n4", "meta").exists()
        groups = c.create_topic("aged", queues=3, retention_ms=1500)["queue_groups"]
        q = groups.index(0)
        for i in range(3):
            r = c.produce("aged", [{"value": f"old-{i}", "queue": q}])
            assert r.status_code == 200, r.text

        def low() -> int:
            r = c.get("/v1/topics/aged")
            assert r.status_code == 200, r.text
            return int(r.json()["queues"][q]["low_offset"])

        wait_until(lambda: low() == 3, 30, what="n4's retention tick removing the old messages")
        assert "retention_tick_failed" not in c.log("n4")
