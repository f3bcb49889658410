"""``raftmq cluster ...``: change the cluster without downtime, one change at a time.

Each command records a change (``POST``/``DELETE`` under ``/v1/cluster``, see
``cluster/api/handlers/cluster.py``) and, unless ``--no-wait``, follows it in ``GET /v1/cluster/placement``
until it ends; a failed change exits with status 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from raftmq.cluster.base.groups import group_sort_key
from raftmq.cluster.cli.admin_http import AdminHttp
from raftmq.cluster.cli.common import stdout_console

__all__ = ["register"]

Decorator = Callable[[Callable[..., None]], Callable[..., None]]


def register(main: click.Group, admin_command: Decorator, json_option: Decorator) -> None:
    """Add the ``cluster`` command group to ``main`` (cli.py's decorators passed in, to keep the
    import one-way)."""

    @main.group("cluster")
    def cluster() -> None:
        """Add or remove nodes, move replicas and leaders, rebalance (docs/operations.md)."""

    wait = click.option(
        "--wait/--no-wait", default=True, show_default=True, help="Follow the change until it ends."
    )
    timeout = click.option(
        "--timeout-s", type=click.IntRange(min=1), default=900, show_default=True, help="How long to follow."
    )

    @cluster.command("placement")
    @json_option
    @admin_command
    def placement(admin: AdminHttp, as_json: bool) -> None:
        """Nodes, each group's replicas (preferred leader first), the change in progress."""
        data = admin.get("/v1/cluster/placement")
        if as_json:
            click.echo(_json(data))
            return
        _print_placement(data)

    @cluster.command("add-node")
    @click.argument("node_id")
    @click.option("--http", "http", required=True, help="The node's HTTP address (host:port).")
    @click.option("--raft", "raft", required=True, help="The node's Raft base address (host:port).")
    @click.option(
        "--rebalance",
        is_flag=True,
        help="Once it is added, move it its share of replicas (as raftmq cluster rebalance does).",
    )
    @wait
    @timeout
    @admin_command
    def add_node(
        admin: AdminHttp, node_id: str, http: str, raft: str, rebalance: bool, wait: bool, timeout_s: int
    ) -> None:
        """Add NODE_ID (already running, with join = true in its cluster file) to the cluster."""
        if rebalance and not wait:
            raise click.UsageError("--rebalance starts once the node is added: it needs --wait")
        answer = admin.post("/v1/cluster/nodes", {"id": node_id, "http": http, "raft": raft})
        _follow(admin, answer["change"], wait, timeout_s)  # exits unless the node was added
        if rebalance:
            before = _groups(admin)
            answer = admin.post("/v1/cluster/rebalance", {})
            _print_plan(answer["plan"])
            _follow(admin, answer["change"], wait, timeout_s, before=before)

    @cluster.command("remove-node")
    @click.argument("node_id")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @wait
    @timeout
    @admin_command
    def remove_node(admin: AdminHttp, node_id: str, yes: bool, wait: bool, timeout_s: int) -> None:
        """Move every replica off NODE_ID, then remove it from the cluster."""
        if not yes:
            click.confirm(f"Move every replica off {node_id} and remove it from the cluster?", abort=True)
        before = _groups(admin)
        answer = admin.delete(f"/v1/cluster/nodes/{admin.quote(node_id)}")
        _follow(admin, answer["change"], wait, timeout_s, before=before)

    @cluster.command("move")
    @click.argument("group")
    @click.option("--from", "source", required=True, help="The node whose replica moves.")
    @click.option("--to", "target", required=True, help="The node that takes it.")
    @wait
    @timeout
    @admin_command
    def move(admin: AdminHttp, group: str, source: str, target: str, wait: bool, timeout_s: int) -> None:
        """Move GROUP's replica (a queue group id, or meta) from one node to another."""
        before = _groups(admin)
        answer = admin.post(f"/v1/cluster/groups/{admin.quote(group)}/move", {"from": source, "to": target})
        _follow(admin, answer["change"], wait, timeout_s, before=before)

    @cluster.command("transfer-leader")
    @click.argument("group")
    @click.option("--to", "target", required=True, help="The replica to lead GROUP.")
    @wait
    @timeout
    @admin_command
    def transfer_leader(admin: AdminHttp, group: str, target: str, wait: bool, timeout_s: int) -> None:
        """Make a replica GROUP's preferred leader and hand it the leadership."""
        before = _groups(admin)
        answer = admin.post(f"/v1/cluster/groups/{admin.quote(group)}/leader", {"node": target})
        _follow(admin, answer["change"], wait, timeout_s, before=before)

    @cluster.command("rebalance")
    @click.option("--dry-run", is_flag=True, help="Print the plan only; record nothing.")
    @wait
    @timeout
    @admin_command
    def rebalance(admin: AdminHttp, dry_run: bool, wait: bool, timeout_s: int) -> None:
        """Move replicas (one group at a time) until every node holds as many as the others, give or
        take one, then spread the preferred leaders. Prints the plan (stdout), then the progress."""
        before = None if dry_run else _groups(admin)
        answer = admin.post("/v1/cluster/rebalance", {"dry_run": True} if dry_run else {})
        _print_plan(answer["plan"])
        if not dry_run:
            _follow(admin, answer["change"], wait, timeout_s, before=before)

    @cluster.command("cancel")
    @wait
    @timeout
    @admin_command
    def cancel(admin: AdminHttp, wait: bool, timeout_s: int) -> None:
        """Cancel the change in progress: a move is rolled back unless its source is already going."""
        before = _groups(admin)
        answer = admin.delete("/v1/cluster/change")
        _follow(admin, answer["change"], wait, timeout_s, cancelling=True, before=before)


