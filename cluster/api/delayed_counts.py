"""The delayed messages of this node's queue group replicas, counted once for many asks (the SQS
API's ApproximateNumberOfMessagesDelayed, read at each queue group's leader).

A count reads the group's whole due-time index (every topic's, up to ``DELAYED_SCAN_MAX`` entries:
about a quarter of a second of a core), and any right on a queue allows asking for it. So a group's
count is shared: one scan at a time per group, whose result answers every ask made while it runs,
and an ask within ``DELAYED_COUNT_MAX_AGE_S`` after it (or at the same applied index: nothing has
changed) takes it too. The figure is approximate anyway, as AWS's is. State: one count per queue
group this node holds, each bounded by ``DELAYED_SCAN_MAX`` entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from raftmq.cluster.machines.views import delayed_by_topic
from raftmq.storage.store import Store

__all__ = ["DELAYED_COUNT_MAX_AGE_S", "DelayedCounts"]

DELAYED_COUNT_MAX_AGE_S = 1.0
"""How long a group's count answers asks after its scan ended, whatever was applied since."""

ByTopic = dict[int, dict[int, int]]


class DelayedCounts:
    """Per queue group: the last count (when, at which applied index) and the scan running."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counted: dict[str, tuple[float, int, ByTopic]] = {}
        self._scans: dict[str, asyncio.Future[ByTopic]] = {}
        self.scans = 0  # scans started (tests read it)

    async def of(self, name: str, store: Store, applied_index: int, topic_id: int) -> dict[int, int]:
        """``{queue: n}``: the delayed messages of ``topic_id`` in group ``name``'s ``store``, whose
        machine has applied ``applied_index``.

        Raises:
            StoreError: the store is closed or being restored (nothing is kept then).
        """
        counted = self._counted.get(name)
        if counted is not None and (
            counted[1] == applied_index or self._clock() - counted[0] < DELAYED_COUNT_MAX_AGE_S
        ):
            return counted[2].get(topic_id, {})
        scan = self._scans.get(name)
        if scan is None:
            scan = self._scans[name] = asyncio.ensure_future(self._scan(name, store, applied_index))
        # shield: an ask cancelled (its client gone) does not cancel the scan others wait for.
        by_topic = await asyncio.shield(scan)
        return by_topic.get(topic_id, {})

    async def _scan(self, name: str, store: Store, applied_index: int) -> ByTopic:
        self.scans += 1
        try:
            by_topic, _ = await asyncio.get_running_loop().run_in_executor(None, delayed_by_topic, store)
        finally:
            del self._scans[name]
        self._counted[name] = (self._clock(), applied_index, by_topic)
        return by_topic
