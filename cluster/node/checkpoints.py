"""Checkpoints of a group's state: sent to a peer that installs a snapshot (``open_stream``, a
tar archive made as it is sent), fetched from the group's replicas when this replica installs one
(``fetch``, on the group's checkpoint thread, blocking), and digests that tests compare across
replicas (``store_digest``).

A fetched checkpoint is checked before use: its ``meta.json`` names the group, it opens as a store,
and its applied index covers the snapshot. Archives are extracted with ``base/safe_tar.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tarfile
import time
import urllib.request
from collections.abc import Generator
from typing import Any

import orjson
import structlog

from raftmq.cluster.base.groups import META
from raftmq.cluster.base.safe_tar import safe_extract_stream
from raftmq.cluster.base.tar_stream import tar_chunks
from raftmq.cluster.config.keys import NO_REDIRECTS, PEER_HEADER
from raftmq.cluster.machines.metadata import applied_index as metadata_applied_index
from raftmq.cluster.node.view import NodeView
from raftmq.errors import RaftmqError
from raftmq.storage.durable_dirs import fsync_tree
from raftmq.storage.queues import applied_index as queues_applied_index
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store

__all__ = ["CheckpointBehind", "CheckpointStream", "Checkpoints"]

log = structlog.get_logger(__name__)


class CheckpointBehind(RaftmqError):
    """This replica's state is behind the index a checkpoint was asked for."""


class CheckpointStream:
    """A checkpoint of one group's state on disk (hard links to the store's files, so it costs
    little space until the store compacts them away) and its tar archive, produced as it is sent
    (``chunks``): the first bytes leave at once, however large the state. ``close`` deletes the
    checkpoint, whether or not the archive was sent whole."""

    def __init__(self, ckpt_dir: str, chunk_delay_s: float = 0.0) -> None:
        self.dir = ckpt_dir
        self._chunk_delay_s = chunk_delay_s  # test fault: a slow disk (``[faults]``)

    def chunks(self) -> Generator[bytes, None, None]:
        for chunk in tar_chunks([(self.dir, "checkpoint"), (self.dir + ".json", "meta.json")]):
            if self._chunk_delay_s:
                time.sleep(self._chunk_delay_s)
            yield chunk

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.dir + ".json")


def _check_checkpoint(name: str, dest: str, need: int) -> int:
    """The applied index of the checkpoint extracted into ``dest``, once it is known to be group
    ``name``'s state at or past ``need``; raises ``ValueError`` otherwise."""
    with open(os.path.join(dest, "meta.json"), "rb") as f:
        meta = orjson.loads(f.read())
    if meta.get("group") != name:
        raise ValueError(f"checkpoint of group {meta.get('group')!r}, not {name!r}")
    store = RocksStore.open(os.path.join(dest, "checkpoint"))  # raises StoreError if it does not open
    try:
        index = metadata_applied_index(store) if name == META else queues_applied_index(store)
    finally:
        store.close()
    if index < need or index < int(meta.get("applied_index", 0)):
        raise ValueError(f"checkpoint at index {index}; the snapshot needs {need}, its source said {meta}")
    return index


def _safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """Extract a checkpoint's archive under ``dest`` (a new directory) as it is read (``tar`` may be
    a stream over the download): regular files and directories only, never a link or a path outside
    ``dest``; a refused or cut-short archive leaves nothing (``cluster/base/safe_tar.py``).

    Raises:
        UnsafeArchive: a ValueError naming the member.
    """
    safe_extract_stream(tar, dest)


def _read_to_the_end(resp: Any) -> None:
    """Read what follows an archive's end in a download (the last record's padding, at most one
    record) and the chunked body's end: a sender's last bytes are taken, not cut off by a close, and
    a body cut short fails here (``IncompleteRead``) if the archive's own end did not show it."""
    left = resp.read(tarfile.RECORDSIZE + 1)
    if len(left) > tarfile.RECORDSIZE or resp.read(1):
        raise ValueError("bytes after the checkpoint archive's end")


