"""Cluster metadata as the client caches it: a plain object that does no I/O.

The producer and consumer fill it from ``GET /v1/cluster`` (node addresses) and ``GET
/v1/topics/{topic}`` (queues and the leader of each queue's group), and read it to send each
request straight to the leader that will serve it (saving the node a forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import crc32c

from ._types import ClusterStatus, TopicDescription

__all__ = ["ClusterMetadata", "key_queue"]


def key_queue(key: str, queues: int) -> int:
    """The queue of a keyed message: CRC32C of the UTF-8 key, mixed (murmur3 fmix32), modulo the
    queue count.

    Identical to the broker's routing (``raftmq.cluster.api.handlers.produce.key_queue``; a unit test compares
    them), so a key lands on the same queue whether the client or the broker routes it.
    """
    h = int(crc32c.crc32c(key.encode()))
    # murmur3's fmix32: CRC is linear, so keys differing in one character differ only in a few
    # low bits; the finalizer spreads every input bit over the result before the modulo.
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h % queues


@dataclass
class _TopicEntry:
    description: TopicDescription
    fetched_s: float


@dataclass
class ClusterMetadata:
    """Node addresses and described topics, with the time each was fetched (monotonic seconds,
    given by the caller)."""

    node_urls: dict[str, str] = field(default_factory=dict)
    _topics: dict[str, _TopicEntry] = field(default_factory=dict)

    def update_cluster(self, status: ClusterStatus) -> None:
        self.node_urls = {n.id: n.url for n in status.nodes}

    def update_topic(self, description: TopicDescription, now_s: float) -> None:
        self._topics[description.name] = _TopicEntry(description, now_s)

    def forget_topic(self, name: str) -> None:
        self._topics.pop(name, None)

    def topic(self, name: str) -> TopicDescription | None:
        entry = self._topics.get(name)
        return entry.description if entry else None

    def topics(self) -> list[str]:
        return list(self._topics)

    def stale_topics(self, now_s: float, max_age_s: float) -> list[str]:
        return [name for name, e in self._topics.items() if now_s - e.fetched_s >= max_age_s]

    def leader_url(self, topic: str, queue: int) -> str | None:
        """The HTTP address of the node leading ``queue``'s group, if known."""
        entry = self._topics.get(topic)
        if entry is None or queue >= len(entry.description.queue_states):
            return None
        leader = entry.description.queue_states[queue].leader
        return self.node_urls.get(leader) if leader else None

    def leader_known(self, node_id: str | None) -> bool:
        return node_id is not None and node_id in self.node_urls
