"""SettleCommitter: concurrent ack/nack/extend requests of a queue group share Raft entries, and
each request still gets exactly the results it would have got alone. The entries are applied by a
real queue-group machine (over a MemoryStore); only Raft is left out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.node.delivery_actions import DeliveryActions
from raftmq.cluster.replication.settle_commit import SettleCommitter
from raftmq.storage.memory import MemoryStore

T, G = 1, "g"
_NODE = {"id": "n1", "http": "127.0.0.1:8001", "raft": "127.0.0.1:7001", "data_dir": "/d"}


class Group:
    """A queue group's machine behind a proposer whose entries can be held back."""

    def __init__(self) -> None:
        self.machine = QueueGroupMachine(MemoryStore(), 0)
        self.index = 0
        self.entries: list[dict[str, Any]] = []  # the settlement commands proposed
        self.gate = asyncio.Event()
        self.gate.set()

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    async def propose(self, command: bytes) -> dict[str, Any]:
        self.entries.append(commands.decode(command))  # type: ignore[arg-type]
        await self.gate.wait()
        result = self.apply(command)
        if "error" in result:
            raise ApiError(errors.BY_CODE[result["error"]["code"]], result["error"]["message"])
        return result

    def deliver(self, count: int) -> list[list[int]]:
        """Produce ``count`` messages to queue 0 and receive them: their receipts."""
        self.apply(commands.produce(0, [{"topic_id": T, "queue": 0, "messages": [{"value": "v"}] * count}]))
        result = self.apply(commands.receive(1, G, T, [0], count, 60_000))
        return [[m["queue"], m["offset"], result["token"]] for m in result["messages"]]


def outcome(results: list[dict[str, Any]]) -> list[str]:
    return ["ok" if r.get("ok") else r["error"]["code"] for r in results]


async def settle_together(
    committer: SettleCommitter, group: Group, requests: list[tuple[str, list[list[int]], dict[str, Any]]]
) -> list[list[dict[str, Any]] | BaseException]:
    """Hold the first entry in flight while ``requests`` arrive, then let everything through."""
    group.gate.clear()
    first = asyncio.create_task(committer.settle("ack", T, G, [[0, 10**6, 1]], {}))  # a stale receipt
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(committer.settle(op, T, G, r, f)) for op, r, f in requests]
    await asyncio.sleep(0)
    group.gate.set()
    await first
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def test_requests_waiting_behind_an_entry_become_one_entry_with_each_requests_own_results() -> None:
    async def main() -> None:
        group = Group()
        receipts = group.deliver(6)
        committer = SettleCommitter(group.propose, lambda: 2)
        twice = receipts[2]
        answers = await settle_together(
            committer,
            group,
            [
                ("ack", receipts[0:3], {}),
                ("ack", [receipts[3], twice], {}),  # acked by the request before: stale now
                ("ack", [[0, 5, 999], *receipts[4:6]], {}),  # a token that never delivered
            ],
        )
        assert [outcome(a) for a in answers] == [  # type: ignore[arg-type]
            ["ok", "ok", "ok"],
            ["ok", "stale_receipt"],
            ["stale_receipt", "ok", "ok"],
        ]
        assert len(group.entries) == 2  # the held entry, then all three requests in one
        assert len(group.entries[1]["receipts"]) == 3 + 2 + 3

    asyncio.run(main())


def test_different_ops_or_fields_are_never_merged() -> None:
    async def main() -> None:
        group = Group()
        receipts = group.deliver(4)
        committer = SettleCommitter(group.propose, lambda: 2)
        answers = await settle_together(
            committer,
            group,
            [
                ("nack", [receipts[0]], {"delay_ms": 0}),
                ("nack", [receipts[1]], {"delay_ms": 5_000}),
                ("extend", [receipts[2]], {"visibility_ms": 90_000}),
                ("ack", [receipts[3]], {}),
            ],
        )
        assert [outcome(a) for a in answers] == [["ok"]] * 4  # type: ignore[arg-type]
        proposed = [(e["op"], e["delay_ms"], e["visibility_ms"]) for e in group.entries[1:]]
        expected = [("ack", None, 0), ("extend", None, 90_000), ("nack", 0, 0), ("nack", 5_000, 0)]
        assert sorted(proposed) == expected
        assert answers[2][0]["deadline_ms"] == 2 + 90_000  # type: ignore[index]

    asyncio.run(main())


