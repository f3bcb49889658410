"""At-least-once under every nemesis: lost = unexpected = 0, one log, dense ordered queues.

Each test runs a cluster in containers under a group of nemeses (each injected at least once, on a
seeded schedule), heals, drains, checks the history and leaves its report in store/<test>/. The
crash and partition groups also consume through receive/ack (workload "both"): every acknowledged
message must be received and acked by the group at least once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftmq.chaos.nemesis import FAULTS, faults_for, parse_faults, time_for_each
from raftmq.chaos.runner import ChaosSpec, RunResult, run

QUIET_S = (2.0, 4.0)
FAULT_S = (5.0, 7.0)

# Groups that also run the receive/ack workload next to the offset consumers.
WITH_RECEIVERS = {"crashes", "partitions"}

GROUPS = {
    "crashes": ["kill", "kill-leader", "kill-majority", "isolate-kill-leader"],
    "partitions": ["partition-one", "partition-halves", "partition-bridge", "partition-leader"],
    "process-faults": ["pause", "clock-skew", "disk-full", "packet-loss"],
    # A node installs snapshots while its checkpoint fetches fail or stall (issue 12, item 3).
    "snapshot-installs": ["checkpoint-fetch"],
    # A leader's clock days ahead, on a topic with retention (issue 12, item 5).
    "clock-jumps": ["clock-jump-leader"],
    # Power loss: every write a node never fsynced is dropped with it (issue 22). One node, a
    # leader, the whole cluster at once.
    "power-losses": ["power-loss", "power-loss-leader", "power-loss-all"],
    # Strangers' idle, partial and garbage connections to every Raft port (issue 19, item 4).
    "raft-strangers": ["raft-strangers"],
}

# Groups that mix faults of GROUPS (each nemesis is in exactly one group above).
MIXED = {
    # Power losses while the network is cut and nodes are frozen.
    "power-losses-mixed": ["power-loss", "power-loss-all", "partition-halves", "pause"],
}

# Settings of a group's run beyond its faults. clock-jumps: retention of 6 hours (nothing the run
# writes is due by the true time; a leader 3 days ahead must not remove it) ticked every 0.5 s.
SETTINGS: dict[str, dict[str, object]] = {
    "clock-jumps": {"retention_ms": 6 * 3600 * 1000, "env": {"RAFTMQ_RAFT_RETENTION_CHECK_MS": "500"}},
    # Production load through the client's batch path during the power losses (chaos/load.py).
    "power-losses": {"load_rate": 10_000},
}


def test_the_groups_cover_every_nemesis() -> None:
    assert sorted(f for group in GROUPS.values() for f in group) == sorted(FAULTS)


def test_one_node_runs_the_faults_that_need_no_peer() -> None:
    """A one-node topology: ``all`` and the shorthands leave out what needs peers (partitions,
    packet loss, a minority's clocks apart from the others', compaction by the others), and naming
    such a fault is refused, by the runner too, before any container starts. A leader's clock days
    ahead needs no peer (the state machine bounds its group's time; the heal restarts the node)."""
    alone = ["kill", "kill-leader", "kill-majority", "pause", "clock-jump-leader", "disk-full"]
    alone += ["power-loss", "power-loss-leader", "power-loss-all", "raft-strangers"]
    assert faults_for(1) == alone
    assert parse_faults("all", 1) == alone and parse_faults("partition", 1) == []
    assert parse_faults("power-losses", 1) == GROUPS["power-losses"]
    assert faults_for(3) == faults_for(5) == list(FAULTS) == parse_faults("all")
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        parse_faults("kill,partition-one", 1)
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        run(ChaosSpec(nodes=1, faults=("power-loss", "packet-loss"), store=Path("/nonexistent")))
    with pytest.raises(ValueError, match="1, 3, 5 nodes, not 2"):
        faults_for(2)


@pytest.mark.parametrize(
    ("nodes", "faults", "refusal"),
    [
        # Shorthands are the CLI's (parse_faults expands them); the runner takes fault names, and
        # "all" would have passed its check only to fail looking itself up at the fault's time.
        (3, ("kill", "all"), "unknown nemesis 'all'"),
        (1, ("kills",), "unknown nemesis 'kills'"),
        (1, ("partition-one",), "needs at least 2 nodes, not 1"),
        # A topology the cluster does not have is refused with no fault to look at.
        (2, (), "1, 3, 5 nodes, not 2"),
        (4, (), "1, 3, 5 nodes, not 4"),
    ],
)
def test_the_runner_refuses_a_spec_before_any_container_starts(
    nodes: int, faults: tuple[str, ...], refusal: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=refusal):
        run(ChaosSpec(nodes=nodes, faults=faults, store=tmp_path))
    assert not any(tmp_path.iterdir()), "the run began (its report directory exists)"


def run_chaos(
    name: str,
    faults: list[str],
    store: Path,
    nodes: int = 3,
    seed: int = 1,
    quiet_s: tuple[float, float] = QUIET_S,
    fault_s: tuple[float, float] = FAULT_S,
    **kw: object,
) -> RunResult:
    spec = ChaosSpec(
        name=name,
        nodes=nodes,
        faults=tuple(faults),
        time_limit_s=time_for_each(faults, quiet_s, fault_s),
        seed=seed,
        quiet_s=quiet_s,
        fault_s=fault_s,
        store=store,
        **kw,  # type: ignore[arg-type]
    )
    result = run(spec)
    print((result.directory / "summary.txt").read_text())
    assert set(result.results["run"]["faults_injected"]) == set(faults), "every nemesis must have run"
    return result


def assert_at_least_once(result: RunResult) -> None:
    run_info, checks = result.results["run"], result.checks
    where = f"see {result.directory}/summary.txt"
    assert run_info["recovery_s"] is not None, f"the cluster did not recover after the heal; {where}"
    assert run_info["drain"]["complete"], f"the drain did not finish; {where}"
    tq = checks["total_queue"]
    assert tq["acknowledged_count"] > 0, f"nothing was acknowledged: the test tested nothing; {where}"
    assert (tq["lost_count"], tq["unexpected_count"]) == (0, 0), (
        f"lost {tq['lost']}, unexpected {tq['unexpected']}"
    )
    assert checks["log_consistency"]["valid"], f"divergent logs: {checks['log_consistency']['divergent']}"
    assert checks["queue_order"]["valid"], f"order: {checks['queue_order']['problems']}"
    assert checks["lost_write"]["valid"], f"lost writes: {checks['lost_write']['lost']}"
    lagging = run_info["replicas"]["lagging_replicas"]
    assert not lagging, f"replicas still behind 20 s after the drain (queue@node: high offset): {lagging}"
    if "receive_ack" in checks:
        assert_received_at_least_once(result)
    if "load" in run_info:
        assert run_info["load"]["acknowledged"] > 0, f"the production load got nothing acknowledged; {where}"
    if "group_consume" in checks:
        assert_group_committed_prefix(result)
    tracebacks = {n: a["traceback"] for n, a in run_info["log_alerts"].items() if a.get("traceback")}
    assert not tracebacks, f"unexplained tracebacks in the node logs (node: count): {tracebacks}; {where}"
    assert result.valid


def assert_received_at_least_once(result: RunResult) -> None:
    rx, drain = result.checks["receive_ack"], result.results["run"]["receive_drain"]
    assert drain["complete"], f"the group did not finish every queue: {drain}"
    assert rx["received_count"] > 0, "nothing was received: the test tested nothing"
    assert (rx["lost_count"], rx["unexpected_count"]) == (0, 0), (
        f"receive/ack lost {rx['lost']}, unexpected {rx['unexpected']}"
    )
    assert rx["never_acked_count"] == 0, f"finished without an ack: {rx['never_acked']}"
    assert rx["divergent_count"] == 0, f"one position handed out with two values: {rx['divergent']}"


def assert_group_committed_prefix(result: RunResult) -> None:
    """The load's consumer group: something consumed and committed, no acknowledged message below
    the final committed offset unconsumed, no committed offset read going back."""
    group = result.checks["group_consume"]
    assert group["consumed_count"] > 0 and group["committed_total"] > 0, (
        f"the group consumed nothing: {group}"
    )
    assert group["skipped_count"] == 0, f"committed past unconsumed messages: {group['skipped']}"
    assert group["backwards_count"] == 0, f"committed offsets went back: {group['backwards']}"
    assert (group["divergent_count"], group["unexpected_count"]) == (0, 0), group


def assert_strangers_were_refused(result: RunResult) -> None:
    """The raft-strangers nemesis reached the Raft ports: every node closed strangers' connections
    (at once over the per-source cap, at the deadline, or on a garbage frame), and counted them."""
    history = [json.loads(line) for line in (result.directory / "history.jsonl").read_text().splitlines()]
    stops = [op for op in history if op.get("f") == "stop" and op.get("fault") == "raft-strangers"]
    assert stops, "the raft-strangers nemesis never stopped"
    for op in stops:
        value = op["value"]
        assert value["strangers"]["closed_by_node"] > 0, value
        for node, counts in value["refused"].items():
            assert "error" not in counts, f"{node}: {counts}"
            for reason in ("source_limit", "auth_timeout", "bad_frame"):
                assert counts[reason] > 0, f"{node} refused no connection for {reason}: {value}"


EXTRA_CHECKS = {"raft-strangers": assert_strangers_were_refused}


@pytest.mark.parametrize("group", sorted(GROUPS) + sorted(MIXED))
def test_at_least_once_under(group: str, chaos_images: str, store: Path) -> None:
    workload = "both" if group in WITH_RECEIVERS else "queue"
    settings = SETTINGS.get(group, {})
    faults = GROUPS.get(group) or MIXED[group]
    result = run_chaos(f"suite-{group}", faults, store, workload=workload, **settings)
    assert_at_least_once(result)
    if group in EXTRA_CHECKS:
        EXTRA_CHECKS[group](result)


def test_at_least_once_on_five_nodes_under_partitions_and_majority_kills(
    chaos_images: str, store: Path
) -> None:
    faults = ["partition-bridge", "partition-halves", "kill-majority", "pause"]
    assert_at_least_once(run_chaos("suite-five-nodes", faults, store, nodes=5, producers=20, rate=100))


# One node (replication 1): the node is every group's lone voter, which counts itself a majority
# and commits alone (the deadline poll that does not sleep, the flush at each tick's start:
# docs/architecture.md). Its power is cut every 3-5 s, for 1-2 s, under the production load;
# the three power losses are one fault here (the node is the leader and the whole cluster).
ONE_NODE_QUIET_S, ONE_NODE_FAULT_S = (2.0, 3.0), (1.0, 2.0)


def test_at_least_once_on_one_node_under_power_losses(chaos_images: str, store: Path) -> None:
    faults = GROUPS["power-losses"]
    result = run_chaos("suite-one-node-power-losses", faults, store, nodes=1, quiet_s=ONE_NODE_QUIET_S,
                       fault_s=ONE_NODE_FAULT_S, **SETTINGS["power-losses"])  # fmt: skip
    assert_at_least_once(result)
    # A cut drops unsynced bytes: a loss that dropped none (all its volumes' counts 0) cut nothing.
    cuts = [
        p
        for p in result.results["run"]["power_losses"]
        if sum(b or 0 for b in p["dropped_bytes"].values()) > 0
    ]
    assert len(cuts) >= 3, f"the node lost power {len(cuts)} times: {result.results['run']['power_losses']}"
