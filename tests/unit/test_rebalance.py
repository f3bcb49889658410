"""The rebalance planner (``cluster/machines/rebalance.py``) and the ``rebalance`` change in the metadata
state machine (pure: no sockets, no clock)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from metadata_log import Meta
from test_placement import config

from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.placement import NodeAddr, Placement, static_placement
from raftmq.cluster.machines.rebalance import (
    LeaderChange,
    Move,
    leader_counts,
    next_leader_change,
    next_move,
    plan,
    replica_counts,
)


def placement(groups: dict[str, tuple[str, ...]], nodes: tuple[str, ...] | None = None) -> Placement:
    ids = nodes or tuple(sorted({i for r in groups.values() for i in r}))
    addrs = tuple(
        NodeAddr(i, f"127.0.0.1:{8000 + k}", f"127.0.0.1:{7000 + 100 * k}") for k, i in enumerate(ids)
    )
    return Placement(1, addrs, groups)


def with_new_node(queue_groups: int) -> Placement:
    """Three nodes with ``queue_groups`` queue groups (replication 3) and an empty n4 added."""
    p = static_placement(config(3, join=1, queue_groups=queue_groups))
    n4 = NodeAddr("n4", "127.0.0.1:8004", "127.0.0.1:7400")
    return Placement(p.version, (*p.nodes, n4), p.groups)


def spread(counts: dict[str, int]) -> int:
    return max(counts.values()) - min(counts.values())


def check_plan_is_sound(before: Placement, unavailable: frozenset[str] = frozenset()) -> Placement:
    """Every step of the plan is valid, the result is balanced; returns the placement after it."""
    result = plan(before, unavailable)
    current = dict(before.groups)
    for move in result.moves:
        assert move.group != META
        assert move.source in current[move.group] and move.target not in current[move.group], move
        assert unavailable.isdisjoint({move.source, move.target}), move
        current[move.group] = tuple(move.target if i == move.source else i for i in current[move.group])
    for change in result.leader_changes:
        assert current[change.group][0] == change.source and change.target in current[change.group]
        current[change.group] = (change.target, *(i for i in current[change.group] if i != change.target))
    after = result.after
    assert dict(after.groups) == current
    for g, ids in after.groups.items():
        assert sorted(ids) == sorted(set(ids)) and len(ids) == len(before.groups[g]), (g, ids)
    load = {i: n for i, n in replica_counts(after).items() if i not in unavailable}
    assert spread(load) <= 1, load
    for i in unavailable:
        assert replica_counts(after)[i] == replica_counts(before)[i]
    assert next_move(after, unavailable) is None and next_leader_change(after, unavailable) is None
    return after


@pytest.mark.parametrize(("queue_groups", "share"), [(4, 3), (8, 6)])
def test_a_new_empty_node_gets_its_share_of_replicas(queue_groups: int, share: int) -> None:
    # 3 nodes x (queue_groups + meta) replicas over 4 nodes: n4 takes the rounded-down share.
    before = with_new_node(queue_groups)
    assert replica_counts(before)["n4"] == 0
    result = plan(before)
    after = check_plan_is_sound(before)
    assert replica_counts(after)["n4"] == share
    assert len(result.moves) == share and all(m.target == "n4" for m in result.moves)
    assert spread(leader_counts(after)) <= 1 and leader_counts(after)["n4"] >= 1
    assert after.groups[META] == before.groups[META]  # meta counts but never moves


def test_moves_prefer_groups_the_source_does_not_lead() -> None:
    before = with_new_node(4)  # 0: n1 n2 n3, 1: n2 n3 n1, 2: n3 n1 n2, 3: n1 n2 n3
    assert plan(before).moves[:2] == (Move("1", "n1", "n4"), Move("0", "n2", "n4"))


def test_a_balanced_cluster_gets_an_empty_plan() -> None:
    for p in (
        static_placement(config(3, queue_groups=3)),
        static_placement(config(5, queue_groups=10)),
        placement({META: ("a", "b", "c"), "0": ("d", "a", "b"), "1": ("c", "d", "a")}),
    ):
        result = plan(p)
        assert result.empty and result.after == p, result
        assert result.to_json()["moves"] == [] and result.to_json()["leader_changes"] == []


def test_a_node_that_already_holds_a_group_cannot_take_it() -> None:
    # a: 4 replicas, b: 2; b holds 0 and 1 already, so only 2 or 3 can go to it.
    p = placement({"0": ("b", "a"), "1": ("b", "a"), "2": ("a",), "3": ("a",)})
    assert next_move(p) == Move("2", "a", "b")
    after = check_plan_is_sound(p)
    assert replica_counts(after) == {"a": 3, "b": 3}


def test_preferred_leaders_are_spread_by_reordering_replicas() -> None:
    groups = {g: ("n1", "n2", "n3") for g in ("0", "1", "2", "3", "4", "5")}
    p = placement({META: ("n1", "n2", "n3"), **groups})
    result = plan(p)
    assert result.moves == ()  # replicas are even already: only the order changes
    assert result.leader_changes[0] == LeaderChange("0", "n1", "n2")
    assert leader_counts(result.after) == {"n1": 2, "n2": 2, "n3": 2}
    assert result.after.groups[META] == ("n1", "n2", "n3")  # meta's leadership is left alone
    assert all(sorted(ids) == ["n1", "n2", "n3"] for ids in result.after.groups.values())


def test_nodes_that_do_not_answer_neither_give_nor_take() -> None:
    before = with_new_node(4)
    result = plan(before, frozenset({"n4"}))
    assert result.empty
    after = check_plan_is_sound(before, frozenset({"n3"}))
    assert replica_counts(after)["n3"] == 5 and replica_counts(after)["n4"] == 3
    nodes = {n["id"]: n for n in plan(before, frozenset({"n3"})).to_json()["nodes"]}
    assert nodes["n3"]["available"] is False and nodes["n4"]["replicas_after"] == 3


def test_the_plan_json_counts_replicas_and_leaders_before_and_after() -> None:
    data = plan(with_new_node(4)).to_json()
    assert [m["target"] for m in data["moves"]] == ["n4", "n4", "n4"]
    n4 = next(n for n in data["nodes"] if n["id"] == "n4")
    assert n4 == {
        "id": "n4",
        "replicas_before": 0,
        "replicas_after": 3,
        "leaders_before": 0,
        "leaders_after": 1,
        "available": True,
    }


def test_random_placements_end_balanced_and_valid() -> None:
    rng = random.Random(7)
    for _ in range(300):
        nodes = tuple(f"n{i}" for i in range(rng.randint(1, 7)))
        groups: dict[str, tuple[str, ...]] = {
            META: tuple(rng.sample(nodes, min(len(nodes), rng.randint(1, 5))))
        }
        for g in range(rng.randint(1, 12)):
            groups[str(g)] = tuple(rng.sample(nodes, rng.randint(1, min(3, len(nodes)))))
        down = frozenset(rng.sample(nodes, rng.randint(0, len(nodes) // 3)))
        check_plan_is_sound(placement(groups, nodes), down)


# -- the rebalance change in the metadata state machine ---------------------------------------------


def _begin(meta: Meta, **change: Any) -> int:
    result = meta("begin_change", now_ms=1, change=change)
    assert "change" in result, result
    return int(result["change"]["id"])


def _add_n4(meta: Meta) -> None:
    n4 = {"id": "n4", "http": "127.0.0.1:8004", "raft": "127.0.0.1:7400"}
    cid = _begin(meta, kind="add_node", node=n4)
    meta("add_node", change_id=cid, node=n4)
    meta("end_change", change_id=cid, now_ms=2, outcome="done")


def test_a_rebalance_carried_out_op_by_op_gives_the_planned_placement() -> None:
    """The coordinator's ops (as ``cluster/node/changes.py`` sends them) reach the plan's placement,
    each next step following from the recorded placement alone."""
    meta = Meta()
    meta("init_placement", placement=static_placement(config(3, join=1, queue_groups=4)).to_json())
    _add_n4(meta)
    planned = plan(meta.placement)
    cid = _begin(meta, kind="rebalance")
    assert meta.machine.change().kind == "rebalance"  # type: ignore[union-attr]
    refused = meta(
        "begin_change", now_ms=3, change={"kind": "move", "group": "0", "source": "n1", "target": "n4"}
    )
    assert refused["error"]["code"] == "change_in_progress"
    done: list[Move] = []
    while (move := next_move(meta.placement)) is not None:
        done.append(move)
        meta("change_phase", change_id=cid, phase="start", **move.to_json())
        meta("place_replica", change_id=cid, group=move.group, node=move.target, after=move.source)
        meta("unplace_replica", change_id=cid, group=move.group, node=move.source)
        meta("change_phase", change_id=cid, phase="next", group=None, source=None, target=None)
    leaders: list[LeaderChange] = []
    while (lead := next_leader_change(meta.placement)) is not None:
        leaders.append(lead)
        meta("prefer_leader", change_id=cid, group=lead.group, node=lead.target)
    ended = meta("end_change", change_id=cid, now_ms=4, outcome="done")["ended"]
    assert (ended["kind"], ended["outcome"]) == ("rebalance", "done")
    assert (tuple(done), tuple(leaders)) == (planned.moves, planned.leader_changes)
    assert dict(meta.placement.groups) == dict(planned.after.groups)


def test_a_rebalance_can_be_cancelled() -> None:
    meta = Meta()
    meta("init_placement", placement=static_placement(config(3, join=1)).to_json())
    cid = _begin(meta, kind="rebalance")
    assert meta("cancel_change", change_id=cid)["change"]["cancel"] is True
    ended = meta("end_change", change_id=cid, now_ms=4, outcome="failed", error="cancelled")["ended"]
    assert (ended["kind"], ended["cancel"], ended["outcome"]) == ("rebalance", True, "failed")
    assert meta.machine.change() is None
