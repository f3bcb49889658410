"""The storage contract: an ordered byte-key store with atomic batched writes.

Everything raftmq keeps on disk goes through :class:`Store`: the queue-group and metadata state
machines, and the Raft journal. ``RocksStore`` (``storage/rocks.py``, the only module that imports
rocksdict) is the real implementation; ``MemoryStore`` (``storage/memory.py``) is its test double.
One contract suite (``tests/unit/test_store_contract.py``) runs against both.

Ownership and errors:
- Keys and values are ``bytes``; returned values are fresh ``bytes`` owned by the caller.
- Keys sort as unsigned bytes (memcmp order), so big-endian integers scan in numeric order.
- ``write`` applies every op of a batch or none (atomic), in op order. It raises ``StoreError`` on
  an I/O failure; the caller must then treat the store as broken (a replica that cannot write stops).
- Reads never see a half-applied batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from raftmq.errors import RaftmqError

__all__ = ["OP_DELETE", "OP_DELETE_RANGE", "OP_PUT", "Batch", "Store", "StoreClosed", "StoreError"]

OP_PUT = 0
OP_DELETE = 1
OP_DELETE_RANGE = 2


class StoreError(RaftmqError):
    """The store failed to read or write (I/O error, corruption, closed store)."""


class StoreClosed(StoreError):
    """The store was closed (or is being swapped for a restored checkpoint)."""


@dataclass
class Batch:
    """An ordered list of writes applied atomically by :meth:`Store.write`.

    ``delete_range(start, end)`` removes every key ``k`` with ``start <= k < end``; when
    ``start >= end`` it removes nothing.
    """

    ops: list[tuple[int, bytes, bytes]] = field(default_factory=list)

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append((OP_PUT, key, value))

    def delete(self, key: bytes) -> None:
        self.ops.append((OP_DELETE, key, b""))

    def delete_range(self, start: bytes, end: bytes) -> None:
        self.ops.append((OP_DELETE_RANGE, start, end))

    def __len__(self) -> int:
        return len(self.ops)


@runtime_checkable
class Store(Protocol):
    """An ordered key-value store. Safe for one writer thread and many reader threads."""

    def get(self, key: bytes) -> bytes | None:
        """The value stored at ``key``, or None."""
        ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values stored at ``keys``, in their order (None where none is), read at one point
        in time: :meth:`get` of each, in one call."""
        ...

    def scan(
        self,
        start: bytes,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` (``end=None``: no upper bound), ascending by key,
        or descending when ``reverse`` is set. At most ``limit`` pairs (``limit < 0`` raises
        ValueError). The iterator sees a consistent snapshot taken by this call; it may raise
        ``StoreClosed`` if the store is closed before it is exhausted."""
        ...

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        """The pair with the greatest key ``k`` such that ``floor <= k <= key``, or None."""
        ...

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        """Apply ``batch`` atomically. With ``sync`` the write (and every earlier write) is on
        stable storage when this returns. An unknown op raises ValueError and writes nothing."""
        ...

    def sync(self) -> None:
        """Make every write made so far durable (an fsync of the write-ahead log)."""
        ...

    def compact_range(self, start: bytes, end: bytes) -> bool:
        """Rewrite what the store keeps on disk for the keys in ``[start, end)`` now, so that the
        space of keys a ``delete_range`` removed there is freed (RocksDB keeps them in its files
        until a compaction rewrites them, which a store that stops growing may never run).
        Nothing readable changes. Blocking: for a background thread, never a state machine.

        Returns True while the store has more of such work under way, which it does in bounded
        pieces, one per call: call again (an empty range, ``start >= end``, does only that)."""
        ...

    def compact_ranges(self, ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        """:meth:`compact_range` of each of ``ranges``, with one piece of the work under way in all
        (not one per range). Returns True while more of it is to do."""
        ...

    def checkpoint(self, path: str) -> None:
        """Write a consistent, openable copy of the whole store into the new directory ``path``
        (its parents are created; ``StoreError`` if ``path`` exists)."""
        ...

    def close(self) -> None:
        """Release the store. Later calls raise ``StoreClosed``."""
        ...
