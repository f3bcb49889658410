"""Read-ahead of a node's own receive lines (the SQS API's standard queues, ``docs/sqs.md``): a
delete takes the line's next messages along in its entry (``ack_receive``), and the line's next
receive hands them out with no entry and no hop of its own. A send to a queue group this node
leads does the same for the receives waiting in the line then (``append.take``,
:meth:`ReadAhead.wanted_by_send`): held and handed out, or given back, as a delete's read-ahead.

What it owns: per line, what its receives asked lately and where its turns stand (``LineTurns``,
shared with the line's takes in ``receive_coordinator.py``), the read-ahead held (at most one a
line, at most one receive's worth, for at most ``READ_AHEAD_HOLD_MS``), the releases under way
(and the give-backs of messages a take got for receivers that went away, retried and awaited
alike: ``give_back``), and the counts ``/metrics`` shows.

Invariants:

- A held message goes only to a receive asking the visibility timeout it was taken for, within
  the hold; it was taken for that timeout plus the hold, so it stays invisible at least what its
  receive asked and at most the hold longer.
- What no receive took goes back with ``release`` (visible again at once, its delivery uncounted),
  tried again for at most ``RELEASE_TRY_S``; from a graceful stop on, nothing is read ahead and
  what is held is released the same way; whatever still tries ``STOP_RELEASE_S`` after the stop
  began is ended (nothing of it outlives the node). Only a crash (or releases failing that long,
  or ended by a stop) leaves a read-ahead in flight until its visibility deadline, counted once,
  as a receive whose answer was lost. The queue group's machine takes nothing ahead for a
  subscription that dead-letters (``delivery.ack_receive``), and the SQS API asks none for a queue
  with a RedrivePolicy, so such a count never moves a message to a dead-letter queue.
- Fairness: a line reads ahead from the queue group of the delete's receipts (its queues in turn),
  at most ``READ_AHEAD_RUN`` times in a row while another of its groups shows something to hand out
  on this node's replica; then its next receive takes in turn, starting after that group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.machines.metadata import Topic

__all__ = [
    "READ_AHEAD_HOLD_MS",
    "READ_AHEAD_MIN_VISIBILITY_MS",
    "READ_AHEAD_RUN",
    "LineTurns",
    "Plan",
    "ReadAhead",
    "ReadAheadCounts",
]

log = structlog.get_logger(__name__)

READ_AHEAD_HOLD_MS = 1000  # a read-ahead is handed out within this, else given back (``release``)
READ_AHEAD_RECENT_S = 5.0  # a line reads ahead only if a receive waited in it this recently
READ_AHEAD_QUIET_S = 10.0  # after a read-ahead given back untouched, the line reads none this long
READ_AHEAD_MIN_VISIBILITY_MS = 10_000  # shorter visibility timeouts are never read ahead
READ_AHEAD_RUN = 16  # read-aheads in a row from one queue group while another has messages
READ_AHEAD_LINES = 4096  # the most lines whose recent receives and turns a node remembers
RELEASE_TRY_S = 5.0  # a release that fails is tried again for this long
STOP_RELEASE_S = 3.0  # a graceful stop waits this long at most for its releases

Settle = Callable[[Topic, str, str, list[str], dict[str, Any]], Awaitable[list[dict[str, Any]]]]
"""``SubscriptionsApi.settle``: apply an op to receipts at their queue groups."""

Shows = Callable[[int], bool]
"""Whether this node's replica of a queue group shows something the line could take (a hint)."""


