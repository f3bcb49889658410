"""Plain values the client returns: delivery reports, messages, topic and cluster descriptions."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ._window import OffsetWindow

__all__ = [
    "ClusterStatus",
    "GroupStatus",
    "Message",
    "NodeInfo",
    "QueueState",
    "RecordMetadata",
    "ReplicaStatus",
    "SubscriptionSettings",
    "TopicDescription",
    "TopicInfo",
    "ack_messages",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced message was stored (it is durable on a majority of its queue group)."""

    topic: str
    queue: int
    offset: int


@dataclass(slots=True, eq=False)
class Message:
    """A consumed message. Call :meth:`ack` once it is processed.

    Attributes:
        topic, queue, offset: Its place; ``(queue, offset)`` names it forever.
        value: ``str`` for a text message, ``bytes`` for a binary one (``value_b64`` on the wire).
        key: The producer's key, if any.
        headers: The producer's headers.
        timestamp_ms: When the broker appended it (milliseconds since the epoch).
    """

    topic: str
    queue: int
    offset: int
    value: str | bytes
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    timestamp_ms: int = 0
    # The queue's window until acked (None: acked, or a message of no consumer). An argument of
    # the constructor only so that the consumer makes a batch's messages in one C-level map.
    _window: OffsetWindow | None = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Mark this message finished: the consumer's committed offset may now move past it.

        Thread-safe and idempotent. After its queue was revoked (a rebalance) an ack does nothing:
        the queue's new owner delivers the message again.
        """
        window = self._window
        if window is not None:
            self._window = None
            window.ack(self.offset)

    @property
    def revoked(self) -> bool:
        """Its queue was revoked (a rebalance) before it was acked: the queue's new owner delivers
        it again, so processing it here is wasted work. A consumer skips such messages it has
        not handed out yet."""
        window = self._window
        return window is not None and window.revoked

    @property
    def acked(self) -> bool:
        """:meth:`ack` was called."""
        return self._window is None

    @classmethod
    def from_wire(cls, topic: str, queue: int, m: Mapping[str, Any], window: OffsetWindow | None) -> Message:
        value: str | bytes = m["value"] if "value" in m else base64.b64decode(m["value_b64"])
        # Positional arguments: this runs for every consumed message.
        return cls(
            topic,
            queue,
            m["offset"],
            value,
            m.get("key"),
            m.get("headers") or _EMPTY,
            m.get("timestamp_ms", 0),
            window,
        )


def ack_messages(messages: Iterable[Message]) -> None:
    """Ack every one of ``messages`` (as :meth:`Message.ack` each), taking each queue's window lock
    once: one move of the committed offset per queue, instead of one per message."""
    windows: dict[OffsetWindow, list[int]] = {}
    window: OffsetWindow | None = None
    offsets: list[int] = []
    try:
        for m in messages:
            w = m._window
            if w is None:
                continue
            m._window = None
            if w is not window:  # a poll's messages come in runs of one queue
                window = w
                offsets = windows.setdefault(w, [])
            offsets.append(m.offset)
    finally:
        # Also when ``messages`` raised part way (a generator, an item that is no Message): the
        # messages taken so far look acked (their window is cleared), so their windows must hear it.
        for w, acked in windows.items():
            w.ack_many(acked)


@dataclass(frozen=True, slots=True)
class SubscriptionSettings:
    """A receive/ack group's settings on a topic (``PUT …/subscriptions/{group}``,
    docs/delivery.md): deliveries before a message becomes a dead letter in
    ``dead_letter_topic``, and the delays before the retries of nacked messages."""

    topic: str
    group: str
    dead_letter_topic: str
    max_deliveries: int
    backoff_ms: tuple[int, ...]

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> SubscriptionSettings:
        return cls(
            topic=d["topic"],
            group=d["group"],
            dead_letter_topic=d["dead_letter_topic"],
            max_deliveries=d["max_deliveries"],
            backoff_ms=tuple(d["backoff_ms"]),
        )


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's settings (``GET /v1/topics``)."""

    name: str
    id: int
    queues: int
    queue_groups: tuple[int, ...]
    retention_ms: int | None = None
    retention_bytes: int | None = None
    max_message_bytes: int | None = None
    created_ms: int = 0

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> TopicInfo:
        queues = d["queues"]
        return cls(
            name=d["name"],
            id=d["id"],
            queues=len(queues) if isinstance(queues, list) else queues,
            queue_groups=tuple(d["queue_groups"]),
            retention_ms=d.get("retention_ms"),
            retention_bytes=d.get("retention_bytes"),
            max_message_bytes=d.get("max_message_bytes"),
            created_ms=d.get("created_ms", 0),
        )


@dataclass(frozen=True, slots=True)
class QueueState:
    """One queue of a described topic. Offsets are None when its group could not be read."""

    queue: int
    group_id: int
    leader: str | None
    replicas: tuple[str, ...]
    low_offset: int | None
    high_offset: int | None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> QueueState:
        return cls(
            queue=d["queue"],
            group_id=d["group_id"],
            leader=d.get("leader"),
            replicas=tuple(d.get("replicas", ())),
            low_offset=d.get("low_offset"),
            high_offset=d.get("high_offset"),
        )


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic with the state of each of its queues (``GET /v1/topics/{topic}``)."""

    info: TopicInfo
    queue_states: tuple[QueueState, ...]

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def queues(self) -> int:
        return self.info.queues

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> TopicDescription:
        return cls(TopicInfo.from_wire(d), tuple(QueueState.from_wire(q) for q in d["queues"]))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    http: str
    raft: str  # "" unless the token is cluster admin (the server shows Raft addresses to no other)
    reachable: bool

    @property
    def url(self) -> str:
        return self.http if "://" in self.http else f"http://{self.http}"


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    node_id: str
    is_leader: bool
    term: int
    commit_index: int
    applied_index: int
    has_quorum: bool


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """A Raft group (a queue group, or ``meta``): its leader and every replica seen."""

    group_id: str
    leader: str | None
    term: int
    replicas: tuple[ReplicaStatus, ...]


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """``GET /v1/cluster`` as answered by ``node_id``."""

    node_id: str
    nodes: tuple[NodeInfo, ...]
    groups: tuple[GroupStatus, ...]

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> ClusterStatus:
        return cls(
            node_id=d["node_id"],
            nodes=tuple(
                NodeInfo(n["id"], n["http"], n.get("raft", ""), bool(n.get("reachable", True)))
                for n in d["nodes"]
            ),
            groups=tuple(
                GroupStatus(
                    group_id=g["group_id"],
                    leader=g.get("leader"),
                    term=g.get("term", 0),
                    replicas=tuple(
                        ReplicaStatus(
                            node_id=r["node_id"],
                            is_leader=bool(r.get("is_leader")),
                            term=r.get("term", 0),
                            commit_index=r.get("commit_index", 0),
                            applied_index=r.get("applied_index", 0),
                            has_quorum=bool(r.get("has_quorum")),
                        )
                        for r in g.get("replicas", ())
                    ),
                )
                for g in d["groups"]
            ),
        )
