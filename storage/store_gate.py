"""The gate between a store's users and its database handle (:class:`HandleGate`, the base of
``RocksStore`` in ``storage/rocks.py``): how many threads use the handle, and taking it away from
them (a close, a restore) only once none is inside. No rocksdict here: the handle is typed by what
the gate calls on it (:class:`Handle`).

Threads: one writer and many readers may call in at once. Every use of the handle happens between
``_enter``/``_leave``. ``close`` and ``restore_from`` stop admitting users, wait until the in-flight
ones have left, and only then close the handle (``_revoke``). So a reader never touches a closed
database: during a swap it gets :class:`StoreClosed`. They cancel a compaction in flight first
(minutes on a large removed backlog), so they wait milliseconds for it, not all of it. A scan's
cursor, which holds an iterator that would keep a closed database open, is registered while it
lives and dropped by ``_revoke`` too.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Generic, Protocol, TypeVar

from .rocks_cursor import ScanCursor
from .store import StoreClosed

__all__ = ["Handle", "HandleGate"]


class Handle(Protocol):
    """What the gate calls on rocksdict's ``Rdict``."""

    def cancel_all_background(self, wait: bool) -> None: ...


H = TypeVar("H", bound=Handle)


class HandleGate(Generic[H]):
    """A database handle behind a gate: ``_enter`` admits a user (raising StoreClosed once the
    handle was taken away), ``_leave`` lets it out, ``_revoke`` takes the handle away."""

    def __init__(self, path: str, db: H) -> None:
        self._path = path
        # A plain lock (nothing holds it twice), taken as itself on the hot paths (_enter, _leave):
        # every call takes it twice, and the Condition's own __enter__ is Python code.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Invariant: _users counts threads between _enter and _leave; _db is not None exactly while new
        # users are admitted; a handle is closed only after _db stopped being it and _users reached 0.
        self._db: H | None = db
        self._users = 0
        self._compactions = 0  # compactions in the gate: _revoke cancels them
        self._cursors: weakref.WeakSet[ScanCursor] = weakref.WeakSet()

    def _enter(self) -> H:
        with self._lock:
            db = self._db
            if db is None:
                raise StoreClosed(f"store {self._path} is closed")
            self._users += 1
            return db

    def _leave(self) -> None:
        with self._lock:
            self._users -= 1
            # Only _revoke waits, and it stops admitting (_db = None) before it does: a leaver
            # while users are admitted has nobody to wake.
            if self._users == 0 and self._db is None:
                self._cond.notify_all()

    def _revoke(self) -> tuple[H | None, bool]:
        """Stop admitting users, cancel a compaction in flight, wait for in-flight users, drop
        every live scan iterator. Returns the handle, now used by nobody (None if the store was
        already closed), and whether its background work was cancelled."""
        with self._cond:
            db, self._db = self._db, None
            cancelled = False
            if db is not None and self._compactions > 0:
                cancelled = True
                # Ends the compaction within milliseconds; the handle is closed next, so what the
                # cancel leaves on it is moot. Should it fail, the wait is for the whole compaction.
                with contextlib.suppress(Exception):
                    db.cancel_all_background(False)
            self._cond.wait_for(lambda: self._users == 0)
            cursors = list(self._cursors)
            self._cursors.clear()
        for cursor in cursors:
            cursor.revoke()
        return db, cancelled

    def _register(self, cursor: ScanCursor) -> None:
        with self._cond:
            self._cursors.add(cursor)

    def _unregister(self, cursor: ScanCursor) -> None:
        with self._cond:
            self._cursors.discard(cursor)
