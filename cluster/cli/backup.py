"""Backups by checkpoint (``raftmq backup``) and restoring them (``raftmq restore``).

A backup is one tar file::

    raftmq-backup.json    the manifest: format, time, queue_groups, the placement, and per group the
                          node it came from, its state index and the SHA-256 of its checkpoint
    groups/<group>.tar    a RocksDB checkpoint of the group's state, as a node sends it to a peer

**Backup** (the cluster running): for every queue group, then the metadata group last (so every
topic with messages in the backup is in it), ask the group's leader for a read barrier (an entry
it applies, so its state then holds everything committed before) and then for a checkpoint, over
the peers' ``/internal`` API with the backup key (derived from the cluster secret,
``cluster/config/keys.py``; it opens only the status, barrier and checkpoint routes). Each checkpoint is
opened once to check it and read its state index. Every message acknowledged before the backup
started is in it; each group is a consistent cut, taken one after another.

**Restore** (offline, on every node of the cluster, each node stopped, from the same file): the
groups the node hosts (by the backup's placement) get the checkpoint as their state and a Raft
snapshot manifest seeded at the checkpoint's state index, with an empty journal. Every replica of a
group thus starts from the same log position, and the Raft index goes on from where the backed-up
cluster was (receipt tokens and delayed-message keys, which use it, stay unique).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import io
import json
import os
import shutil
import socket
import ssl
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import click

from raftmq.cluster.base.groups import META, port_offset
from raftmq.cluster.base.safe_tar import UnsafeArchive, safe_extract
from raftmq.cluster.config.cluster_file import ClusterConfig, ConfigError, NodeConfig, load_config
from raftmq.cluster.config.keys import BACKUP_HEADER, NO_REDIRECTS, derive_keys
from raftmq.cluster.config.tls import TlsError, client_context
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.placement import Placement, static_placement
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.errors import RaftmqError
from raftmq.storage.rocks import RocksStore

__all__ = [
    "BackupError",
    "backup_cluster",
    "backup_command",
    "read_manifest",
    "restore_command",
    "restore_node",
]

FORMAT = 1
MANIFEST = "raftmq-backup.json"
# pysyncobj's NO_OP command byte (0.3.17, a unit test checks it): the seeded snapshot's two entries.
# They are never applied (the snapshot covers them) and never sent (every replica starts with them).
_NO_OP = b"\x01"

Progress = Callable[[str], None]


class BackupError(RaftmqError):
    """A backup or restore that cannot go on; ``str(e)`` says why, in one or a few lines."""


# -- backup ---------------------------------------------------------------------------------------


def backup_cluster(
    config: ClusterConfig, out_path: str, *, timeout_s: float = 60.0, progress: Progress = print
) -> dict[str, Any]:
    """Write a backup of the running cluster to ``out_path`` (atomically: a temporary file is
    renamed into place). Returns the manifest."""
    names = [str(g) for g in range(config.queue_groups)] + [META]
    out_dir = os.path.dirname(os.path.abspath(out_path))
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created_ms": time.time_ns() // 1_000_000,
        "queue_groups": config.queue_groups,
        "groups": {},
    }
    open_url = _opener(config)
    with tempfile.TemporaryDirectory(prefix=".raftmq-backup-", dir=out_dir) as tmp:
        tmp_out = os.path.join(tmp, "backup.tar")
        with tarfile.open(tmp_out, "w") as backup:
            for name in names:
                tar_path = os.path.join(tmp, f"{name}.tar")
                source = _fetch_checkpoint(config, open_url, name, tar_path, timeout_s)
                info = _inspect_checkpoint(tar_path, name, os.path.join(tmp, f"check-{name}"))
                info |= {"source": source, "sha256": _sha256(tar_path), "bytes": os.path.getsize(tar_path)}
                if name == META:
                    manifest["placement"] = info.pop("placement")
                manifest["groups"][name] = info
                backup.add(tar_path, arcname=f"groups/{name}.tar")
                os.remove(tar_path)
                progress(
                    f"group {name}: state index {info['state_index']} from {source} ({info['bytes']} bytes)"
                )
            data = json.dumps(manifest, indent=2).encode()
            entry = tarfile.TarInfo(MANIFEST)
            entry.size, entry.mtime = len(data), int(time.time())
            backup.addfile(entry, io.BytesIO(data))
        with open(tmp_out, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_out, out_path)
    return manifest


OpenUrl = Callable[..., Any]


def _opener(config: ClusterConfig) -> OpenUrl:
    """Calls to the nodes' ``/internal`` API with the backup key (API tokens play no part), HTTPS
    verified against ``tls.ca_file`` when the cluster serves it. Straight to the nodes, as the
    nodes call each other: ``HTTP(S)_PROXY`` is ignored (a proxy would see the key)."""
    backup_key = derive_keys(config.secret).backup
    try:
        context: ssl.SSLContext | None = client_context(config)
    except TlsError as e:
        raise BackupError(f"{e} (tls.ca_file in the cluster file; RAFTMQ_TLS_CA_FILE overrides it)") from None
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), NO_REDIRECTS, urllib.request.HTTPSHandler(context=context)
    )

    def open_url(url: str, *, method: str = "GET", timeout_s: float) -> Any:
        request = urllib.request.Request(
            url,
            data=b"{}" if method == "POST" else None,
            method=method,
            headers={BACKUP_HEADER: backup_key},
        )
        return opener.open(request, timeout=timeout_s)

    return open_url


def _fetch_checkpoint(
    config: ClusterConfig, open_url: OpenUrl, name: str, dest: str, timeout_s: float
) -> str:
    """Save a checkpoint of group ``name`` taken at its leader after a barrier; returns the node id."""
    deadline = time.monotonic() + timeout_s
    problems: dict[str, str] = {}  # the last problem per node, for the error at the deadline
    while time.monotonic() < deadline:
        for node in _leaders(config, name, open_url, problems):
            try:
                with open_url(f"{node.http_url}/internal/groups/{name}/barrier", method="POST", timeout_s=30):
                    pass
                with (
                    open_url(f"{node.http_url}/internal/groups/{name}/checkpoint", timeout_s=300) as resp,
                    open(dest, "wb") as f,
                ):
                    shutil.copyfileobj(resp, f, 1 << 20)
                return node.id
            except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
                problems[node.id] = _problem(config, node, e)
        time.sleep(0.5)
    seen = "; ".join(f"{nid}: {p}" for nid, p in sorted(problems.items())) or "no node claimed leadership"
    raise BackupError(f"no leader of group {name} gave a checkpoint in {timeout_s:.0f} s ({seen})")


def _leaders(
    config: ClusterConfig, name: str, open_url: OpenUrl, problems: dict[str, str]
) -> list[NodeConfig]:
    """Nodes claiming leadership of group ``name``, the highest term first; why a node could not
    say goes into ``problems``."""
    claims = []
    for node in config.nodes:
        try:
            with open_url(f"{node.http_url}/internal/status", timeout_s=3) as resp:
                group = json.loads(resp.read())["groups"].get(name)
        except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
            problems[node.id] = _problem(config, node, e)
            continue
        if group and group.get("is_leader"):
            claims.append((int(group["term"]), node))
    return [node for _, node in sorted(claims, key=lambda c: -c[0])]


def _problem(config: ClusterConfig, node: NodeConfig, e: Exception) -> str:
    """What a failed call to ``node`` says, in one line. Raises BackupError for what no wait can
    mend: a refused backup key or a certificate that does not verify."""
    if isinstance(e, urllib.error.HTTPError):
        if e.code == 401:
            raise BackupError(
                f"node {node.id} ({node.http_url}) refused the backup key (HTTP 401): the backup "
                "calls the nodes with a key derived from the cluster secret (cluster.secret in the "
                "cluster file, or RAFTMQ_SECRET), which must be the running nodes' secret, and the "
                "nodes must run a raftmq version with derived keys; API tokens are not used"
            )
        return f"HTTP {e.code} {e.read()[:200].decode(errors='replace')}"
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, ssl.SSLCertVerificationError):
        against = f"the CA file {config.tls.ca_file!r}" if config.tls.ca_file else "the system's CAs"
        raise BackupError(
            f"node {node.id}'s certificate is not trusted ({node.http_url}): {reason.verify_message}. "
            f"The backup verifies it against {against} (tls.ca_file in the cluster file; "
            "RAFTMQ_TLS_CA_FILE overrides it) and checks that it names the host of the node's http address"
        )
    return str(reason) or type(reason).__name__


def _inspect_checkpoint(tar_path: str, name: str, scratch: str) -> dict[str, Any]:
    """Open a checkpoint once: its state index (and, for the metadata group, the placement)."""
    try:
        with tarfile.open(tar_path) as tar:
            _safe_extract(tar, scratch)
        store = RocksStore.open(os.path.join(scratch, "checkpoint"))
    except (tarfile.TarError, OSError, ValueError) as e:
        raise BackupError(f"the checkpoint of group {name} is unusable: {e}") from None
    try:
        info: dict[str, Any] = {}
        if name == META:
            meta = MetadataMachine(store)
            placement = meta.placement()
            info["placement"] = None if placement is None else placement.to_json()
            info["state_index"] = meta.applied_index
            info["topics"] = len(meta.topics())
        else:
            info["state_index"] = QueueGroupMachine(store, int(name)).applied_index
        return info
    finally:
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)


# -- restore --------------------------------------------------------------------------------------


def read_manifest(backup_path: str) -> dict[str, Any]:
    try:
        with tarfile.open(backup_path) as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            manifest: dict[str, Any] = json.loads(member.read())
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        raise BackupError(f"{backup_path} is not a raftmq backup: {e}") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(
            f"{backup_path}: backup format {manifest.get('format')} (this raftmq reads {FORMAT})"
        )
    return manifest


def restore_node(
    config: ClusterConfig, node_id: str, backup_path: str, *, force: bool = False, progress: Progress = print
) -> list[str]:
    """Restore node ``node_id``'s groups from a backup, the node being stopped. Its data directory
    must be empty or missing; with ``force`` an existing one is moved aside first. Returns the
    groups restored here."""
    manifest = read_manifest(backup_path)
    placement = _placement(config, manifest)
    node = config.node(node_id)
    if _address_in_use(node.http):
        raise BackupError(f"node {node_id} seems to be running ({node.http} is in use): stop it first")
    node_dir = os.path.abspath(node.node_dir())
    if os.path.isdir(node_dir) and os.listdir(node_dir):
        if not force:
            raise BackupError(
                f"{node_dir} is not empty: restore into an empty node (or pass --force to move it aside)"
            )
        aside = f"{node_dir}.before-restore-{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(node_dir, aside)
        progress(f"moved the old data of {node_id} to {aside}")
    mine = [g for g in placement.groups_on(node_id) if g in manifest["groups"]]
    os.makedirs(os.path.join(node_dir, "tmp"), exist_ok=True)
    with tarfile.open(backup_path) as backup:
        for name in mine:
            _restore_group(backup, manifest, placement, name, node_id, node_dir)
            progress(f"group {name}: restored at state index {manifest['groups'][name]['state_index']}")
    os.sync()
    return mine


def _placement(config: ClusterConfig, manifest: dict[str, Any]) -> Placement:
    """The backup's placement, which must name the same nodes at the same addresses as the file."""
    if manifest["queue_groups"] != config.queue_groups:
        raise BackupError(
            f"the backup has {manifest['queue_groups']} queue groups, the cluster file {config.queue_groups}"
        )
    raw = manifest.get("placement")
    placement = static_placement(config) if raw is None else Placement.from_json(raw)
    # Group names become paths (<node_dir>/groups/<name>): only the groups the cluster file has.
    known = {META, *(str(g) for g in range(config.queue_groups))}
    unknown = sorted(set(placement.groups) - known)
    if unknown:
        raise BackupError(f"the backup's placement names groups this cluster does not have: {unknown}")
    for n in placement.nodes:
        try:
            file_node = config.node(n.id)
        except KeyError:
            raise BackupError(f"the backup's node {n.id} is not in the cluster file") from None
        if (file_node.http, file_node.raft) != (n.http, n.raft):
            raise BackupError(
                f"node {n.id} was at http {n.http}, raft {n.raft} in the backup; the cluster file says "
                f"http {file_node.http}, raft {file_node.raft}. Restore onto the same addresses."
            )
    return placement


