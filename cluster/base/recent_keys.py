"""A bounded set of recently seen keys (:class:`RecentKeys`), for keys that clients choose."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["RecentKeys"]


class RecentKeys:
    """Keys seen within the last ``ttl_s`` seconds, at most ``max_keys`` of them (the least
    recently added go first). For keys that clients choose (consumer group names), so that no
    number of distinct names grows a node's memory without bound."""

    def __init__(self, max_keys: int, ttl_s: float) -> None:
        self.max_keys = max_keys
        self.ttl_s = ttl_s
        self._added: OrderedDict[Hashable, float] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._added)

    def fresh(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` was added less than ``ttl_s`` before ``now`` (a monotonic time)."""
        added = self._added.get(key)
        if added is None:
            return False
        if now - added < self.ttl_s:
            return True
        del self._added[key]
        return False

    def add(self, key: Hashable, now: float) -> None:
        """Remember ``key`` as added at ``now``; forget the oldest keys beyond ``max_keys`` and
        those that expired (kept in the order they were added, so they are at the front)."""
        self._added[key] = now
        self._added.move_to_end(key)
        while self._added:
            oldest, added = next(iter(self._added.items()))
            if len(self._added) <= self.max_keys and now - added < self.ttl_s:
                break
            del self._added[oldest]
