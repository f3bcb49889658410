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

**Owners and caps.** A member records its ``owner``: the name of the API token that created it
(None without tokens). The coordinator's route refuses a heartbeat or leave under a member id owned
by another token (``api/handlers/groups.py`` decides; this module only keeps the name). Members are
counted per owner and per topic, and :meth:`GroupMembership.admit` refuses a new member, or a new
topic of a member, beyond ``max_members_per_token`` / ``max_members_per_topic``: with the groups
forgotten when empty, no token can grow this state without bound.

**Topic generations.** The members route shows one topic of a group to a token that may read only
that topic, so it must not show the group's generation, which every other topic's rebalance moves.
Each (group, topic) has a generation of its own that moves only when the topic's subscribers change;
it starts at the group's first generation, so it also never goes backwards.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from raftmq.cluster.base.limits import DEFAULT_MAX_MEMBERS_PER_TOKEN, DEFAULT_MAX_MEMBERS_PER_TOPIC

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
    owner: str | None = None
    """The name of the API token that created this member (None: created without one)."""
    applied: int | None = None
    """The generation this member last said it has applied (None: it does not send one)."""
    sent_generation: int | None = None
    """The generation of the last assignment sent to this member, and what it granted."""
    sent: frozenset[TopicQueue] = frozenset()
    sent_topics: dict[str, int] = field(default_factory=dict)
    """Each topic's generation when that assignment was sent."""
    applied_topics: dict[str, int] = field(default_factory=dict)
    """Each topic's generation in the last assignment this member said it has applied."""


