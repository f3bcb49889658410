"""What the queue-group apply reads again at every entry, kept between entries (:class:`StateCache`):
the group's time, the queues' bounds, producer states, topic tombstones, the producers' sweep
key, the subscriptions (every receive and settlement reads its group's) and the cursor, floor
and lock of each subscription queue (a receive reads the three, a settlement the first two),
each of which the previous entry usually just wrote or read (4-5 store reads per produced batch
otherwise, docs/benchmarks.md, "A cache of the apply's reads").

Invariants (tests/unit/test_state_cache.py, test_determinism.py):

- NEVER ANSWERS DIFFERENTLY FROM THE STORE. An entry is what the store holds at its key (decoded,
  or its absence) as of the last write. Reads fill it from the store; a written batch updates it
  (:meth:`StateCache.written`) op by op, in the batch's order: a put of bytes the apply encoded
  (``Apply.finish``) keeps what a read of those bytes decodes to (not the object encoded: a decoding
  may normalise, as a group time stamped 0 does), any other put or delete of a cached kind of key
  forgets the key, and a ``delete_range`` reaching into a cached kind forgets everything.
- Only the machine's apply thread uses it; the store has one writer, that apply.
- Forgotten whenever the store may hold anything else: a restore (a snapshot install swaps the
  store's contents), a write that failed (``StoreError``: nothing unwritten is kept).
- Bounded: at most ``max_entries`` keys, the least recently used forgotten first, and at most
  ``max_entries`` empty retry prefixes (below: at most 265 bytes each), all forgotten when one
  more would pass that; 0 disables both.
  Decoded values are frozen dataclasses, shared safely with the apply's overlay.
- It also keeps how many producer idle-index (``W``) keys the store holds, the live producer
  states the group's cap counts (``producers.py``): counted with one scan when first asked, then
  moved by each written put (a new key: the apply never puts one that exists) and delete (of a
  key that exists) of a ``W`` key; forgotten with the rest, and by a ``delete_range`` reaching
  ``W``.
- It also keeps which subscription queues' retry indexes (``Y`` keys under a ``sub_key(RETRY,
  ...)`` prefix) the store holds no key under: learnt when a scan finds none, forgotten by each
  written put of a ``Y`` key under the prefix (a delete cannot make an empty prefix hold a key),
  and with the rest. Every receive looks there first, and the index is empty unless a delivery
  was nacked or released (docs/benchmarks.md, "A follower's applies of the SQS cycle").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Final, TypeVar, cast

from raftmq.storage.keys import (
    DROPPED,
    GROUP_TIME,
    LOCK,
    META,
    OFFSET,
    PRODUCER,
    PRODUCER_CAP,
    PRODUCER_IDLE,
    PRODUCER_SWEEP,
    RETRY,
    SUB_CURSOR,
    SUBSCRIPTION,
    retry_key,
    sub_key,
)
from raftmq.storage.queues import scan_prefix
from raftmq.storage.store import OP_DELETE_RANGE, OP_PUT, Batch, Store

__all__ = ["DEFAULT_CACHE_ENTRIES", "StateCache"]

DEFAULT_CACHE_ENTRIES = 4096
"""Keys kept per queue group: every queue's bounds and the recent producers' states (about 0.8 KiB
each with five remembered batches, up to ~3.3 MiB per group when full), and as many empty retry prefixes
(up to 1.3 MiB more with the longest consumer group names, docs/operations.md)."""

_T = TypeVar("_T")

_KINDS: Final = frozenset(
    (
        DROPPED,
        GROUP_TIME,
        LOCK,
        META,
        OFFSET,
        PRODUCER,
        PRODUCER_CAP,
        PRODUCER_SWEEP,
        SUB_CURSOR,
        SUBSCRIPTION,
    )
)
"""The one-byte prefixes of the keys kept."""
_KIND_RANGES: Final = tuple((p, bytes([p[0] + 1])) for p in sorted(_KINDS))
_IDLE_END: Final = bytes([PRODUCER_IDLE[0] + 1])
_RETRY_TAIL: Final = len(retry_key(0, 0, "", 0, 0)) - len(sub_key(RETRY, 0, 0, ""))
"""What a retry-index key adds to its subscription queue's prefix (its due time and offset)."""
_ABSENT: Final = object()  # the store holds nothing at the key
_UNKNOWN: Final = object()  # not kept


