"""The sliding window of one queue's delivered offsets: what a consumer may commit.

Pure and thread-safe (a sync consumer's messages are acked from the application's threads while
the fetch loop adds to the window from the event loop's thread). No I/O, no clock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["OffsetWindow"]


class OffsetWindow:
    """Offsets handed to the application, in fetch order, until they are finished.

    Invariants:
        - ``low_edge <= next_offset``;
        - every offset below ``low_edge`` was finished (acked), or skipped by :meth:`jump`;
        - ``low_edge`` only grows, except when :meth:`jump` moves backwards (which restarts the
          window: a reset after the queue was recreated);
        - the delivered offsets not below ``low_edge`` are the ranges ``[first, end)`` of
          ``_runs`` (increasing, none empty; more than one only after a forward :meth:`jump`), and
          the first of them is not finished; ``_finished`` holds the finished ones among them.

    ``low_edge`` is what the consumer commits: a slow message holds it back however many later
    messages finish, so a restart never skips an unfinished message. The ranges make an in-order
    ack (the common case) a move of the head, and :meth:`ack_many` of a contiguous run one move.
    """

    def __init__(self, start: int) -> None:
        self._lock = threading.Lock()
        self._runs: deque[list[int]] = deque()  # [first, end) of delivered offsets, increasing
        self._finished: set[int] = set()  # finished offsets still behind an unfinished head
        self._size = 0  # offsets in _runs
        self._next = start
        self._on_shrink: Callable[[], None] | None = None
        self._revoked = False

    @property
    def next_offset(self) -> int:
        """The next offset to fetch."""
        return self._next

    @property
    def low_edge(self) -> int:
        """The commit point: the first delivered offset not finished, else ``next_offset``."""
        with self._lock:
            return self._runs[0][0] if self._runs else self._next

    @property
    def size(self) -> int:
        """Offsets held in the window: delivered, and not yet below the low edge."""
        return self._size  # one int, replaced whole: no lock needed to read it

    @property
    def revoked(self) -> bool:
        """The queue was revoked: its delivered messages go to its next owner, acks do nothing."""
        return self._revoked

    def revoke(self) -> None:
        """Freeze the window (its queue was given up): later acks are ignored."""
        with self._lock:
            self._revoked = True

    def set_on_shrink(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (under no lock, from the acking thread) whenever the low edge moves
        (once per :meth:`ack` or :meth:`ack_many` that moved it)."""
        self._on_shrink = callback

    def add(self, first: int, count: int) -> None:
        """Offsets ``first .. first+count-1`` were fetched and are about to be delivered.

        Raises:
            ValueError: ``first`` is not ``next_offset`` (fetches are contiguous; use :meth:`jump`).
        """
        with self._lock:
            if first != self._next:
                raise ValueError(f"fetched offset {first} but the window expects {self._next}")
            if count <= 0:
                return
            runs = self._runs
            if runs and runs[-1][1] == first:
                runs[-1][1] += count
            else:
                runs.append([first, first + count])
            self._size += count
            self._next = first + count

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` finished. Unknown or repeated offsets are ignored.

        Returns:
            True if the low edge moved.
        """
        with self._lock:
            runs = self._runs
            if self._revoked or not runs:
                return False
            head = runs[0]
            if offset != head[0]:
                if self._held(offset) and offset not in self._finished:
                    self._finished.add(offset)
                return False
            head[0] += 1
            self._size -= 1
            if head[0] == head[1] or self._finished:
                self._advance()
        if self._on_shrink is not None:
            self._on_shrink()
        return True

    def ack_many(self, offsets: Sequence[int]) -> bool:
        """Mark every one of ``offsets`` finished under one lock (unknown and repeated ones are
        ignored), and call the shrink callback at most once.

        Returns:
            True if the low edge moved.
        """
        if not offsets:
            return False
        with self._lock:
            if self._revoked or not self._runs:
                return False
            head = self._runs[0]
            first, n = head[0], len(offsets)
            if not self._finished and first + n <= head[1] and offsets[0] == first and self._run_of(offsets):
                # The common case: the next n offsets, in order, and nothing finished out of order.
                head[0] += n
                self._size -= n
                if head[0] == head[1]:
                    self._advance()
            else:
                self._finished.update(filter(self._held, offsets))
                if head[0] not in self._finished:
                    return False
                self._advance()
        if self._on_shrink is not None:
            self._on_shrink()
        return True

    def jump(self, offset: int) -> None:
        """Continue fetching at ``offset`` (a reset after ``offset_out_of_range``).

        Forward: the skipped offsets count as finished (they are gone); delivered offsets stay
        pending. Backward: the window restarts at ``offset``.
        """
        with self._lock:
            if offset < self._next:
                self._runs.clear()
                self._finished.clear()
                self._size = 0
            self._next = offset

    # -- under the lock --------------------------------------------------------------------------

    @staticmethod
    def _run_of(offsets: Sequence[int]) -> bool:
        """``offsets`` are consecutive and increasing (one C-level comparison)."""
        first = offsets[0]
        return offsets[-1] == first + len(offsets) - 1 and list(offsets) == list(
            range(first, first + len(offsets))
        )

    def _held(self, offset: int) -> bool:
        """``offset`` is delivered and not below the low edge."""
        runs = self._runs
        if not runs or offset < runs[0][0] or offset >= self._next:
            return False
        return len(runs) == 1 or any(first <= offset < end for first, end in runs)

    def _advance(self) -> None:
        """Move the head past finished offsets and drop emptied ranges (restores the invariant)."""
        runs, finished = self._runs, self._finished
        while runs:
            head = runs[0]
            low, end = head[0], head[1]
            while low < end and low in finished:
                finished.discard(low)
                low += 1
            self._size -= low - head[0]
            if low < end:
                head[0] = low
                return
            runs.popleft()
