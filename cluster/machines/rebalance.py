"""The rebalance plan: which replicas move and which preferred leaders change. Pure: no I/O, no clock.

A ``rebalance`` change (``cluster/machines/placement.py``) is carried out one step at a time by the
coordinator (``cluster/node/changes.py``); before each step it asks this module for the next one, given
the placement as the metadata group has it now. Nothing but the placement decides a step, so the
next metadata leader continues a rebalance exactly where the last one stopped, and :func:`plan`
(the same steps on a copy of the placement) is what the change will do.

Replicas. A node's load is the number of replicas it holds, the metadata group's included (it
costs a node like any other, and it is movable: ``raftmq cluster move meta``, and a removed node's
``meta`` replica moves last). While the most loaded node holds at least two more than the least
loaded node, a queue group's replica moves from the former to the latter. Such a
group always exists, so the metadata group itself never has to move: a node holds at most one
replica of a group, so with ``meta`` counted as one, a node with two more replicas than another
holds at least one queue group more, hence one that the other lacks. A group whose preferred leader
is not the source goes first (no leadership hand-over during the move), then one the source leads.
Every move lowers the sum of the squared loads, so the moves end, with the loads at most one apart.
Nodes that do not answer are left out: they neither give nor take replicas.

Preferred leaders. Then, while a node is the preferred leader (first replica) of at least two
queue groups more than another node holding a replica of one of them, that replica is made the
group's preferred leader (``prefer_leader``: a reordering, no data moves); the leader balancer
hands it the leadership once the change has ended. Only queue groups count: the leader balancer
leaves the metadata group's leadership where it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.placement import Placement

__all__ = [
    "LeaderChange",
    "Move",
    "Plan",
    "leader_counts",
    "moved",
    "next_leader_change",
    "next_move",
    "plan",
    "preferred",
    "replica_counts",
]


@dataclass(frozen=True)
class _Step:
    group: str
    source: str
    target: str

    def to_json(self) -> dict[str, str]:
        return {"group": self.group, "source": self.source, "target": self.target}


class Move(_Step):
    """Group ``group``'s replica moves from ``source`` to ``target`` (add, catch up, remove)."""


class LeaderChange(_Step):
    """Group ``group``'s preferred leader changes from ``source`` to ``target`` (a replica of it)."""


@dataclass(frozen=True)
class Plan:
    """The steps of a rebalance, and the per-node counts before and after them."""

    moves: tuple[Move, ...]
    leader_changes: tuple[LeaderChange, ...]
    before: Placement
    after: Placement
    unavailable: frozenset[str]

    @property
    def empty(self) -> bool:
        return not self.moves and not self.leader_changes

    def to_json(self) -> dict[str, Any]:
        replicas = (replica_counts(self.before), replica_counts(self.after))
        leaders = (leader_counts(self.before), leader_counts(self.after))
        return {
            "moves": [m.to_json() for m in self.moves],
            "leader_changes": [c.to_json() for c in self.leader_changes],
            "nodes": [
                {
                    "id": n.id,
                    "replicas_before": replicas[0][n.id],
                    "replicas_after": replicas[1][n.id],
                    "leaders_before": leaders[0][n.id],
                    "leaders_after": leaders[1][n.id],
                    "available": n.id not in self.unavailable,
                }
                for n in self.before.nodes
            ],
        }


def replica_counts(p: Placement) -> dict[str, int]:
    """Replicas per node of the node list, every group counted (the metadata group too)."""
    load = {n.id: 0 for n in p.nodes}
    for ids in p.groups.values():
        for i in ids:
            if i in load:
                load[i] += 1
    return load


def leader_counts(p: Placement) -> dict[str, int]:
    """Queue groups per node of the node list that have it as their preferred leader."""
    count = {n.id: 0 for n in p.nodes}
    for g, ids in p.groups.items():
        if g != META and ids and ids[0] in count:
            count[ids[0]] += 1
    return count


def next_move(p: Placement, unavailable: frozenset[str] = frozenset()) -> Move | None:
    """The next replica move, or None when the loads are even. ``unavailable`` nodes (not
    answering) are left as they are: they neither give nor take a replica (moving replicas off a
    dead node is a node removal's job)."""
    load = replica_counts(p)
    order = [n.id for n in p.nodes if n.id not in unavailable]
    if not order:
        return None
    source = max(order, key=lambda i: load[i])  # ties: the first in the node list
    target = min(order, key=lambda i: load[i])
    if load[source] - load[target] < 2:
        return None
    # Never empty (see the module docstring); checked all the same.
    candidates = [g for g, ids in p.groups.items() if g != META and source in ids and target not in ids]
    if not candidates:
        return None
    group = min(candidates, key=lambda g: (p.groups[g][0] == source, _group_key(g)))
    return Move(group, source, target)


def next_leader_change(p: Placement, unavailable: frozenset[str] = frozenset()) -> LeaderChange | None:
    """The next preferred-leader change, or None when they are as even as reorderings make them."""
    count = leader_counts(p)
    order = [n.id for n in p.nodes if n.id not in unavailable]
    sources = sorted(order, key=lambda i: -count[i])  # stable: ties keep the node list's order
    targets = sorted(order, key=lambda i: count[i])
    for source in sources:
        for target in targets:
            if count[source] - count[target] < 2:
                break
            led = [g for g, ids in p.groups.items() if g != META and ids[0] == source and target in ids]
            if led:
                return LeaderChange(min(led, key=_group_key), source, target)
    return None


def moved(p: Placement, move: Move) -> Placement:
    """``p`` after ``move``: the target takes the source's place in the replica list (as the
    ``place_replica`` after the source, then ``unplace_replica`` of the source, of a move do)."""
    ids = tuple(move.target if i == move.source else i for i in p.replicas(move.group))
    return replace(p, groups={**p.groups, move.group: ids})


def preferred(p: Placement, change: LeaderChange) -> Placement:
    """``p`` after ``change``: the target first, the others in their order (as ``prefer_leader``)."""
    ids = p.replicas(change.group)
    first = (change.target, *(i for i in ids if i != change.target))
    return replace(p, groups={**p.groups, change.group: first})


def plan(p: Placement, unavailable: frozenset[str] = frozenset()) -> Plan:
    """Every step a rebalance starting from ``p`` takes (unless the placement or the nodes that
    answer change meanwhile): the moves, then the preferred-leader changes."""
    moves: list[Move] = []
    current = p
    while (move := next_move(current, unavailable)) is not None:
        moves.append(move)
        current = moved(current, move)
    changes: list[LeaderChange] = []
    while (change := next_leader_change(current, unavailable)) is not None:
        changes.append(change)
        current = preferred(current, change)
    return Plan(tuple(moves), tuple(changes), p, current, unavailable)


def _group_key(g: str) -> tuple[int, str]:
    return (len(g), g)  # "2" before "10"