@dataclass
class _Group:
    generation: int
    members: dict[str, Member] = field(default_factory=dict)
    holders: dict[TopicQueue, str] = field(default_factory=dict)
    """Who may be consuming each queue: the member it was last granted to."""
    base: int = 0
    """The group's first generation."""
    topic_generations: dict[str, int] = field(default_factory=dict)
    """Per topic ever subscribed in this group's life: bumped when its subscribers change."""

    def drop(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        for key in [k for k, m in self.holders.items() if m == member_id]:
            del self.holders[key]
        return member

    def topics_changed(self, topics: set[str] | tuple[str, ...]) -> None:
        """The subscribers of ``topics`` changed: the group's generation moves, and so does each
        topic's (a topic first subscribed starts at the group's first generation)."""
        self.generation += 1
        for topic in topics:
            self.topic_generations[topic] = self.topic_generations.get(topic, self.base) + 1


class GroupMembership:
    """Live members of every consumer group known to this coordinator."""

    def __init__(
        self,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        max_members_per_token: int = DEFAULT_MAX_MEMBERS_PER_TOKEN,
        max_members_per_topic: int = DEFAULT_MAX_MEMBERS_PER_TOPIC,
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_members_per_token = max_members_per_token
        self.max_members_per_topic = max_members_per_topic
        self._groups: dict[str, _Group] = {}  # groups with members only: see _prune
        # Invariant: the live members (over all groups) per owner and per subscribed topic.
        self._per_owner: Counter[str] = Counter()
        self._per_topic: Counter[str] = Counter()
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
            self._per_owner.clear()
            self._per_topic.clear()

    def __len__(self) -> int:
        """How many groups this coordinator keeps (each has at least one live member)."""
        return len(self._groups)

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is None:
            # Above every generation a forgotten group had: a group that comes back never sees
            # its generation go backwards.
            base = max(self._term << 32, self._floor)
            g = self._groups[group] = _Group(generation=base, base=base)
        return g

    def _count(self, member: Member, step: int) -> None:
        if member.owner is not None:
            self._per_owner[member.owner] += step
            if self._per_owner[member.owner] <= 0:
                del self._per_owner[member.owner]
        for topic in member.topics:
            self._per_topic[topic] += step
            if self._per_topic[topic] <= 0:
                del self._per_topic[topic]

    def _drop(self, g: _Group, member_id: str) -> None:
        member = g.drop(member_id)
        if member is not None:
            self._count(member, -1)
            g.topics_changed(member.topics)

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
            self._drop(g, member_id)
            touched[group] = g
        for group, g in touched.items():
            self._prune(group, g)

    def subscribed(self, now_ms: int) -> list[tuple[str, str]]:
        """``(group, topic)`` of every topic a live member subscribes to (after dropping the
        expired), sorted: the groups whose offsets stay while they have members."""
        self.expire(now_ms)
        return sorted(
            {(name, t) for name, g in self._groups.items() for m in g.members.values() for t in m.topics}
        )

    def member(self, group: str, member_id: str, now_ms: int) -> Member | None:
        """The live member ``member_id`` of ``group`` (after dropping the expired), or None. The
        caller reads it only (its owner and topics)."""
        self.expire(now_ms)
        g = self._groups.get(group)
        return None if g is None else g.members.get(member_id)

    def admit(
        self, group: str, member_id: str, topics: list[str], owner: str | None, now_ms: int
    ) -> str | None:
        """Why a heartbeat with these arguments would break a cap, or None if it may go ahead:
        a new member counts against ``owner``'s cap (when it has one) and each topic's; an
        existing member only against the caps of the topics it adds."""
        current = self.member(group, member_id, now_ms)
        added = set(topics) - set(current.topics if current else ())
        if current is None and owner is not None and self._per_owner[owner] >= self.max_members_per_token:
            return (
                f"token {owner!r} already has {self._per_owner[owner]} consumer-group members "
                f"(limits.max_members_per_token = {self.max_members_per_token})"
            )
        for topic in sorted(added):
            if self._per_topic[topic] >= self.max_members_per_topic:
                return (
                    f"topic {topic!r} already has {self._per_topic[topic]} consumer-group members "
                    f"(limits.max_members_per_topic = {self.max_members_per_topic})"
                )
        return None

    def heartbeat(
        self,
        group: str,
        member_id: str,
        topics: list[str],
        now_ms: int,
        generation: int | None = None,
        owner: str | None = None,
    ) -> None:
        """Join, or refresh a member; a new member or a changed subscription bumps the generation.

        ``generation`` is the generation of the last assignment the member has applied (0 before
        its first); when it is the generation last sent to the member, the queues that assignment
        did not give it are released for their new owners. ``owner`` names the token of a new
        member (an existing member keeps its owner; one created without a token takes it). The
        caller has checked :meth:`admit` and who may act on an existing member.
        """
        self.expire(now_ms)
        g = self._group(group)
        current = g.members.get(member_id)
        wanted = tuple(sorted(set(topics)))
        if current is None:
            current = g.members[member_id] = Member(member_id, wanted, now_ms, owner)
            self._count(current, +1)
            g.topics_changed(wanted)
        elif current.topics != wanted:
            self._count(current, -1)
            changed = set(current.topics) ^ set(wanted)
            current.topics = wanted
            self._count(current, +1)
            g.topics_changed(changed)
        if current.owner is None and owner is not None:
            current.owner = owner
            self._per_owner[owner] += 1
        current.last_seen_ms = now_ms
        self._seen[(group, member_id)] = None
        self._seen.move_to_end((group, member_id))
        current.applied = generation
        if generation is not None and generation == current.sent_generation:
            current.applied_topics = current.sent_topics
            for key in [k for k, m in g.holders.items() if m == member_id and k not in current.sent]:
                del g.holders[key]

    def leave(self, group: str, member_id: str) -> bool:
        g = self._groups.get(group)
        if g is None or member_id not in g.members:
            return False
        self._drop(g, member_id)
        self._seen.pop((group, member_id), None)
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
            me.sent_topics = {t: g.topic_generations.get(t, g.base) for t in me.topics}
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
        """The members of ``group`` consuming ``topic`` (``queues`` queues) and their state on it,
        for monitoring (``GET /v1/topics/{topic}/groups/{group}/members``); changes nothing.

        Everything is of ``topic`` alone, so a token that may read one topic learns nothing of the
        group's others, not even that they rebalance: ``generation`` is the topic's (it moves only
        when the topic's subscribers change), and per member the queues of ``topic`` last handed
        to it (``queues``), the ones its allocation gives it but the revoke barrier still holds
        back (``pending``), when it was last heard from, and the topic generation of the last
        assignment it says it has applied (``applied_generation``; None if it sends none, or has
        applied none yet). At most ``limit`` members, by member id; ``member_count`` says how
        many there are.

        ``state``: ``empty`` (no member consumes the topic), ``rebalancing`` (some member has not
        yet been sent the topic's current generation, has not applied it, or waits for a queue
        of its allocation), else ``stable``.
        """
        g = self._groups.get(group)
        subscribers = sorted(m for m, info in g.members.items() if topic in info.topics) if g else []
        current = g.topic_generations.get(topic) if g else None
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
            applied = None if info.applied is None else info.applied_topics.get(topic)
            if (
                info.sent_topics.get(topic) != current
                or (info.applied is not None and applied != current)
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
                        "applied_generation": applied,
                    }
                )
        state = "empty" if not subscribers else ("stable" if settled else "rebalancing")
        return {
            "group": group,
            "topic": topic,
            "state": state,
            "generation": current if subscribers else None,
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