@dataclass
class LineTurns:
    """What a line last asked for and where its turns stand, kept while it has no receiver.

    ``group``: the index (in the line's sorted queue groups) its next take starts at, after the
    group it last took from; ``queue``: per queue group, the turn its queues start at
    (:meth:`in_turn`); ``run``: the read-aheads in a row since its last take. ``at``, ``max``,
    ``visibility_ms``: its last receive (a line of this node's own); ``quiet_until``: it reads
    nothing ahead until then.
    """

    group: int = 0
    queue: dict[int, int] = field(default_factory=dict)
    run: int = 0
    at: float = 0.0  # time.monotonic(); 0: no receive of a line of this node's own yet
    max: int = 0
    visibility_ms: int = 0
    quiet_until: float = 0.0

    def in_turn(self, g: int, queues: list[int]) -> list[int]:
        """Queue group ``g``'s ``queues`` for its next take or read-ahead: each starts one queue
        further than the last."""
        turn = self.queue.get(g, 0)
        self.queue[g] = turn + 1
        start = turn % len(queues)
        return queues[start:] + queues[:start]


@dataclass(frozen=True)
class Plan:
    """A read-ahead to ask of a delete's entry: up to ``max`` messages of ``queues`` (in this
    order, all of queue group ``group``) for receives asking ``visibility_ms``."""

    group: int
    queues: list[int]
    max: int
    visibility_ms: int
    send: bool = False  # a send's take-along (``append.take``), not a delete's read-ahead

    @property
    def taken_ms(self) -> int:
        """The visibility they are taken for: the receive's, plus the hold."""
        return self.visibility_ms + READ_AHEAD_HOLD_MS


@dataclass
class ReadAheadCounts:
    """Messages read ahead by this node, by what became of them (``/metrics``)."""

    taken: int = 0  # taken in flight by a delete's entry
    taken_by_send: int = 0  # taken in flight by a send's entry for a receive waiting then
    handed_out: int = 0  # to a receive, with no entry of its own
    released: int = 0  # given back uncounted (no receive took them in time, or a stop)
    unreleased: int = 0  # the release failed: back at their visibility deadline, counted


@dataclass
class _Held:
    """Messages a delete took in flight for a line's next receives asking ``visibility_ms``."""

    topic: Topic
    group: str
    messages: list[dict[str, Any]]
    visibility_ms: int
    until: float  # time.monotonic(): handed out by then, else given back
    claimed: bool = False  # a receive took some: the line is in use
    timer: asyncio.TimerHandle | None = None