def test_a_refused_entry_fails_every_request_it_carried_and_the_next_entry_still_goes() -> None:
    async def main() -> None:
        group = Group()
        receipts = group.deliver(2)
        committer = SettleCommitter(group.propose, lambda: 2)
        group.gate.clear()
        first = asyncio.create_task(committer.settle("ack", T, G, [receipts[0]], {}))
        await asyncio.sleep(0)
        doomed = [asyncio.create_task(committer.settle("ack", T + 1, G, [[0, 0, 1]], {})) for _ in range(2)]
        await asyncio.sleep(0)
        group.apply(commands.drop_topic(T + 1))  # the other topic is gone before its entry applies
        group.gate.set()
        assert outcome(await first) == ["ok"]
        for task in doomed:
            with pytest.raises(ApiError) as e:
                await task
            assert e.value.error is errors.TOPIC_NOT_FOUND
        assert len(group.entries) == 2
        assert outcome(await committer.settle("ack", T, G, [receipts[1]], {})) == ["ok"]

    asyncio.run(main())


def test_merged_entries_stay_within_the_receipt_limit() -> None:
    async def main() -> None:
        group = Group()
        committer = SettleCommitter(group.propose, lambda: 2)
        half = commands.MAX_RECEIPTS // 2 + 1
        stale = [[[0, o, 1] for o in range(i * half, (i + 1) * half)] for i in range(3)]
        answers = await settle_together(committer, group, [("ack", r, {}) for r in stale])
        assert [len(a) for a in answers] == [half] * 3  # type: ignore[arg-type]
        assert [len(e["receipts"]) for e in group.entries[1:]] == [half] * 3

    asyncio.run(main())


def test_a_leaders_acks_keep_as_many_entries_in_flight_as_its_group_commit() -> None:
    """Two receivers' acks at one queue group's leader (``DeliveryActions``): the second is proposed
    while the first is still on its way (``raft.group_commit_inflight``, 2 by default), not a
    whole commit later; a third waits and shares an entry."""

    async def main() -> None:
        group = Group()
        receipts = group.deliver(4)
        config = parse_config({"cluster": {"secret": "0123456789abcdef"}, "nodes": [_NODE]})
        assert config.raft.group_commit_inflight == 2
        node = SimpleNamespace(config=config, groups={"0": SimpleNamespace(machine=group.machine)})

        async def no_barrier(name: str) -> dict[str, Any]:
            raise AssertionError("acks without an epoch take no barrier")

        actions = DeliveryActions(node, lambda name, command: group.propose(command), no_barrier)  # type: ignore[arg-type]
        group.gate.clear()
        body = {"group": G, "topic_id": T}
        acks = []
        for receipt in receipts[:2]:
            acks.append(asyncio.create_task(actions.run("0", "ack", {**body, "receipts": [receipt]})))
            for _ in range(5):  # the request, then its entry's task, reach the proposer
                await asyncio.sleep(0)
        assert len(group.entries) == 2  # both on their way at once
        acks += [
            asyncio.create_task(actions.run("0", "ack", {**body, "receipts": [r]})) for r in receipts[2:]
        ]
        await asyncio.sleep(0)
        assert len(group.entries) == 2  # the third and fourth wait for room
        group.gate.set()
        answers = await asyncio.gather(*acks)
        assert [outcome(a["results"]) for a in answers] == [["ok"]] * 4
        assert [len(e["receipts"]) for e in group.entries] == [1, 1, 2]

    asyncio.run(main())
