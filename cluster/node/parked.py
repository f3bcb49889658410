"""Dead letters parked for want of a dead-letter topic, as a queue group's applies report them
(``Applied.parked``: ``(topic_id, topic, consumer group)``), kept by the node for whoever creates
the topics (the API's delivery handlers, ``SubscriptionsApi.take_parked``).

The node owns the queue, so nothing is set on it after its construction. Bounded
(:data:`PARKED_REPORTS_MAX`): a report that finds it full is dropped and counted, which loses
nothing, since the parked message is parked again at its next failure, and that asks again.
"""

from __future__ import annotations

import asyncio

__all__ = ["PARKED_REPORTS_MAX", "Parked", "ParkedReports"]

PARKED_REPORTS_MAX = 1024

Parked = tuple[tuple[int, str, str], ...]
"""One apply's report: ``(topic_id, topic, consumer group)`` of each group that parked a message."""


class ParkedReports:
    """The reports not taken yet, oldest first. ``put`` and ``get`` run on the event loop."""

    def __init__(self, limit: int = PARKED_REPORTS_MAX) -> None:
        self._queue: asyncio.Queue[Parked] = asyncio.Queue(limit)
        self.dropped = 0  # reports that found the queue full

    def put(self, parked: Parked) -> None:
        try:
            self._queue.put_nowait(parked)
        except asyncio.QueueFull:
            self.dropped += 1

    async def get(self) -> Parked:
        """The oldest report, waiting for one."""
        return await self._queue.get()
