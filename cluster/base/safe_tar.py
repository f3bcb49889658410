"""Extracting tar files that arrive from elsewhere (a peer's checkpoint, a backup) under one directory.

Used by ``checkpoints._safe_extract`` (snapshot install) and ``backup._safe_extract`` (backup checks and
``raftmq restore``). Invariants, checked for every member before anything is written (so a refused
archive leaves nothing behind):

- a member is a regular file or a directory: symbolic and hard links, devices and FIFOs are refused
  (a link inside the destination could point elsewhere once the directory is renamed into place);
- its name is relative, uses ``/`` only, and has no ``..`` part;
- it resolves, with any symlink already on disk followed, to a path under the destination.

Files are written with mode 0644, directories 0755, owned by the running user (no setuid bit, no
owner taken from the archive). Python's ``filter="data"`` (3.11.4 and later) is applied on top when
it exists; it still allows links inside the destination, hence the checks here.
"""

from __future__ import annotations

import os
import tarfile

from raftmq.errors import RaftmqError

__all__ = ["UnsafeArchive", "safe_extract"]


class UnsafeArchive(RaftmqError, ValueError):
    """A member of the archive would be written outside the destination, or is not a plain file
    or directory."""


def _check(member: tarfile.TarInfo, root: str) -> None:
    name = member.name
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"unsafe entry {name!r}: only regular files and directories are allowed")
    parts = name.split("/")
    if not name or name.startswith("/") or os.path.isabs(name) or "\\" in name or ".." in parts:
        raise UnsafeArchive(f"unsafe entry {name!r}: not a relative path inside the archive")
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root:
        raise UnsafeArchive(f"unsafe entry {name!r}: resolves outside the destination")


def safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """Extract every member of ``tar`` under ``dest`` or, if any is unsafe, nothing.

    Raises:
        UnsafeArchive: a member breaks one of the module's rules (nothing was extracted).
    """
    root = os.path.realpath(dest)
    members = tar.getmembers()
    for member in members:
        _check(member, root)
    for member in members:
        member.mode = 0o755 if member.isdir() else 0o644
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
    else:  # Python before 3.11.4 (Debian bookworm's 3.11.2): the checks above are the filter
        tar.extractall(dest, members=members)
