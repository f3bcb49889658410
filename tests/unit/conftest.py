"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store


@pytest.fixture(params=["memory", "rocks"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each test that takes ``store`` runs on a MemoryStore and on a real RocksStore."""
    if request.param == "memory":
        yield MemoryStore()
        return
    rocks = RocksStore.open(str(tmp_path / "db"))
    try:
        yield rocks
    finally:
        rocks.close()
