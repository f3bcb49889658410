"""The client's side of the revoke barrier, without sockets: what a revoke commits, when the
generation is acknowledged, and how heartbeats are paced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from raftmq.client._consumer_config import ConsumerConfig
from raftmq.client._consumer_core import ConsumerCore
from raftmq.client._fetcher import QueueRun
from raftmq.client._group_member import GroupMember
from raftmq.client._group_member import average_allocation as client_allocation
from raftmq.client._types import Message
from raftmq.cluster.machines.membership import average_allocation as broker_allocation

CONFIG = ConsumerConfig(group="g", topics=("t",))


def test_the_client_guesses_the_brokers_allocation() -> None:
    for queues in range(0, 13):
        for n in range(0, 6):
            members = [f"m{i}" for i in (3, 1, 4, 0, 2, 5)[:n]]
            assert client_allocation(queues, members) == broker_allocation(queues, members)


class FakeApi:
    def __init__(self) -> None:
        self.commits: list[tuple[str, dict[int, int]]] = []
        self.events: list[str] = []

    async def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        *,
        advance: bool = False,
        retry_timeout_ms: int | None = None,
    ) -> None:
        assert advance, "a consumer's commit only moves offsets forward"
        self.events.append(f"commit {dict(offsets)}")
        self.commits.append((topic, dict(offsets)))

    async def leave_group(self, group: str, member_id: str) -> None:
        self.events.append(f"leave {group}")


def core_with_queue(handed_out: int, buffered: int) -> tuple[ConsumerCore, QueueRun, list[Message], FakeApi]:
    """A core owning queue ("t", 0): ``handed_out`` messages given to the application and
    ``buffered`` more still in its buffer (offsets from 0)."""
    core = ConsumerCore("127.0.0.1:1", CONFIG)
    api = FakeApi()
    core.api = api  # type: ignore[assignment]
    run = QueueRun("t", 0, 0, None, core.loop, resume_at=CONFIG.max_backlog - CONFIG.max_batch)
    run.task = asyncio.ensure_future(asyncio.sleep(3600))
    core.runs[("t", 0)] = run
    run.window.add(0, handed_out + buffered)
    wire = [{"offset": i, "value": f"v{i}"} for i in range(handed_out + buffered)]
    messages = [Message.from_wire("t", 0, m, run.window) for m in wire]
    core.buffer.extend(messages[handed_out:])
    return core, run, messages[:handed_out], api


def test_a_revoke_waits_for_acks_of_handed_out_messages_then_commits_their_edge() -> None:
    async def main() -> None:
        core, run, handed, api = core_with_queue(handed_out=5, buffered=3)

        async def app() -> None:
            for m in handed:
                await asyncio.sleep(0.01)
                m.ack()

        acking = asyncio.ensure_future(app())
        await core.release(set(), grace_s=2.0)
        await acking
        assert core.runs == {} and not core.buffer  # the 3 buffered ones were dropped
        assert api.commits == [("t", {0: 5})]  # every handed-out message was finished in time
        assert run.window.revoked
        late = Message.from_wire("t", 0, {"offset": 5, "value": "x"}, run.window)
        assert late.revoked
        await core.transport.close()

    asyncio.run(main())


def test_after_the_grace_a_revoke_commits_what_was_acked_and_ignores_later_acks() -> None:
    async def main() -> None:
        core, run, handed, api = core_with_queue(handed_out=4, buffered=0)
        handed[0].ack()
        handed[1].ack()
        t0 = time.monotonic()
        await core.release(set(), grace_s=0.2)
        # It waited out the grace, then gave up on 2 and 3 (never acked: without the grace it
        # would wait for ever); the upper bound is generous for a slow machine.
        assert 0.15 < time.monotonic() - t0 < 10.0
        assert api.commits == [("t", {0: 2})]  # 2 and 3 are delivered again by the next owner
        assert handed[2].revoked
        handed[2].ack()
        assert run.window.low_edge == 2  # frozen
        await core.transport.close()

    asyncio.run(main())


def test_close_during_a_revoke_still_commits_the_revoked_queue() -> None:
    async def main() -> None:
        core, _run, handed, api = core_with_queue(handed_out=3, buffered=0)
        handed[0].ack()
        releasing = asyncio.ensure_future(core.release(set(), grace_s=30.0))
        await asyncio.sleep(0.05)
        assert not releasing.done()  # waiting for the acks of 1 and 2
        core._tasks.add(releasing)  # as the membership task that runs it would be
        t0 = time.monotonic()
        await core.close()
        assert time.monotonic() - t0 < 10.0  # cut short: not the 30 s grace
        assert api.commits == [("t", {0: 1})]
        assert api.events[-1] == "leave g"

    asyncio.run(main())


class FakeCore:
    """Records the order of the calls GroupMember makes."""

    def __init__(self) -> None:
        self.config = CONFIG
        self.member_id = "b"
        self.events: list[str] = []
        self.member: GroupMember | None = None
        self.metadata = self

    def topic(self, name: str) -> Any:
        return type("Desc", (), {"queues": 4})()

    async def release(self, keep: Any, **kw: Any) -> None:
        assert self.member is not None
        self.events.append(f"release keep={sorted(keep)} applied={self.member.applied}")

    async def acquire(self, target: Any) -> None:
        assert self.member is not None
        self.events.append(f"acquire {sorted(target)} applied={self.member.applied}")


def view(generation: int, assignment: list[int], members: list[str]) -> dict[str, Any]:
    return {
        "generation": generation,
        "assignment": {"t": assignment},
        "members": members,
        "heartbeat_interval_ms": 1_000,
        "session_timeout_ms": 10_000,
    }


def test_a_generation_is_acknowledged_only_after_the_revoked_queues_were_released() -> None:
    async def main() -> None:
        core = FakeCore()
        member = GroupMember(core)  # type: ignore[arg-type]
        core.member = member
        assert await member.apply(view(7, [0, 1, 2, 3], ["b"]))  # a new generation
        assert not await member.apply(view(7, [0, 1, 2, 3], ["b"]))
        assert await member.apply(view(8, [2], ["a", "b"]))
        assert core.events == [
            "release keep=[('t', 0), ('t', 1), ('t', 2), ('t', 3)] applied=0",
            "acquire [('t', 0), ('t', 1), ('t', 2), ('t', 3)] applied=7",
            "release keep=[('t', 0), ('t', 1), ('t', 2), ('t', 3)] applied=7",
            "acquire [('t', 0), ('t', 1), ('t', 2), ('t', 3)] applied=7",
            "release keep=[('t', 2)] applied=7",  # still 7 while releasing
            "acquire [('t', 2)] applied=8",
        ]
        # b's share over [a, b] is queues 2 and 3; 3 is held back by the barrier.
        assert member.withheld == {("t", 3)}
        assert member.withheld_until > time.monotonic() + 5

    asyncio.run(main())


@pytest.mark.parametrize("members", [["b"], ["a", "b"]])
def test_nothing_is_withheld_once_the_whole_share_is_granted(members: list[str]) -> None:
    async def main() -> None:
        core = FakeCore()
        member = GroupMember(core)  # type: ignore[arg-type]
        core.member = member
        share = [0, 1, 2, 3] if members == ["b"] else [2, 3]
        await member.apply(view(9, share, members))
        assert member.withheld == frozenset()

    asyncio.run(main())


def test_the_answers_allocation_says_what_is_withheld_without_other_members_names() -> None:
    async def main() -> None:
        core = FakeCore()
        member = GroupMember(core)  # type: ignore[arg-type]
        core.member = member
        # The broker names only the member itself, and its share once the barrier lets go.
        await member.apply({**view(8, [2], ["b"]), "allocation": {"t": [2, 3]}})
        assert member.withheld == {("t", 3)}

    asyncio.run(main())
