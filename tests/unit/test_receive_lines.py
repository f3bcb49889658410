"""A node's receive lines (``cluster/node/receive_coordinator.py``): messages taken for one
visibility timeout go only to receivers that asked that timeout, however the line is ordered.
The queue groups' leaders are a stand-in router (the replicated receive is the delivery machine's,
``test_delivery*.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace
from typing import Any

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import CatalogError
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node import receive_coordinator
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, TargetKey, Waiter
from raftmq.storage.memory import MemoryStore

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


class IdleLeaders:
    """Two queue groups led elsewhere: ``await`` answers after its wait whether the leader has
    something (``available``: the groups that do), ``receive`` hands out one message of such a
    group; every call is recorded."""

    def __init__(self, available: set[int]) -> None:
        self.available = available
        self.calls: list[tuple[str, int]] = []

    def leads(self, name: str) -> bool:
        return False

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((action, g))
        if action == "await":
            if g not in self.available:
                await asyncio.sleep(body["wait_ms"] / 1000)
            return {"available": g in self.available}
        assert action == "receive"
        found = g in self.available
        self.available.discard(g)
        return {"messages": [{"receipt": f"8.{g - 1}.0.1", "queue": g - 1, "offset": 0}] if found else []}


def _empty_replicas() -> SimpleNamespace:
    """A node with a replica of queue groups 1 and 2 showing nothing to hand out (it may lag its
    leaders)."""
    return SimpleNamespace(
        groups={str(g): SimpleNamespace(machine=SimpleNamespace(store=MemoryStore())) for g in (1, 2)}
    )


TWO_GROUPS = Topic(8, "idle", 2, (1, 2), None, None, None, 0)
IDLE_KEY: TargetKey = (TWO_GROUPS.id, "g", None, None, False, True)


def _one_receiver(leaders: IdleLeaders, wait_s: float) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        c = ReceiveCoordinator(_empty_replicas(), leaders, _no_settle)  # type: ignore[arg-type]
        waiter = Waiter(10, 30_000, time.monotonic() + wait_s, asyncio.get_running_loop().create_future())
        c.enqueue(IDLE_KEY, waiter, lambda: c.target(TWO_GROUPS, "g", None, None, None))
        return await asyncio.wait_for(waiter.future, wait_s + 5)

    return asyncio.run(main())


async def _no_settle(*_: Any) -> list[Any]:
    raise AssertionError("nothing is given back")


def test_a_long_poll_on_an_empty_queue_asks_no_leader_to_receive() -> None:
    """A line of this node's own whose replicas here show nothing waits on its leaders' ``await``
    only: before, every round of the wait asked each leader for a ``receive`` as well (an SQS
    receiver polling an empty queue cost a hop to each leader every second)."""
    leaders = IdleLeaders(available=set())
    assert _one_receiver(leaders, 1.5) == []
    assert [c for c in leaders.calls if c[0] == "receive"] == []
    assert sorted(leaders.calls) == [("await", 1), ("await", 2)]  # one round: the wait is 1.5 s


def test_a_leader_that_says_it_has_messages_is_asked_though_the_replica_here_shows_none() -> None:
    """The replica here may lag its leader: the group whose ``await`` said it has something is
    asked to receive at once."""
    leaders = IdleLeaders(available={2})
    got = _one_receiver(leaders, 10)
    assert [m["receipt"] for m in got] == ["8.1.0.1"]
    assert ("receive", 2) in leaders.calls and ("receive", 1) not in leaders.calls


class MovingLeadership(IdleLeaders):
    """Leads the coordinator's group ``"1"`` until ``moved`` is set; queue group 2 is led
    elsewhere and has nothing."""

    def __init__(self) -> None:
        super().__init__(available=set())
        self.moved = False

    def leads(self, name: str) -> bool:
        return name == "1" and not self.moved


def test_a_coordinator_whose_leadership_moves_fails_its_waiters_within_a_look() -> None:
    """A coordinator's wait lasts up to MAX_REMOTE_AWAIT_S (5 s) between its leaders' ``await``s,
    but it looks every LEADERSHIP_CHECK_S (1 s) whether it still leads: its receivers are sent
    to the new coordinator then, not after the whole wait."""
    topic = Topic(9, "moving", 1, (2,), None, None, None, 0)
    key: TargetKey = (topic.id, "g", None, None, False, False)

    async def main() -> tuple[BaseException | None, float]:
        leaders = MovingLeadership()
        c = ReceiveCoordinator(SimpleNamespace(groups={}), leaders, _no_settle)  # type: ignore[arg-type]
        waiter = Waiter(10, 30_000, time.monotonic() + 30, asyncio.get_running_loop().create_future())
        c.enqueue(key, waiter, lambda: c.target(topic, "g", None, None, "1"))
        for _ in range(500):  # until it took nothing and waits on the leader's await (5 s at most)
            if ("await", 2) in leaders.calls:
                break
            await asyncio.sleep(0.01)
        assert ("await", 2) in leaders.calls, leaders.calls
        leaders.moved, moved_at = True, time.monotonic()
        await asyncio.wait([waiter.future], timeout=10)
        return waiter.future.exception() if waiter.future.done() else None, time.monotonic() - moved_at

    failure, after_s = asyncio.run(main())
    assert isinstance(failure, CatalogError) and failure.code == errors.NOT_LEADER.code, failure
    assert after_s < 3.5, f"the waiters learnt of the move {after_s:.1f} s after it"


class PatientLeaders:
    """Queue groups 1 and 2 led elsewhere. ``await`` waits its ``wait_ms`` for its group to have
    something (``fill``), or hangs for good while the group is in ``silent``; ``receive`` hands out
    one message of a group that has some. Calls, and awaits cancelled by the caller, are recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.cancelled: list[int] = []
        self.silent: set[int] = set()
        self.has = {1: asyncio.Event(), 2: asyncio.Event()}

    def leads(self, name: str) -> bool:
        return False

    def fill(self, g: int) -> None:
        self.has[g].set()

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((action, g))
        if action == "receive":
            found = self.has[g].is_set()
            self.has[g].clear()
            return {"messages": [{"receipt": f"8.{g - 1}.0.1", "queue": g - 1, "offset": 0}] if found else []}
        assert action == "await"
        try:
            if g in self.silent:
                self.silent.discard(g)  # (the next await at it answers)
                await asyncio.sleep(3600)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.has[g].wait(), body["wait_ms"] / 1000)
        except asyncio.CancelledError:
            self.cancelled.append(g)
            raise
        return {"available": self.has[g].is_set()}

    def awaits(self, g: int) -> int:
        return self.calls.count(("await", g))


