"""Clustering mode: membership of a consumer group, heartbeats, and following the assignment.

The broker's coordinator keeps a **revoke barrier** (``cluster/machines/membership.py``): a queue that moves
to this member is left out of its assignment until the queue's previous owner has acknowledged the
generation that took it away. This member does its part:

1. every heartbeat carries ``generation``: that of the last assignment it has *applied*, which
   means its revoked queues stopped fetching, their messages not handed out yet were dropped, the
   application had up to two heartbeat intervals to ack those it was handed, and their progress
   was committed (0 before the first);
2. after an assignment with a new generation it heartbeats again at once, so the coordinator hands
   the revoked queues to their new owners without waiting for a heartbeat interval;
3. for 1.5 heartbeat intervals after its assignment changed, and while queues it expects (the
   average allocation over the group's members, computed here as the broker does) are still held
   back by the barrier, it heartbeats every tenth of an interval, so it picks them up soon after
   their previous owner released them;
4. it gives up every queue before the coordinator could have expired it: when no heartbeat sent
   less than ``session_timeout - heartbeat_interval`` ago has been answered.

With API tokens a member id belongs to the token that created it. If another token holds this
consumer's id (it claimed the id first, e.g. while a new coordinator waited for members to come
back), the join or heartbeat is refused with ``member_not_owned``; the member then goes on under a
new random id instead of failing (a warning says so): the id only orders the allocation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ._api import ApiClient
from ._consumer_config import ConsumerConfig, TopicQueue
from ._metadata import ClusterMetadata
from ._retry import Backoff
from .errors import MemberNotOwned, RaftmqError, Timeout

__all__ = ["ConsumerView", "GroupMember"]

log = logging.getLogger("raftmq.client.consumer")

SETTLE_INTERVALS = 1.5  # fast heartbeats for this many intervals after the assignment changed
FAST_FRACTION = 0.1  # of the heartbeat interval, while settling
MIN_FAST_S = 0.05
REVOKE_GRACE_INTERVALS = 2.0  # how long a revoked queue waits for acks of handed-out messages


def average_allocation(queues: int, members: list[str]) -> dict[str, list[int]]:
    """The broker's allocation (``cluster/machines/membership.py``): contiguous ranges over sorted member
    ids, the first ``queues % n`` members one more. Only used to guess which queues are withheld."""
    ordered = sorted(members)
    out: dict[str, list[int]] = {m: [] for m in ordered}
    if not ordered:
        return out
    base, extra = divmod(queues, len(ordered))
    start = 0
    for i, m in enumerate(ordered):
        count = base + (1 if i < extra else 0)
        out[m] = list(range(start, start + count))
        start += count
    return out


class ConsumerView(Protocol):
    """What a member uses of its consumer (``_consumer_core.ConsumerCore``, which creates it)."""

    api: ApiClient
    backoff: Backoff
    config: ConsumerConfig
    member_id: str
    metadata: ClusterMetadata

    @property
    def runs(self) -> Mapping[TopicQueue, Any]: ...

    def fail(self, error: RaftmqError) -> None: ...

    async def release(
        self, keep: Iterable[TopicQueue], *, grace_s: float = 0.0, commit_retry_ms: int | None = None
    ) -> None: ...

    async def acquire(self, target: Iterable[TopicQueue]) -> None: ...


class GroupMember:
    """The membership of one consumer (``ConsumerCore``) in its group (clustering mode)."""

    def __init__(self, core: ConsumerView) -> None:
        self.core = core
        self.applied = 0  # generation of the last applied assignment (0: none yet)
        self.generation: int | None = None
        self.target: frozenset[TopicQueue] = frozenset()
        self.interval_s = 1.0
        self.session_s = 10.0
        self.last_ok_sent = time.monotonic()  # send time of the last answered heartbeat
        self.settle_until = 0.0
        self.withheld: frozenset[TopicQueue] = frozenset()  # expected, not granted yet
        self.withheld_until = 0.0  # stop fast heartbeats for them then (the guess may be wrong)

    async def _send(self, generation: int, retry: bool) -> dict[str, Any]:
        """One join or heartbeat; under a new id if another token holds this one."""
        cfg = self.core.config
        try:
            return await self.core.api.join_group(
                cfg.group, self.core.member_id, cfg.topics, generation=generation, retry=retry
            )
        except MemberNotOwned:
            taken, self.core.member_id = self.core.member_id, f"c-{uuid.uuid4().hex[:16]}"
            log.warning(
                "member id %r of group %s belongs to another API token; continuing as %r",
                taken,
                cfg.group,
                self.core.member_id,
            )
            return await self.core.api.join_group(
                cfg.group, self.core.member_id, cfg.topics, generation=generation, retry=retry
            )

    async def join(self) -> dict[str, Any]:
        """The first heartbeat (retried like any request); applies its assignment."""
        sent = time.monotonic()
        view = await self._send(0, retry=True)
        self.last_ok_sent = sent
        await self.apply(view)
        return view

    async def _heartbeat(self) -> dict[str, Any]:
        give_up_at = self.last_ok_sent + max(self.session_s / 2, self.session_s - self.interval_s)
        # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that comes as
        # the answer arrives, and close() would then wait for this loop forever.
        try:
            async with asyncio.timeout(max(0.05, give_up_at - time.monotonic())):
                return await self._send(self.applied, retry=False)
        except TimeoutError:
            raise Timeout("no heartbeat answer before the session could expire") from None

    async def run(self) -> None:
        """Heartbeat and follow the assignment until cancelled."""
        failures = 0
        next_beat = time.monotonic()
        while True:
            await asyncio.sleep(max(0.0, next_beat - time.monotonic()))
            sent = time.monotonic()
            try:
                view = await self._heartbeat()
            except RaftmqError as e:
                failures += 1
                next_beat = time.monotonic() + self.core.backoff.delay_s(failures)
                if not e.retriable:
                    self.core.fail(e)
                    return
                limit = max(self.session_s / 2, self.session_s - self.interval_s)
                if time.monotonic() - self.last_ok_sent >= limit and self.core.runs:
                    log.warning(
                        "no heartbeat answer for %.1f s; giving up all queues before the session "
                        "expires (%s)",
                        limit,
                        e,
                    )
                    await self.core.release(frozenset(), commit_retry_ms=0)
                    self.target = frozenset()
                continue
            failures = 0
            self.last_ok_sent = sent
            log.debug(
                "heartbeat answered in %.3f s: generation=%s assignment=%s",
                time.monotonic() - sent,
                view["generation"],
                view["assignment"],
            )
            try:
                new_generation = await self.apply(view)
            except RaftmqError as e:
                if not e.retriable:
                    self.core.fail(e)
                    return
                log.warning("taking the assignment failed (retried at the next heartbeat): %s", e)
                new_generation = False
            now = time.monotonic()
            if new_generation:
                next_beat = now  # acknowledge at once: the coordinator releases what we dropped
            elif now < self.settle_until or (self.withheld and now < self.withheld_until):
                next_beat = now + max(MIN_FAST_S, self.interval_s * FAST_FRACTION)
            else:
                next_beat = now + self.interval_s

    def _expected(self, view: dict[str, Any]) -> frozenset[TopicQueue]:
        """The queues this member should get once the barrier lets them go: the answer's
        ``allocation``; from a broker that does not send it, computed from ``members`` assuming
        every member subscribes to the same topics (a guess, which only affects heartbeat pacing)."""
        allocation = view.get("allocation")
        if isinstance(allocation, dict):
            return frozenset((t, q) for t, queues in allocation.items() for q in queues)
        expected: set[TopicQueue] = set()
        for topic in view["assignment"]:
            desc = self.core.metadata.topic(topic)
            if desc is not None:
                mine = average_allocation(desc.queues, view["members"]).get(self.core.member_id, [])
                expected.update((topic, q) for q in mine)
        return frozenset(expected)

    async def apply(self, view: dict[str, Any]) -> bool:
        """Follow ``view``: drop (and commit) revoked queues, acknowledge its generation, then start
        the newly granted queues at the group's committed offsets.

        Returns:
            True if the generation is new (an acknowledgement should be sent at once).
        """
        self.interval_s = view["heartbeat_interval_ms"] / 1000
        self.session_s = view["session_timeout_ms"] / 1000
        target = frozenset((t, q) for t, queues in view["assignment"].items() for q in queues)
        generation: int = view["generation"]
        new_generation = generation != self.generation
        if new_generation or target != self.target:
            self.settle_until = time.monotonic() + SETTLE_INTERVALS * self.interval_s
            log.info(
                "assignment generation=%s member=%s queues=%s",
                generation,
                self.core.member_id,
                sorted(target),
            )
        self.generation = generation
        self.target = target
        withheld = self._expected(view) - target
        if withheld and withheld != self.withheld:
            self.withheld_until = time.monotonic() + self.session_s
        self.withheld = withheld
        await self.core.release(target, grace_s=REVOKE_GRACE_INTERVALS * self.interval_s)
        self.applied = generation
        await self.core.acquire(target)
        return new_generation
