"""What the delivery loop knows of a queue group's schedule without a look at its store: the
earliest due time the applies since its last look added (``Applied.due_ms``: delayed messages and
in-flight deadlines), recorded by the apply hook on the tick thread (:class:`AddedDues`).

Why: the look (``storage/queues.py``, ``next_due_ms``) scans the deadline index from its start,
and that scan passes over the tombstone of every delivery settled since the store last compacted:
under a steady receive-and-delete load (an SQS receiver), tens of thousands of them, 10 % of a
leader's CPU per SQS call (docs/benchmarks.md, "The delivery loop's look"). With the applies'
due times the loop looks only when a known due time comes (a deliver_tick runs then anyway) or
when it cannot account for every apply since its last look (a snapshot installed, a new leader).
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["AddedDues"]


class Replica(Protocol):
    """A queue group's machine as the loop sees it."""

    @property
    def applied_index(self) -> int: ...


class AddedDues:
    """Per queue group, a run of consecutive applies since the loop's last look and the earliest
    due time they added. Thread-safe: the hook runs on the group's tick thread, the loop on the
    event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # name -> (first index, last index, earliest due time or None): the applies hooked since
        # the last look, consecutive (first > last: none yet).
        self._runs: dict[str, tuple[int, int, int | None]] = {}

    def applied(self, name: str, index: int, due_ms: int | None) -> None:
        """Apply ``index`` of group ``name`` added due times from ``due_ms`` on (None: none)."""
        with self._lock:
            run = self._runs.get(name)
            if run is not None and index <= run[1]:
                return  # an entry the look or the run covers already (a skipped one)
            if run is not None and index == run[1] + 1:
                earliest = run[2] if due_ms is None or (run[2] is not None and run[2] <= due_ms) else due_ms
                self._runs[name] = (run[0], index, earliest)
            else:  # the first, or after a gap (a snapshot installed): what came before is unknown
                self._runs[name] = (index, index, due_ms)

    def looked(self, name: str, replica: Replica) -> int:
        """The loop looks at the store now: the group's applied index (read under the lock, so an
        apply after it is in the new run, and one before it in the store the look reads)."""
        with self._lock:
            index = replica.applied_index
            self._runs[name] = (index + 1, index, None)
            return index

    def since(self, name: str, index: int, applied: int) -> tuple[bool, int | None]:
        """``(True, earliest due time added or None)`` when the applies after ``index`` (a look's)
        up to ``applied`` were all hooked; ``(False, None)`` otherwise."""
        with self._lock:
            run = self._runs.get(name)
        if run is None or run[0] != index + 1 or run[1] != applied:
            return False, None
        return True, run[2]
