"""The sliding window of one queue's delivered offsets: what a consumer may commit.

Pure and thread-safe (a sync consumer's messages are acked from the application's threads while
the fetch loop adds to the window from the event loop's thread). No I/O, no clock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

__all__ = ["OffsetWindow"]


class OffsetWindow:
    """Offsets handed to the application, in fetch order, until they are finished.

    Invariants:
        - ``low_edge <= next_offset``;
        - every offset below ``low_edge`` was finished (acked), or skipped by :meth:`jump`;
        - ``low_edge`` only grows, except when :meth:`jump` moves backwards (which restarts the
          window: a reset after the queue was recreated).

    ``low_edge`` is what the consumer commits: a slow message holds it back however many later
    messages finish, so a restart never skips an unfinished message.
    """

    def __init__(self, start: int) -> None:
        self._lock = threading.Lock()
        self._pending: deque[int] = deque()  # delivered offsets, increasing; the head is not finished
        self._finished: set[int] = set()  # finished offsets still behind an unfinished head
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
            return self._pending[0] if self._pending else self._next

    @property
    def size(self) -> int:
        """Offsets held in the window: delivered, and not yet below the low edge."""
        with self._lock:
            return len(self._pending)

    @property
    def revoked(self) -> bool:
        """The queue was revoked: its delivered messages go to its next owner, acks do nothing."""
        return self._revoked

    def revoke(self) -> None:
        """Freeze the window (its queue was given up): later acks are ignored."""
        with self._lock:
            self._revoked = True

    def set_on_shrink(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (under no lock, from the acking thread) whenever the low edge moves."""
        self._on_shrink = callback

    def add(self, first: int, count: int) -> None:
        """Offsets ``first .. first+count-1`` were fetched and are about to be delivered.

        Raises:
            ValueError: ``first`` is not ``next_offset`` (fetches are contiguous; use :meth:`jump`).
        """
        with self._lock:
            if first != self._next:
                raise ValueError(f"fetched offset {first} but the window expects {self._next}")
            self._pending.extend(range(first, first + count))
            self._next = first + count

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` finished. Unknown or repeated offsets are ignored.

        Returns:
            True if the low edge moved.
        """
        with self._lock:
            pending = self._pending
            if self._revoked or not pending or offset < pending[0] or offset >= self._next:
                return False
            if offset in self._finished:
                return False
            if offset != pending[0]:
                self._finished.add(offset)
                return False
            pending.popleft()
            while pending and pending[0] in self._finished:
                self._finished.discard(pending.popleft())
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
                self._pending.clear()
                self._finished.clear()
            self._next = offset
