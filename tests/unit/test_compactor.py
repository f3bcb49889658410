"""The node's compactor of removed ranges (cluster/node/compactor.py): what applies freed is
compacted on the replica's state store, one range per queue start with the greatest end, a closed
store (a replica removed, restarted or stopping) logged and passed over, whether or not the node
lists the replica in its groups yet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest

from raftmq.cluster.node import compactor as compactor_module
from raftmq.cluster.node.compactor import Compactor
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, StoreClosed


class Recording:
    def __init__(self, closed: bool = False, more: int = 0) -> None:
        self.calls: list[list[tuple[bytes, bytes]]] = []  # the ranges of each call
        self.closed = closed
        self.more = more  # calls that answer "more to do" (a blob garbage rewrite under way)

    def compact_range(self, start: bytes, end: bytes) -> bool:
        return self.compact_ranges(((start, end),))

    def compact_ranges(self, ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        if self.closed:
            raise StoreClosed("closed")
        self.calls.append(list(ranges))
        self.more -= 1
        return self.more >= 0


def _compact(compactor: Compactor, *reports: tuple[str, object, tuple[tuple[bytes, bytes], ...]]) -> None:
    async def run() -> None:
        for name, store, ranges in reports:
            compactor.freed(name, store, ranges)  # type: ignore[arg-type]
        for task in compactor.tasks():
            await task

    asyncio.run(run())


def test_freed_ranges_are_compacted_once_each_with_the_greatest_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor_module, "COMPACT_DELAY_S", 0.0)
    g0, g1, closed, old, new = (
        Recording(),
        Recording(),
        Recording(closed=True),
        Recording(closed=True),
        Recording(),
    )
    compactor = Compactor()
    _compact(
        compactor,
        ("0", g0, ((b"a", b"a5"), (b"b", b"b2"))),
        ("0", g0, ((b"a", b"a9"),)),  # a later retain of the same queue: one range
        ("1", g1, ()),  # nothing freed: nothing to do
        ("2", closed, ((b"c", b"c1"),)),  # a closed store: logged, passed over
        ("3", old, ((b"d", b"d1"),)),  # a replica restarted meanwhile: its old store is closed
        ("3", new, ((b"e", b"e1"),)),  # and its new one reports its own
    )
    assert g0.calls == [[(b"a", b"a9"), (b"b", b"b2")]]  # one call: one piece of other work at most
    assert g1.calls == [] and closed.calls == [] and old.calls == [] and new.calls == [[(b"e", b"e1")]]
    assert compactor.compacted_ranges == 3 and compactor.tasks() == []


def test_a_store_with_more_to_do_is_called_again_with_an_empty_range_until_it_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RocksStore rewrites its blob garbage a bounded piece per compact_ranges call, however many
    ranges a job freed: the compactor calls it again (an empty range: nothing more was freed) for
    as long as it answers that it has more."""
    monkeypatch.setattr(compactor_module, "COMPACT_DELAY_S", 0.0)
    busy, idle = Recording(more=3), Recording()
    compactor = Compactor()
    _compact(compactor, ("0", busy, ((b"a", b"a5"), (b"b", b"b5"))), ("1", idle, ((b"b", b"b5"),)))
    assert busy.calls == [[(b"a", b"a5"), (b"b", b"b5")], [(b"", b"")], [(b"", b"")], [(b"", b"")]]
    assert idle.calls == [[(b"b", b"b5")]]
    assert compactor.compacted_ranges == 3 and compactor.tasks() == []


def test_a_replica_not_yet_listed_by_the_node_has_its_ranges_compacted_and_a_closed_one_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's start replays its journal before the node lists it in its groups: what that
    replay freed is compacted all the same (real RocksDB stores; the compactor knows no groups)."""
    monkeypatch.setattr(compactor_module, "COMPACT_DELAY_S", 0.0)
    starting, removed = (
        RocksStore.open(str(tmp_path / "starting")),
        RocksStore.open(str(tmp_path / "removed")),
    )
    for store in (starting, removed):
        batch = Batch()
        for n in range(20_000):
            batch.put(b"q" + n.to_bytes(4, "big"), bytes(1024))
        store.write(batch)
        gone = Batch()
        gone.delete_range(b"q", b"r")
        store.write(gone, sync=True)
    filled = starting.approximate_size()
    removed.close()
    compactor = Compactor()
    _compact(compactor, ("4", starting, ((b"q", b"r"),)), ("5", removed, ((b"q", b"r"),)))
    assert starting.approximate_size() < filled // 4, (filled, starting.approximate_size())
    assert compactor.compacted_ranges == 1
    starting.close()
