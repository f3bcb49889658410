"""The receive coordinator: the line of waiting receivers of each (topic, consumer group) and
how it is served (``docs/delivery.md``).

The coordinator of a (topic, group) is the leader of the queue group holding the topic's queue 0
(a locked receive: the leader of its queue's group). It keeps its waiting receivers in arrival
order and serves them from the queue groups' leaders (internal action ``receive``, which proposes
a ``receive`` command only when something is available), the head of the line first: waiting
receivers are served round robin. HTTP receives (``cluster/api/handlers/subscriptions.py``) and push
streams (``cluster/api/handlers/push.py``, through ``SubscriptionsApi.take``) wait in the same line.
The ``receive`` and ``await`` it calls at the queue groups' leaders are the node's
(``delivery_actions.py``), here or at a peer, through the ``LeaderRouter``. A line may also be this
node's own, whatever it leads (no coordinator: the SQS API's standard queues, which take no hop to
the coordinator and promise no round robin between nodes).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import CatalogError, RaftmqError, answerable
from raftmq.cluster.machines.apply import group_now
from raftmq.cluster.machines.delivery import available
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.delivery_actions import await_available
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.read_ahead import Plan, ReadAhead, Settle

if TYPE_CHECKING:
    from raftmq.cluster.node.router import LeaderRouter

__all__ = ["ReceiveCoordinator", "TargetKey", "Waiter", "local_key", "queues_by_group"]

log = structlog.get_logger(__name__)

MAX_REMOTE_AWAIT_S = 5.0  # how long an ``await`` waits at a queue group (a line arms the next after)
AWAIT_GRACE_S = 1.0  # past its time, an ``await`` whose peer has not answered is given up
DISARM_AFTER_S = 1.0  # a line's awaits outlive it this long (a receiver looping comes back sooner)
LEADERSHIP_CHECK_S = 1.0  # a waiting coordinator checks at least this often that it still leads


def queues_by_group(topic: Topic, queues: list[int]) -> dict[int, list[int]]:
    """``queues`` of ``topic`` by the queue group holding them."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for q in queues:
        by_group[topic.queue_groups[q]].append(q)
    return dict(by_group)


TargetKey = tuple[int, str, int | None, int | None, bool, bool]
"""A line's key: topic id, consumer group, queue (a locked receive's), epoch, ordered, local (a
line of this node's own, :meth:`ReceiveCoordinator.target` with no coordinator)."""


@dataclass
class Waiter:
    max: int
    visibility_ms: int
    deadline: float  # time.monotonic()
    future: asyncio.Future[list[dict[str, Any]]]
    delay_ms: int = 0  # an ordered receive's: a message is handed out first after its timestamp + this


@dataclass
class _Target:
    """What one coordinator serves: a topic, a consumer group, the queues by queue group, and the
    epoch of a locked receive (None: any unlocked queue); ``ordered``: the receives are
    ``receive_ordered`` (a message's key is its message group, ``delivery/ordered.py``)."""

    topic: Topic
    group: str
    by_group: dict[int, list[int]]
    coordinator: str | None  # the group whose leader serves this target; None: this node
    epoch: int | None = None
    ordered: bool = False
    waiters: deque[Waiter] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # Queue groups whose leader's ``await`` said, since the line last looked, it has something.
    news: set[int] = field(default_factory=set)
    # The line's own take (its receives at the queue groups) is on its way: it takes for the
    # waiters in line now, so a send takes nothing along for them meanwhile.
    taking: bool = False


def local_key(topic_id: int, group: str) -> TargetKey:
    """The key of the line of this node's own for (topic, group): ``take_here``'s."""
    return (topic_id, group, None, None, False, True)


