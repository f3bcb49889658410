"""A small latency histogram that the Raft and journal code fill and the metrics collector reads.

It has no dependency (``cluster/replication/raft.py`` and ``cluster/replication/journal.py`` stay
free of prometheus); the collector in ``cluster/api/metrics.py`` turns a
:meth:`LatencyHistogram.snapshot` into a Prometheus histogram at scrape time.
"""

from __future__ import annotations

import bisect
import threading

__all__ = ["LATENCY_BUCKETS_S", "LatencyHistogram"]

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    15.0,
)
"""Upper bounds (seconds) of the buckets; one more bucket (+Inf) catches the rest."""


class LatencyHistogram:
    """Counts of observed durations per bucket, and their sum. Thread-safe.

    ``observe`` is called on a tick thread for every entry, so it is a bisect and two additions
    under an uncontended lock.
    """

    def __init__(self, buckets_s: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self._bounds = buckets_s
        self._counts = [0] * (len(buckets_s) + 1)
        self._sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum_s += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative ``(le, count)`` pairs ending with ``("+Inf", total)``, and the sum in seconds."""
        with self._lock:
            counts = list(self._counts)
            total_s = self._sum_s
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*map(str, self._bounds), "+Inf"), counts, strict=True):
            running += n
            out.append((bound, running))
        return out, total_s

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)
