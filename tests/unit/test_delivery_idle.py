"""The delivery loop of an idle queue group (issue 25): a leader whose schedule holds nothing due
sleeps ``WAKE_WITHIN_MS`` less a tick between looks, not every ``delivery.tick_ms``, and reads
nothing from its store meanwhile; a deadline set by an apply that did not wake it is still expired
on time. A real queue-group machine (``test_delivery.Machine``) under a stand-in node that leads it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
from test_delivery import Machine, T

from raftmq.cluster import commands
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.node.ticks import TickLoops

TICK_MS = 200


class CountingStore:
    """The machine's store, counting the scans (the look-up of the next due time is one)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.scans = 0

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        self.scans += 1
        return self.inner.scan(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Replica:
    """What the loop reads of the replica: its applied index, and its store through the counter."""

    def __init__(self, m: Machine) -> None:
        self.m = m
        self.store = CountingStore(m.store)

    @property
    def applied_index(self) -> int:
        return self.m.machine.applied_index


def leader(m: Machine, proposed: list[dict[str, Any]]) -> tuple[TickLoops, CountingStore]:
    """A tick loop over a stand-in node leading queue group 0 (``m``); proposals apply at once."""
    replica = Replica(m)

    async def propose(name: str, command: bytes) -> Any:
        proposed.append({**orjson.loads(command), "applied_at_ms": now_ms()})
        return SimpleNamespace(error=None, result=m.apply(command))

    async def await_group_supports(name: str, capability: str) -> bool:
        return True

    delivery = SimpleNamespace(tick_ms=TICK_MS, tick_max_items=100, expiry_backoff=False)
    local = SimpleNamespace(
        raft=SimpleNamespace(is_leader=lambda: True), machine=replica, state_store=m.store
    )
    node = SimpleNamespace(
        config=SimpleNamespace(delivery=delivery),
        groups={"0": local},
        propose=propose,
        await_group_supports=await_group_supports,
    )
    return TickLoops(node), replica.store  # type: ignore[arg-type]


def subscribed() -> Machine:
    m = Machine()
    m.subscribe()
    m.produce(0, "a", "b")
    return m


def test_an_idle_group_is_looked_at_once_and_the_loop_sleeps_800_ms() -> None:
    loops, store = leader(subscribed(), [])
    assert asyncio.run(loops.deliver_once()) == 0.8  # every tick_ms (0.2) before
    looked = store.scans
    assert looked > 0  # the first look reads the schedule
    for _ in range(5):
        assert asyncio.run(loops.deliver_once()) == 0.8
    assert store.scans == looked  # nothing applied: the cached due time, no read


def test_a_deadline_set_without_waking_the_loop_still_expires_on_time() -> None:
    m = subscribed()
    proposed: list[dict[str, Any]] = []
    loops, _store = leader(m, proposed)

    async def run() -> int:
        task = asyncio.create_task(loops.deliver_forever())
        await asyncio.sleep(0.3)  # the loop looked: nothing due, it sleeps
        # A receive applied while it sleeps, its deadline 1.2 s away: an apply that far ahead
        # does not wake the loop (nothing here calls loops.scheduled()).
        received_at = now_ms()
        result = m.apply(commands.receive(received_at, "g", T, [0], 10, 1200))
        assert len(result["messages"]) == 2, result
        for _ in range(300):
            if proposed:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return received_at + 1200

    deadline = asyncio.run(run())
    ticks = [p for p in proposed if p["op"] == "deliver_tick"]
    assert ticks, "the deadline was never expired"
    # On time: not before the deadline, and well before the idle loop's 800 ms sleep would end
    # (two ticks of slack for a loaded machine).
    assert deadline <= ticks[0]["now_ms"] <= deadline + 2 * TICK_MS, ticks[0]["now_ms"] - deadline
    assert m.tick(now_ms())["expired"] == 0  # the tick already expired both deliveries
