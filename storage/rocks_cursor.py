"""``ScanCursor``: a lazy scan over one RocksDB iterator of :class:`~raftmq.storage.rocks.RocksStore`,
read in chunks through the store's gate. No rocksdict here: the iterator is typed by what the
cursor calls on it (``RawIterator``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from .store import StoreClosed, StoreError

__all__ = ["CHUNK_BYTES", "CHUNK_PAIRS", "RawIterator", "ScanCursor", "as_bytes"]

# A scan reads this many pairs (or this many bytes of keys and values, whichever comes first) per
# visit to the database, so readers take the gate once per chunk rather than once per pair, and a
# scan of 1 MiB values does not buffer more than about a chunk of them.
CHUNK_PAIRS = 64
CHUNK_BYTES = 1 << 20


class RawIterator(Protocol):
    """What a cursor calls on rocksdict's ``RdictIter``."""

    def valid(self) -> bool: ...
    def key(self) -> object: ...
    def value(self) -> object: ...
    def next(self) -> None: ...
    def prev(self) -> None: ...
    def seek(self, key: bytes) -> None: ...
    def seek_to_last(self) -> None: ...


def as_bytes(value: object) -> bytes:
    """``value`` read from the database, checked to be bytes (raw mode)."""
    if not isinstance(value, bytes):
        raise StoreError(f"expected bytes from the database, got {type(value).__name__}")
    return value


class ScanCursor:
    """A lazy scan over one rocksdict iterator, read in chunks while admitted through the store's gate.

    Invariant: ``_it`` is used only inside ``gate`` (the store's ``_enter`` and ``_leave``), and the
    store calls :meth:`revoke` only when no thread is inside it; so the iterator is never used
    concurrently with the database being closed.
    """

    def __init__(
        self,
        it: RawIterator,
        start: bytes,
        *,
        reverse: bool,
        limit: int | None,
        gate: Callable[[], AbstractContextManager[object]],
        done: Callable[[ScanCursor], None],
        path: str,
    ) -> None:
        self._gate = gate  # the store's gate: every use of the iterator happens inside it
        self._done = done  # told once the iterator is exhausted and dropped
        self._path = path
        self._it: RawIterator | None = it
        self._start = start
        self._reverse = reverse
        self._remaining = limit
        self._positioned = False
        self._below_start = False  # a reverse scan went past start: done
        self._revoked = False
        self._buffer: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._pinned: tuple[object, ...] = ()

    def __iter__(self) -> ScanCursor:
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        if not self._buffer and self._it is not None:
            self._refill()
        if self._buffer:
            return self._buffer.popleft()
        if self._revoked:
            raise StoreClosed(f"store {self._path} was closed during a scan")
        raise StopIteration

    def pin(self, *objects: object) -> None:
        """Keep ``objects`` alive as long as this cursor (the iterator points into them)."""
        self._pinned = objects

    def revoke(self) -> None:
        """Drop the iterator (it would keep a closed database open). Called by the store."""
        if self._it is not None:
            self._it = None
            self._revoked = True

    def prime(self) -> bool:
        """Read the first chunk now, inside the gate the store's ``scan`` holds; True when the scan
        is not over (the store then registers the cursor: only a live iterator needs revoking).
        A scan of a few pairs is read whole here, with no second visit to the gate."""
        it = self._it
        assert it is not None and not self._positioned
        self._position(it)
        self._read_chunk(it)
        if self._exhausted(it):
            self._it = None
            return False
        return True

    def _position(self, it: RawIterator) -> None:
        # Forward: seek to start (the upper bound ends it). Reverse: the last key below the upper
        # bound; the lower limit is checked in _read_chunk (rocksdict's lower bound is broken).
        if self._reverse:
            it.seek_to_last()
        else:
            it.seek(self._start)
        self._positioned = True

    def _refill(self) -> None:
        with self._gate():
            it = self._it
            if it is None:  # revoked between the check in __next__ and the gate
                return
            if not self._positioned:
                self._position(it)
            self._read_chunk(it)
            if self._exhausted(it):
                self._it = None
                self._done(self)

    def _read_chunk(self, it: RawIterator) -> None:
        size = 0
        while len(self._buffer) < CHUNK_PAIRS and size < CHUNK_BYTES and not self._exhausted(it):
            key = as_bytes(it.key())
            if self._reverse and key < self._start:
                self._below_start = True
                break
            value = as_bytes(it.value())
            self._buffer.append((key, value))
            size += len(key) + len(value)
            if self._remaining is not None:
                self._remaining -= 1
            if self._reverse:
                it.prev()
            else:
                it.next()

    def _exhausted(self, it: RawIterator) -> bool:
        return self._below_start or self._remaining == 0 or not it.valid()
