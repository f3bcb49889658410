"""Raft group names: the metadata group's name, the Raft port of each group, the order groups are
listed in. Queue groups are named by their number as a string (``"0"``, ``"1"``, ...)."""

from __future__ import annotations

__all__ = ["META", "group_sort_key", "port_offset"]

META = "meta"
"""The metadata group's name."""


def port_offset(name: str) -> int:
    """The Raft port of group ``name`` is the node's ``raft`` port plus this: 0 for the metadata
    group, ``1 + g`` for queue group ``g``."""
    return 0 if name == META else 1 + int(name)


def group_sort_key(name: str) -> tuple[bool, str]:
    """Sorts the metadata group first, then queue groups by number."""
    return (name != META, name.zfill(4))
