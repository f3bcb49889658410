"""The parts of cluster/cli/backup.py that need no cluster: the seeded snapshot's command byte, and the
checks that refuse a restore before anything is written."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pysyncobj.syncobj as pso
import pytest

from raftmq.cluster.cli import backup
from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.machines.placement import static_placement

SECRET = "unit-test-secret-0123456789"


def _config(tmp: Path, raft_port: int = 7100) -> Any:
    nodes = [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8100 + i}",
            "raft": f"127.0.0.1:{raft_port + 10 * i}",
            "data_dir": str(tmp),
        }
        for i in (1, 2, 3)
    ]
    return parse_config({"cluster": {"secret": SECRET}, "nodes": nodes})


def _backup_file(tmp: Path, manifest: dict[str, Any]) -> str:
    path = tmp / "b.tar"
    data = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        entry = tarfile.TarInfo(backup.MANIFEST)
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    return str(path)


def test_seeded_entries_are_pysyncobj_no_ops() -> None:
    # Never applied, but if pysyncobj ever read them they must parse as NO_OP entries.
    assert bytes([pso._COMMAND_TYPE.NO_OP]) == backup._NO_OP


def test_not_a_backup_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar")
    with pytest.raises(backup.BackupError, match="not a raftmq backup"):
        backup.read_manifest(str(junk))


def test_other_format_is_refused(tmp_path: Path) -> None:
    path = _backup_file(tmp_path, {"format": 99, "queue_groups": 3, "groups": {}})
    with pytest.raises(backup.BackupError, match="backup format 99"):
        backup.read_manifest(path)


def test_restore_onto_other_addresses_is_refused_before_writing(tmp_path: Path) -> None:
    taken = _config(tmp_path)
    manifest = {"format": 1, "queue_groups": 3, "groups": {}, "placement": static_placement(taken).to_json()}
    path = _backup_file(tmp_path, manifest)
    moved = _config(tmp_path, raft_port=9100)
    with pytest.raises(backup.BackupError, match="Restore onto the same addresses"):
        backup.restore_node(moved, "n1", path)
    assert not (tmp_path / "n1").exists()


def test_restore_with_other_queue_group_count_is_refused(tmp_path: Path) -> None:
    path = _backup_file(tmp_path, {"format": 1, "queue_groups": 5, "groups": {}, "placement": None})
    with pytest.raises(backup.BackupError, match="5 queue groups"):
        backup.restore_node(_config(tmp_path), "n1", path)