class ReceiveCoordinator:
    """The lines of waiting receivers this node coordinates; one instance per node
    (``SubscriptionsApi.coordinator``)."""

    def __init__(self, node: Node, router: LeaderRouter, settle: Settle) -> None:
        self.node = node
        self.router = router
        self._settle = settle
        self._targets: dict[TargetKey, _Target] = {}
        # The ``await`` armed for a line at each queue group, with the delay it was armed for, kept
        # across the line's waits until it answers, so receivers that come and go (a push stream's
        # short takes, loops of short polls) do not arm another each time (``_arm``).
        self._armed: dict[tuple[TargetKey, int], tuple[int, asyncio.Task[bool]]] = {}
        # Every line's turns (kept while it is empty: its next receive goes on in turn) and the
        # read-aheads of the lines of this node's own (read_ahead.py).
        self.read_ahead = ReadAhead(settle)

    def target(
        self,
        topic: Topic,
        group: str,
        queue: int | None,
        epoch: int | None,
        coordinator: str | None,
        ordered: bool = False,
    ) -> _Target:
        """A line to serve. ``coordinator``: the group whose leader serves it (the line moves with
        that leadership), or None for a line this node serves whatever it leads (the SQS API's
        standard queues: no forwarding hop to the coordinator, and no round robin with the
        receivers waiting at other nodes, which SQS does not promise)."""
        queues = list(range(topic.queues)) if queue is None else [queue]
        return _Target(topic, group, queues_by_group(topic, queues), coordinator, epoch, ordered)

    def enqueue(self, key: TargetKey, waiter: Waiter, make: Callable[[], _Target]) -> None:
        """Put ``waiter`` at the end of its target's line and make sure the line is served."""
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = make()
        target.waiters.append(waiter)
        target.arrived.set()
        if key[5]:  # a line of this node's own: remembered for its read-ahead
            self.read_ahead.received(key, waiter.max, waiter.visibility_ms)
        if target.task is None or target.task.done():
            target.task = asyncio.create_task(self._serve(key, target))

    def waiting(self) -> dict[tuple[str, str], int]:
        """The receivers waiting in this node's lines by (topic, consumer group), lines with none
        left out: the metric ``raftmq_receivers_waiting``. Called from the metrics thread: the
        copies (``list`` of a dict's values or a deque) are taken whole under the GIL."""
        counts: dict[tuple[str, str], int] = {}
        for target in list(self._targets.values()):
            n = sum(1 for w in list(target.waiters) if not w.future.done())
            if n:
                key = (target.topic.name, target.group)
                counts[key] = counts.get(key, 0) + n
        return counts

    async def new_leader_known(self, name: str) -> None:
        """Until this node leads group ``name`` again or knows another leader (a leadership transfer
        takes a moment to be seen), at most ``leader_wait_s``."""
        deadline = time.monotonic() + self.router.leader_wait_s
        while time.monotonic() < deadline and not self.router.leads(name):
            leader = self.node.leader_of(name)
            if leader is not None and leader.id != self.node.me.id:
                return
            await asyncio.sleep(0.05)

    async def _serve(self, key: TargetKey, target: _Target) -> None:
        """Serve the waiting receivers of one target, the head of the line first."""
        woken: set[int] = set()  # queue groups whose leader said, while the line waited, it has some
        try:
            while True:
                self._drop_done(target)
                if not target.waiters:
                    self._line_gone(key)
                    return
                if target.coordinator is not None and not self.router.leads(target.coordinator):
                    # Leadership moved: the new leader coordinates, and the waiters move there
                    # (serving them here too would break the line).
                    self._line_gone(key)
                    self._fail(target, CatalogError(errors.NOT_LEADER, "the receive coordinator moved"))
                    return
                target.arrived.clear()
                head = target.waiters[0]
                line = [w for w in target.waiters if w.visibility_ms == head.visibility_ms]
                if target.ordered:  # one receiver's take: a group's messages never go to two
                    line = [head]
                demand = min(sum(w.max for w in line), commands.MAX_RECEIVE)
                got = self.read_ahead.claim(key, head.visibility_ms, demand)
                if not got:
                    target.taking = True
                    try:
                        got = await self._take(key, target, demand, head.visibility_ms, head.delay_ms, woken)
                    finally:
                        target.taking = False
                woken = set()
                self._hand_out(target, got, head.visibility_ms)
                now = time.monotonic()
                for w in list(target.waiters):
                    if w.deadline <= now:
                        target.waiters.remove(w)
                        if not w.future.done():
                            w.future.set_result([])
                if got or not target.waiters:
                    continue
                woken = await self._wait(key, target, min(w.deadline for w in target.waiters))
        except RaftmqError as e:
            self._fail(target, answerable(e, write=True))
        except Exception:
            log.exception("receive_dispatch_failed", topic=target.topic.name, group=target.group)
            self._fail(target, CatalogError(errors.INTERNAL, "internal error; see the node's log"))
        finally:
            if self._targets.get(key) is target and not target.waiters:
                self._line_gone(key)

    def _line_gone(self, key: TargetKey) -> None:
        """The line ``key`` has no receiver left: forgotten now, its awaits a moment later unless
        a receiver comes back to the line by then (:meth:`_disarm`)."""
        self._targets.pop(key, None)
        asyncio.get_running_loop().call_later(DISARM_AFTER_S, self._disarm, key)

    def _disarm(self, key: TargetKey) -> None:
        if key in self._targets:
            return
        for (line, _), (_, task) in list(self._armed.items()):
            if line == key:
                task.cancel()  # (its done callback forgets it)

    @staticmethod
    def _drop_done(target: _Target) -> None:
        for w in [w for w in target.waiters if w.future.done()]:  # the client went away
            target.waiters.remove(w)

    @staticmethod
    def _fail(target: _Target, e: RaftmqError) -> None:
        while target.waiters:
            w = target.waiters.popleft()
            if not w.future.done():
                w.future.set_exception(e)

    def _hand_out(self, target: _Target, got: list[dict[str, Any]], visibility_ms: int) -> None:
        """Give messages taken for ``visibility_ms`` to the waiters that asked that timeout, in line
        order, each up to its ``max``; a waiter that asked another stays in line (its messages would
        turn visible while it still works on them)."""
        rest = got
        while rest:
            self._drop_done(target)
            w = next((w for w in target.waiters if w.visibility_ms == visibility_ms), None)
            if w is None:
                # Nobody left to take them (clients went away): give them back at once.
                self._give_back(target, [m["receipt"] for m in rest])
                return
            target.waiters.remove(w)
            part, rest = rest[: w.max], rest[w.max :]
            w.future.set_result(part)

    # -- read-ahead (lines of this node's own, read_ahead.py) --------------------------------------

    def read_ahead_wanted(self, key: TargetKey, topic: Topic, candidates: list[int]) -> Plan | None:
        """What a delete of ``topic``'s receipts for the line ``key`` of this node's own
        (:func:`local_key`) may take along, in the entry of one of the ``candidates`` (queue
        groups of its receipts whose voters apply ``ack_receive``): ``ReadAhead.wanted``. A caller
        given a plan must call :meth:`put_ahead`."""
        by_group = queues_by_group(topic, list(range(topic.queues)))
        return self.read_ahead.wanted(
            key, by_group, candidates, lambda g: self._shows(topic, key[1], g, by_group[g])
        )

    async def append(
        self, topic: Topic, group: str, queue: int, data: bytes, take_along: bool
    ) -> dict[str, Any]:
        """Append the binary batch ``data`` to ``queue`` of ``topic`` (the ``append`` action at
        its queue group); ``take_along`` (a standard SQS queue with no RedrivePolicy, as a delete's
        read-ahead): when this node leads that group, every voter of it applies ``append.take`` and
        receivers of ``group`` wait in the line of this node's own (:meth:`take_along_wanted`),
        the entry also takes messages along for them (``delivery.take_along``), handed to them at
        once (:meth:`put_ahead`), given back if they went away. The action's answer."""
        g = topic.queue_groups[queue]
        key = local_key(topic.id, group)
        plan = None
        if take_along and self.router.leads(str(g)) and self.node.group_supports(str(g), "append.take"):
            plan = self.take_along_wanted(key, topic, g)
        body: dict[str, Any] = {"items": [(topic.id, queue, data)]}
        if plan is not None:
            body["take"] = {
                "group": group,
                "topic_id": topic.id,
                "queues": plan.queues,
                "max": plan.max,
                "visibility_ms": plan.taken_ms,
                "max_age_ms": topic.retention_ms,
            }
        started = time.monotonic()
        taken: list[dict[str, Any]] = []
        try:
            result = await self.router.group_call(g, "append", body, size_hint=len(data))
            taken = result.get("messages") or []
        finally:
            if plan is not None:
                self.put_ahead(key, topic, group, taken, plan, started)
        return result

    def take_along_wanted(self, key: TargetKey, topic: Topic, g: int) -> Plan | None:
        """What a send of ``topic`` whose entry goes to queue group ``g`` may take along for the
        receivers waiting now in the line ``key`` of this node's own (:func:`local_key`): the
        waiters asking the head's visibility timeout, up to their ``max`` in all
        (``ReadAhead.wanted_by_send``); None when nobody waits there, or while the line's own take
        is on its way (it takes for those waiters: what a send took then would be held, then
        released, an entry for nothing). A caller given a plan must call :meth:`put_ahead` (the
        waiting receivers take what it got at once)."""
        target = self._targets.get(key)
        if target is None or not key[5] or target.ordered or target.epoch is not None or target.taking:
            return None
        self._drop_done(target)
        queues = target.by_group.get(g)
        if not target.waiters or not queues:
            return None
        head = target.waiters[0]
        demand = sum(w.max for w in target.waiters if w.visibility_ms == head.visibility_ms)
        return self.read_ahead.wanted_by_send(
            key, g, queues, min(demand, commands.MAX_RECEIVE), head.visibility_ms
        )

    def put_ahead(
        self,
        key: TargetKey,
        topic: Topic,
        group: str,
        messages: list[dict[str, Any]],
        plan: Plan,
        started: float,
    ) -> None:
        """Hold what a delete took along by ``plan`` (``ReadAhead.put``); a receiver waiting in
        the line takes it at once."""
        if self.read_ahead.put(key, topic, group, messages, plan, started):
            target = self._targets.get(key)
            if target is not None:
                target.arrived.set()

    def _give_back(self, target: _Target, receipts: list[str]) -> None:
        """Messages taken for receivers that went away: ``release``d (visible again at once,
        their delivery uncounted: no consumer got them) where every queue group's voters apply
        it, else visible again at once by a ``nack`` (counted, as the release before did); tried
        again and waited for at a graceful stop (``ReadAhead.give_back``)."""
        groups = {target.topic.queue_groups[int(r.split(".")[1])] for r in receipts}
        release = all(self.node.group_supports(str(g), "release") for g in groups)
        op, fields = ("release", {}) if release else ("nack", {"delay_ms": 0})
        self.read_ahead.give_back(target.topic, target.group, receipts, op, fields)

    async def _take(
        self,
        key: TargetKey,
        target: _Target,
        demand: int,
        visibility_ms: int,
        delay_ms: int = 0,
        woken: set[int] | None = None,
    ) -> list[dict[str, Any]]:
        """Receive up to ``demand`` messages from the queue groups, one after the other, in turn:
        the line's turns (kept while the line is empty, ``read_ahead.LineTurns``) start it after
        the group it last took from (or read ahead from), and each group's queues one further each
        time it is asked, so no queue is always served first. A line that is neither locked nor
        ordered asks only the groups whose replica here shows something to hand out (or that have
        none here) and those whose leader said so while the line waited (``woken``: a replica here
        may lag its leader by a heartbeat), in turn, so an empty queue costs no receive at its
        leaders; ``delay_ms``: an ordered receive's delay."""
        turns = self.read_ahead.turns(key)
        groups = sorted(target.by_group)
        start = turns.group % len(groups)
        order = groups[start:] + groups[:start]
        if target.epoch is None and not target.ordered:
            order = [g for g in order if g in (woken or ()) or self._seen_available(target, g)]
        turns.run = 0
        turns.group = start + 1  # the next take starts after this one's first group ...
        got: list[dict[str, Any]] = []
        failures = 0
        for g in order:
            if len(got) >= demand:
                break
            body = {
                "group": target.group,
                "topic_id": target.topic.id,
                "queues": turns.in_turn(g, target.by_group[g]),
                "max": demand - len(got),
                "visibility_ms": visibility_ms,
                "epoch": target.epoch,
                "max_age_ms": target.topic.retention_ms,
            }
            if target.ordered:
                body["ordered"] = True
                if delay_ms:
                    body["delay_ms"] = delay_ms
            try:
                taken = (await self.router.group_call(g, "receive", body))["messages"]
            except RaftmqError as e:
                if not e.retriable:
                    raise
                failures += 1
                log.info("receive_group_unavailable", group_id=g, code=e.code)
                continue
            if taken and not got:
                turns.group = groups.index(g) + 1  # ... or after the group it first took from
            got += taken
        if failures == len(groups):
            await asyncio.sleep(0.2)  # every group is electing: do not spin
        return got

    def _seen_available(self, target: _Target, g: int) -> bool:
        """Whether this node's replica of group ``g`` shows something a receive of the target
        could hand out (:meth:`_shows`)."""
        return self._shows(target.topic, target.group, g, target.by_group[g])

    def _shows(self, topic: Topic, group: str, g: int, queues: list[int]) -> bool:
        """Whether this node's replica of queue group ``g`` (a hint: it may lag its leader) shows
        something a receive of ``group`` from ``queues`` of ``topic`` could hand out; True when
        this node has no replica."""
        local = self.node.groups.get(str(g))
        if local is None:
            return True
        store = local.machine.store
        now = group_now(store, now_ms())
        return available(store, group, topic.id, queues, now)[0]

    async def _wait(self, key: TargetKey, target: _Target, until: float) -> set[int]:
        """Until something may be available in one of the target's queue groups, a new receiver
        arrives, a coordinator's leadership moves (looked at every ``LEADERSHIP_CHECK_S``), an
        ``await`` ends, or ``until`` (at most ``MAX_REMOTE_AWAIT_S``). An ``await`` is armed at
        each queue group (a hop for each led elsewhere) for ``MAX_REMOTE_AWAIT_S`` and kept across
        waits until it answers (:meth:`_arm`). Returns the queue groups whose leader said it has
        something to hand out."""
        if target.news:
            return self._news(target)
        # (At most an await's time: one that hangs, a peer unreachable, is not waited for longer.)
        timeout = min(until - time.monotonic(), MAX_REMOTE_AWAIT_S)
        if timeout <= 0:
            return set()
        awaits = [self._arm(key, target, g, queues) for g, queues in target.by_group.items()]
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(target.arrived.wait())]
        if target.coordinator is not None:
            tasks.append(asyncio.create_task(self._until_not_leading(target.coordinator)))
        try:
            await asyncio.wait([*tasks, *awaits], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:  # (not the awaits: the line's next wait keeps them)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self._news(target)

    @staticmethod
    def _news(target: _Target) -> set[int]:
        news, target.news = target.news, set()
        return news

    def _arm(self, key: TargetKey, target: _Target, g: int, queues: list[int]) -> asyncio.Task[bool]:
        """The ``await`` of the line ``key`` at queue group ``g``: the one armed before while it
        has not answered, else a new one. When it answers, it leaves ``_armed``, and a yes goes to
        the line's news (the line's target then, if it has one) and wakes it."""
        # An ordered line is served for its head (one receiver a take), with the head's delay: an
        # await armed for another head's is replaced.
        delay_ms = target.waiters[0].delay_ms if target.ordered and target.waiters else 0
        armed_key = (key, g)
        armed = self._armed.get(armed_key)
        if armed is not None:
            if armed[0] == delay_ms:
                return armed[1]
            armed[1].cancel()
        task = asyncio.create_task(self._await_group(g, target, queues, delay_ms))

        def answered(done: asyncio.Task[bool]) -> None:
            if self._armed.get(armed_key, (0, None))[1] is done:
                del self._armed[armed_key]
            if done.cancelled() or done.exception() is not None or not done.result():
                return  # no news (a failed await: the next wait arms another)
            line = self._targets.get(key)
            if line is not None:
                line.news.add(g)
                line.arrived.set()

        task.add_done_callback(answered)
        self._armed[armed_key] = (delay_ms, task)
        return task

    async def _until_not_leading(self, name: str) -> None:
        while self.router.leads(name):
            await asyncio.sleep(LEADERSHIP_CHECK_S)

    async def _await_group(self, g: int, target: _Target, queues: list[int], delay_ms: int) -> bool:
        name = str(g)
        timeout = MAX_REMOTE_AWAIT_S
        if self.router.leads(name):
            return await await_available(
                self.node,
                name,
                target.topic.id,
                target.group,
                queues,
                target.epoch,
                timeout,
                target.ordered,
                delay_ms,
            )
        body = {
            "group": target.group,
            "topic_id": target.topic.id,
            "queues": queues,
            "epoch": target.epoch,
            "wait_ms": int(timeout * 1000),
        }
        if target.ordered:
            body["ordered"] = True
            if delay_ms:
                body["delay_ms"] = delay_ms
        try:
            # Given up past its time (a peer that does not answer): the line's next wait arms
            # another, at whoever leads the group by then.
            answer = await asyncio.wait_for(
                self.router.group_call(g, "await", body), MAX_REMOTE_AWAIT_S + AWAIT_GRACE_S
            )
            return answer.get("available") is True
        except (RaftmqError, TimeoutError):
            await asyncio.sleep(0.2)  # the group is electing; try again a little later
            return False

    # -- ack, nack, extend ------------------------------------------------------------------------
