"""The SQS delayed figure's shared count (cluster/api/delayed_counts.py): one scan of a group's
due-time index at a time, its result answering every ask made meanwhile and, for a short while,
after it; a new scan once the group applied something and the count aged."""

from __future__ import annotations

import asyncio
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


def test_asks_at_once_share_one_scan_and_later_ones_reuse_it_until_it_ages_with_news() -> None:
    group, now = Group(), [100.0]
    group.delay(T, 0, 2)
    group.delay(OTHER, 1, 3)
    counts = DelayedCounts(clock=lambda: now[0])

    async def ask(topic: int) -> dict[int, int]:
        return await counts.of("0", group.store, group.machine.applied_index, topic)

    async def run() -> None:
        # 50 asks of any queue of the group at once (any right on a queue allows one): one scan.
        answers = await asyncio.gather(*(ask(T if i % 2 else OTHER) for i in range(50)))
        assert answers == [({0: 2} if i % 2 else {1: 3}) for i in range(50)]
        assert counts.scans == 1
        group.delay(T, 0, 1)  # the group applies an entry: within the count's age, it answers still
        assert await ask(T) == {0: 2} and counts.scans == 1
        now[0] += DELAYED_COUNT_MAX_AGE_S
        assert await ask(T) == {0: 3} and counts.scans == 2  # aged and news: counted again
        now[0] += 60
        assert await ask(OTHER) == {1: 3} and counts.scans == 2  # aged, nothing applied since: as it was

    asyncio.run(run())


def test_a_failed_scan_fails_its_asks_and_keeps_nothing() -> None:
    group = Group()
    group.delay(T, 0, 1)
    counts = DelayedCounts()
    group.store.close()

    async def run() -> list[Any]:
        index = group.machine.applied_index
        return await asyncio.gather(
            *(counts.of("0", group.store, index, T) for _ in range(3)), return_exceptions=True
        )

    assert [type(e) for e in asyncio.run(run())] == [StoreClosed] * 3
    assert counts.scans == 1
    with pytest.raises(StoreClosed):
        asyncio.run(counts.of("0", group.store, group.machine.applied_index, T))
    assert counts.scans == 2
