"""Group commit and take-alongs (``GroupCommitter.append_taking``, the field level
``append.take``): a send's take-along merges with other sends' batches into one entry, at most one
take-along an entry, and its messages go back to the request that asked; a take-along whose group
gained a voter that does not apply ``append.take`` while it waited goes without it, as one that
the leader's ``LeaderActions`` finds unsupported. Entries are applied by the real state machine on
a MemoryStore, in order, as a Raft group would."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from test_group_commit_delayed import AppliedInOrder

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.config.cluster_file import Limits, RaftTimingConfig
from raftmq.cluster.machines.delivery import NEVER_DEAD_LETTERED
from raftmq.cluster.node.actions import LeaderActions
from raftmq.cluster.replication.group_commit import GroupCommitter
from raftmq.cluster.replication.upgrade import previous_release_refuses

TAKE = {"group": "g", "topic_id": 1, "queues": [0], "max": 10, "visibility_ms": 30_000, "max_age_ms": None}


def items(*values: str) -> list[tuple[int, int, bytes]]:
    b = rb.BatchBuilder(base_timestamp_ms=1)
    for v in values:
        b.append(v)
    return [(1, 0, b.finish())]


def test_take_alongs_merge_with_plain_sends_one_an_entry_and_answer_the_request_that_asked() -> None:
    async def main() -> tuple[AppliedInOrder, list[Any]]:
        group = AppliedInOrder()
        subscribe = commands.subscribe("g", 1, "t", None, NEVER_DEAD_LETTERED, [0], now_ms=1)
        group.entries.append(subscribe)
        assert "subscription" in group.machine.apply(1, subscribe)
        committer = GroupCommitter(
            group,  # type: ignore[arg-type]
            asyncio.get_running_loop(),
            now_ms=lambda: 10_000,
            max_entry_bytes=1 << 20,
            max_inflight=1,
        )
        first = asyncio.ensure_future(committer.append(items("x"), 10))
        await asyncio.sleep(0)  # in flight: the next requests wait and may be merged
        calls = [
            committer.append(items("a"), 10),
            committer.append_taking(items("b", "c"), 10, TAKE),
            committer.append_taking(items("d"), 10, TAKE),  # a second take-along: the next entry
            committer.append(items("e"), 10),
        ]
        pending = [asyncio.ensure_future(c) for c in calls]
        for _ in range(10):
            await asyncio.sleep(0)
            group.release()
        return group, await asyncio.gather(first, *pending)

    group, (_, _, (_, taken_b), (_, taken_d), _) = asyncio.run(main())
    # x; then a, b+c (with its take-along); then d (with its own) and e
    assert len(group.entries) == 4  # (the subscribe first)
    assert [commands.has_take(e) for e in group.entries[1:]] == [False, True, True]
    # The first take-along took everything visible then (x, a, b, c: offsets 0-3); the second
    # what its entry appended before it (d; e comes after it in the entry, and is taken too).
    assert [m["offset"] for m in taken_b["messages"]] == [0, 1, 2, 3]
    assert [m["offset"] for m in taken_d["messages"]] == [4, 5]
    assert taken_b["token"] == 3 and taken_d["token"] == 4


def _subscribed(kind: type[AppliedInOrder] = AppliedInOrder) -> AppliedInOrder:
    group = kind()
    subscribe = commands.subscribe("g", 1, "t", None, NEVER_DEAD_LETTERED, [0], now_ms=1)
    group.entries.append(subscribe)
    assert "subscription" in group.machine.apply(1, subscribe)
    return group


def test_a_take_along_that_waited_while_an_older_voter_joined_goes_without_it() -> None:
    """The voters are asked again when the entry is proposed (``take_ok``): a request that waited
    in the committer while a voter of the release before ``append.take`` joined becomes a plain
    append (that voter would refuse a version 2 entry whole: the replicas diverge); its batches
    stand and it took nothing."""

    async def main() -> tuple[AppliedInOrder, Any]:
        group = _subscribed()
        voters_apply_take = [True]
        committer = GroupCommitter(
            group,  # type: ignore[arg-type]
            asyncio.get_running_loop(),
            now_ms=lambda: 10_000,
            max_entry_bytes=1 << 20,
            max_inflight=1,
            take_ok=lambda: voters_apply_take[0],
        )
        first = asyncio.ensure_future(committer.append(items("x"), 10))
        await asyncio.sleep(0)  # in flight: the take-along's request waits
        taking = asyncio.ensure_future(committer.append_taking(items("a", "b"), 10, TAKE))
        await asyncio.sleep(0)
        voters_apply_take[0] = False  # ... meanwhile a voter of the release before joined
        for _ in range(10):
            await asyncio.sleep(0)
            group.release()
        await first
        return group, await taking

    group, (results, taken) = asyncio.run(main())
    assert len(group.entries) == 3
    assert not any(commands.has_take(e) or previous_release_refuses(e) for e in group.entries[1:])
    assert results == [{"topic_id": 1, "queue": 0, "base_offset": 1, "count": 2}]
    assert taken == {"token": 0, "messages": []}
    later = commands.receive(10_001, "g", 1, [0], 10, 30_000)
    assert [m["offset"] for m in group.machine.apply(4, later)["messages"]] == [0, 1, 2]  # none taken


class _AppliedAtOnce(AppliedInOrder):
    def submit(self, command: bytes, on_done: Any) -> None:
        super().submit(command, on_done)
        self.release()


def test_a_leader_whose_voters_do_not_all_apply_take_alongs_appends_without_one() -> None:
    """``LeaderActions``' own check (the sending node checked too, but the group's voters may
    differ at the leader): an ``append`` with a take-along is a plain append, no messages, unless
    every voter applies ``append.take``; then its entry carries it and the messages come back
    rendered as a receive's."""

    def run(supported: bool) -> tuple[AppliedInOrder, dict[str, Any]]:
        async def main() -> tuple[AppliedInOrder, dict[str, Any]]:
            group = _subscribed(_AppliedAtOnce)
            committer = GroupCommitter(
                group,  # type: ignore[arg-type]
                asyncio.get_running_loop(),
                now_ms=lambda: 10_000,
                max_entry_bytes=1 << 20,
                max_inflight=1,
            )
            node = SimpleNamespace(
                config=SimpleNamespace(limits=Limits(), raft=RaftTimingConfig(), queue_groups=1),
                groups={
                    "0": SimpleNamespace(
                        raft=SimpleNamespace(
                            is_leader=lambda: True, reads=SimpleNamespace(ready=lambda: True)
                        ),
                        committer=committer,
                        machine=group.machine,
                    )
                },
                me=SimpleNamespace(id="n1"),
                group_supports=lambda name, capability: supported or capability != "append.take",
            )
            actions = LeaderActions(node)  # type: ignore[arg-type]
            return group, await actions.run("0", "append", {"items": items("a", "b"), "take": TAKE})

        return asyncio.run(main())

    group, answer = run(supported=False)
    assert not commands.has_take(group.entries[-1])
    assert answer == {"results": [{"topic_id": 1, "queue": 0, "base_offset": 0, "count": 2}], "messages": []}
    group, answer = run(supported=True)
    assert commands.has_take(group.entries[-1])
    assert answer["results"] == [{"topic_id": 1, "queue": 0, "base_offset": 0, "count": 2}]
    assert [m["receipt"] for m in answer["messages"]] == ["1.0.0.2", "1.0.1.2"]
