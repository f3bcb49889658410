"""Power-loss nemeses: a node loses power, every write it never fsynced with it.

Each runs only on a cluster whose volumes are the power-loss file system
(``ChaosCluster(power_loss=True)``; the runner sets it when a run has one of these faults). A power
loss is ``kill -9`` of the node's container, then the file system puts back exactly what was
fsynced (:mod:`raftmq.chaos.powerloss_fs`); the stop starts the node again. The value recorded in
the history has each node's drop report (``dropped``: unsynced bytes, files reverted, directory
entries removed and restored), the figures docs/chaos.md shows.

| name | start | stop |
|---|---|---|
| power-loss | one node loses power | start it again |
| power-loss-leader | the leader of a random queue group loses power | start it again |
| power-loss-all | every node loses power at once (a whole-cluster outage) | start them all again |
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the figures are read without docker
    from .cluster import ChaosCluster

__all__ = [
    "POWER_LOSS_FAULTS",
    "power_loss_all",
    "power_loss_figures",
    "power_loss_leader",
    "power_loss_one",
    "power_restore",
]

Value = dict[str, Any]
POWER_LOSS_FAULTS = ("power-loss", "power-loss-leader", "power-loss-all")


def _cut(c: ChaosCluster, nodes: list[str]) -> Value:
    dropped = c.power_loss(nodes)
    return {"nodes": nodes, "dropped": dropped}


def power_loss_one(c: ChaosCluster, rng: random.Random) -> Value:
    return _cut(c, [rng.choice([n for n in c.node_ids if c.running(n)])])


def power_loss_leader(c: ChaosCluster, rng: random.Random) -> Value:
    group = rng.choice(c.groups()[1:])
    leader = c.leader(group)
    if leader is None:
        return {"group": group, "nodes": [], "note": "no leader to cut"}
    return {"group": group, **_cut(c, [leader])}


def power_loss_all(c: ChaosCluster, rng: random.Random) -> Value:
    return _cut(c, list(c.node_ids))


def power_restore(c: ChaosCluster, v: Value) -> None:
    c.restart_all(v.get("nodes", []))


def power_loss_figures(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each power loss of a history: its fault, id, and per node the unsynced bytes dropped."""
    return [
        {
            "fault": op["fault"],
            "fault_id": op["fault_id"],
            "dropped_bytes": {n: r.get("unsynced_bytes") for n, r in op["value"].get("dropped", {}).items()},
        }
        for op in ops
        if op.get("f") == "start" and op.get("fault") in POWER_LOSS_FAULTS and "value" in op
    ]
