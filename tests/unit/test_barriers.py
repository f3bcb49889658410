"""Shared read barriers (``cluster/node/barriers.py``): reads waiting at once share one entry, and
a read never joins the barrier that was already in flight when it arrived."""

from __future__ import annotations

import asyncio

import pytest

from raftmq.cluster.node.barriers import Barriers
from raftmq.cluster.replication.raft import Outcome


def test_reads_share_a_round_and_never_join_the_one_in_flight() -> None:
    async def scenario() -> None:
        proposed: list[asyncio.Future[None]] = []

        async def propose(name: str, command: bytes) -> Outcome:
            commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            proposed.append(commit)
            await commit
            return Outcome(result={"round": len(proposed)})

        barriers = Barriers(propose, b"noop", 10.0)
        first = [asyncio.create_task(barriers.wait("0")) for _ in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(proposed) == 1  # three reads, one entry
        late = [asyncio.create_task(barriers.wait("0")) for _ in range(5)]  # arrive while it is in flight
        await asyncio.sleep(0)
        assert len(proposed) == 1  # they wait for the next one, not proposed while one is in flight
        proposed[0].set_result(None)
        assert [(await t).result for t in first] == [{"round": 1}] * 3
        await asyncio.sleep(0)
        assert len(proposed) == 2 and not any(t.done() for t in late)  # the in-flight one did not answer them
        proposed[1].set_result(None)
        assert [(await t).result for t in late] == [{"round": 2}] * 5
        await asyncio.sleep(0)
        assert len(proposed) == 2  # nobody waiting: no third entry
        assert barriers.counts.reads == {"0": 8} and barriers.counts.entries == {"0": 2}

    asyncio.run(scenario())


def test_a_read_that_gives_up_does_not_cancel_the_others() -> None:
    async def scenario() -> None:
        commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def propose(name: str, command: bytes) -> Outcome:
            await commit
            return Outcome(result={})

        barriers = Barriers(propose, b"noop", 10.0)
        gone, kept = asyncio.create_task(barriers.wait("0")), asyncio.create_task(barriers.wait("0"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        commit.set_result(None)
        assert (await kept).result == {}

    asyncio.run(scenario())


def test_a_failed_proposal_fails_its_round_and_the_next_round_proposes_again() -> None:
    async def scenario() -> None:
        calls: list[int] = []

        async def propose(name: str, command: bytes) -> Outcome:
            calls.append(1)
            if len(calls) == 1:
                raise KeyError(name)  # e.g. the group left this node meanwhile
            return Outcome(error="not_leader")

        barriers = Barriers(propose, b"noop", 10.0)
        with pytest.raises(KeyError):
            await barriers.wait("0")
        assert (await barriers.wait("0")).error == "not_leader"  # a new round, a new proposal
        assert len(calls) == 2

    asyncio.run(scenario())


def test_a_read_waits_at_most_its_own_timeout_behind_a_slow_round() -> None:
    """A read that arrives while a round hangs (a leader cut off from its group: the proposal
    takes its whole timeout) would wait for that round, then its own: twice the timeout. Its wait
    is bounded from its arrival (review of the shared barriers), and the round goes on for others."""

    async def scenario() -> None:
        hang: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rounds: list[int] = []

        async def propose(name: str, command: bytes) -> Outcome:
            rounds.append(1)
            if len(rounds) == 1:
                await hang
            return Outcome(result={"round": len(rounds)})

        barriers = Barriers(propose, b"noop", 0.2)
        first = asyncio.create_task(barriers.wait("0"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(rounds) == 1  # the first round is proposed, and hangs
        started = asyncio.get_running_loop().time()
        late = await barriers.wait("0")  # joins the next round, behind the hanging one
        assert late.error == "timeout" and not late.definite
        assert asyncio.get_running_loop().time() - started < 0.5
        hang.set_result(None)
        assert (await first).error == "timeout"  # its own 0.2 s were up too
        await asyncio.sleep(0.05)
        assert len(rounds) == 2  # the late read's round was proposed all the same, once

    asyncio.run(scenario())
