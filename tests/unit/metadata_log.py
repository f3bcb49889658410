"""A metadata machine fed commands at increasing indexes, shared by the metadata tests
(``test_topic_attributes.py``, ``test_topic_tags.py``, ``test_rebalance.py``)."""

from __future__ import annotations

from typing import Any

import orjson

from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.placement import Placement
from raftmq.storage.memory import MemoryStore

__all__ = ["Meta", "create_topic"]


class Meta:
    """A MetadataMachine over a MemoryStore, fed commands at increasing indexes."""

    def __init__(self) -> None:
        self.machine = MetadataMachine(MemoryStore())
        self.index = 0

    def apply(self, **cmd: Any) -> dict[str, Any]:
        self.index += 1
        result: dict[str, Any] = self.machine.apply(self.index, orjson.dumps({"v": 1, **cmd}))
        return result

    def __call__(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.apply(op=op, **fields)

    @property
    def placement(self) -> Placement:
        p = self.machine.placement()
        assert p is not None
        return p


def create_topic(meta: Meta, name: str = "q", **extra: Any) -> dict[str, Any]:
    """``create_topic`` of ``name`` (2 queues over 3 groups, at 5 ms) with ``extra`` fields."""
    return meta.apply(op="create_topic", name=name, queues=2, group_count=3, now_ms=5, **extra)
