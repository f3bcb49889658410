"""Extracting tar files that arrive from elsewhere (a peer's checkpoint, a backup) under one directory.

Used by ``checkpoints._safe_extract`` (snapshot install: ``safe_extract_stream``, member by member as
a download arrives) and ``backup._safe_extract`` (backup checks and ``raftmq restore``:
``safe_extract``). Invariants, checked for every member before it is written (``safe_extract``
checks them all before writing anything; ``safe_extract_stream`` deletes its destination when one
fails, so either way a refused archive leaves nothing behind):

- a member is a regular file or a directory: symbolic and hard links, devices and FIFOs are refused
  (a link inside the destination could point elsewhere once the directory is renamed into place);
- its name is relative, uses ``/`` only, and has no ``..`` part;
- it resolves, with any symlink already on disk followed, to a path under the destination.

Files are written with mode 0644, directories 0755, owned by the running user (no setuid bit, no
owner taken from the archive). Python's ``filter="data"`` (3.11.4 and later) is applied on top when
it exists; it still allows links inside the destination, hence the checks here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile

from raftmq.errors import RaftmqError

__all__ = ["UnsafeArchive", "safe_extract", "safe_extract_stream"]


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


def _own(member: tarfile.TarInfo) -> None:
    member.mode = 0o755 if member.isdir() else 0o644
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""


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
        _own(member)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
    else:  # Python before 3.11.4 (Debian bookworm's 3.11.2): the checks above are the filter
        tar.extractall(dest, members=members)


def safe_extract_stream(tar: tarfile.TarFile, dest: str) -> None:
    """Extract the members of ``tar`` under ``dest`` (new, or an empty directory) one by one as they
    are read, each checked first: ``tar`` may be opened in stream mode (``"r|"``) over a download, so
    the archive is never stored whole. If a member breaks a rule, or the archive cannot be read to
    its end, everything extracted is deleted (``dest`` too if this made it) and the error raised.

    Raises:
        UnsafeArchive: a member breaks one of the module's rules.
    """
    made = not os.path.exists(dest)
    os.makedirs(dest, exist_ok=True)
    if not made and os.listdir(dest):
        raise ValueError(f"{dest} is not empty: a refused archive could not be told from what was there")
    root = os.path.realpath(dest)
    try:
        for member in tar:
            _check(member, root)
            _own(member)
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, dest, filter="data")
            else:  # Python before 3.11.4: the checks above are the filter
                tar.extract(member, dest)
    except BaseException:
        if made:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            for entry in os.scandir(dest):
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.remove(entry.path)
        raise
