"""Test doubles shared by the pysyncobj seam tests (``test_raft_seams.py``), the RaftGroup tests
(``test_raft_group.py``, ``test_raft_wire.py``) and the snapshot install tests
(``test_snapshot_install.py``): a tiny state machine and fast Raft timings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raftmq.cluster.replication.raft import RaftSettings
from raftmq.storage.memory import MemoryStore

__all__ = ["Machine", "fast_settings"]


class Machine:
    """A tiny state machine recording the (index, command) pairs it applied."""

    def __init__(self, check: Callable[[int], None] | None = None) -> None:
        self._store = MemoryStore()
        self.applied: list[tuple[int, bytes]] = []
        self.check = check

    @property
    def store(self) -> MemoryStore:
        return self._store

    @property
    def applied_index(self) -> int:
        return self.applied[-1][0] if self.applied else 0

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self.applied_index:
            return {"skipped": True}
        if self.check is not None:
            self.check(index)
        self.applied.append((index, command))
        return {"index": index}

    def commands(self) -> list[bytes]:
        """The commands applied, in order (a copy: safe while the tick thread applies more)."""
        return [c for _, c in list(self.applied)]

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


def fast_settings() -> RaftSettings:
    return RaftSettings(
        password="x" * 16,
        election_min_s=0.15,
        election_max_s=0.3,
        heartbeat_s=0.02,
        tick_s=0.01,
    )
