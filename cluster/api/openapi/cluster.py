"""OpenAPI entries of cluster changes (``cluster/api/handlers/cluster.py``, docs/operations.md)."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.openapi.base import (
    RAFT_ERRORS,
    Schema,
    _array,
    _errors,
    _int,
    _json,
    _nullable,
    _obj,
    _op,
    _param,
    _ref,
    _str,
)

NODE_ID = _str(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="A node id.")
ADDRESS = _str(minLength=1, maxLength=300, description="host:port")
GROUP_NAME = _param(
    "group",
    "path",
    _str(pattern=r"^(meta|[0-9]{1,3})$"),
    "A queue group id, or `meta` for the metadata group.",
)


def _cluster_schemas() -> dict[str, Schema]:
    node = _obj({"id": NODE_ID, "http": ADDRESS, "raft": ADDRESS}, required=("id", "http", "raft"))
    change_props: dict[str, Schema] = {
        "id": _int(1),
        "kind": {"enum": ["move", "transfer_leader", "add_node", "remove_node", "rebalance"]},
        "started_ms": _int(0),
        "phase": _str(description="The step under way (see docs/operations.md)."),
        "group": _nullable(_str()),
        "source": _nullable(_str()),
        "target": _nullable(_str()),
        "node": _nullable(_str()),
        "new_node": _nullable(_ref("NodeAddress")),
        "cancel": {"type": "boolean", "description": "Cancelling: rolled back as far as it can go."},
    }
    required = ("id", "kind", "started_ms", "phase")
    return {
        "NodeAddress": node,
        "Placement": _obj(
            {
                "version": _int(1),
                "nodes": _array(_ref("NodeAddress")),
                "groups": {
                    "type": "object",
                    "additionalProperties": _array(_str()),
                    "description": "Group (`meta`, `0`, `1`, ...) -> node ids, the preferred leader first.",
                },
            },
            required=("version", "nodes", "groups"),
        ),
        "Change": _obj(change_props, required=required),
        "FinishedChange": _obj(
            {
                **change_props,
                "outcome": {"enum": ["done", "failed"]},
                "error": _nullable(_str()),
                "ended_ms": _int(0),
            },
            required=(*required, "outcome", "ended_ms"),
        ),
        "ClusterPlacement": _obj(
            {
                "placement": _nullable(_ref("Placement")),
                "change": _nullable(_ref("Change")),
                "history": _array(_ref("FinishedChange"), description="The last changes, oldest first."),
            },
            required=("placement", "change", "history"),
        ),
        "ChangeAccepted": _obj({"change": _ref("Change")}, required=("change",)),
        "RebalancePlan": _rebalance_plan(),
        "RebalanceDryRun": _obj({"plan": _ref("RebalancePlan")}, required=("plan",)),
        "RebalanceAccepted": _obj(
            {"change": _ref("Change"), "plan": _ref("RebalancePlan")}, required=("change", "plan")
        ),
    }


def _rebalance_plan() -> Schema:
    fields = ("group", "source", "target")
    step = _obj({"group": _str(), "source": NODE_ID, "target": NODE_ID}, required=fields)
    count = _int(0)
    node = _obj(
        {
            "id": NODE_ID,
            "replicas_before": count,
            "replicas_after": count,
            "leaders_before": count,
            "leaders_after": count,
            "available": {
                "type": "boolean",
                "description": "false: it did not answer; it neither gives nor takes replicas.",
            },
        },
        required=("id", "replicas_before", "replicas_after", "leaders_before", "leaders_after", "available"),
    )
    return _obj(
        {
            "moves": _array(step, description="Replica moves, in order (each: add, catch up, remove)."),
            "leader_changes": _array(
                step, description="Then preferred-leader changes of queue groups (replicas reordered)."
            ),
            "nodes": _array(
                node,
                description="Per node: replicas (every group, `meta` too) and preferred leaderships "
                "(queue groups) before and after the plan.",
            ),
        },
        required=("moves", "leader_changes", "nodes"),
        description="What a rebalance does, from the placement as it is now. Empty: already balanced.",
    )


def _cluster_paths() -> dict[str, Any]:
    accepted = {"202": _json(_ref("ChangeAccepted"), "the change is recorded; see GET /v1/cluster/placement")}
    refused = _errors(400, 409, *RAFT_ERRORS)
    return {
        "/v1/cluster/placement": {
            "get": _op(
                "getPlacement",
                "The nodes, each group's replicas, the change in progress and the last changes",
                {"200": _json(_ref("ClusterPlacement"), "placement"), **_errors(*RAFT_ERRORS)},
            )
        },
        "/v1/cluster/nodes": {
            "post": _op(
                "addNode",
                "Add a running node to the cluster (it then hosts nothing until replicas move to it)",
                {**accepted, **refused},
                body=_ref("NodeAddress"),
            )
        },
        "/v1/cluster/nodes/{node}": {
            "delete": _op(
                "removeNode",
                "Move every replica off a node, then remove it from the cluster",
                {**accepted, **refused},
                params=(_param("node", "path", NODE_ID, "The node to remove."),),
            )
        },
        "/v1/cluster/change": {
            "delete": _op(
                "cancelChange",
                "Cancel the change in progress (a move not yet removing its source is rolled back);"
                " 409 `no_change_in_progress` when there is none, or when the change read ended before the"
                " cancel applied (another begun since is named in the message and left as is)",
                {**accepted, **_errors(409, *RAFT_ERRORS)},
            )
        },
        "/v1/cluster/groups/{group}/move": {
            "post": _op(
                "moveReplica",
                "Move a group's replica from one node to another (add, catch up, then remove)",
                {**accepted, **refused},
                params=(GROUP_NAME,),
                body=_obj({"from": NODE_ID, "to": NODE_ID}, required=("from", "to")),
            )
        },
        "/v1/cluster/rebalance": {"post": _rebalance_op(refused)},
        "/v1/cluster/groups/{group}/leader": {
            "post": _op(
                "transferLeader",
                "Make a replica the group's preferred leader and hand it the leadership",
                {**accepted, **refused},
                params=(GROUP_NAME,),
                body=_obj({"node": NODE_ID}, required=("node",)),
            )
        },
    }


def _rebalance_op(refused: dict[str, Any]) -> dict[str, Any]:
    op = _op(
        "rebalance",
        "Move replicas until the nodes' counts differ by at most one, then spread the preferred "
        "leaders (body optional; `dry_run` answers the plan and records nothing)",
        {
            "200": _json(_ref("RebalanceDryRun"), "dry run: the plan; nothing recorded"),
            "202": _json(_ref("RebalanceAccepted"), "the change is recorded; see GET /v1/cluster/placement"),
            **_errors(400, 409, *RAFT_ERRORS),
        },
        body=_obj(
            {
                "dry_run": {
                    "type": "boolean",
                    "default": False,
                    "description": "true: answer the plan only; nothing is recorded.",
                }
            }
        ),
    )
    op["requestBody"]["required"] = False
    return op
