"""A node's receive lines (``cluster/node/receive_coordinator.py``): messages taken for one
visibility timeout go only to receivers that asked that timeout, however the line is ordered.
The queue groups' leaders are a stand-in router (the replicated receive is the delivery machine's,
``test_delivery*.py``)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, TargetKey, Waiter

TOPIC = Topic(7, "t", 1, (1,), None, None, None, 0)
KEY: TargetKey = (TOPIC.id, "g", None, None, False, True)  # a key of its line


class Leaders:
    """The queue group's leader: its first receive hands out 11 messages, later ones nothing;
    each receive's visibility timeout is recorded."""

    def __init__(self) -> None:
        self.visibility_ms: list[int] = []

    def leads(self, name: str) -> bool:
        return False

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        assert action == "receive"
        first = not self.visibility_ms
        self.visibility_ms.append(body["visibility_ms"])
        count = min(body["max"], 11) if first else 0
        return {"messages": [{"receipt": f"7.0.{o}.1", "queue": 0, "offset": o} for o in range(count)]}


def test_messages_taken_for_one_visibility_timeout_go_only_to_receivers_that_asked_it() -> None:
    """Receivers asking 30 s, 60 s and 30 s wait in that order: the take is for the line's 30 s
    receivers (11 messages); the 60 s receiver must not get messages invisible for only 30 s (a
    second consumer could receive them while it still works on them)."""

    async def main() -> list[list[dict[str, Any]]]:
        leaders = Leaders()

        async def settle(*_: Any) -> list[Any]:
            raise AssertionError("nothing is given back: every message has a receiver of its timeout")

        c = ReceiveCoordinator(SimpleNamespace(groups={}), leaders, settle)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        waiters = [
            Waiter(most, visibility_ms, time.monotonic() + 1.0, loop.create_future())
            for visibility_ms, most in ((30_000, 1), (60_000, 10), (30_000, 10))
        ]
        for waiter in waiters:
            c.enqueue(KEY, waiter, lambda: c.target(TOPIC, "g", None, None, None))
        got = await asyncio.wait_for(asyncio.gather(*(w.future for w in waiters)), 5)
        assert leaders.visibility_ms[0] == 30_000 and 60_000 in leaders.visibility_ms  # its own take
        return got

    first, long, last = asyncio.run(main())
    assert [len(first), len(long), len(last)] == [1, 0, 10]
