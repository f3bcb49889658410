"""Shared read barriers: a read that must see every write acknowledged before it arrived commits a
``noop`` entry at the group's leader first, and the reads of one group share those entries.

A barrier entry is a write to every replica's journal (an fsync on each voter). Proposed once per
read, a client holding only a read right could make a group write at the rate it sends reads. Here
a group has at most one barrier in flight on this node: the reads that arrive meanwhile wait for the
next one, proposed when the one in flight is done, which then answers all of them. So the entries a
group's barriers cost are bounded by the cluster (one per round trip of its Raft log), not by how
many reads its clients send.

Linearizability: a read is answered only after a barrier *proposed after the read arrived*
committed. One in flight when a read arrives may have been appended before a write the read must
see was acknowledged, so the read never joins it; it joins the next round, whose entry is proposed
after the read arrived, so every write acknowledged before the read sits below it in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from raftmq.cluster.replication.raft import Outcome

__all__ = ["BarrierCounts", "Barriers"]

Propose = Callable[[str, bytes], Awaitable[Outcome]]


@dataclass
class BarrierCounts:
    """What a node's barriers did, per group, since it started (``/metrics``)."""

    reads: dict[str, int] = field(default_factory=dict)  # reads that waited for a barrier
    entries: dict[str, int] = field(default_factory=dict)  # barrier entries proposed for them


class Barriers:
    """The read barriers of one node, one round at a time per group (the module's docstring)."""

    def __init__(self, propose: Propose, noop: bytes, timeout_s: float) -> None:
        self._propose = propose
        self._noop = noop
        self._timeout_s = timeout_s  # a read's own wait: the round it joins may follow a slow one
        self._next: dict[str, asyncio.Future[Outcome]] = {}  # the round the reads arriving now join
        self._running: dict[str, asyncio.Task[None]] = {}  # the group's proposing task
        self.counts = BarrierCounts()

    async def wait(self, name: str) -> Outcome:
        """Wait for a ``noop`` of group ``name`` proposed after this call, and return its outcome
        (shared with the reads that joined the same round)."""
        self.counts.reads[name] = self.counts.reads.get(name, 0) + 1
        round_ = self._next.get(name)
        if round_ is None:
            round_ = self._next[name] = asyncio.get_running_loop().create_future()
            if name not in self._running:
                self._running[name] = asyncio.get_running_loop().create_task(self._rounds(name))
        # shield: a read that gives up (its client went away, or its time is up) must not cancel
        # the others' round. Its time counts from its arrival: a round in flight at a leader cut
        # off from its group takes a proposal's whole timeout before the read's round is proposed.
        try:
            return await asyncio.wait_for(asyncio.shield(round_), self._timeout_s)
        except TimeoutError:
            return Outcome(error="timeout", definite=False)

    async def _rounds(self, name: str) -> None:
        """Propose one barrier per round while reads wait for one; a round's reads are the ones that
        arrived before its entry was proposed."""
        try:
            while (round_ := self._next.pop(name, None)) is not None:
                self.counts.entries[name] = self.counts.entries.get(name, 0) + 1
                try:
                    outcome = await self._propose(name, self._noop)
                except asyncio.CancelledError:  # the node stops: its waiters are cancelled too
                    round_.cancel()
                    raise
                except Exception as e:  # each waiter raises it, as its own proposal would have
                    round_.set_exception(e)
                else:
                    round_.set_result(outcome)
        finally:
            del self._running[name]
            pending = self._next.pop(name, None)  # only when cancelled: the loop drains it otherwise
            if pending is not None:
                pending.cancel()
