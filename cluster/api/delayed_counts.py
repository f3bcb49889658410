"""The delayed messages of this node's queue group replicas, counted once for many asks (the SQS
API's ApproximateNumberOfMessagesDelayed, read at each queue group's leader).

A count reads the group's whole due-time index (every topic's, up to ``DELAYED_SCAN_MAX`` entries:
about a quarter of a second of a core), and any right on a queue allows asking for it. So a
group's count is shared and its scans spaced: an ask takes the last count if the group applied
nothing since; otherwise it waits for the scan running, or starts one, which begins no sooner than
``DELAYED_COUNT_MAX_AGE_S`` after the last one ended. One scan per group at a time and at most
about one a second, whatever the asks; an answer never predates the ask's own writes. State: one
count per queue group this node has led, each bounded by ``DELAYED_SCAN_MAX`` entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from raftmq.cluster.machines.views import delayed_by_topic
from raftmq.storage.store import Store

__all__ = ["DELAYED_COUNT_MAX_AGE_S", "DelayedCounts"]

DELAYED_COUNT_MAX_AGE_S = 1.0
"""The least time between the end of a group's scan and the start of its next one."""

ByTopic = dict[int, dict[int, int]]


class DelayedCounts:
    """Per queue group: the last count (when it ended, at which applied index) and the scan running."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._counted: dict[str, tuple[float, int, ByTopic]] = {}
        self._scans: dict[str, asyncio.Future[ByTopic]] = {}
        self._scan_index: dict[str, int] = {}  # the applied index a running scan started at
        self.scans = 0  # scans run (tests read it)

    async def of(
        self, name: str, store: Store, applied_index: Callable[[], int], topic_id: int
    ) -> dict[int, int]:
        """``{queue: n}``: the delayed messages of ``topic_id`` in group ``name``'s ``store``, whose
        machine's applied index ``applied_index`` reads.

        Raises:
            StoreError: the store is closed or being restored (nothing is kept then).
        """
        asked_at = applied_index()  # the ask's own writes are applied up to here
        while True:
            counted = self._counted.get(name)
            if counted is not None and counted[1] >= asked_at:
                return counted[2].get(topic_id, {})
            scan = self._scans.get(name)
            if scan is None:
                wait_s = 0.0 if counted is None else counted[0] + DELAYED_COUNT_MAX_AGE_S - self._clock()
                scan = self._scans[name] = asyncio.ensure_future(
                    self._scan(name, store, applied_index, wait_s)
                )
            started_at = self._scan_index.get(name)
            # shield: an ask cancelled (its client gone) does not cancel the scan others wait for.
            by_topic = await asyncio.shield(scan)
            if started_at is None or started_at >= asked_at:
                return by_topic.get(topic_id, {})
            # That scan read the index before this ask's writes: wait for it, then for a newer one.

    async def _scan(
        self, name: str, store: Store, applied_index: Callable[[], int], wait_s: float
    ) -> ByTopic:
        try:
            if wait_s > 0:
                await self._sleep(wait_s)
            index = self._scan_index[name] = applied_index()  # the count covers at least this index
            self.scans += 1
            by_topic, _ = await asyncio.get_running_loop().run_in_executor(None, delayed_by_topic, store)
        finally:
            del self._scans[name]
            self._scan_index.pop(name, None)
        self._counted[name] = (self._clock(), index, by_topic)
        return by_topic
