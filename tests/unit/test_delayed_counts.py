"""The SQS delayed figure's shared count (cluster/api/delayed_counts.py): one scan of a group's
due-time index at a time, its result answering every ask made meanwhile and every later ask until
the group applies something; the next scan no sooner than DELAYED_COUNT_MAX_AGE_S after the last."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.cluster import commands
from raftmq.cluster.api.delayed_counts import DELAYED_COUNT_MAX_AGE_S, DelayedCounts
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import StoreClosed

T, OTHER = 1, 2


class Group:
    """A queue group's machine with delayed messages in its store."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 0)

    def delay(self, topic: int, queue: int, n: int) -> None:
        msgs = [{"value": f"d{i}", "deliver_at_ms": 10_000} for i in range(n)]
        index = self.machine.applied_index + 1
        assert "results" in self.machine.apply(
            index, commands.produce(0, [{"topic_id": topic, "queue": queue, "messages": msgs}])
        )

    def index(self) -> int:
        return self.machine.applied_index


class Clock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_asks_share_one_scan_and_its_count_until_the_group_changes_then_scans_are_spaced() -> None:
    group, clock = Group(), Clock()
    group.delay(T, 0, 2)
    group.delay(OTHER, 1, 3)
    counts = DelayedCounts(clock=clock, sleep=clock.sleep)

    async def ask(topic: int) -> dict[int, int]:
        return await counts.of("0", group.store, group.index, topic)

    async def run() -> None:
        # 50 asks of the group's queues at once (any right on a queue allows one): one scan.
        answers = await asyncio.gather(*(ask(T if i % 2 else OTHER) for i in range(50)))
        assert answers == [({0: 2} if i % 2 else {1: 3}) for i in range(50)]
        assert counts.scans == 1
        assert [await ask(T) for _ in range(20)] == [{0: 2}] * 20  # nothing applied: the same count
        assert counts.scans == 1 and clock.slept == []
        clock.now += 0.25
        group.delay(T, 0, 1)  # the group changed: the next asks wait for a scan, spaced from the last
        answers = await asyncio.gather(*(ask(T) for _ in range(10)))
        assert answers == [{0: 3}] * 10  # never older than the ask's own write
        assert counts.scans == 2 and clock.slept == [pytest.approx(DELAYED_COUNT_MAX_AGE_S - 0.25)]
        clock.now += 60
        group.delay(OTHER, 1, 1)
        assert await ask(OTHER) == {1: 4} and counts.scans == 3 and len(clock.slept) == 1  # long since

    asyncio.run(run())


def test_a_failed_scan_fails_its_asks_and_keeps_nothing() -> None:
    group = Group()
    group.delay(T, 0, 1)
    counts = DelayedCounts()
    group.store.close()

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(counts.of("0", group.store, group.index, T) for _ in range(3)), return_exceptions=True
        )

    assert [type(e) for e in asyncio.run(run())] == [StoreClosed] * 3
    assert counts.scans == 1
    with pytest.raises(StoreClosed):
        asyncio.run(counts.of("0", group.store, group.index, T))
    assert counts.scans == 2


class GatedStore(MemoryStore):
    """A store whose next scan reads its entries, then waits for ``gate`` before handing them over:
    a scan that is running (its index read, its entries taken) while a write applies."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.scanning = threading.Event()

    def scan(self, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        items = list(super().scan(*args, **kwargs))
        gate, self.gate = self.gate, None
        if gate is not None:
            self.scanning.set()
            gate.wait(10)
        return iter(items)


def test_an_ask_after_its_own_write_does_not_join_a_scan_that_began_before_it() -> None:
    group = Group()
    group.store = GatedStore()
    group.machine = QueueGroupMachine(group.store, 0)
    group.delay(T, 0, 2)
    counts = DelayedCounts()

    async def run() -> tuple[dict[int, int], dict[int, int]]:
        gate = group.store.gate = threading.Event()
        first = asyncio.ensure_future(counts.of("0", group.store, group.index, T))
        await asyncio.to_thread(group.store.scanning.wait, 10)  # that scan read its index and entries
        group.delay(T, 0, 1)  # then a SendMessage with a delay applies, and its sender asks
        second = asyncio.ensure_future(counts.of("0", group.store, group.index, T))
        await asyncio.sleep(0.05)
        gate.set()
        return await first, await second

    first, second = asyncio.run(run())
    assert first == {0: 2}  # the scan that began before the write
    assert second == {0: 3}  # never older than the ask's own write
    assert counts.scans == 2
