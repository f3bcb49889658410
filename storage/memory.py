"""An in-memory :class:`~raftmq.storage.store.Store`: the test double of ``RocksStore``.

Sorted keys live in a list beside a dict; ``bisect`` gives ordered scans. A lock makes each batch
atomic for concurrent readers. ``checkpoint`` writes a file ``MemoryStore.load`` reads back, so tests
of snapshot code can run without RocksDB.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterable, Iterator

import orjson

from .store import OP_DELETE, OP_DELETE_RANGE, OP_PUT, Batch, StoreClosed, StoreError

__all__ = ["MemoryStore"]

_CHECKPOINT_FILE = "memory-store.json"


class MemoryStore:
    """A :class:`Store` in a dict. Nothing survives the process."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, path: str) -> MemoryStore:
        """A store holding what :meth:`checkpoint` wrote into ``path``."""
        store = cls()
        with open(os.path.join(path, _CHECKPOINT_FILE), "rb") as f:
            pairs = orjson.loads(f.read())
        batch = Batch()
        for key_hex, value_hex in pairs:
            batch.put(bytes.fromhex(key_hex), bytes.fromhex(value_hex))
        store.write(batch)
        return store

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("store is closed")

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        return self._data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self._check_open()
        return [self._data.get(key) for key in keys]

    def scan(
        self,
        start: bytes,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self._check_open()
        with self._lock:
            lo = bisect.bisect_left(self._keys, start)
            hi = len(self._keys) if end is None else bisect.bisect_left(self._keys, end)
            keys = self._keys[lo:hi]
            if reverse:
                keys.reverse()
            if limit is not None:
                keys = keys[:limit]
            pairs = [(k, self._data[k]) for k in keys]
        return iter(pairs)

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        self._check_open()
        with self._lock:
            i = bisect.bisect_right(self._keys, key) - 1
            if i < 0 or self._keys[i] < floor:
                return None
            k = self._keys[i]
            return k, self._data[k]

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        # Validate first: a bad op must leave the store unchanged (the batch is all or nothing).
        for op, _, _ in batch.ops:
            if op not in (OP_PUT, OP_DELETE, OP_DELETE_RANGE):
                raise ValueError(f"unknown batch op {op}")
        self._check_open()
        with self._lock:
            for op, a, b in batch.ops:
                if op == OP_PUT:
                    if a not in self._data:
                        bisect.insort(self._keys, a)
                    self._data[a] = b
                elif op == OP_DELETE:
                    if self._data.pop(a, None) is not None:
                        del self._keys[bisect.bisect_left(self._keys, a)]
                elif op == OP_DELETE_RANGE:
                    lo = bisect.bisect_left(self._keys, a)
                    hi = bisect.bisect_left(self._keys, b)
                    if lo < hi:
                        for k in self._keys[lo:hi]:
                            del self._data[k]
                        del self._keys[lo:hi]

    def sync(self) -> None:
        self._check_open()

    def compact_range(self, start: bytes, end: bytes) -> bool:
        self._check_open()  # a deleted key takes no space here
        return False

    def compact_ranges(self, ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        self._check_open()
        return False

    def checkpoint(self, path: str) -> None:
        self._check_open()
        with self._lock:
            pairs = [(k.hex(), self._data[k].hex()) for k in self._keys]
        try:
            os.makedirs(path)
            with open(os.path.join(path, _CHECKPOINT_FILE), "wb") as f:
                f.write(orjson.dumps(pairs))
        except OSError as exc:
            raise StoreError(f"checkpoint into {path} failed: {exc}") from exc

    def close(self) -> None:
        self._closed = True
