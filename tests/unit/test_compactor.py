"""The node's compactor of removed ranges (cluster/node/compactor.py): what applies freed is
compacted on the replica's state store, one range per queue start with the greatest end, ranges
of a replica removed meanwhile skipped, a closed store logged and passed over."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raftmq.cluster.node import compactor as compactor_module
from raftmq.cluster.node.compactor import Compactor
from raftmq.storage.store import StoreClosed


class Recording:
    def __init__(self, closed: bool = False) -> None:
        self.calls: list[tuple[bytes, bytes]] = []
        self.closed = closed

    def compact_range(self, start: bytes, end: bytes) -> None:
        if self.closed:
            raise StoreClosed("closed")
        self.calls.append((start, end))


def _node(**stores: Recording) -> Any:
    return SimpleNamespace(groups={name: SimpleNamespace(state_store=s) for name, s in stores.items()})


def test_freed_ranges_are_compacted_once_each_with_the_greatest_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor_module, "COMPACT_DELAY_S", 0.0)
    g0, g1, closed = Recording(), Recording(), Recording(closed=True)
    compactor = Compactor(_node(**{"0": g0, "1": g1, "2": closed}))

    async def run() -> None:
        compactor.freed("0", ((b"a", b"a5"), (b"b", b"b2")))
        compactor.freed("0", ((b"a", b"a9"),))  # a later retain of the same queue: one range
        compactor.freed("1", ())  # nothing freed: nothing to do
        compactor.freed("2", ((b"c", b"c1"),))  # a closed store: logged, passed over
        compactor.freed("gone", ((b"d", b"d1"),))  # a replica removed meanwhile
        (task,) = compactor.tasks()
        await task

    asyncio.run(run())
    assert g0.calls == [(b"a", b"a9"), (b"b", b"b2")]
    assert g1.calls == [] and closed.calls == []
    assert compactor.compacted_ranges == 2 and compactor.tasks() == []