def _restore_group(
    backup: tarfile.TarFile,
    manifest: dict[str, Any],
    placement: Placement,
    name: str,
    node_id: str,
    node_dir: str,
) -> None:
    expected = manifest["groups"][name]
    member = backup.extractfile(f"groups/{name}.tar")
    if member is None:
        raise BackupError(f"the backup has no checkpoint of group {name}")
    scratch = tempfile.mkdtemp(prefix=f"restore-{name}-", dir=os.path.join(node_dir, "tmp"))
    try:
        tar_path = os.path.join(scratch, "checkpoint.tar")
        with open(tar_path, "wb") as f:
            shutil.copyfileobj(member, f, 1 << 20)
        if _sha256(tar_path) != expected["sha256"]:
            raise BackupError(f"the checkpoint of group {name} does not match its checksum: damaged backup")
        with tarfile.open(tar_path) as tar:
            _safe_extract(tar, scratch)
        group_dir = os.path.join(node_dir, "groups", name)
        os.makedirs(group_dir, exist_ok=True)
        os.rename(os.path.join(scratch, "checkpoint"), os.path.join(group_dir, "state"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    state_index = int(expected["state_index"])
    if state_index >= 2:  # index 1 is pysyncobj's first NO_OP: below 2 nothing was ever applied
        offset = port_offset(name)
        voters = sorted(_raft_addr(placement, nid, offset) for nid in placement.replicas(name))
        _seed_snapshot(
            os.path.join(group_dir, "snapshot"),
            name,
            node_id,
            _raft_addr(placement, node_id, offset),
            state_index,
            voters,
        )


def _raft_addr(placement: Placement, node_id: str, offset: int) -> str:
    node = placement.node(node_id)
    assert node is not None, node_id
    host, port = node.raft.rsplit(":", 1)
    return f"{host}:{int(port) + offset}"


def _seed_snapshot(
    snapshot_dir: str, group: str, node_id: str, raft_addr: str, state_index: int, voters: list[str]
) -> None:
    """The snapshot manifest of ``cluster/replication/raft.py`` (format 1) for a state at ``state_index``: the
    log starts after it, identically on every replica, at term 0 (any election's term is higher)."""
    os.makedirs(snapshot_dir, exist_ok=True)
    manifest = {
        "format": 1,
        "group": group,
        "node_id": node_id,
        "raft_addr": raft_addr,
        "state_index": state_index,
        "last": [base64.b64encode(_NO_OP).decode(), state_index, 0],
        "prev": [base64.b64encode(_NO_OP).decode(), state_index - 1, 0],
        "cluster": voters,
        "restored": True,
    }
    path = os.path.join(snapshot_dir, "manifest.json")
    with open(path + ".tmp", "wb") as f:
        f.write(json.dumps(manifest).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


# -- helpers --------------------------------------------------------------------------------------


def _address_in_use(addr: str) -> bool:
    """True if something listens on ``addr`` here (an address of another host counts as free:
    the restore may run in a helper container or on a copy of the data)."""
    host, port = addr.rsplit(":", 1)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
    except OSError as e:
        return e.errno == errno.EADDRINUSE
    return False


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """Extract regular files and directories under ``dest`` only, or nothing (``cluster/base/safe_tar.py``:
    no links, no absolute or ``..`` paths)."""
    try:
        safe_extract(tar, dest)
    except UnsafeArchive as e:
        raise BackupError(f"checkpoint tar: {e}") from None


# -- command line (hooked into ``raftmq`` by cluster/cli/main.py) -----------------------------------------

config_option = click.option(
    "--config",
    "config_path",
    required=True,
    envvar="RAFTMQ_CONFIG",
    type=click.Path(dir_okay=False),
    help="The cluster file (default: $RAFTMQ_CONFIG).",
)


def _load(path: str) -> ClusterConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@click.command("backup")
@config_option
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="The backup file to write."
)
@click.option(
    "--timeout", "timeout_s", default=60.0, show_default=True, help="Seconds to find each group's leader."
)
def backup_command(config_path: str, output: str, timeout_s: float) -> None:
    """Back up the running cluster: a checkpoint of every Raft group, taken at its leader, in one file."""
    started = time.monotonic()
    try:
        manifest = backup_cluster(_load(config_path), output, timeout_s=timeout_s, progress=click.echo)
    except BackupError as e:
        raise click.ClickException(str(e)) from None
    size = os.path.getsize(output)
    click.echo(
        f"backup of {len(manifest['groups'])} groups written to {output} "
        f"({size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s)"
    )


@click.command("restore")
@config_option
@click.option(
    "--node", "node_id", required=True, help="The (stopped) node to restore, as in the cluster file."
)
@click.option("--force", is_flag=True, help="Move the node's existing data aside instead of refusing.")
@click.argument("backup_file", type=click.Path(exists=True, dir_okay=False))
def restore_command(config_path: str, node_id: str, force: bool, backup_file: str) -> None:
    """Restore one stopped node from a backup. Restore every node of the cluster from the same file,
    then start them all."""
    config = _load(config_path)
    try:
        config.node(node_id)
    except KeyError:
        raise click.ClickException(f"node {node_id!r} is not in {config_path}") from None
    try:
        groups = restore_node(config, node_id, backup_file, force=force, progress=click.echo)
    except BackupError as e:
        raise click.ClickException(str(e)) from None
    click.echo(
        f"node {node_id}: restored groups {', '.join(groups) or '(none)'}; start it with `raftmq serve`"
    )
