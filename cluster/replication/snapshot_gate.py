"""Snapshot install, all or nothing: the gate a Raft group's incoming snapshot messages pass.

pysyncobj installs a snapshot in __loadDumpFile, which swallows any exception; the follower
would then answer success, raise its commit index to the end of its own unchecked log and
apply entries that were never committed. So nothing may fail in there: the last chunk of an
install message reaches pysyncobj only once the state already covers the snapshot (a
verified checkpoint restored first, on the tick thread). Until then the message is held:
pysyncobj sees a heartbeat (leader, term, election deadline) without the snapshot and
without the leader's commit index, answers nothing, keeps its manifest file, journal,
commit index and state, and the leader sends the snapshot again. The checkpoint is fetched
and verified by a background thread, so a slow or failing fetch never blocks the ticks.

The gate is :class:`SnapshotGate`, one per :class:`~raftmq.cluster.replication.raft.RaftGroup`; the
adapter (``raft.py``, on pysyncobj through ``pso.py``) hands it each message with the group's
current term and commit index, and calls :meth:`SnapshotGate.install_blocking` on a start whose state
is behind its own snapshot.
"""

from __future__ import annotations

import base64
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from raftmq.storage.store import StoreError

if TYPE_CHECKING:
    from raftmq.cluster.replication.contract import StateMachine
    from raftmq.cluster.replication.journal import Entry

__all__ = [
    "EXIT_STORAGE_FAILURE",
    "FetchCheckpoint",
    "SnapshotGate",
    "entry_from_json",
    "entry_to_json",
    "fsync_dir",
    "read_durable_manifest",
    "read_manifest",
    "write_manifest",
]

# Logged under the adapter's name, as before the gate had a module of its own.
log = structlog.get_logger("raftmq.cluster.replication.raft")

EXIT_STORAGE_FAILURE = 70
_CHECKPOINT_RETRY_S = 1.0  # after a failed checkpoint fetch, the next try waits this long
_BLOCKING_INSTALL_S = 120.0  # on start, how long a replica behind its own snapshot tries to fetch

FetchCheckpoint = Callable[[dict[str, Any]], tuple[str, int]]
"""Fetches a verified checkpoint covering a snapshot manifest: ``(directory, applied index)``."""