class StateCache:
    """Decoded values of the store at the keys the apply reads again and again.

    Args:
        max_entries: The most keys kept (0: none, every read goes to the store).
    """

    def __init__(self, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be at least 0")
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, object] = OrderedDict()
        self._idle_keys: int | None = None  # W keys in the store; None: not counted
        self._no_retries: set[bytes] = set()  # retry-index prefixes the store holds no key under

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, store: Store, key: bytes, decode: Callable[[bytes], _T]) -> _T | None:
        """The store's value at ``key`` decoded by ``decode`` (None: no value), from the cache when
        kept. ``key`` must be of a kept kind, and ``decode`` the same for a key every time."""
        assert key[:1] in _KINDS, f"{key!r} is not of a kind the write-through keeps up to date"
        value = self._entries.get(key, _UNKNOWN)
        if value is _UNKNOWN:
            data = store.get(key)
            value = _ABSENT if data is None else decode(data)
            self._keep(key, value)
        else:
            self._entries.move_to_end(key)
        return None if value is _ABSENT else cast(_T, value)

    def producer_states(self, store: Store) -> int:
        """How many ``W`` keys ``store`` holds (one scan the first time)."""
        if self._idle_keys is None:
            self._idle_keys = sum(1 for _ in store.scan(PRODUCER_IDLE, _IDLE_END))
        return self._idle_keys

    def retries(self, store: Store, prefix: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        """The first ``limit`` pairs of the retry index under ``prefix`` (a subscription queue's),
        with no scan when an earlier one found none and no key was put under it since. Read
        lazily: a receive stops at the first retry not due yet, and a queue's backed-off retries
        may be thousands."""
        if prefix in self._no_retries:
            return iter(())
        found = scan_prefix(store, prefix, limit=limit)
        first = next(found, None)
        if first is not None:
            return chain((first,), found)
        if self._max_entries:
            if len(self._no_retries) >= self._max_entries:
                self._no_retries.clear()
            self._no_retries.add(prefix)
        return iter(())

    @property
    def counted_producer_states(self) -> int | None:
        """:meth:`producer_states` if counted (another thread may look: a hint, not a read)."""
        return self._idle_keys

    def written(self, batch: Batch, encoded: Mapping[bytes, tuple[bytes, object]]) -> None:
        """Bring the cache up to date with ``batch``, which the store has just written.

        ``encoded`` maps a key to ``(bytes, value)`` for the puts whose bytes are ``value``'s
        encoding (``value`` as a read of those bytes decodes it); a put is kept only when it wrote
        those bytes."""
        entries = self._entries
        idle, retry = PRODUCER_IDLE[0], RETRY[0]
        no_retries = self._no_retries
        for op, key, value in batch.ops:
            if op == OP_DELETE_RANGE:
                if key < value and _reaches_kept_kind(key, value):
                    entries.clear()
                if key < value and key < _IDLE_END and value > PRODUCER_IDLE:
                    self._idle_keys = None
                continue
            if key[0] == idle:
                if self._idle_keys is not None:
                    self._idle_keys += 1 if op == OP_PUT else -1
                continue
            if key[0] == retry:
                if op == OP_PUT and no_retries:
                    no_retries.discard(key[:-_RETRY_TAIL])
                continue
            if key[:1] not in _KINDS:
                continue
            known = encoded.get(key) if op == OP_PUT else None
            if known is not None and known[0] == value:
                self._keep(key, known[1])
            else:
                entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything (the store was replaced, or a write failed)."""
        self._entries.clear()
        self._idle_keys = None
        self._no_retries.clear()

    def _keep(self, key: bytes, value: object) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self._max_entries:
            entries.popitem(last=False)


def _reaches_kept_kind(start: bytes, end: bytes) -> bool:
    return any(start < kind_end and end > kind for kind, kind_end in _KIND_RANGES)