def _describe(change: dict[str, Any]) -> str:
    kind = change["kind"]
    if kind == "move":
        return f"move group {change['group']} from {change['source']} to {change['target']}"
    if kind == "transfer_leader":
        return f"leadership of group {change['group']} to {change['target']}"
    if kind == "rebalance":
        return "rebalance"
    return f"{kind.replace('_', ' ')} {change['node']}"


def _groups(admin: AdminHttp) -> dict[str, list[str]]:
    """Each group's replicas (preferred leader first) as recorded now; {} before the first placement."""
    placement = admin.get("/v1/cluster/placement").get("placement")
    return dict(placement["groups"]) if placement else {}


def _placement_changes(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """What changed between two recordings of the groups' replicas, a line per group: a replica
    moved (``from A to B``), replicas added or removed, or a new preferred leader."""
    lines = []
    for g in sorted(set(before) | set(after), key=group_sort_key):
        old, new = before.get(g, []), after.get(g, [])
        if old == new:
            continue
        gone, came = [n for n in old if n not in new], [n for n in new if n not in old]
        if len(gone) == 1 and len(came) == 1:
            lines.append(f"group {g}: replica moved from {gone[0]} to {came[0]}")
        elif gone or came:
            parts = ([f"added {' '.join(came)}"] if came else []) + (
                [f"removed {' '.join(gone)}"] if gone else []
            )
            lines.append(f"group {g}: replica {', '.join(parts)}")
        if old and new and new[0] != old[0]:
            lines.append(f"group {g}: preferred leader {old[0]} -> {new[0]}")
    return lines


def _follow(
    admin: AdminHttp,
    change: dict[str, Any],
    wait: bool,
    timeout_s: int,
    cancelling: bool = False,
    before: dict[str, list[str]] | None = None,
) -> None:
    """Print the change's progress until it ends: its phases as seen at each poll (a fast step can
    fall between polls), and every change of placement since ``before`` (none is missed: each
    poll compares the whole recorded placement with the previous one)."""
    change_id = change["id"]
    click.echo(f"change {change_id}: {'cancelling ' if cancelling else ''}{_describe(change)}", err=True)
    if not wait:
        return
    deadline = time.monotonic() + timeout_s
    last_phase = None
    last_groups = before
    while time.monotonic() < deadline:
        data = admin.get("/v1/cluster/placement")
        groups = dict(data["placement"]["groups"]) if data.get("placement") else {}
        if last_groups is not None:
            for line in _placement_changes(last_groups, groups):
                click.echo(f"change {change_id}: {line}", err=True)
        last_groups = groups
        ended = next((h for h in data["history"] if h["id"] == change_id), None)
        if ended is not None:
            if ended["outcome"] == "done":
                click.echo(f"change {change_id}: done", err=True)
                return
            click.echo(f"change {change_id}: failed: {ended.get('error')}", err=True)
            sys.exit(0 if cancelling and ended.get("cancel") else 1)
        current = data.get("change") or {}
        phase = (current.get("group"), current.get("phase"), current.get("source"), current.get("target"))
        if current.get("id") == change_id and phase != last_phase:
            where = f"group {phase[0]}: " if phase[0] is not None else ""
            if phase[0] is not None and current.get("kind") == "rebalance":
                where = f"group {phase[0]} from {phase[2]} to {phase[3]}: "
            click.echo(f"change {change_id}: {where}{phase[1]}", err=True)
            last_phase = phase
        time.sleep(1.0)
    click.echo(
        f"change {change_id}: still running after {timeout_s} s (see raftmq cluster placement)", err=True
    )
    sys.exit(1)


def _print_plan(plan: dict[str, Any]) -> None:
    if not plan["moves"] and not plan["leader_changes"]:
        click.echo("already balanced: nothing to move")
    for m in plan["moves"]:
        click.echo(f"move group {m['group']} from {m['source']} to {m['target']}")
    for c in plan["leader_changes"]:
        click.echo(f"preferred leader of group {c['group']}: {c['target']} (was {c['source']})")
    click.echo("node  replicas  preferred leader of")
    for n in plan["nodes"]:
        note = "" if n["available"] else "  (not answering: takes nothing)"
        click.echo(
            f"{n['id']:<5} {n['replicas_before']:>3} -> {n['replicas_after']:<3}"
            f"{n['leaders_before']:>3} -> {n['leaders_after']}{note}"
        )


def _print_placement(data: dict[str, Any]) -> None:
    console = stdout_console()
    placement = data.get("placement")
    if placement is None:
        console.print("the metadata group has not recorded a placement yet")
        return
    nodes = Table("node", "http", "raft", "replicas", title=f"placement version {placement['version']}")
    for n in placement["nodes"]:
        hosted = sorted(g for g, ids in placement["groups"].items() if n["id"] in ids)
        nodes.add_row(n["id"], n["http"], n["raft"], " ".join(hosted))
    console.print(nodes)
    groups = Table("group", "replicas (preferred leader first)")
    for g, ids in sorted(placement["groups"].items(), key=lambda kv: (kv[0] != "meta", kv[0].zfill(4))):
        groups.add_row(g, " ".join(ids))
    console.print(groups)
    change = data.get("change")
    console.print(
        "no change in progress"
        if change is None
        else f"change {change['id']} in progress: {_describe(change)} (phase {change['phase']})"
    )
    for h in data.get("history", [])[-5:]:
        error = f": {h['error']}" if h.get("error") else ""
        console.print(f"change {h['id']}: {_describe(h)}: {h['outcome']}{error}")


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=2, sort_keys=True)
