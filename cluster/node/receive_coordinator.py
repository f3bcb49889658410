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
from collections.abc import Awaitable, Callable
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

if TYPE_CHECKING:
    from raftmq.cluster.node.router import LeaderRouter

__all__ = ["READ_AHEAD_HOLD_MS", "ReceiveCoordinator", "Waiter", "local_key", "queues_by_group"]

log = structlog.get_logger(__name__)

MAX_REMOTE_AWAIT_S = 5.0  # a remote ``await`` is re-armed at least this often
LEADERSHIP_CHECK_S = 1.0  # a waiting coordinator checks at least this often that it still leads

# Read-ahead of a line of this node's own (the SQS API's standard queues): a delete takes the
# line's next messages along in its entry (``ack_receive``), and the line's next receive takes
# them with no entry of its own. See ReceiveCoordinator.read_ahead_wanted.
READ_AHEAD_HOLD_MS = 1000  # a read-ahead is handed out within this, else given back (``release``)
READ_AHEAD_RECENT_S = 5.0  # a line reads ahead only if a receive waited in it this recently
READ_AHEAD_QUIET_S = 10.0  # after a read-ahead given back unclaimed, the line reads none this long
READ_AHEAD_MIN_VISIBILITY_MS = 10_000  # shorter visibility timeouts are never read ahead
READ_AHEAD_LINES = 4096  # the most lines whose recent receives a node remembers

Settle = Callable[[Topic, str, str, list[str], dict[str, Any]], Awaitable[list[dict[str, Any]]]]
"""``SubscriptionsApi._receipts_call``: apply an op to receipts at their queue groups."""


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
    rotation: int = 0


@dataclass
class _LineSeen:
    """What a line of this node's own last asked for, and until when it reads nothing ahead."""

    at: float  # time.monotonic() of its last receive
    max: int
    visibility_ms: int
    quiet_until: float = 0.0


