"""A node's read-ahead for its own receive lines (``cluster/node/receive_coordinator.py``): when a
delete may take messages along, a receive of the same visibility takes them with no take of its
own, and what no receive took within the hold is released and quiets the line. The queue groups'
leaders are a stand-in router that hands out nothing (the replicated ops are
``tests/unit/test_delivery_read_ahead.py``'s and ``tests/integration/test_sqs_read_ahead.py``'s)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node import receive_coordinator as rc
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, Waiter, local_key

TOPIC = Topic(7, "t", 1, (1,), None, None, None, 0)
KEY = local_key(TOPIC.id, "sqs")
TAKEN = [{"receipt": f"7.0.{o}.9", "queue": 0, "offset": o, "attempt": 1} for o in range(3)]


class Leaders:
    """The queue groups' leaders: every receive hands out nothing; the takes are counted."""

    def __init__(self) -> None:
        self.takes = 0

    def leads(self, name: str) -> bool:
        return False

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        self.takes += action == "receive"
        return {"messages": []}


def coordinator() -> tuple[ReceiveCoordinator, Leaders, list[tuple[str, list[str]]]]:
    settled: list[tuple[str, list[str]]] = []

    async def settle(topic: Topic, group: str, op: str, receipts: list[str], fields: Any) -> list[Any]:
        settled.append((op, receipts))
        return [{"ok": True} for _ in receipts]

    leaders = Leaders()
    node = SimpleNamespace(groups={})
    return ReceiveCoordinator(node, leaders, settle), leaders, settled  # type: ignore[arg-type]


async def receive(c: ReceiveCoordinator, visibility_ms: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
    waiter = Waiter(10, visibility_ms, time.monotonic() + wait_s, asyncio.get_running_loop().create_future())
    c.enqueue(KEY, waiter, lambda: c.target(TOPIC, "sqs", None, None, None))
    return await asyncio.wait_for(waiter.future, 5)


def test_a_line_reads_ahead_only_after_a_recent_receive_of_a_long_enough_visibility() -> None:
    async def main() -> None:
        c, _, _ = coordinator()
        assert c.read_ahead_wanted(KEY) is None  # no receive waited in the line
        await receive(c, rc.READ_AHEAD_MIN_VISIBILITY_MS - 1)
        assert c.read_ahead_wanted(KEY) is None  # too short a visibility timeout
        await receive(c, 30_000)
        assert c.read_ahead_wanted(KEY) == (10, 30_000)
        assert c.read_ahead_wanted(KEY) is None  # one read-ahead a line at a time
        c.put_ahead(KEY, TOPIC, "sqs", [], 30_000, time.monotonic())  # it found nothing
        assert c.read_ahead_wanted(KEY) == (10, 30_000)

    asyncio.run(main())


def test_a_receive_of_the_same_visibility_takes_the_read_ahead_without_a_take() -> None:
    async def main() -> None:
        c, leaders, settled = coordinator()
        await receive(c, 30_000)
        assert c.read_ahead_wanted(KEY) is not None
        c.put_ahead(KEY, TOPIC, "sqs", list(TAKEN), 30_000, time.monotonic())
        takes = leaders.takes
        assert await receive(c, 60_000) == []  # another visibility: not for it
        got = await receive(c, 30_000, wait_s=1.0)
        assert got == TAKEN and leaders.takes == takes + 1  # only the 60 s receive took
        await asyncio.sleep(0)
        assert settled == []  # nothing left to give back

    asyncio.run(main())


def test_a_read_ahead_no_receive_takes_in_time_is_released_and_the_line_goes_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rc, "READ_AHEAD_HOLD_MS", 0)

    async def main() -> None:
        c, _, settled = coordinator()
        await receive(c, 30_000)
        assert c.read_ahead_wanted(KEY) is not None
        c.put_ahead(KEY, TOPIC, "sqs", list(TAKEN), 30_000, time.monotonic())
        for _ in range(3):
            await asyncio.sleep(0)
        assert settled == [("release", [m["receipt"] for m in TAKEN])]
        assert await receive(c, 30_000) == []  # given back, not handed out
        assert c.read_ahead_wanted(KEY) is None  # quiet for READ_AHEAD_QUIET_S

    asyncio.run(main())
