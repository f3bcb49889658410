"""``raftmq repair-journal``: cut a stopped node's damaged Raft journal so the node can start again.

A node refuses to start when a group's journal holds a damaged or missing entry with good entries
after it (:class:`~raftmq.cluster.replication.journal.JournalCorruptError`; docs/architecture.md, "Journal
integrity"). This command deletes that entry and everything after it from the node's journal of that
group, so the node starts with the good prefix and re-fetches the rest (or a snapshot) from the
group's leader. Without ``--yes`` it only reports what it found and what it would delete.

Deleting entries a node acknowledged is safe only while the other replicas hold them, so it is meant
for one node at a time, with the group's other replicas running (docs/operations.md, "Repairing a
damaged journal").
"""

from __future__ import annotations

import os
import re

import click

from raftmq.cluster.cli.backup import config_option
from raftmq.cluster.config.cluster_file import ClusterConfig, ConfigError, load_config
from raftmq.cluster.replication.journal import JournalScan, scan_journal, truncate_journal
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import StoreError

__all__ = ["repair_journal_command"]

# A group's directory name: the metadata group or a queue group's number (never a path).
_GROUP = re.compile(r"meta|0|[1-9][0-9]{0,5}")


def _load(path: str) -> ClusterConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


def _journal_path(config: ClusterConfig, config_path: str, node_id: str, group: str) -> str:
    try:
        node = config.node(node_id)
    except KeyError:
        ids = ", ".join(n.id for n in config.nodes)
        raise click.ClickException(f"node {node_id!r} is not in {config_path} (nodes: {ids})") from None
    if not _GROUP.fullmatch(group):
        raise click.ClickException(f"--group must be 'meta' or a queue group's number, not {group!r}")
    path = os.path.join(node.node_dir(), "groups", group, "raft")
    if not os.path.isfile(os.path.join(path, "CURRENT")):
        raise click.ClickException(f"node {node_id} has no journal of group {group} (no database at {path})")
    return path


def _open(path: str, node_id: str) -> RocksStore:
    try:
        return RocksStore.open(path)
    except StoreError as e:
        raise click.ClickException(
            f"cannot open {path}: {e}\nIs node {node_id} still running? Stop it first."
        ) from None


def _plan(scan: JournalScan, truncate_from: int | None) -> int | None:
    """The index to cut from, or None when there is nothing to do; refuses a cut that keeps damage."""
    if truncate_from is None:
        return scan.bad_index
    if scan.bad_index is not None and truncate_from > scan.bad_index:
        raise click.ClickException(
            f"--truncate-from {truncate_from} would keep the damage at index {scan.bad_index}, and the "
            f"node would still refuse to start: use --truncate-from {scan.bad_index} (or lower)"
        )
    return truncate_from


@click.command("repair-journal")
@config_option
@click.option("--node", "node_id", required=True, help="The (stopped) node whose journal to repair.")
@click.option("--group", required=True, help="The group: 'meta' or a queue group's number.")
@click.option(
    "--truncate-from",
    type=click.IntRange(min=1),
    default=None,
    help="Delete the entry at this index and every later one (default: the first damaged index).",
)
@click.option("--yes", is_flag=True, help="Really delete (without it: report what would be deleted).")
def repair_journal_command(
    config_path: str, node_id: str, group: str, truncate_from: int | None, yes: bool
) -> None:
    """Repair a stopped node's damaged Raft journal of one group.

    Deletes the damaged entry and every entry after it; when started, the node re-fetches them from
    the group's leader (or a snapshot). Do it on one node at a time, while the group's other
    replicas run and have a leader: they are what still holds those entries. Without --yes, only
    reports what it found and what it would delete.
    """
    config = _load(config_path)
    path = _journal_path(config, config_path, node_id, group)
    store = _open(path, node_id)
    try:
        scan = scan_journal(store)
        where = f"node {node_id}, group {group}"
        click.echo(f"{where}: journal {path}")
        click.echo(f"  found: {scan.describe()}")
        cut = _plan(scan, truncate_from)
        if cut is None:
            click.echo("  nothing to repair: every entry is intact. Nothing changed.")
            return
        count = truncate_journal(store, cut, dry_run=True)
        if count == 0:
            click.echo(f"  nothing at or after index {cut}. Nothing changed.")
            return
        last = f"..{scan.last_index}" if scan.last_index is not None and scan.last_index > cut else ""
        click.echo(f"  plan: delete {count} records, entries {cut}{last}, from this node's journal.")
        click.echo(
            "  When started, the node re-fetches them from the group's leader (or a snapshot). Those "
            "entries then live only on the other replicas: repair one node at a time, while the "
            "group's other replicas run and have a leader."
        )
        if not yes:
            click.echo("Dry run: nothing changed. Run again with --yes to delete.")
            return
        removed = truncate_journal(store, cut)
    except StoreError as e:
        raise click.ClickException(f"{path}: {e}") from None
    finally:
        store.close()
    click.echo(
        f"{where}: deleted {removed} records (entries {cut}{last}). Start the node "
        f"(raftmq serve --config {config_path} --node {node_id}); it re-fetches them from the leader."
    )
