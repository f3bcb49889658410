"""The node's tick loops: what a leader proposes on a timer, so that time enters the state machines
only through leader-stamped commands (docs/architecture.md): leader balancing (leadership back to
each queue group's preferred replica), retention and producer expiry (``retain``,
``expire_producers``), and delivery ticks (``deliver_tick``, woken early when an apply schedules
something sooner). One :class:`TickLoops` per node; ``Node.start`` runs its ``*_forever`` loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import orjson
import structlog

from raftmq.cluster import commands
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.groups import META, port_offset
from raftmq.cluster.base.limits import MAX_DURATION_MS
from raftmq.cluster.commands import expire_subscriptions
from raftmq.cluster.commands.producers import EXPIRE_MAX, expire_producers
from raftmq.cluster.machines import producers
from raftmq.cluster.machines.apply import group_now, group_time
from raftmq.cluster.machines.delivery import WAKE_WITHIN_MS
from raftmq.cluster.machines.delivery.expiry import next_expiry_ms
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.machines.queue_group import Applied, QueueGroupMachine, retention_due
from raftmq.cluster.node.added_dues import AddedDues
from raftmq.cluster.node.view import LocalGroup, NodeView
from raftmq.storage.keys import GROUP_MAX_STEP_MS
from raftmq.storage.queues import next_due_ms

__all__ = ["TickLoops"]

# How long a leader waits, once every voter of a group applies expire_subscriptions, before it
# proposes one (at most; half of limits.subscription_idle_ms if shorter): receives refresh their
# subscription's use at least once a minute and four times per idle time
# (handlers/subscriptions.py), which they could not while a voter ran a release whose subscribe
# has no now_ms.
EXPIRY_GRACE_S = 120.0

# How long after a node's start it asks unheard peers for their release quickly, and how often
# (``TickLoops.learn_peer_releases``).
PEER_RELEASE_QUICK_S = 30.0
PEER_RELEASE_QUICK_POLL_S = 0.1

log = structlog.get_logger(__name__)


class TickLoops:
    """The tick loops of one node (see the module docstring)."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.delivery_wake = asyncio.Event()  # an apply scheduled a delayed message or deadline
        self.scheduled_seq = 0  # counts those applies (on the event loop)
        # Per led queue group: (applied index, scheduled_seq, now_ms) at its last look at the
        # schedule, and the due time it found (deliver_once's cache).
        self._due_cache: dict[str, tuple[int, int, int, int | None]] = {}
        self.added_dues = AddedDues()  # what the applies since each look scheduled (the apply hook)
        # Per queue group: retain ticks this node proposed whose time jumped too far ahead.
        self.retention_clock_jumps: dict[str, int] = {}
        # Per queue group: entries this replica applied whose stamp the group's time clamped.
        self.group_clock_jumps: dict[str, int] = {}
        # Per queue group: when this node first saw every voter apply expire_subscriptions
        # (monotonic seconds; see _expire_subscriptions).
        self._expiry_open_s: dict[str, float] = {}
        # Per led queue group: (applied index, metadata applied index, next due time on the
        # group's time) at its last look for retention work, and (applied index, next due time)
        # at its last look for idle subscriptions. Until the group (or the metadata) applies
        # something, nothing falls due before that time: the tick skips the look.
        self._retention_next: dict[str, tuple[int, int, int | None]] = {}
        self._expiry_next: dict[str, tuple[int, int | None, int | None]] = {}

    def applied(self, name: str, applied: Applied) -> None:
        """An apply of queue group ``name`` (on its tick thread): a clamped clock counted, the due
        times it added recorded for the delivery loop (``added_dues.py``)."""
        self.added_dues.applied(name, applied.index, applied.due_ms)
        if applied.clock_jump_ms is not None:
            self.group_clock_jumps[name] = self.group_clock_jumps.get(name, 0) + 1
            log.warning("group_clock_jump", group=name, index=applied.index, jump_ms=applied.clock_jump_ms)

    def scheduled(self) -> None:
        """An apply scheduled something (on the event loop): the delivery loop looks again."""
        self.scheduled_seq += 1
        self.delivery_wake.set()

    # -- leader balancing -------------------------------------------------------------------------

    async def balance_leaders_forever(self) -> None:
        """Hand leadership of a queue group to its preferred node (its first replica) when that
        node is up and caught up, so leaders stay spread over the cluster."""
        while True:
            await asyncio.sleep(3.0)
            try:
                await self._balance_once()
            except Exception:
                log.exception("leader_balance_failed")

    async def learn_peer_releases(self) -> None:
        """Ask every peer for its status until each has answered once (new peers too, as the
        configuration grows): the release a voter advertised is kept while it is down, so a node
        that becomes leader after a peer died still knows what that peer applies
        (``Node.group_supports``) instead of refusing gated writes until it comes back.

        For ``PEER_RELEASE_QUICK_S`` after this node's start it asks every ``PEER_RELEASE_QUICK_POLL_S``
        (then once a second): on a new cluster the nodes start together, and a peer that dies soon
        after its start must have been heard first (with a poll a second apart, one that lived
        about a second could die unheard, and its queue groups' gated writes were refused until it
        came back). A peer that is down refuses at once on a LAN, or fails within the 1 s connect
        timeout, so the quick polls cost one connection attempt each."""
        started = time.monotonic()
        while True:
            peers = {n.id for n in self.node.config.nodes} - {self.node.me.id}
            if peers - self.node.heard_from():
                try:
                    await self.node.refresh_peer_status()
                except Exception:
                    log.exception("peer_status_failed")
                quick = time.monotonic() - started < PEER_RELEASE_QUICK_S
                await asyncio.sleep(PEER_RELEASE_QUICK_POLL_S if quick else 1.0)
            else:
                await asyncio.sleep(10.0)

    async def _balance_once(self) -> None:
        if self.node.change_in_progress is not None:
            return  # the change's coordinator moves leaders itself
        for g in self.node.config.groups_on(self.node.me.id):
            local = self.node.groups.get(str(g))
            preferred = self.node.config.group_replicas(g)[0]
            if local is None or preferred.id == self.node.me.id or not local.raft.is_leader():
                continue
            if preferred.raft_addr(port_offset(str(g))) not in local.raft.members():
                continue
            status = await self.node.refresh_peer_status()
            peer = status.get(preferred.id, {}).get("groups", {}).get(str(g))
            mine = local.raft.status()
            if peer and peer["applied_index"] >= mine.commit_index - 10 and peer["term"] == mine.term:
                log.info("leadership_transfer", group=str(g), to=preferred.id)
                local.raft.transfer_leadership(preferred.raft_addr(port_offset(str(g))))

    # -- retention --------------------------------------------------------------------------------

    async def retention_forever(self) -> None:
        """As leader of a queue group, propose a ``retain`` tick for the queues of topics with a
        retention setting, and ``expire_producers`` when idle producer states are due. Time enters
        the state machine only through these leader-stamped ticks."""
        interval_s = self.node.config.raft.retention_check_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.retention_once()
            except Exception:
                log.exception("retention_tick_failed")

    async def retention_once(self) -> None:
        """One round: as leader of each queue group, ``retain`` the queues with something to
        remove (none: no entry, unless the group's time needs a stamp), then expire idle producer
        states and subscriptions. A group that applied nothing since a look that found nothing due
        by now is not looked at again: an idle queue costs nothing."""
        await self._record_dead_letters()
        led = {
            name: local for name, local in self.node.groups.items() if name != META and local.raft.is_leader()
        }
        for name in set(self._retention_next) - set(led):
            del self._retention_next[name]  # a new leadership looks first
        for name in set(self._expiry_next) - set(led):
            del self._expiry_next[name]
        topics: list[Topic] | None = None
        for name, local in led.items():
            if not self._retention_quiet(name, local):
                if topics is None:
                    topics = [
                        t for t in await self._topics_for_retention() if t.retention_ms or t.retention_bytes
                    ]
                await self._retention_look(name, local, topics)
            elif self._time_goes_stale(local):
                await self._retain(name, local, [])
            await self._expire_producers(name, local)
            await self._expire_subscriptions(name, local)

    def _metadata_index(self) -> int | None:
        """The applied index of this node's metadata replica (the topics' retention settings),
        None on a node without one (it asks a peer for the topics each time)."""
        return None if self.node.metadata is None else self.node.metadata.applied_index

    def _retention_quiet(self, name: str, local: LocalGroup) -> bool:
        cached = self._retention_next.get(name)
        meta_index = self._metadata_index()
        if cached is None or meta_index is None:
            return False
        index, looked_meta_index, next_ms = cached
        if index != local.machine.applied_index or looked_meta_index != meta_index:
            return False
        return next_ms is None or group_now(local.state_store, now_ms()) < next_ms

    async def _retention_look(self, name: str, local: LocalGroup, topics: list[Topic]) -> None:
        """Propose ``retain`` for the queues of group ``name`` with something to remove now."""
        entries = [
            {"topic_id": t.id, "queue": q, "max_age_ms": t.retention_ms, "max_bytes": t.retention_bytes}
            for t in topics
            for q, g in enumerate(t.queue_groups)
            if str(g) == name
        ]
        index, meta_index = local.machine.applied_index, self._metadata_index()
        now = group_now(local.state_store, now_ms())
        loop = asyncio.get_running_loop()
        due, next_ms = await loop.run_in_executor(None, retention_due, local.machine.store, entries, now)
        if meta_index is not None:
            self._retention_next[name] = (index, meta_index, next_ms)
        if due or self._time_goes_stale(local):
            await self._retain(name, local, due)

    def _time_goes_stale(self, local: LocalGroup) -> bool:
        """Whether the group's last stamp is a third of its clock bound old: an empty ``retain``
        then stamps it, so that a led group never goes a whole bound without a stamp (the group's
        time would take the gap for a clock jump and run late by the excess: ``advance``)."""
        bound = min(GROUP_MAX_STEP_MS, self.node.config.raft.retention_max_jump_ms or GROUP_MAX_STEP_MS)
        return now_ms() - group_time(local.state_store).stamp_ms >= bound // 3

    async def _retain(self, name: str, local: LocalGroup, queues: list[dict[str, Any]]) -> None:
        """Propose ``retain`` again while the last one stopped at its batch bound (at most 100 per
        tick). A tick stamped further ahead of the last one than ``max_jump_ms`` is logged and
        counted (``raftmq_retention_clock_jumps_total``): the group's retention clock moved less,
        so no message is removed early (``cluster/machines/queue_group.py``, ``retention_clock``)."""
        raft = self.node.config.raft
        # 0: the field is left out, as releases before it wrote retain (a rolling upgrade).
        max_jump_ms: int | None = max(raft.retention_max_jump_ms, 3 * raft.retention_check_ms)
        if not raft.retention_max_jump_ms:
            max_jump_ms = None
        max_batches = raft.retention_max_batches or None
        for _ in range(100):
            if not local.raft.is_leader():
                return
            command = commands.retain(now_ms(), queues, max_jump_ms=max_jump_ms, max_batches=max_batches)
            outcome = await self.node.propose(name, command)
            result = outcome.result
            if outcome.error or not isinstance(result, dict) or "error" in result:
                log.warning("retention_tick_not_applied", group=name, error=outcome.error or result)
                return
            if "clock_jump_ms" in result:
                self.retention_clock_jumps[name] = self.retention_clock_jumps.get(name, 0) + 1
                log.warning(
                    "retention_clock_jump",
                    group=name,
                    jump_ms=result["clock_jump_ms"],
                    retention_clock_ms=result["retention_clock_ms"],
                    max_jump_ms=max_jump_ms,
                )
            if not result.get("more"):
                return

    async def _topics_for_retention(self) -> list[Topic]:
        """Every topic, from this node's metadata replica or, on a node without one (a queue
        group's leader need not be a metadata voter), from the first node that has one; [] when
        none answers (the next tick tries again)."""
        if self.node.metadata is not None:
            return self.node.metadata.topics()
        leader = self.node.leader_of(META)
        others = [n for n in self.node.config.nodes if n.id != self.node.me.id and n != leader]
        for node in ([leader] if leader is not None else []) + others:
            try:
                body = await self.node.peer_get_json(node, "/internal/topics", timeout_s=2.0)
                return [Topic.from_json(t) for t in body["topics"]]
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError):
                continue
        return []

    async def _expire_producers(self, name: str, local: LocalGroup) -> None:
        """Propose ``expire_producers`` steps while this leader's store shows idle producer states
        are due (``limits.producer_idle_ms``, 0: never), or the group does not hold the cap
        ``limits.max_producer_states`` yet (sent once every voter applies the field; also when
        states are never forgotten for idleness: the cap bounds them then too); at most 100
        steps, the next tick goes on."""
        limits = self.node.config.limits
        idle_ms, expired = limits.producer_idle_ms or MAX_DURATION_MS, 0  # 0: never (as good as)
        capped = await self.node.await_group_supports(name, "expire_producers.max_states")
        cap = limits.max_producer_states if capped else None
        for _ in range(100):
            now = group_now(local.state_store, now_ms())  # producer states are timed on the group's time
            machine = local.machine
            states = machine.counted_producer_states if isinstance(machine, QueueGroupMachine) else None
            if not local.raft.is_leader() or not producers.expiry_due(
                local.machine.store, now, idle_ms, cap, states
            ):
                break
            new_cap = cap is not None and producers.stored_cap(local.machine.store) != cap
            outcome = await self.node.propose(name, expire_producers(now_ms(), idle_ms, max_states=cap))
            result = outcome.result
            if outcome.error or not isinstance(result, dict) or "error" in result:
                log.warning("expire_producers_not_applied", group=name, error=outcome.error or result)
                break
            if new_cap:
                log.info("producer_cap_set", group=name, max_states=cap)
            expired += result["expired"]
        if expired:
            log.info("producers_expired", group=name, count=expired)

    async def _record_dead_letters(self) -> None:
        """As the metadata leader, propose ``record_dead_letters`` once every metadata voter
        applies it (``cluster/machines/metadata.py``: the dead-letter topics of an older release
        get their record at one entry on every replica)."""
        local, machine = self.node.groups.get(META), self.node.metadata
        if local is None or machine is None or not machine.needs_dead_letter_records:
            return
        if not local.raft.is_leader() or not self.node.group_supports(META, "meta.record_dead_letters"):
            return
        outcome = await self.node.propose(META, orjson.dumps({"v": 1, "op": "record_dead_letters"}))
        result = outcome.result
        if outcome.error or not isinstance(result, dict) or "error" in result:
            log.warning("record_dead_letters_not_applied", error=outcome.error or result)
        else:
            log.info("dead_letters_recorded", count=result.get("recorded"))

    async def _expire_subscriptions(self, name: str, local: LocalGroup) -> None:
        """Propose ``expire_subscriptions`` while this leader's store shows unconfigured
        subscriptions unused for ``limits.subscription_idle_ms`` (0: never), or the offset API's
        offsets of one unused for ``limits.offset_retention_ms`` (0: never); at most 100 steps."""
        limits = self.node.config.limits
        idle_ms = limits.subscription_idle_ms or MAX_DURATION_MS  # 0: never (as good as)
        if not limits.subscription_idle_ms and not limits.offset_retention_ms:
            return
        if not self.node.group_supports(name, "expire_subscriptions"):
            self._expiry_open_s.pop(name, None)
            return  # a voter of an older release would refuse it: it waits for the upgrade's end
        # Offsets expire only once every voter applies the field; until then the command is
        # written as before it (the offset API's offsets stay), and never with nothing to do.
        retention_ms = limits.offset_retention_ms or None
        if not self.node.group_supports(name, "expire_subscriptions.offsets"):
            if not limits.subscription_idle_ms:
                return
            retention_ms = None
        # Until then receives could not mark their subscription used (the older subscribe has no
        # now_ms): they get EXPIRY_GRACE_S to mark it again before idle ones are looked for.
        opened_s = self._expiry_open_s.setdefault(name, time.monotonic())
        if time.monotonic() - opened_s < min(EXPIRY_GRACE_S, idle_ms / 2000):
            return
        expired = dormant = 0
        for _ in range(100):
            if not local.raft.is_leader() or not self._subscriptions_due(name, local, idle_ms, retention_ms):
                break
            command = expire_subscriptions(now_ms(), idle_ms, EXPIRE_MAX, offset_retention_ms=retention_ms)
            outcome = await self.node.propose(name, command)
            result = outcome.result
            if outcome.error or not isinstance(result, dict) or "error" in result:
                log.warning("expire_subscriptions_not_applied", group=name, error=outcome.error or result)
                break
            expired += result["expired"]
            dormant += result.get("dormant", 0)
            if not result["more"]:
                break
        if expired or dormant:
            log.info("subscriptions_expired", group=name, count=expired, dormant=dormant)

    def _subscriptions_due(
        self, name: str, local: LocalGroup, idle_ms: int, retention_ms: int | None
    ) -> bool:
        """Whether something of an unconfigured subscription of group ``name`` expires now (its
        store is read again only once the group applied something since the last read, or the
        rule changed: the upgrade's end)."""
        cached = self._expiry_next.get(name)
        index = local.machine.applied_index
        if cached is None or cached[:2] != (index, retention_ms):
            due = next_expiry_ms(local.machine.store, idle_ms, retention_ms)
            cached = self._expiry_next[name] = (index, retention_ms, due)
        return cached[2] is not None and cached[2] <= now_ms()

    # -- delivery ticks ---------------------------------------------------------------------------

    async def deliver_forever(self) -> None:
        """As leader of a queue group, propose ``deliver_tick`` when a delayed message is due or an
        in-flight deadline passed: at that time (woken early when an apply schedules something
        sooner), and at least every :meth:`idle_wait_s` (a new leader's first look, and a look
        within ``WAKE_WITHIN_MS`` of any apply). Time enters the state machine only through this
        leader-stamped tick; a new leader's loop continues where the old one stopped, since the
        schedule is in the replicated state."""
        tick_s = self.node.config.delivery.tick_ms / 1000
        while True:
            self.delivery_wake.clear()
            try:
                wait_s = await self.deliver_once()
            except Exception:
                log.exception("deliver_tick_failed")
                wait_s = tick_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(max(wait_s, 0.001), self.idle_wait_s())):
                    await self.delivery_wake.wait()

    def idle_wait_s(self) -> float:
        """The longest the delivery loop sleeps: ``WAKE_WITHIN_MS`` less a tick (800 ms by
        default), so that an entry applied without waking it (due ``WAKE_WITHIN_MS`` after its
        command at the earliest) is looked up a tick before it is due, and a new leader looks
        within it. An idle group costs one wake-up per such period, no store read
        (:meth:`_known_due`); it was every ``delivery.tick_ms`` (200 ms)."""
        tick_ms = self.node.config.delivery.tick_ms
        return max(tick_ms, WAKE_WITHIN_MS - tick_ms) / 1000

    async def deliver_once(self) -> float:
        """Propose the ticks that are due; returns the seconds until the next known due time."""
        settings = self.node.config.delivery
        next_wait_ms: int | None = None
        for name, local in self.node.groups.items():
            if name == META or not local.raft.is_leader():
                self._due_cache.pop(name, None)  # a leader looks at the schedule once first
                continue
            for _ in range(100):  # bounded: the loop comes back at once if more is due
                # Due times are on the group's time (a leader clock ahead does not move it further
                # than its bound); the tick is stamped with this node's clock, as every command.
                wall = now_ms()
                now = group_now(local.state_store, wall)
                known, due = self._known_due(name, local, now)
                if not known:
                    seq = self.scheduled_seq
                    index = self.added_dues.looked(name, local.machine)
                    due = next_due_ms(local.machine.store)
                    self._due_cache[name] = (index, seq, now, due)
                if due is None or due > now:
                    break
                outcome = await self.node.propose(
                    name,
                    commands.deliver_tick(
                        wall,
                        settings.tick_max_items,
                        # the rule before issue 21 while a voter would refuse the new field
                        expiry_backoff=settings.expiry_backoff
                        or not await self.node.await_group_supports(name, "deliver_tick.expiry"),
                    ),
                )
                if outcome.error or not isinstance(outcome.result, dict) or "error" in outcome.result:
                    log.warning("deliver_tick_not_applied", group=name, error=outcome.error or outcome.result)
                    due = None
                    break
            if due is not None:
                wait_ms = due - group_now(local.state_store, now_ms())
                next_wait_ms = wait_ms if next_wait_ms is None else min(next_wait_ms, wait_ms)
        if next_wait_ms is None:
            return self.idle_wait_s()
        return max(0.0, next_wait_ms / 1000)

    def _known_due(self, name: str, local: LocalGroup, now: int) -> tuple[bool, int | None]:
        """``(True, due)`` when group ``name``'s next due time is known without a look at the store
        (its deadline index scan passes over every settled entry's tombstone): nothing was applied
        since the last look, or every apply since said what it scheduled (``added_dues.py``: the
        earlier of that and the cached time), or nothing that woke the loop (an entry added
        without waking it is due ``WAKE_WITHIN_MS`` after its command at the earliest, so one look
        in that time, a tick early, finds it on time). A cached time may be early (settled since):
        the look then finds the real one."""
        cached = self._due_cache.get(name)
        if cached is None:
            return False, None
        index, seq, looked_ms, due = cached
        if due is not None and due <= now:
            return False, None
        applied = local.machine.applied_index
        if applied == index:
            return True, due
        complete, added = self.added_dues.since(name, index, applied)
        if complete:  # every apply since the look told what it scheduled
            earliest = due if added is None else added if due is None else min(due, added)
            return (True, earliest) if earliest is None or earliest > now else (False, None)
        horizon = looked_ms + WAKE_WITHIN_MS - self.node.config.delivery.tick_ms
        if seq != self.scheduled_seq or now >= horizon:
            return False, None
        return True, due if due is not None and due < horizon else horizon
