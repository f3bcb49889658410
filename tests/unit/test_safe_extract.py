"""Tar extraction of checkpoints and backups stays inside its destination (``cluster/base/safe_tar.py``).

Both extractors are run over crafted archives: the snapshot install's (``checkpoints._safe_extract``, a tar
from a peer, read as a stream as the download arrives) and ``raftmq restore``'s
(``backup._safe_extract``). A refused archive must leave nothing behind, inside the destination or next to it.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from raftmq.cluster.cli.backup import BackupError
from raftmq.cluster.cli.backup import _safe_extract as backup_extract
from raftmq.cluster.node.checkpoints import _safe_extract as node_extract

Extract = Callable[[tarfile.TarFile, str], None]
EXTRACTORS = {"node": (node_extract, ValueError), "backup": (backup_extract, BackupError)}
MODES = {"node": "r|", "backup": "r"}  # the node reads a download in one pass


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, b""


def _special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, b""


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Each case: a good member first (so "nothing extracted" is meaningful), then the crafted one.
CASES = {
    "dotdot": [_file("checkpoint/CURRENT"), _file("../evil")],
    "dotdot-inside-a-path": [_file("checkpoint/CURRENT"), _file("checkpoint/../../evil")],
    "absolute": [_file("checkpoint/CURRENT"), _file("/tmp/raftmq-evil-absolute")],
    "symlink-outside": [_file("checkpoint/CURRENT"), _link("checkpoint/evil", "../../evil", tarfile.SYMTYPE)],
    "symlink-absolute": [
        _file("checkpoint/CURRENT"),
        _link("checkpoint/evil", "/etc/passwd", tarfile.SYMTYPE),
    ],
    "symlink-inside": [_file("checkpoint/CURRENT"), _link("checkpoint/OPTIONS", "CURRENT", tarfile.SYMTYPE)],
    "file-through-symlink": [
        _link("escape", "..", tarfile.SYMTYPE),
        _file("escape/evil"),
    ],
    "hardlink-inside": [
        _file("checkpoint/CURRENT"),
        _link("checkpoint/h", "checkpoint/CURRENT", tarfile.LNKTYPE),
    ],
    "hardlink-outside": [_file("checkpoint/CURRENT"), _link("checkpoint/h", "/etc/passwd", tarfile.LNKTYPE)],
    "fifo": [_file("checkpoint/CURRENT"), _special("checkpoint/fifo", tarfile.FIFOTYPE)],
    "char-device": [_file("checkpoint/CURRENT"), _special("checkpoint/null", tarfile.CHRTYPE)],
    "backslash": [_file("checkpoint/CURRENT"), _file("checkpoint\\..\\..\\evil")],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("which", sorted(EXTRACTORS))
def test_crafted_archive_is_refused_and_nothing_is_extracted(tmp_path: Path, which: str, case: str) -> None:
    extract, error = EXTRACTORS[which]
    outside = tmp_path / "outside"
    dest = outside / "dest"
    dest.mkdir(parents=True)
    archive = _tar(tmp_path / "crafted.tar", CASES[case])
    with tarfile.open(archive, MODES[which]) as tar, pytest.raises(error, match="unsafe entry"):
        extract(tar, str(dest))
    assert _everything(outside) == ["dest"]  # nothing inside, nothing next to it
    assert not os.path.lexists("/tmp/raftmq-evil-absolute")


@pytest.mark.parametrize("which", sorted(EXTRACTORS))
def test_plain_checkpoint_extracts_with_safe_modes(tmp_path: Path, which: str) -> None:
    extract, _ = EXTRACTORS[which]
    archive = _tar(
        tmp_path / "good.tar",
        [
            _dir("checkpoint"),
            _file("checkpoint/CURRENT", b"MANIFEST-000001\n", mode=0o4777),  # setuid, world-writable
            _file("checkpoint/000001.sst", b"sst"),
            _file("meta.json", b"{}"),
        ],
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    with tarfile.open(archive, MODES[which]) as tar:
        extract(tar, str(dest))
    assert _everything(dest) == ["checkpoint", "checkpoint/000001.sst", "checkpoint/CURRENT", "meta.json"]
    assert (dest / "checkpoint" / "CURRENT").read_bytes() == b"MANIFEST-000001\n"
    assert stat.S_IMODE((dest / "checkpoint" / "CURRENT").stat().st_mode) == 0o644
