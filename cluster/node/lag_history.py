"""Consumer lag over the last minutes, kept by every node for the web console's charts.

Every ``limits.lag_sample_ms`` (default 10 s) a node reads the lag of every consumer group (the
figures of ``GET /v1/topics/{topic}/groups``, all topics at once: one read per queue group, whose
cost grows with the groups, not the topics or queues) and appends it to a ring per (topic, group):
``HISTORY_MS`` (15 minutes) of samples at most. Memory is bounded in both
directions a client could push it: samples per series by the ring, series by ``MAX_SERIES`` (group
names are chosen by clients; past the bound the series updated longest ago is dropped first), and
a series nobody has seen for ``HISTORY_MS`` is dropped. A topic whose figures are incomplete (a
queue group's leader could not be asked) is skipped for that round: a gap, not a false dip.

The history is this node's: a node that just started has none yet, and nodes' samples differ a
little in time. ``GET /v1/topics/{topic}/groups/lag`` reads it (``api/handlers/consumers.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable

__all__ = ["HISTORY_MS", "MAX_SERIES", "LagHistory", "Lags", "sample_forever"]

HISTORY_MS = 15 * 60 * 1000
MAX_SERIES = 1000  # (topic, group) series kept on a node

Lags = dict[int, list[tuple[str, int]]]  # topic id -> [(consumer group, lag), ...]

log = logging.getLogger("raftmq.lag_history")


class LagHistory:
    """Rings of ``(time_ms, lag)`` per ``(topic_id, group)``, bounded as the module says."""

    def __init__(self, interval_ms: int, history_ms: int = HISTORY_MS, max_series: int = MAX_SERIES) -> None:
        self.interval_ms = interval_ms
        self.history_ms = history_ms
        self.max_series = max_series
        self.samples_per_series = max(2, history_ms // max(1, interval_ms) + 1)
        self._series: OrderedDict[tuple[int, str], deque[tuple[int, int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._series)

    def record(self, topic_id: int, lags: Iterable[tuple[str, int]], now_ms: int) -> None:
        """One sample of each group's lag on a topic."""
        self._append(topic_id, lags, now_ms)
        self.expire(now_ms)

    def _append(self, topic_id: int, lags: Iterable[tuple[str, int]], now_ms: int) -> None:
        for group, lag in lags:
            key = (topic_id, group)
            ring = self._series.get(key)
            if ring is None:
                ring = self._series[key] = deque(maxlen=self.samples_per_series)
            else:
                self._series.move_to_end(key)  # the most recently updated last
            ring.append((now_ms, lag))
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)

    def record_round(self, lags: Lags, now_ms: int) -> None:
        """One sample of each group's lag on each topic (``{topic id: [(group, lag), ...]}``),
        then one expiry pass: a round costs the series, not the series times the topics."""
        for topic_id, of_topic in sorted(lags.items()):
            self._append(topic_id, of_topic, now_ms)
        self.expire(now_ms)

    def expire(self, now_ms: int) -> None:
        """Drops samples older than the history, and series left with none."""
        horizon = now_ms - self.history_ms
        while self._series:
            key, ring = next(iter(self._series.items()))
            if ring[-1][0] >= horizon:
                break
            del self._series[key]  # updated longest ago and too old: the rest are newer
        for ring in self._series.values():
            while ring and ring[0][0] < horizon:
                ring.popleft()

    def of_topic(self, topic_id: int) -> dict[str, list[tuple[int, int]]]:
        """``group -> [(time_ms, lag), ...]`` (oldest first) of one topic."""
        return {group: list(ring) for (tid, group), ring in self._series.items() if tid == topic_id}


async def sample_forever(
    history: LagHistory,
    sample: Callable[[], Awaitable[Lags]],
    now_ms: Callable[[], int],
) -> None:
    """Samples every ``history.interval_ms``: ``sample()`` gives each group's lag per topic id, for
    the topics with a consumer group whose figures are complete (the others are left out)."""
    while True:
        await asyncio.sleep(history.interval_ms / 1000)
        try:
            lags = await sample()
        except asyncio.CancelledError:
            raise
        except Exception:  # no metadata yet, a node going away: next round (the loop never dies)
            log.debug("lag sample failed", exc_info=True)
            lags = {}
        history.record_round(lags, now_ms())
