"""A send's take-along at a node (``ReceiveCoordinator.append``, ``ReadAhead.wanted_by_send``): when
a send's entry takes messages along for the receives waiting in the line of this node's own, that
they are handed to them at once (no receive of their own), what nobody was left to take is given
back uncounted, and when no take-along is asked (nobody waits, a short visibility timeout, another
node leads the group, a voter that does not apply ``append.take``, a queue that may not read
ahead). The queue group's leader is a stand-in router (the replicated op is
``tests/unit/test_delivery_take_along.py``'s, the whole with real nodes
``tests/integration/test_sqs_take_along.py``'s)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node import read_ahead as ra
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, Waiter, local_key

TOPIC = Topic(7, "t", 1, (1,), None, None, None, 0)
KEY = local_key(TOPIC.id, "sqs")


class Leader:
    """The leader of queue group 1 (this node while ``leading``): an append with a take-along
    hands out ``handing`` new messages; a receive finds nothing; an await never answers."""

    def __init__(self, handing: int = 3) -> None:
        self.leading = False
        self.handing = handing
        self.appends: list[dict[str, Any]] = []
        self.receives = 0

    def leads(self, name: str) -> bool:
        return self.leading

    async def group_call(
        self, g: int, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        if action == "await":
            await asyncio.sleep(60)
        if action == "receive":
            self.receives += 1
            return {"messages": []}
        assert action == "append"
        self.appends.append(body)
        result: dict[str, Any] = {"results": [{"queue": 0, "base_offset": 0, "count": self.handing}]}
        if "take" in body:
            n = min(self.handing, body["take"]["max"])
            result["messages"] = [{"receipt": f"7.0.{o}.5", "queue": 0, "offset": o} for o in range(n)]
        return result


class Node:
    groups: dict[str, Any] = {}

    def __init__(self, take: bool = True) -> None:
        self.take = take

    def group_supports(self, name: str, capability: str) -> bool:
        return self.take or capability != "append.take"


def coordinator(leader: Leader, node: Node | None = None) -> tuple[ReceiveCoordinator, list[Any]]:
    settled: list[Any] = []

    async def settle(topic: Topic, group: str, op: str, receipts: list[str], fields: Any) -> list[Any]:
        settled.append((op, receipts))
        return [{"receipt": r, "ok": True} for r in receipts]

    return ReceiveCoordinator(node or Node(), leader, settle), settled  # type: ignore[arg-type]


def waiting(c: ReceiveCoordinator, visibility_ms: int = 30_000, most: int = 10) -> Waiter:
    loop = asyncio.get_running_loop()
    waiter = Waiter(most, visibility_ms, time.monotonic() + 5, loop.create_future())
    c.enqueue(KEY, waiter, lambda: c.target(TOPIC, "sqs", None, None, None))
    return waiter


async def settle_soon() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_send_hands_its_messages_to_the_receive_waiting_here_in_its_own_entry() -> None:
    async def main() -> None:
        leader = Leader(handing=3)
        c, settled = coordinator(leader)
        waiter = waiting(c, most=10)
        await settle_soon()  # the line took (nothing) and waits
        receives = leader.receives
        leader.leading = True
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)
        got = await asyncio.wait_for(waiter.future, 2)
        assert [m["offset"] for m in got] == [0, 1, 2]
        (body,) = leader.appends
        take = body["take"]
        assert (take["group"], take["topic_id"], take["queues"], take["max"]) == ("sqs", 7, [0], 10)
        assert take["visibility_ms"] == 30_000 + ra.READ_AHEAD_HOLD_MS  # as a read-ahead's
        assert leader.receives == receives  # no receive of its own
        counts = c.read_ahead.counts
        assert (counts.taken_by_send, counts.handed_out, counts.taken) == (3, 3, 0)
        assert settled == []

    asyncio.run(main())


def test_what_a_send_took_for_a_receive_gone_meanwhile_is_given_back_uncounted() -> None:
    async def main() -> None:
        leader = Leader(handing=2)
        c, settled = coordinator(leader)
        waiter = waiting(c)
        await settle_soon()
        leader.leading = True
        plan = c.take_along_wanted(KEY, TOPIC, 1)  # asked while it waited ...
        assert plan is not None
        waiter.future.cancel()  # ... then the client went away
        c.put_ahead(
            KEY, TOPIC, "sqs", [{"receipt": "7.0.0.5"}, {"receipt": "7.0.1.5"}], plan, time.monotonic()
        )
        await asyncio.sleep(ra.READ_AHEAD_HOLD_MS / 1000 + 0.2)
        await settle_soon()
        assert settled == [("release", ["7.0.0.5", "7.0.1.5"])]
        assert (c.read_ahead.counts.taken_by_send, c.read_ahead.counts.released) == (2, 2)

    asyncio.run(main())


def test_no_take_along_without_a_receive_waiting_or_for_a_short_visibility() -> None:
    async def main() -> None:
        leader = Leader()
        leader.leading = True
        c, _ = coordinator(leader)
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)  # nobody waits
        waiter = waiting(c, visibility_ms=ra.READ_AHEAD_MIN_VISIBILITY_MS - 1)
        await settle_soon()
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)  # too short a visibility
        assert all("take" not in body for body in leader.appends)
        waiter.future.cancel()

    asyncio.run(main())


def test_no_take_along_when_the_group_is_led_elsewhere_a_voter_is_older_or_the_queue_may_not() -> None:
    async def main() -> None:
        for leading, node, may in (
            (False, Node(), True),
            (True, Node(take=False), True),
            (True, Node(), False),
        ):
            leader = Leader()
            c, _ = coordinator(leader, node)
            waiter = waiting(c)
            await settle_soon()
            leader.leading = leading
            await c.append(TOPIC, "sqs", 0, b"batch", take_along=may)
            assert "take" not in leader.appends[-1]
            waiter.future.cancel()

    asyncio.run(main())


class HeldLeader(Leader):
    """A :class:`Leader` whose receives, while ``hold``, stay on their way until ``answer`` is set,
    then hand out one message."""

    def __init__(self, handing: int = 3) -> None:
        super().__init__(handing)
        self.hold = True
        self.answer = asyncio.Event()

    async def group_call(
        self, g: int, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        if action != "receive" or not self.hold:
            return await super().group_call(g, action, body, size_hint)
        self.receives += 1
        await self.answer.wait()
        return {"token": 9, "messages": [{"receipt": "7.0.9.9", "queue": 0, "offset": 9}]}


def test_no_take_along_while_the_lines_own_receive_is_on_its_way() -> None:
    """The line's receive takes for the waiters in line: a send meanwhile takes nothing along
    for them (what it took would wait unclaimed, then cost a ``release``); once that receive has
    answered, a send takes along for whoever waits then."""

    async def main() -> None:
        leader = HeldLeader(handing=3)
        leader.leading = True
        c, settled = coordinator(leader)
        first = waiting(c, most=10)
        await settle_soon()
        assert leader.receives == 1  # on its way
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)
        assert "take" not in leader.appends[-1]
        leader.answer.set()
        assert [m["offset"] for m in await asyncio.wait_for(first.future, 2)] == [9]
        leader.hold = False  # the next receives find nothing at once: the line waits
        second = waiting(c, most=10)
        await settle_soon()
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)
        assert "take" in leader.appends[-1]
        assert [m["offset"] for m in await asyncio.wait_for(second.future, 2)] == [0, 1, 2]
        counts = c.read_ahead.counts
        assert (counts.taken_by_send, counts.handed_out, counts.released) == (3, 3, 0)
        assert settled == []

    asyncio.run(main())


def test_a_take_along_asks_for_the_waiters_of_the_heads_visibility_in_all() -> None:
    """Its ``max`` is what the waiters asking the head's visibility timeout asked in all (their
    messages would turn visible while a waiter asking another still worked on them); each is
    handed its part in line order, and the waiter asking another timeout goes on waiting."""

    async def main() -> None:
        leader = Leader(handing=10)
        c, _ = coordinator(leader)
        first, second = waiting(c, most=3), waiting(c, visibility_ms=60_000, most=5)
        third = waiting(c, most=4)
        await settle_soon()
        leader.leading = True
        await c.append(TOPIC, "sqs", 0, b"batch", take_along=True)
        take = leader.appends[-1]["take"]
        assert (take["max"], take["visibility_ms"]) == (7, 30_000 + ra.READ_AHEAD_HOLD_MS)
        assert [m["offset"] for m in await asyncio.wait_for(first.future, 2)] == [0, 1, 2]
        assert [m["offset"] for m in await asyncio.wait_for(third.future, 2)] == [3, 4, 5, 6]
        assert not second.future.done()
        second.future.cancel()

    asyncio.run(main())
