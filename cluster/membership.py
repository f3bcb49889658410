"""Consumer-group membership for clustering consumption, kept by the metadata group's leader.

Members join and heartbeat with ``POST /v1/groups/{group}/members``; the coordinator (the metadata
leader) divides each topic's queues among the live members that subscribe to it with EQueue's
average allocation over sorted member ids (4 queues, 3 members → 2/1/1, contiguous ranges), drops a
member that missed heartbeats for ``session_timeout_ms``, and bumps the group's ``generation`` on
every change so clients drop revoked queues.

Membership is soft state, like Kafka's group coordinator: it lives in the leader's memory, and after
a leader change members simply rejoin on their next heartbeat. Generations stay monotonic across
leaders because they start from the leader's Raft term (``term << 32``).
Time comes in as ``now_ms`` arguments, so this module reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GroupMembership", "Member", "average_allocation"]


def average_allocation(queues: int, members: list[str]) -> dict[str, list[int]]:
    """Queues ``0..queues-1`` split into contiguous ranges over sorted ``members``: every member gets
    ``queues // n`` queues and the first ``queues % n`` members one more."""
    ordered = sorted(members)
    n = len(ordered)
    out: dict[str, list[int]] = {m: [] for m in ordered}
    if n == 0:
        return out
    base, extra = divmod(queues, n)
    start = 0
    for i, m in enumerate(ordered):
        count = base + (1 if i < extra else 0)
        out[m] = list(range(start, start + count))
        start += count
    return out


@dataclass
class Member:
    member_id: str
    topics: tuple[str, ...]
    last_seen_ms: int


@dataclass
class _Group:
    generation: int
    members: dict[str, Member] = field(default_factory=dict)


class GroupMembership:
    """Live members of every consumer group known to this coordinator."""

    def __init__(self, session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 1_000) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._groups: dict[str, _Group] = {}
        self._term = 0

    def set_term(self, term: int) -> None:
        """Called with the metadata group's term when this node leads it; a new term forgets the
        members (they rejoin) and starts generations above every earlier leader's."""
        if term != self._term:
            self._term = term
            self._groups.clear()

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(generation=self._term << 32)
        return g

    def expire(self, now_ms: int) -> None:
        for g in self._groups.values():
            dead = [
                m for m, info in g.members.items() if now_ms - info.last_seen_ms > self.session_timeout_ms
            ]
            for m in dead:
                del g.members[m]
            if dead:
                g.generation += 1

    def heartbeat(self, group: str, member_id: str, topics: list[str], now_ms: int) -> None:
        """Join, or refresh a member; a new member or a changed subscription bumps the generation."""
        self.expire(now_ms)
        g = self._group(group)
        current = g.members.get(member_id)
        wanted = tuple(sorted(set(topics)))
        if current is None or current.topics != wanted:
            g.generation += 1
        g.members[member_id] = Member(member_id, wanted, now_ms)

    def leave(self, group: str, member_id: str) -> bool:
        g = self._groups.get(group)
        if g is None or g.members.pop(member_id, None) is None:
            return False
        g.generation += 1
        return True

    def view(self, group: str, member_id: str, queue_counts: dict[str, int]) -> dict[str, Any]:
        """What ``member_id`` should consume: its queues per topic, and the group's generation."""
        g = self._group(group)
        assignment: dict[str, list[int]] = {}
        me = g.members.get(member_id)
        for topic in me.topics if me else ():
            subscribers = [m for m, info in g.members.items() if topic in info.topics]
            assignment[topic] = average_allocation(queue_counts.get(topic, 0), subscribers).get(member_id, [])
        return {
            "group": group,
            "member_id": member_id,
            "generation": g.generation,
            "members": sorted(g.members),
            "assignment": assignment,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "session_timeout_ms": self.session_timeout_ms,
        }