async def _receive(c: ReceiveCoordinator, wait_s: float) -> list[dict[str, Any]]:
    waiter = Waiter(10, 30_000, time.monotonic() + wait_s, asyncio.get_running_loop().create_future())
    c.enqueue(IDLE_KEY, waiter, lambda: c.target(TWO_GROUPS, "g", None, None, None))
    return await asyncio.wait_for(waiter.future, wait_s + 10)


def test_receivers_that_come_and_go_share_the_lines_awaits() -> None:
    """Three polls of 0.5 s in a row arm one ``await`` at each group (5 s each), not one a poll
    (a push stream's 1 s takes, a client's loop of short polls: 20-22 hops in 10 s before)."""
    leaders = PatientLeaders()

    async def main() -> list[list[dict[str, Any]]]:
        c = ReceiveCoordinator(_empty_replicas(), leaders, _no_settle)  # type: ignore[arg-type]
        return [await _receive(c, 0.5) for _ in range(3)]

    assert asyncio.run(main()) == [[], [], []]
    assert (leaders.awaits(1), leaders.awaits(2)) == (1, 1), leaders.calls
    assert [c for c in leaders.calls if c[0] == "receive"] == []


def test_an_await_answered_after_its_receiver_left_wakes_the_next_one() -> None:
    """The ``await`` armed while the first receiver waited answers yes while the second waits:
    the second gets the message at once, with no other ``await`` armed."""
    leaders = PatientLeaders()

    async def main() -> tuple[list[dict[str, Any]], float]:
        c = ReceiveCoordinator(_empty_replicas(), leaders, _no_settle)  # type: ignore[arg-type]
        assert await _receive(c, 0.5) == []
        asyncio.get_running_loop().call_later(0.5, leaders.fill, 2)
        started = time.monotonic()
        got = await _receive(c, 4)
        return got, time.monotonic() - started

    got, took_s = asyncio.run(main())
    assert [m["receipt"] for m in got] == ["8.1.0.1"]
    assert took_s < 2, f"the second receiver waited {took_s:.1f} s"
    assert leaders.awaits(2) == 1, leaders.calls


def test_an_await_whose_peer_never_answers_is_given_up_and_armed_again(monkeypatch: Any) -> None:
    """A peer that does not answer (the group's old leader, unreachable) holds no line past an
    await's time and grace: the next await goes out, and the message it finds comes."""
    monkeypatch.setattr(receive_coordinator, "MAX_REMOTE_AWAIT_S", 0.3)
    monkeypatch.setattr(receive_coordinator, "AWAIT_GRACE_S", 0.2)
    leaders = PatientLeaders()
    leaders.silent.add(2)
    leaders.fill(2)  # there all along; the first await at group 2 never says so

    async def main() -> tuple[list[dict[str, Any]], float]:
        c = ReceiveCoordinator(_empty_replicas(), leaders, _no_settle)  # type: ignore[arg-type]
        started = time.monotonic()
        got = await _receive(c, 5)
        return got, time.monotonic() - started

    got, took_s = asyncio.run(main())
    assert [m["receipt"] for m in got] == ["8.1.0.1"]
    assert took_s < 3, f"{took_s:.1f} s behind a peer that never answered"
    assert leaders.awaits(2) == 2 and leaders.cancelled.count(2) == 1, (leaders.calls, leaders.cancelled)


def test_a_lines_awaits_are_dropped_soon_after_its_last_receiver(monkeypatch: Any) -> None:
    monkeypatch.setattr(receive_coordinator, "DISARM_AFTER_S", 0.1)
    leaders = PatientLeaders()

    async def main() -> ReceiveCoordinator:
        c = ReceiveCoordinator(_empty_replicas(), leaders, _no_settle)  # type: ignore[arg-type]
        assert await _receive(c, 0.3) == []
        await asyncio.sleep(0.5)
        return c

    c = asyncio.run(main())
    assert c._armed == {}
    assert sorted(leaders.cancelled) == [1, 2]  # not left waiting at the leaders for their 5 s