@dataclass
class _ReadAhead:
    """Messages a delete took in flight for a line's next receives (``ack_receive``): taken for
    ``visibility_ms`` plus the hold, so one handed out by ``until`` stays invisible at least the
    ``visibility_ms`` its receive asked."""

    topic: Topic
    group: str
    messages: list[dict[str, Any]]
    visibility_ms: int
    until: float  # time.monotonic(): handed out by then, else given back
    timer: asyncio.TimerHandle | None = None


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
        # Read-ahead (lines of this node's own only): what each line asked for lately (oldest
        # first, at most READ_AHEAD_LINES), the read-aheads held (at most one a line, each at most
        # a receive's max, each for at most READ_AHEAD_HOLD_MS), and the lines being read ahead.
        self._seen: dict[TargetKey, _LineSeen] = {}
        self._ahead: dict[TargetKey, _ReadAhead] = {}
        self._filling: set[TargetKey] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

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
            seen = self._seen.pop(key, None)
            quiet = 0.0 if seen is None else seen.quiet_until
            self._seen[key] = _LineSeen(time.monotonic(), waiter.max, waiter.visibility_ms, quiet)
            if len(self._seen) > READ_AHEAD_LINES:
                del self._seen[next(iter(self._seen))]
        if target.task is None or target.task.done():
            target.task = asyncio.create_task(self._serve(key, target))

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
        try:
            while True:
                self._drop_done(target)
                if not target.waiters:
                    self._targets.pop(key, None)
                    return
                if target.coordinator is not None and not self.router.leads(target.coordinator):
                    # Leadership moved: the new leader coordinates, and the waiters move there
                    # (serving them here too would break the line).
                    self._targets.pop(key, None)
                    self._fail(target, CatalogError(errors.NOT_LEADER, "the receive coordinator moved"))
                    return
                target.arrived.clear()
                head = target.waiters[0]
                line = [w for w in target.waiters if w.visibility_ms == head.visibility_ms]
                if target.ordered:  # one receiver's take: a group's messages never go to two
                    line = [head]
                demand = min(sum(w.max for w in line), commands.MAX_RECEIVE)
                got = self._claim_ahead(key, head.visibility_ms, demand)
                if not got:
                    got = await self._take(target, demand, head.visibility_ms, head.delay_ms)
                self._hand_out(target, got, head.visibility_ms)
                now = time.monotonic()
                for w in list(target.waiters):
                    if w.deadline <= now:
                        target.waiters.remove(w)
                        if not w.future.done():
                            w.future.set_result([])
                if got or not target.waiters:
                    continue
                await self._wait(target, min(w.deadline for w in target.waiters))
        except RaftmqError as e:
            self._fail(target, answerable(e, write=True))
        except Exception:
            log.exception("receive_dispatch_failed", topic=target.topic.name, group=target.group)
            self._fail(target, CatalogError(errors.INTERNAL, "internal error; see the node's log"))
        finally:
            if self._targets.get(key) is target and not target.waiters:
                self._targets.pop(key, None)

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
                receipts = [m["receipt"] for m in rest]
                task = asyncio.create_task(self._give_back(target, receipts))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                return
            target.waiters.remove(w)
            part, rest = rest[: w.max], rest[w.max :]
            w.future.set_result(part)

    # -- read-ahead (lines of this node's own) -----------------------------------------------------

    def read_ahead_wanted(self, key: TargetKey) -> tuple[int, int] | None:
        """``(max, visibility_ms)`` of the receives to take along with a delete for the line
        ``key`` of this node's own (:func:`local_key`), or None; they are taken in flight for
        ``visibility_ms + READ_AHEAD_HOLD_MS``. Only for a line whose last receive was at most
        ``READ_AHEAD_RECENT_S`` ago, asked a visibility timeout of at least
        ``READ_AHEAD_MIN_VISIBILITY_MS`` and holds no read-ahead; not for ``READ_AHEAD_QUIET_S``
        after one was given back unclaimed (a receiver that does not come straight back). A caller
        given a pair must call :meth:`put_ahead` (with what it got, maybe nothing)."""
        seen = self._seen.get(key)
        now = time.monotonic()
        if (
            seen is None
            or now - seen.at > READ_AHEAD_RECENT_S
            or now < seen.quiet_until
            or seen.visibility_ms < READ_AHEAD_MIN_VISIBILITY_MS
            or key in self._ahead
            or key in self._filling
        ):
            return None
        self._filling.add(key)
        return seen.max, seen.visibility_ms

    def put_ahead(
        self,
        key: TargetKey,
        topic: Topic,
        group: str,
        messages: list[dict[str, Any]],
        visibility_ms: int,
        started: float,
    ) -> None:
        """Hold ``messages`` a delete took along for the line ``key``'s next receives asking
        ``visibility_ms`` (``started``: when that delete was sent, ``time.monotonic()``, before the
        leader stamped the deadline) until ``READ_AHEAD_HOLD_MS`` after ``started``; then give
        back what is left."""
        self._filling.discard(key)
        if not messages:
            return
        until = started + READ_AHEAD_HOLD_MS / 1000
        ahead = _ReadAhead(topic, group, messages, visibility_ms, until)
        self._ahead[key] = ahead
        delay = max(0.0, until - time.monotonic())
        ahead.timer = asyncio.get_running_loop().call_later(delay, self._expire_ahead, key, ahead)
        target = self._targets.get(key)
        if target is not None:
            target.arrived.set()  # a receiver waiting in the line takes them now

    def _claim_ahead(self, key: TargetKey, visibility_ms: int, demand: int) -> list[dict[str, Any]]:
        """Up to ``demand`` read-ahead messages for a receive asking ``visibility_ms``."""
        ahead = self._ahead.get(key)
        if ahead is None or ahead.visibility_ms != visibility_ms or time.monotonic() >= ahead.until:
            return []
        got, ahead.messages = ahead.messages[:demand], ahead.messages[demand:]
        if not ahead.messages:
            self._ahead.pop(key, None)
            if ahead.timer is not None:
                ahead.timer.cancel()
        return got

    def _expire_ahead(self, key: TargetKey, ahead: _ReadAhead) -> None:
        """Give back a read-ahead no receive took in time (``release``: visible again at once,
        not counted as a delivery); the line reads none ahead for a while. If the release fails,
        the messages come back at their visibility deadline (counted, as a lost answer)."""
        if self._ahead.get(key) is not ahead:
            return
        del self._ahead[key]
        seen = self._seen.get(key)
        if seen is not None:
            seen.quiet_until = time.monotonic() + READ_AHEAD_QUIET_S
        receipts = [m["receipt"] for m in ahead.messages]
        task = asyncio.create_task(self._release(ahead.topic, ahead.group, receipts))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, topic: Topic, group: str, receipts: list[str]) -> None:
        try:
            await self._settle(topic, group, "release", receipts, {})
        except RaftmqError as e:
            log.warning("read_ahead_not_released", topic=topic.name, group=group, code=e.code)

    async def _give_back(self, target: _Target, receipts: list[str]) -> None:
        await self._settle(target.topic, target.group, "nack", receipts, {"delay_ms": 0})

    async def _take(
        self, target: _Target, demand: int, visibility_ms: int, delay_ms: int = 0
    ) -> list[dict[str, Any]]:
        """Receive up to ``demand`` messages from the queue groups, one after the other (starting
        group and queue order rotate, so no queue is always served first). A line of this node's
        own asks first the groups whose replica here shows something to hand out (still in turn),
        so a receive is seldom forwarded to a leader with nothing for it; ``delay_ms``: an ordered
        receive's delay."""
        target.rotation += 1
        groups = sorted(target.by_group)
        start = target.rotation % len(groups)
        order = groups[start:] + groups[:start]
        if target.coordinator is None and target.epoch is None and not target.ordered:
            order.sort(key=lambda g: not self._seen_available(target, g))  # stable: in turn
        got: list[dict[str, Any]] = []
        failures = 0
        for g in order:
            if len(got) >= demand:
                break
            queues = target.by_group[g]
            turn = target.rotation % len(queues)
            body = {
                "group": target.group,
                "topic_id": target.topic.id,
                "queues": queues[turn:] + queues[:turn],
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
                got += (await self.router.group_call(g, "receive", body))["messages"]
            except RaftmqError as e:
                if not e.retriable:
                    raise
                failures += 1
                log.info("receive_group_unavailable", group_id=g, code=e.code)
        if failures == len(groups):
            await asyncio.sleep(0.2)  # every group is electing: do not spin
        return got

    def _seen_available(self, target: _Target, g: int) -> bool:
        """Whether this node's replica of group ``g`` (a hint: it may lag its leader) shows
        something a receive of the target could hand out; True when this node has no replica."""
        local = self.node.groups.get(str(g))
        if local is None:
            return True
        store = local.machine.store
        now = group_now(store, now_ms())
        return available(store, target.group, target.topic.id, target.by_group[g], now)[0]

    async def _wait(self, target: _Target, until: float) -> None:
        """Until something may be available in one of the target's queue groups, a new receiver
        arrives, or ``until``."""
        timeout = min(until - time.monotonic(), LEADERSHIP_CHECK_S)
        if timeout <= 0:
            return
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(target.arrived.wait())]
        for g, queues in target.by_group.items():
            tasks.append(asyncio.create_task(self._await_group(g, target, queues, timeout)))
        try:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _await_group(self, g: int, target: _Target, queues: list[int], timeout: float) -> None:
        name = str(g)
        # An ordered line is served for its head (one receiver a take), with the head's delay.
        delay_ms = target.waiters[0].delay_ms if target.ordered and target.waiters else 0
        if self.router.leads(name):
            await await_available(
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
            return
        body = {
            "group": target.group,
            "topic_id": target.topic.id,
            "queues": queues,
            "epoch": target.epoch,
            "wait_ms": int(min(timeout, MAX_REMOTE_AWAIT_S) * 1000),
        }
        if target.ordered:
            body["ordered"] = True
            if delay_ms:
                body["delay_ms"] = delay_ms
        try:
            await self.router.group_call(g, "await", body)
        except RaftmqError:
            await asyncio.sleep(0.2)  # the group is electing; try again a little later

    # -- ack, nack, extend ------------------------------------------------------------------------