class SnapshotGate:
    """Holds a snapshot install until the state covers it (see the module docstring).

    The tick thread owns the snapshot being received; the rest is shared with the background
    fetch thread under :attr:`lock`."""

    def __init__(self, name: str, machine: StateMachine, fetch: FetchCheckpoint | None) -> None:
        self.name = name
        self._machine = machine
        self._fetch = fetch
        self._incoming: bytes | None = None
        self.lock = threading.Lock()
        self.staged: tuple[str, int] | None = None  # (directory, its applied index)
        self.fetching = False
        self._retry_at = 0.0
        # Read by metrics: snapshot installs done here, and checkpoint fetches or checks that failed.
        self.installs = 0
        self.install_failures = 0

    def gate(self, current_term: int, commit_index: int, message: Any) -> Any:
        """Tick thread: ``message`` as pysyncobj may see it, given the group's ``current_term`` and
        ``commit_index`` (see the module docstring)."""
        if (
            not isinstance(message, dict)
            or message.get("type") != "append_entries"
            or "prevLogIdx" in message
            or message.get("serialized") is None
            or message.get("term", -1) < current_term
        ):
            return message
        # The leader's commit index says nothing about this follower's unchecked log.
        held = {**message, "commit_index": min(message["commit_index"], commit_index)}
        chunk = message["serialized"]
        if not isinstance(chunk, tuple | list) or len(chunk) != 3:  # the leader failed to read its file
            return {**held, "serialized": None}
        data, is_first, is_last = chunk
        if is_first:
            self._incoming = bytes(data)
        elif self._incoming is not None:
            self._incoming += bytes(data)
        if not is_last:
            return held  # pysyncobj writes the chunk to a temporary file, nothing else
        raw, self._incoming = self._incoming, None
        if raw is not None and self._snapshot_ready(raw):
            return message
        return {**held, "serialized": None}

    def _snapshot_ready(self, raw: bytes) -> bool:
        """Tick thread: whether the state covers the snapshot manifest ``raw`` (restoring a verified
        checkpoint first if one is staged); starts a background fetch when it does not."""
        try:
            manifest = orjson.loads(raw)
            need = int(manifest["state_index"])
            if manifest["group"] != self.name:
                raise ValueError(f"snapshot of group {manifest['group']!r}")
        except (ValueError, KeyError, TypeError) as e:
            self.install_failures += 1
            log.error("snapshot_rejected", group=self.name, error=str(e))
            return False
        with self.lock:
            staged, self.staged = self.staged, None
        if self._machine.applied_index >= need:
            if staged is not None:
                shutil.rmtree(staged[0], ignore_errors=True)  # no longer needed
            return True
        if staged is not None:
            path, index = staged
            if index >= need:
                return self._restore_staged(path, need)
            shutil.rmtree(path, ignore_errors=True)  # a newer snapshot needs a newer checkpoint
        self._start_checkpoint_fetch(manifest)
        return False

    def _restore_staged(self, path: str, need: int) -> bool:
        log.info(
            "snapshot_install_started",
            group=self.name,
            state_index=need,
            local_index=self._machine.applied_index,
        )
        try:
            self._machine.restore(path)  # an atomic swap: the old state or the new one
        except StoreError as e:
            # The checkpoint opened and was checked: the local disk failed. Stop, as the journal does.
            log.critical("snapshot_restore_storage_failure_stopping", group=self.name, error=str(e))
            os._exit(EXIT_STORAGE_FAILURE)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        if self._machine.applied_index < need:  # never after the checks; hold and fetch again
            self.install_failures += 1
            log.error(
                "snapshot_restore_behind", group=self.name, state_index=self._machine.applied_index, need=need
            )
            return False
        self.installs += 1
        log.info("snapshot_install_done", group=self.name, state_index=self._machine.applied_index)
        return True

    def _start_checkpoint_fetch(self, manifest: dict[str, Any]) -> None:
        if self._fetch is None:
            log.error("snapshot_install_impossible", group=self.name, reason="no way to fetch a checkpoint")
            return
        with self.lock:
            if self.fetching or time.monotonic() < self._retry_at:
                return
            self.fetching = True
        log.info(
            "snapshot_checkpoint_fetch_started",
            group=self.name,
            source=manifest.get("node_id"),
            state_index=manifest["state_index"],
            local_index=self._machine.applied_index,
        )
        threading.Thread(
            target=self._fetch_in_background,
            args=(manifest,),
            name=f"raftmq-checkpoint-{self.name}",
            daemon=True,
        ).start()

    def _fetch_in_background(self, manifest: dict[str, Any]) -> None:
        staged: tuple[str, int] | None = None
        try:
            staged = self._fetch_verified(manifest)
        except Exception as e:
            log.warning("snapshot_checkpoint_fetch_failed", group=self.name, error=str(e))
        with self.lock:
            self.fetching = False
            if staged is None:
                self.install_failures += 1
                self._retry_at = time.monotonic() + _CHECKPOINT_RETRY_S
                return
            old, self.staged = self.staged, staged
        if old is not None:
            shutil.rmtree(old[0], ignore_errors=True)
        log.info("snapshot_checkpoint_ready", group=self.name, state_index=staged[1])

    def _fetch_verified(self, manifest: dict[str, Any]) -> tuple[str, int]:
        """A checkpoint directory holding this group's state at or past the snapshot, and its
        applied index (any thread). Raises when no replica could send one."""
        assert self._fetch is not None
        path, index = self._fetch(manifest)
        if index < int(manifest["state_index"]):
            shutil.rmtree(path, ignore_errors=True)
            raise ValueError(
                f"checkpoint at index {index} is behind the snapshot's {manifest['state_index']}"
            )
        return path, index

    def install_blocking(self, manifest: dict[str, Any], on_restored: Callable[[], None]) -> None:
        """Tick thread, on start: this replica's state is behind its own snapshot manifest (its
        state directory was lost or replaced). Fetch and restore before pysyncobj goes on, or stop:
        pysyncobj must never continue from a state that does not cover its snapshot. ``on_restored``
        runs once the state covers it (the caller resets pysyncobj's election deadline)."""
        need = int(manifest["state_index"])
        deadline = time.monotonic() + _BLOCKING_INSTALL_S
        while self._fetch is not None and time.monotonic() < deadline:
            try:
                path, _index = self._fetch_verified(manifest)
            except Exception as e:
                self.install_failures += 1
                log.warning("snapshot_checkpoint_fetch_failed", group=self.name, error=str(e))
                time.sleep(_CHECKPOINT_RETRY_S)
                continue
            if self._restore_staged(path, need):
                on_restored()
                return
        log.critical(
            "snapshot_state_behind_stopping",
            group=self.name,
            state_index=self._machine.applied_index,
            need=need,
        )
        os._exit(EXIT_STORAGE_FAILURE)


# -- the snapshot manifest file ---------------------------------------------------------------


def read_manifest(path: str) -> dict[str, Any] | None:
    """The snapshot manifest at ``path``, or None when there is none."""
    try:
        with open(path, "rb") as f:
            manifest: dict[str, Any] = orjson.loads(f.read())
        return manifest
    except FileNotFoundError:
        return None
    except ValueError:  # written and fsynced before its rename, so never torn; pysyncobj logs it too
        log.error("snapshot_manifest_unreadable", path=path)
        return None


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` to ``path`` and fsync it (pysyncobj then renames it into place)."""
    with open(path, "wb") as f:
        f.write(orjson.dumps(manifest))
        f.flush()
        os.fsync(f.fileno())


def read_durable_manifest(path: str) -> dict[str, Any]:
    """The manifest at ``path``, once it and its directory entry are synced (pysyncobj writes and
    renames a snapshot received from the leader without fsync)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        manifest: dict[str, Any] = orjson.loads(f.read())
    fsync_dir(os.path.dirname(path))
    return manifest


def entry_to_json(entry: Entry) -> list[Any]:
    command, index, term = entry
    return [base64.b64encode(command).decode(), index, term]


def entry_from_json(raw: list[Any]) -> Entry:
    return (base64.b64decode(raw[0]), int(raw[1]), int(raw[2]))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