class Checkpoints:
    """Checkpoints of this node's replicas (see the module docstring)."""

    def __init__(self, node: NodeView) -> None:
        self.node = node

    def open_stream(self, name: str, min_index: int = 0) -> CheckpointStream:
        """A checkpoint of group ``name``'s state, to be sent as a tar archive (the caller closes it).

        The archive holds ``checkpoint/`` (the RocksDB checkpoint) and ``meta.json`` (group, node, the
        applied index before the checkpoint was taken: the checkpoint holds at least that).

        Raises:
            CheckpointBehind: this replica has applied less than ``min_index`` (a follower that
                lags the snapshot the fetching replica must cover).
        """
        local = self.node.groups[name]
        applied = local.machine.applied_index
        if applied < min_index:
            raise CheckpointBehind(
                f"node {self.node.me.id} applied group {name} to {applied}, not {min_index}"
            )
        ckpt_dir = os.path.join(self.node.node_dir, "tmp", f"ckpt-{name}-{time.time_ns()}")
        stream = CheckpointStream(ckpt_dir, self.node.config.faults.checkpoint_send_chunk_delay_ms / 1000)
        try:
            local.machine.store.checkpoint(ckpt_dir)
            with open(ckpt_dir + ".json", "wb") as f:
                f.write(orjson.dumps({"group": name, "node_id": self.node.me.id, "applied_index": applied}))
        except BaseException:
            stream.close()
            raise
        return stream

    def fetch(self, name: str, manifest: dict[str, Any]) -> tuple[str, int]:
        """Download and check a checkpoint of group ``name`` covering the snapshot ``manifest``
        (RaftGroup's checkpoint thread; blocking). Returns the checkpoint directory (the caller
        restores or deletes it) and the applied index read from it.

        Sources, in order: the group's leader as this replica knows it, the replica that wrote the
        manifest, then the other replicas; each is asked for a state at or past the manifest's
        ``state_index`` (a lagging replica refuses) and what arrives is checked: its ``meta.json``
        names this group, it opens as a store, and its applied index is at least that.
        """
        need = int(manifest["state_index"])
        local = self.node.groups.get(name)
        members = [self.node.node_for_addr(a) for a in (local.raft.members() if local else ())]
        replicas = {n.id: n for n in [*self.node.replicas(name), *(m for m in members if m is not None)]}
        leader_addr = local.raft.leader() if local else None
        leader = self.node.node_for_addr(leader_addr) if leader_addr else None
        first = [leader.id if leader else None, manifest.get("node_id")]
        order = sorted(
            (r for r in replicas.values() if r.id != self.node.me.id),
            key=lambda r: (first.index(r.id) if r.id in first else len(first), r.id),
        )
        # No proxy from the environment: a checkpoint goes straight to a peer, with the peer key.
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            NO_REDIRECTS,
            urllib.request.HTTPSHandler(context=self.node.ssl_context),
        )
        # Per socket operation: the sender's archive arrives as it is made, so a long download of a
        # large state never waits this long for its next bytes unless its peer stopped.
        timeout_s = self.node.config.raft.checkpoint_io_timeout_ms / 1000
        errors = []
        for node in order:
            dest = os.path.join(self.node.node_dir, "tmp", f"incoming-{name}-{time.time_ns()}")
            try:
                self._fetch_fault(name)
                request = urllib.request.Request(
                    f"{node.http_url}/internal/groups/{name}/checkpoint?min_index={need}",
                    headers={PEER_HEADER: self.node.keys.peer},
                )
                # Extracted as it arrives (no archive on this disk). A download cut short fails the
                # read (the chunked body lacks its end); and ``meta.json`` is the archive's last
                # member, so an archive cut before it fails the check below too.
                with opener.open(request, timeout=timeout_s) as resp:
                    with tarfile.open(fileobj=resp, mode="r|") as tar:
                        _safe_extract(tar, dest)
                    _read_to_the_end(resp)
                index = _check_checkpoint(name, dest, need)
                # Written to disk here, so the restore on the group's tick thread finds nothing dirty.
                fsync_tree(os.path.join(dest, "checkpoint"))
                os.rename(os.path.join(dest, "checkpoint"), dest + ".checkpoint")
                shutil.rmtree(dest, ignore_errors=True)
                return dest + ".checkpoint", index
            except Exception as e:  # try the next replica
                errors.append(f"{node.id}: {e}")
                shutil.rmtree(dest, ignore_errors=True)
        raise RuntimeError(f"no replica could send a checkpoint of group {name} at index {need}: {errors}")

    def _fetch_fault(self, name: str) -> None:
        """Test fault ``[faults] checkpoint_fetch_fault_file``: while that file says ``fail`` every
        checkpoint fetch fails; while it says ``stall`` a fetch waits (up to 60 s), then fails."""
        path = self.node.config.faults.checkpoint_fetch_fault_file
        if not path:
            return
        deadline = time.monotonic() + 60
        while True:
            try:
                with open(path) as f:
                    mode = f.read().strip()
            except FileNotFoundError:
                return
            if mode not in ("fail", "stall"):
                return
            if mode == "fail" or time.monotonic() > deadline:
                log.warning("test_fault_checkpoint_fetch", group=name, mode=mode)
                raise RuntimeError(f"test fault: checkpoint fetch {mode}")
            time.sleep(0.2)

    def store_digest(self, name: str) -> dict[str, Any]:
        """A hash of every key and value of group ``name``'s state (replicas compare equal)."""
        store: Store = self.node.groups[name].machine.store
        h = hashlib.sha256()
        keys = 0
        for k, v in store.scan(b""):
            h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
            keys += 1
        return {
            "group": name,
            "state_index": self.node.groups[name].machine.applied_index,
            "keys": keys,
            "sha256": h.hexdigest(),
        }
