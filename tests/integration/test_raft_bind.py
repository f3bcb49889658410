"""A Raft group whose port is taken fails to start with a clear error instead of hanging."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.replication.raft import RaftBindError, RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore


class _Machine:
    def __init__(self) -> None:
        self._store = MemoryStore()

    @property
    def store(self) -> MemoryStore:
        return self._store

    @property
    def applied_index(self) -> int:
        return 0

    def apply(self, index: int, command: bytes) -> Any:
        return None

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


def test_a_taken_raft_port_raises_raft_bind_error_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(RaftBindError, match=addr):
            RaftGroup(
                name="0",
                node_id="n1",
                self_addr=addr,
                peer_addrs=[addr],
                journal_store=MemoryStore(),
                machine=_Machine(),
                snapshot_file=str(tmp_path / "snapshot" / "manifest.json"),
                settings=RaftSettings(password="x" * 16),
            )
        assert time.monotonic() - started < 30  # bounded, not a hang (about 5 s of retries)
