"""Where the Raft groups live, and the one cluster change in progress. Pure: no I/O, no clock.

The metadata group replicates a :class:`Placement` (the nodes with their addresses, and each
group's replicas, the preferred leader first) and at most one :class:`Change`. The placement is
seeded once from the cluster file (``init_placement``, :func:`static_placement`); every later
change goes through ``begin_change`` → steps → ``end_change``, so changes are serialized: a second
``begin_change`` is refused with ``change_in_progress`` until the first ends. The coordinator
(``cluster/node/changes.py``) drives the steps; each step op names the change it belongs to, so a stale
coordinator cannot touch a later change.

Metadata ops of this module (ONLY ADD TO THE END; see ``cluster/machines/metadata.py``)::

    {"op": "init_placement", "placement": placement}
    {"op": "begin_change", "now_ms": u64, "change": {"kind": "move", "group", "source", "target"}
                                                   | {"kind": "transfer_leader", "group", "target"}
                                                   | {"kind": "add_node", "node": {"id","http","raft"}}
                                                   | {"kind": "remove_node", "node": id}
                                                   | {"kind": "rebalance"}}
    {"op": "change_phase", "change_id", "phase", "group"?, "source"?, "target"?}
    {"op": "place_replica", "change_id", "group", "node", "after"?: id}
    {"op": "unplace_replica", "change_id", "group", "node"}
    {"op": "prefer_leader", "change_id", "group", "node"}
    {"op": "add_node", "change_id", "node": {"id", "http", "raft"}}
    {"op": "remove_node", "change_id", "node"}
    {"op": "end_change", "change_id", "now_ms", "outcome": "done" | "failed", "error"?: str}
    {"op": "cancel_change", "change_id"}     (the coordinator then rolls the change back or ends it)

Invariants: replicas of a group are distinct nodes of the node list; a group keeps at least one
replica; a node hosting a replica is never removed; ``version`` grows with every placement change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.cluster_file import ClusterConfig, NodeConfig

__all__ = [
    "OPS",
    "Change",
    "NodeAddr",
    "Placement",
    "apply_op",
    "overlay",
    "pick_target",
    "static_placement",
]

MAX_HISTORY = 20
# ONLY ADD TO THE END: op names are part of the metadata group's log.
OPS = (
    "init_placement",
    "begin_change",
    "change_phase",
    "place_replica",
    "unplace_replica",
    "prefer_leader",
    "add_node",
    "remove_node",
    "end_change",
    "cancel_change",
)
KINDS = ("move", "transfer_leader", "add_node", "remove_node", "rebalance")
_NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass(frozen=True)
class NodeAddr:
    id: str
    http: str
    raft: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "http": self.http, "raft": self.raft}


@dataclass(frozen=True)
class Placement:
    version: int
    nodes: tuple[NodeAddr, ...]
    groups: Mapping[str, tuple[str, ...]]  # "meta", "0", "1", ... -> node ids, preferred leader first

    def node(self, node_id: str) -> NodeAddr | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def replicas(self, group: str) -> tuple[str, ...]:
        return self.groups.get(group, ())

    def groups_on(self, node_id: str) -> list[str]:
        return [g for g, ids in self.groups.items() if node_id in ids]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "nodes": [n.to_json() for n in self.nodes],
            "groups": {g: list(ids) for g, ids in self.groups.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placement:
        return cls(
            version=int(d["version"]),
            nodes=tuple(NodeAddr(str(n["id"]), str(n["http"]), str(n["raft"])) for n in d["nodes"]),
            groups={str(g): tuple(str(i) for i in ids) for g, ids in d["groups"].items()},
        )

    def _with(self, **changes: Any) -> Placement:
        return replace(self, version=self.version + 1, **changes)


@dataclass(frozen=True)
class Change:
    """The change in progress. For ``remove_node`` and ``rebalance``, ``group``/``source``/
    ``target``/``phase`` describe the replica move under way (none between moves). A rebalance
    records no plan: each next step follows from the placement (``cluster/machines/rebalance.py``)."""

    id: int
    kind: str
    started_ms: int
    phase: str = "start"
    group: str | None = None
    source: str | None = None
    target: str | None = None
    node: str | None = None  # add_node / remove_node
    new_node: NodeAddr | None = None  # add_node
    cancel: bool = False  # cancel_change asked for; the coordinator rolls back what it can

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "new_node"}
        out["new_node"] = self.new_node.to_json() if self.new_node else None
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Change:
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "new_node"}
        n = d.get("new_node")
        return cls(**fields, new_node=NodeAddr(n["id"], n["http"], n["raft"]) if n else None)


def static_placement(config: ClusterConfig) -> Placement:
    """The first placement, computed from the cluster file (nodes marked ``join`` left out)."""
    nodes = config.bootstrap_nodes
    groups = {META: tuple(n.id for n in config.metadata_voters)}
    for g in range(config.queue_groups):
        groups[str(g)] = tuple(n.id for n in config.group_replicas(g))
    return Placement(1, tuple(NodeAddr(n.id, n.http, n.raft) for n in nodes), groups)


def overlay(config: ClusterConfig, placement: Placement, me: str) -> ClusterConfig:
    """``config`` (the cluster file) with the placement's nodes and replicas. A node the file lists
    keeps its settings (and gets the placement's addresses); other nodes inherit ``me``'s TLS
    switch, since HTTPS is on for every node or for none."""
    mine = config.node(me)
    known = {n.id: n for n in config.nodes}
    nodes = []
    for n in placement.nodes:
        base = known.get(n.id) or NodeConfig(
            n.id, n.http, n.raft, "", tls_cert_file=mine.tls_cert_file, tls_key_file=mine.tls_key_file
        )
        nodes.append(replace(base, http=n.http, raft=n.raft))
    if placement.node(me) is None:
        nodes.append(mine)  # removed from the cluster: this node still needs its own entry
    return replace(config, nodes=tuple(nodes), replica_map=dict(placement.groups))


def pick_target(placement: Placement, group: str, exclude: set[str]) -> str | None:
    """The node to take a replica of ``group``: not hosting it, not excluded, hosting the fewest
    replicas (ties: the node list's order). None when there is none."""
    load = {n.id: 0 for n in placement.nodes}
    for ids in placement.groups.values():
        for i in ids:
            load[i] = load.get(i, 0) + 1
    hosts = set(placement.replicas(group))
    candidates = [n.id for n in placement.nodes if n.id not in hosts and n.id not in exclude]
    return min(candidates, key=lambda i: load[i], default=None)


def apply_op(
    placement: Placement | None, change: Change | None, next_change_id: int, cmd: dict[str, Any]
) -> tuple[dict[str, Any], Placement | None, Change | None, dict[str, Any] | None]:
    """Apply one placement op: (result, placement, change, finished change record or None).

    Raises:
        Refused: the op is invalid or not allowed now; nothing changes.
    """
    op = cmd.get("op")
    if op == "init_placement":
        if placement is not None:
            return {"placement": placement.to_json(), "created": False}, placement, change, None
        p = _parse_placement(cmd.get("placement"))
        return {"placement": p.to_json(), "created": True}, p, change, None
    if placement is None:
        raise Refused(errors.UNAVAILABLE, "the cluster placement is not initialised yet")
    if op == "begin_change":
        if change is not None:
            raise Refused(
                errors.CHANGE_IN_PROGRESS,
                f"change {change.id} ({change.kind}) is in progress",
                change=change.to_json(),
            )
        new = _begin(placement, next_change_id, cmd)
        return {"change": new.to_json()}, placement, new, None
    if change is None or cmd.get("change_id") != change.id:
        raise Refused(errors.BAD_REQUEST, f"change {cmd.get('change_id')!r} is not the change in progress")
    if op == "end_change":
        outcome = cmd.get("outcome")
        if outcome not in ("done", "failed"):
            raise Refused(errors.BAD_REQUEST, "outcome must be 'done' or 'failed'")
        record = {
            **change.to_json(),
            "outcome": outcome,
            "error": cmd.get("error"),
            "ended_ms": _uint(cmd, "now_ms"),
        }
        return {"ended": record}, placement, None, record
    if op == "cancel_change":
        new_change = replace(change, cancel=True)
        return {"change": new_change.to_json()}, placement, new_change, None
    if op == "change_phase":
        fields: dict[str, Any] = {k: cmd.get(k) for k in ("group", "source", "target") if k in cmd}
        if not all(v is None or isinstance(v, str) for v in fields.values()):
            raise Refused(errors.BAD_REQUEST, "group, source and target must be strings or null")
        new_change = replace(change, phase=_str(cmd, "phase"), **fields)
        return {"change": new_change.to_json()}, placement, new_change, None
    p = _step(placement, op, cmd)
    return {"placement": p.to_json()}, p, change, None


def _step(p: Placement, op: Any, cmd: dict[str, Any]) -> Placement:
    if op == "add_node":
        node = _parse_node(cmd.get("node"))
        if p.node(node.id) == node:
            return p
        _check_new_node(p, node)
        return p._with(nodes=(*p.nodes, node))
    if op == "remove_node":
        node_id = _str(cmd, "node")
        if p.node(node_id) is None:
            return p
        if p.groups_on(node_id):
            raise Refused(errors.BAD_REQUEST, f"node {node_id} still hosts {', '.join(p.groups_on(node_id))}")
        return p._with(nodes=tuple(n for n in p.nodes if n.id != node_id))
    group, node_id = _str(cmd, "group"), _str(cmd, "node")
    if group not in p.groups:
        raise Refused(errors.BAD_REQUEST, f"no group {group!r}")
    ids = list(p.replicas(group))
    if op == "place_replica":
        if node_id in ids:
            return p
        if p.node(node_id) is None:
            raise Refused(errors.BAD_REQUEST, f"no node {node_id!r}")
        after = cmd.get("after")
        ids.insert(ids.index(after) + 1 if after in ids else len(ids), node_id)
    elif op == "unplace_replica":
        if node_id not in ids:
            return p
        if len(ids) == 1:
            raise Refused(errors.BAD_REQUEST, f"{node_id} is the last replica of group {group}")
        ids.remove(node_id)
    elif op == "prefer_leader":
        if node_id not in ids:
            raise Refused(errors.BAD_REQUEST, f"{node_id} hosts no replica of group {group}")
        if ids[0] == node_id:
            return p
        ids.remove(node_id)
        ids.insert(0, node_id)
    else:
        raise Refused(errors.BAD_REQUEST, f"unknown op {op!r}")
    return p._with(groups={**p.groups, group: tuple(ids)})


def _begin(p: Placement, change_id: int, cmd: dict[str, Any]) -> Change:
    spec = cmd.get("change")
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        raise Refused(errors.BAD_REQUEST, f"change must be an object with kind one of {', '.join(KINDS)}")
    kind, now_ms = spec["kind"], _uint(cmd, "now_ms")
    if kind == "add_node":
        node = _parse_node(spec.get("node"))
        _check_new_node(p, node)
        return Change(change_id, kind, now_ms, node=node.id, new_node=node)
    if kind == "remove_node":
        node_id = _known_node(p, _str(spec, "node"))
        if len(p.nodes) == 1:
            raise Refused(errors.BAD_REQUEST, "the last node of a cluster cannot be removed")
        for group in p.groups_on(node_id):
            if pick_target(p, group, {node_id}) is None:
                raise Refused(
                    errors.BAD_REQUEST,
                    f"no node can take {node_id}'s replica of group {group}; add one first",
                )
        return Change(change_id, kind, now_ms, node=node_id)
    if kind == "rebalance":
        return Change(change_id, kind, now_ms)
    group = _str(spec, "group")
    if group not in p.groups:
        raise Refused(errors.BAD_REQUEST, f"no group {group!r}")
    target = _known_node(p, _str(spec, "target"))
    if kind == "transfer_leader":
        if target not in p.replicas(group):
            raise Refused(errors.BAD_REQUEST, f"{target} hosts no replica of group {group}")
        return Change(change_id, kind, now_ms, group=group, target=target)
    source = _known_node(p, _str(spec, "source"))
    if source not in p.replicas(group):
        raise Refused(errors.BAD_REQUEST, f"{source} hosts no replica of group {group}")
    if target in p.replicas(group):
        raise Refused(errors.BAD_REQUEST, f"{target} already hosts a replica of group {group}")
    return Change(change_id, kind, now_ms, group=group, source=source, target=target)


def _known_node(p: Placement, node_id: str) -> str:
    if p.node(node_id) is None:
        raise Refused(errors.BAD_REQUEST, f"no node {node_id!r} in the cluster")
    return node_id


def _check_new_node(p: Placement, node: NodeAddr) -> None:
    for n in p.nodes:
        if n.id == node.id:
            raise Refused(errors.BAD_REQUEST, f"node {node.id} is already in the cluster")
        if n.http == node.http or n.raft == node.raft:
            raise Refused(
                errors.BAD_REQUEST,
                f"node {n.id} already uses {node.http if n.http == node.http else node.raft}",
            )


def _parse_node(raw: Any) -> NodeAddr:
    if not isinstance(raw, dict) or set(raw) != {"id", "http", "raft"}:
        raise Refused(errors.BAD_REQUEST, 'node must be {"id", "http", "raft"}')
    if not isinstance(raw["id"], str) or not _NODE_ID.match(raw["id"]):
        raise Refused(errors.BAD_REQUEST, "node id must be 1-32 characters of A-Z a-z 0-9 _ -")
    for key in ("http", "raft"):
        if not isinstance(raw[key], str) or not _valid_addr(raw[key]):
            raise Refused(errors.BAD_REQUEST, f"node {key} must be host:port")
    return NodeAddr(raw["id"], raw["http"], raw["raft"])


def _parse_placement(raw: Any) -> Placement:
    try:
        p = Placement.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise Refused(errors.BAD_REQUEST, "placement must be {version, nodes, groups}") from None
    ids = [n.id for n in p.nodes]
    if not ids or len(set(ids)) != len(ids):
        raise Refused(errors.BAD_REQUEST, "placement nodes must be distinct and not empty")
    for group, replicas in p.groups.items():
        if not replicas or len(set(replicas)) != len(replicas) or not set(replicas) <= set(ids):
            raise Refused(
                errors.BAD_REQUEST, f"group {group}: replicas must be distinct nodes of the placement"
            )
    return p


def _valid_addr(addr: str) -> bool:
    """host:port. The apply's rule, kept as it was for the log's old entries and a rolling upgrade:
    any decimal digits int() reads (the API takes ASCII ones only); digits int() cannot read, such as
    a superscript two, are no port (an error inside the apply before)."""
    host, sep, port = addr.rpartition(":")
    try:
        return bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535)
    except ValueError:
        return False


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise Refused(errors.BAD_REQUEST, f"{key} must be a non-empty string")
    return v


def _uint(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise Refused(errors.BAD_REQUEST, f"{key} must be a non-negative integer")
    return v


def command(op: str, **fields: Any) -> dict[str, Any]:
    """A placement op as a metadata command object (the caller serializes it)."""
    assert op in OPS, op
    return {"v": 1, "op": op, **fields}
