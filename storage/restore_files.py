"""The file steps of a store restore (``RocksStore.restore_from``'s protocol, described in
``storage/rocks.py``): the durable renames that put a checkpoint in place or undo it, and removing
a store's directories. No RocksDB here: these are directories and renames.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

from .durable_dirs import fsync_tree, rename_durably
from .store import StoreError

__all__ = [
    "RESTORE_FAILED_SUFFIX",
    "RESTORE_OLD_SUFFIX",
    "check_restorable",
    "destroy_store",
    "is_database",
    "remove_tree",
    "roll_back",
    "swap_in",
]

RESTORE_OLD_SUFFIX = ".restore-old"
"""``<path><suffix>`` holds the database being replaced while a restore is in progress."""

RESTORE_FAILED_SUFFIX = ".restore-failed"
"""``<path><suffix>`` holds a restored database that would not open, until it is deleted."""


@contextlib.contextmanager
def _os_errors() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise StoreError(str(exc)) from exc


def is_database(path: str) -> bool:
    """``path`` holds a RocksDB database (its ``CURRENT`` file)."""
    return os.path.isfile(os.path.join(path, "CURRENT"))


def check_restorable(src: str, path: str) -> None:
    """Raise StoreError unless ``src`` is a checkpoint the store at ``path`` can swap in: a
    database, not inside ``path``, on its filesystem (the swap is renames)."""
    if not is_database(src):
        raise StoreError(f"{src} is not a RocksDB checkpoint (no CURRENT file)")
    if os.path.commonpath([src, path]) == path:
        raise StoreError(f"checkpoint {src} lies inside the store it would replace")
    if os.stat(src).st_dev != os.stat(os.path.dirname(path)).st_dev:
        raise StoreError(f"checkpoint {src} is on another filesystem than {path}")


def roll_back(path: str) -> None:
    """Put ``<path>.restore-old`` back at ``path``. Each rename is atomic and made durable."""
    failed = path + RESTORE_FAILED_SUFFIX
    with _os_errors():
        if os.path.lexists(path):
            rename_durably(path, failed)
        rename_durably(path + RESTORE_OLD_SUFFIX, path)
    remove_tree(failed)


def swap_in(src: str, path: str) -> None:
    """Steps 1-3 of the restore protocol: make ``src`` durable, move ``path`` aside, move ``src`` in."""
    fsync_tree(src)
    rename_durably(path, path + RESTORE_OLD_SUFFIX)
    rename_durably(src, path)


def remove_tree(path: str) -> None:
    """Delete the directory ``path`` if it exists (``StoreError`` if it cannot be removed)."""
    if os.path.lexists(path):
        with _os_errors():
            shutil.rmtree(path)


def destroy_store(path: str) -> None:
    """Delete the store directory ``path`` and any restore leftovers beside it. The store must be closed.

    Raises:
        StoreError: a directory could not be removed.
    """
    path = os.path.abspath(path)
    for victim in (path, path + RESTORE_OLD_SUFFIX, path + RESTORE_FAILED_SUFFIX):
        remove_tree(victim)
