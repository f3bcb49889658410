"""Directories whose entries survive a power loss.

A file's fsync makes its data durable, and a directory's fsync the entries in it; nothing makes the
directory's own entry in its parent durable but an fsync of the parent. RocksDB fsyncs its files and
its database directory, never the directory above, so without this a node's whole database (or its
snapshot directory) may vanish in a power loss right after it was created (the chaos suite's power-loss
file system drops exactly such entries; docs/chaos.md, "Power loss").
"""

from __future__ import annotations

import os

__all__ = ["fsync_dir", "fsync_tree", "make_dirs_durable", "rename_durably"]


def make_dirs_durable(path: str) -> None:
    """Create ``path`` (and its parents) if missing, then fsync it and every directory above it, so
    that the whole chain of entries leading to it is durable.

    Raises:
        OSError: a directory could not be created or fsynced.
    """
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def rename_durably(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (atomic on one filesystem) and make both directories' entries durable."""
    os.rename(src, dst)
    fsync_dir(os.path.dirname(dst))
    if os.path.dirname(src) != os.path.dirname(dst):
        fsync_dir(os.path.dirname(src))


def fsync_dir(path: str) -> None:
    """fsync the directory ``path`` (the entries in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file in ``path`` and the directory itself.

    A checkpoint made by RocksDB is already durable, but one assembled from a snapshot received over
    the network may not be, and a restore must not publish files whose data could still be lost.
    """
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    fsync_dir(path)
