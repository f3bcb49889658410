"""Consumer-group membership for clustering consumption, kept by the metadata group's leader.

Members join and heartbeat with ``POST /v1/groups/{group}/members``; the coordinator (the metadata
leader) divides each topic's queues among the live members that subscribe to it with EQueue's
average allocation over sorted member ids (4 queues, 3 members → 2/1/1, contiguous ranges), drops a
member that missed heartbeats for ``session_timeout_ms``, and bumps the group's ``generation`` on
every change so clients drop revoked queues.

**Revoke barrier.** The coordinator remembers who holds each (topic, queue) of a group: the member
it last handed the queue to. When the allocation moves a queue, its new owner gets it only once the
previous holder

- has heartbeated with ``generation`` equal to the generation of the last assignment it was sent,
  which says it has applied that assignment: it stopped fetching every queue not in it and committed
  their progress; or
- has left, or expired (missed heartbeats for ``session_timeout_ms``); or
- never sent a ``generation`` (an older client, which cannot take part: no barrier, as before).

Until then the queue is left out of the new owner's assignment (it is still in the allocation, so
the new owner gets it on a later heartbeat). Two members therefore never consume a queue at the
same time, and the new owner starts from the final committed progress of the previous one: a
rebalance delivers nothing twice unless the previous holder had messages in processing that it had
not acked when it committed.

Membership is soft state, like Kafka's group coordinator: it lives in the leader's memory, and after
a leader change members simply rejoin on their next heartbeat. Generations stay monotonic across
leaders because they start from the leader's Raft term (``term << 32``). A new coordinator does not
know who holds what; it grants queues at once until members have answered it (see ``set_term``).
Time comes in as ``now_ms`` arguments, so this module reads no clock.

Group names and member ids are chosen by clients, so the coordinator keeps only groups with a live
member: a group whose last member left or expired is forgotten (a later group of that name starts
above the generations of the forgotten ones, so generations still never go backwards).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GroupMembership", "Member", "average_allocation"]

TopicQueue = tuple[str, int]


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
    applied: int | None = None
    """The generation this member last said it has applied (None: it does not send one)."""
    sent_generation: int | None = None
    """The generation of the last assignment sent to this member, and what it granted."""
    sent: frozenset[TopicQueue] = frozenset()


@dataclass
class _Group:
    generation: int
    members: dict[str, Member] = field(default_factory=dict)
    holders: dict[TopicQueue, str] = field(default_factory=dict)
    """Who may be consuming each queue: the member it was last granted to."""

    def drop(self, member_id: str) -> None:
        self.members.pop(member_id, None)
        for key in [k for k, m in self.holders.items() if m == member_id]:
            del self.holders[key]


class GroupMembership:
    """Live members of every consumer group known to this coordinator."""

    def __init__(self, session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 1_000) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._groups: dict[str, _Group] = {}  # groups with members only: see _prune
        # Every member as (group, member id), least recently heard from first: expire looks at
        # the front only, so a heartbeat costs the same however many groups there are.
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._term = 0
        self._floor = 0  # the highest generation of a group forgotten in this term

    def set_term(self, term: int) -> None:
        """Called with the metadata group's term when this node leads it; a new term forgets the
        members (they rejoin) and starts generations above every earlier leader's."""
        if term != self._term:
            self._term = term
            self._floor = 0
            self._groups.clear()
            self._seen.clear()

    def __len__(self) -> int:
        """How many groups this coordinator keeps (each has at least one live member)."""
        return len(self._groups)

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is None:
            # Above every generation a forgotten group had: a group that comes back never sees
            # its generation go backwards.
            g = self._groups[group] = _Group(generation=max(self._term << 32, self._floor))
        return g

    def _prune(self, group: str, g: _Group) -> None:
        """Forget ``group`` once it has no member: group names are chosen by clients, so no
        number of them may grow this coordinator's memory (only live members hold state)."""
        if not g.members:
            self._floor = max(self._floor, g.generation)
            self._groups.pop(group, None)

    def expire(self, now_ms: int) -> None:
        """Drop the members not heard from for ``session_timeout_ms``."""
        touched: dict[str, _Group] = {}
        while self._seen:
            key = next(iter(self._seen))
            group, member_id = key
            g = self._groups.get(group)
            info = None if g is None else g.members.get(member_id)
            if g is None or info is None:
                del self._seen[key]
                continue
            if now_ms - info.last_seen_ms <= self.session_timeout_ms:
                break
            del self._seen[key]
            g.drop(member_id)
            touched[group] = g
        for group, g in touched.items():
            g.generation += 1
            self._prune(group, g)

    def heartbeat(
        self, group: str, member_id: str, topics: list[str], now_ms: int, generation: int | None = None
    ) -> None:
        """Join, or refresh a member; a new member or a changed subscription bumps the generation.

        ``generation`` is the generation of the last assignment the member has applied (0 before
        its first); when it is the generation last sent to the member, the queues that assignment
        did not give it are released for their new owners.
        """
        self.expire(now_ms)
        g = self._group(group)
        current = g.members.get(member_id)
        wanted = tuple(sorted(set(topics)))
        if current is None:
            current = g.members[member_id] = Member(member_id, wanted, now_ms)
            g.generation += 1
        elif current.topics != wanted:
            current.topics = wanted
            g.generation += 1
        current.last_seen_ms = now_ms
        self._seen[(group, member_id)] = None
        self._seen.move_to_end((group, member_id))
        current.applied = generation
        if generation is not None and generation == current.sent_generation:
            for key in [k for k, m in g.holders.items() if m == member_id and k not in current.sent]:
                del g.holders[key]

    def leave(self, group: str, member_id: str) -> bool:
        g = self._groups.get(group)
        if g is None or member_id not in g.members:
            return False
        g.drop(member_id)
        self._seen.pop((group, member_id), None)
        g.generation += 1
        self._prune(group, g)
        return True

    def _may_take(self, g: _Group, key: TopicQueue, member_id: str) -> bool:
        holder_id = g.holders.get(key)
        if holder_id is None or holder_id == member_id:
            return True
        holder = g.members.get(holder_id)
        return holder is None or holder.applied is None

    def view(self, group: str, member_id: str, queue_counts: dict[str, int]) -> dict[str, Any]:
        """What ``member_id`` should consume now: its queues per topic, and the group's generation.

        A queue of its allocation that another member may still be consuming is left out (the
        revoke barrier); it is granted on a later call once that member has let it go. The answer
        names no other member: ``allocation`` (the member's queues once the barrier lets them go,
        which the client paces its heartbeats by) is all it needs of them; ``members`` holds the
        member itself only (older clients read it).
        """
        g = self._group(group)
        assignment: dict[str, list[int]] = {}
        allocation: dict[str, list[int]] = {}
        me = g.members.get(member_id)
        granted: set[TopicQueue] = set()
        for topic in me.topics if me else ():
            subscribers = [m for m, info in g.members.items() if topic in info.topics]
            mine = average_allocation(queue_counts.get(topic, 0), subscribers).get(member_id, [])
            allocation[topic] = mine
            assignment[topic] = [q for q in mine if self._may_take(g, (topic, q), member_id)]
            granted.update((topic, q) for q in assignment[topic])
        if me is not None:
            for key in granted:
                g.holders[key] = member_id
            me.sent_generation = g.generation
            me.sent = frozenset(granted)
        return {
            "group": group,
            "member_id": member_id,
            "generation": g.generation,
            "members": [member_id] if me is not None else [],
            "assignment": assignment,
            "allocation": allocation,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "session_timeout_ms": self.session_timeout_ms,
        }

    def describe(self, group: str, topic: str, queues: int, now_ms: int, limit: int) -> dict[str, Any]:
        """The members of ``group`` consuming ``topic`` (``queues`` queues) and the group's state,
        for monitoring (``GET /v1/topics/{topic}/groups/{group}/members``); changes nothing.

        Per member: the queues of ``topic`` last handed to it (``queues``), the ones its allocation
        gives it but the revoke barrier still holds back (``pending``), when it was last heard
        from, and the generation it says it has applied. Only ``topic`` is shown of a member's
        subscription (a token that may read one topic learns nothing of the others). At most
        ``limit`` members, by member id; ``member_count`` says how many there are.

        ``state``: ``empty`` (no member consumes the topic), ``rebalancing`` (some member has not
        yet been sent the group's current generation, has not applied what it was sent, or waits
        for a queue of its allocation), else ``stable``.
        """
        g = self._groups.get(group)
        subscribers = sorted(m for m, info in g.members.items() if topic in info.topics) if g else []
        allocation = average_allocation(queues, subscribers)
        rows: list[dict[str, Any]] = []
        held: set[int] = set()
        settled = True
        for member_id in subscribers:
            assert g is not None
            info = g.members[member_id]
            granted = sorted(q for t, q in info.sent if t == topic)
            held.update(granted)
            pending = [q for q in allocation[member_id] if q not in granted]
            if (
                info.sent_generation != g.generation
                or (info.applied is not None and info.applied != info.sent_generation)
                or pending
            ):
                settled = False
            if len(rows) < limit:
                rows.append(
                    {
                        "member_id": member_id,
                        "queues": granted,
                        "pending": pending,
                        "last_seen_ms": info.last_seen_ms,
                        "last_seen_ago_ms": max(0, now_ms - info.last_seen_ms),
                        "applied_generation": info.applied,
                    }
                )
        state = "empty" if not subscribers else ("stable" if settled else "rebalancing")
        return {
            "group": group,
            "topic": topic,
            "state": state,
            "generation": g.generation if g else None,
            "member_count": len(subscribers),
            "members": rows,
            "truncated": len(rows) < len(subscribers),
            "unassigned_queues": [q for q in range(queues) if q not in held],
            "session_timeout_ms": self.session_timeout_ms,
        }

    def member_topics(self, group: str, member_id: str) -> tuple[str, ...] | None:
        """The topics ``member_id`` of ``group`` consumes, or None if it is not a member."""
        g = self._groups.get(group)
        member = None if g is None else g.members.get(member_id)
        return None if member is None else member.topics

    def holders(self, group: str) -> dict[TopicQueue, str]:
        """Who may be consuming each queue of ``group`` (for tests and diagnostics)."""
        g = self._groups.get(group)
        return dict(g.holders) if g else {}