@dataclass
class ReadAhead:
    """The read-aheads of one node's lines; ``ReceiveCoordinator.read_ahead``."""

    settle: Settle
    counts: ReadAheadCounts = field(default_factory=ReadAheadCounts)
    stopping: bool = False
    _turns: dict[Any, LineTurns] = field(default_factory=dict)
    _held: dict[Any, _Held] = field(default_factory=dict)
    _filling: set[Any] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def turns(self, key: Any) -> LineTurns:
        """The line's turns (new ones for a line not seen lately); it becomes the most recent of
        at most ``READ_AHEAD_LINES``."""
        turns = self._turns.pop(key, None) or LineTurns()
        self._turns[key] = turns
        if len(self._turns) > READ_AHEAD_LINES:
            del self._turns[next(iter(self._turns))]
        return turns

    def received(self, key: Any, max_messages: int, visibility_ms: int) -> None:
        """A receive waited in the line ``key`` of this node's own."""
        turns = self.turns(key)
        turns.at, turns.max, turns.visibility_ms = time.monotonic(), max_messages, visibility_ms

    def wanted(
        self, key: Any, by_group: dict[int, list[int]], candidates: list[int], shows: Shows
    ) -> Plan | None:
        """What a delete for the line ``key`` (whose queues are ``by_group``) may take along in the
        entry of one of the ``candidates`` (the receipts' queue groups whose voters apply
        ``ack_receive``), or None. Only for a line whose last receive was at most
        ``READ_AHEAD_RECENT_S`` ago, asked at least ``READ_AHEAD_MIN_VISIBILITY_MS`` and holds
        nothing; not for ``READ_AHEAD_QUIET_S`` after a read-ahead no receive touched; not after
        ``READ_AHEAD_RUN`` in a row while another group ``shows`` something (the line's next
        take serves the groups in turn). A caller given a plan must call :meth:`put`."""
        turns = self._turns.get(key)
        now = time.monotonic()
        if (
            self.stopping
            or not candidates
            or turns is None
            or now - turns.at > READ_AHEAD_RECENT_S
            or now < turns.quiet_until
            or turns.visibility_ms < READ_AHEAD_MIN_VISIBILITY_MS
            or key in self._held
            or key in self._filling
        ):
            return None
        g = candidates[0]
        groups = sorted(by_group)
        if turns.run >= READ_AHEAD_RUN and any(shows(other) for other in groups if other != g):
            return None
        turns.run += 1
        turns.group = groups.index(g) + 1
        self._filling.add(key)
        return Plan(g, turns.in_turn(g, by_group[g]), turns.max, turns.visibility_ms)

    def wanted_by_send(
        self, key: Any, g: int, queues: list[int], demand: int, visibility_ms: int
    ) -> Plan | None:
        """What a send whose entry goes to queue group ``g`` (whose queues of the line are
        ``queues``) may take along for the receives waiting in the line ``key`` of this node's own,
        ``demand`` messages for ``visibility_ms`` (the head's, ``ReceiveCoordinator``), or None:
        as :meth:`wanted`, not during a stop, not below ``READ_AHEAD_MIN_VISIBILITY_MS``, not while
        the line holds or fills a read-ahead. A receive waits there, so the line's recent receives
        and quiet time are not asked. A caller given a plan must call :meth:`put`."""
        if (
            self.stopping
            or visibility_ms < READ_AHEAD_MIN_VISIBILITY_MS
            or key in self._held
            or key in self._filling
        ):
            return None
        self._filling.add(key)
        return Plan(g, self.turns(key).in_turn(g, queues), demand, visibility_ms, send=True)

    def put(
        self,
        key: Any,
        topic: Topic,
        group: str,
        messages: list[dict[str, Any]],
        plan: Plan,
        started: float,
    ) -> bool:
        """Hold ``messages`` a delete took along by ``plan`` for the line ``key``'s next
        receives (``started``: when that delete was sent, ``time.monotonic()``, before the leader
        stamped their deadline) until ``READ_AHEAD_HOLD_MS`` after ``started``; then give back what
        is left. During a stop they are given back at once. True when something is held."""
        self._filling.discard(key)
        if not messages:
            return False
        if plan.send:
            self.counts.taken_by_send += len(messages)
        else:
            self.counts.taken += len(messages)
        held = _Held(topic, group, messages, plan.visibility_ms, started + READ_AHEAD_HOLD_MS / 1000)
        self._held[key] = held
        if self.stopping:
            self._expire(key, held)
            return False
        delay = max(0.0, held.until - time.monotonic())
        held.timer = asyncio.get_running_loop().call_later(delay, self._expire, key, held)
        return True

    def claim(self, key: Any, visibility_ms: int, demand: int) -> list[dict[str, Any]]:
        """Up to ``demand`` held messages for a receive asking ``visibility_ms``."""
        held = self._held.get(key)
        if held is None or held.visibility_ms != visibility_ms or time.monotonic() >= held.until:
            return []
        got, held.messages = held.messages[:demand], held.messages[demand:]
        held.claimed = True
        self.counts.handed_out += len(got)
        if not held.messages:
            self._held.pop(key, None)
            if held.timer is not None:
                held.timer.cancel()
        return got

    async def stop(self) -> None:
        """A graceful stop: read nothing ahead from now on, release what is held, and wait for
        the releases and give-backs under way (at most ``STOP_RELEASE_S``). What is still under
        way then is ended: it must not outlive the node (a give-back started before the stop would
        go on trying for ``RELEASE_TRY_S``); its messages are counted unreleased."""
        self.stopping = True
        for key, held in list(self._held.items()):
            self._expire(key, held)
        # Give-backs can start while it waits (a take under way finds its receivers gone): wait
        # for those too, within the same bound.
        end = time.monotonic() + STOP_RELEASE_S
        while self._tasks and (left := end - time.monotonic()) > 0:
            await asyncio.wait(list(self._tasks), timeout=left)
        late = list(self._tasks)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    def give_back(
        self,
        topic: Topic,
        group: str,
        receipts: list[str],
        op: str = "release",
        fields: dict[str, Any] | None = None,
    ) -> None:
        """Give back messages a take got for receivers that went away meanwhile (not read-aheads:
        not counted as such): ``op`` (``release``, or a ``nack`` where a queue group's voters do
        not apply it) on the ``receipts``, tried again as a release is, and waited for by a
        graceful stop (:meth:`stop`)."""
        self._start(self._give_back(topic, group, op, receipts, fields or {}, self._deadline()))

    def _expire(self, key: Any, held: _Held) -> None:
        """Give back a read-ahead no receive took in time; a line whose receives took none of it
        reads nothing ahead for ``READ_AHEAD_QUIET_S`` (a receiver that did not come back)."""
        if self._held.get(key) is not held:
            return
        del self._held[key]
        if held.timer is not None:
            held.timer.cancel()
        turns = self._turns.get(key)
        if turns is not None and not held.claimed and not self.stopping:
            turns.quiet_until = time.monotonic() + READ_AHEAD_QUIET_S
        receipts = [m["receipt"] for m in held.messages]
        self._start(self._release(held.topic, held.group, receipts, self._deadline()))

    def _deadline(self) -> float:
        return time.monotonic() + (STOP_RELEASE_S if self.stopping else RELEASE_TRY_S)

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, topic: Topic, group: str, receipts: list[str], deadline: float) -> None:
        """``release`` a read-ahead's ``receipts`` (:meth:`_settle_until`), counted (also when a
        stop ends it)."""
        progress = _Progress(receipts)
        try:
            await self._settle_until(topic, group, "release", progress, {}, deadline)
        finally:
            self.counts.released += progress.done
            if progress.left:
                self.counts.unreleased += len(progress.left)
                log.warning(
                    "read_ahead_not_released",
                    topic=topic.name,
                    group=group,
                    code=progress.code,
                    messages=len(progress.left),
                )

    async def _give_back(
        self, topic: Topic, group: str, op: str, receipts: list[str], fields: dict[str, Any], deadline: float
    ) -> None:
        progress = _Progress(receipts)
        try:
            await self._settle_until(topic, group, op, progress, fields, deadline)
        finally:
            if progress.left:  # in flight until their visibility deadline, as a receive whose answer was lost
                log.warning(
                    "receive_not_given_back",
                    topic=topic.name,
                    group=group,
                    op=op,
                    code=progress.code,
                    messages=len(progress.left),
                )

    async def _settle_until(
        self, topic: Topic, group: str, op: str, progress: _Progress, fields: dict[str, Any], deadline: float
    ) -> None:
        """Apply ``op`` to ``progress.left``, again to those that failed (a leader change), until
        ``deadline``. A receipt no longer current (acked, expired) has nothing to give back.
        ``progress`` says at every moment how many it applied to, the receipts left, and the last
        failure's code (so a stop that ends it knows what is left)."""
        pause = 0.05
        while True:
            try:
                results = await self.settle(topic, group, op, progress.left, fields)
            except RaftmqError as e:
                progress.code = e.code
            except Exception:  # not a refusal (a peer's answer without an error body): try again
                log.exception("settle_failed", topic=topic.name, group=group, op=op)
                progress.code = errors.INTERNAL.code
            else:
                progress.done += sum(1 for r in results if r.get("ok"))
                failed = [
                    r for r in results if "error" in r and r["error"].get("code") != errors.STALE_RECEIPT.code
                ]
                progress.left = [r["receipt"] for r in failed]
                if not failed:
                    return
                progress.code = failed[0]["error"].get("code")
            if time.monotonic() + pause > deadline:
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


@dataclass
class _Progress:
    """Where a release or give-back stands: the receipts ``left`` to apply its op to, how many
    it applied to (``done``), and the last failure's ``code``."""

    left: list[str]
    done: int = 0
    code: str | None = None
