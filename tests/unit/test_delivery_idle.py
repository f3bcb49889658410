"""The delivery loop of an idle queue group (issue 25): a leader whose schedule holds nothing due
sleeps ``WAKE_WITHIN_MS`` less a tick between looks, not every ``delivery.tick_ms``, and reads
nothing from its store meanwhile; a deadline set by an apply that did not wake it is still expired
on time, and known from the applies without a look (issue 24). A real queue-group machine
(``test_delivery.Machine``) under a stand-in node that leads it."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import orjson
from test_delivery import Machine, T

from raftmq.cluster import commands
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.node.added_dues import AddedDues
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


def expires_on_time(m: Machine, loops: TickLoops, proposed: list[dict[str, Any]]) -> None:
    """A receive applied while the loop sleeps, its deadline 1.2 s away (an apply that far ahead
    does not wake the loop: nothing here calls ``loops.scheduled()``), is expired on time: not
    before the deadline, and well before the idle loop's 800 ms sleep would end (two ticks of
    slack for a loaded machine)."""

    async def run() -> int:
        task = asyncio.create_task(loops.deliver_forever())
        await asyncio.sleep(0.3)  # the loop looked: nothing due, it sleeps
        received_at = now_ms()
        assert len(m.apply(commands.receive(received_at, "g", T, [0], 10, 1200))["messages"]) == 2
        for _ in range(300):
            if proposed:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return received_at + 1200

    deadline = asyncio.run(run())
    ticks = [p for p in proposed if p["op"] == "deliver_tick"]
    assert ticks, "the deadline was never expired"
    assert deadline <= ticks[0]["now_ms"] <= deadline + 2 * TICK_MS, ticks[0]["now_ms"] - deadline


def test_a_deadline_set_without_waking_the_loop_still_expires_on_time() -> None:
    m = subscribed()
    proposed: list[dict[str, Any]] = []
    loops, _store = leader(m, proposed)
    expires_on_time(m, loops, proposed)
    assert m.tick(now_ms())["expired"] == 0  # the tick already expired both deliveries


def hooked(m: Machine, loops: TickLoops) -> None:
    """Each apply reported to the loops as the node's apply hook reports it (``Node._on_applied``)."""
    m.machine.on_applied = lambda applied: loops.applied("0", applied)


def test_applies_that_schedule_nothing_soon_cost_the_loop_no_look_at_the_store() -> None:
    """Receives and deletes with a far deadline (an SQS receiver, visibility 30 s): the loop knows
    what they scheduled from the applies and does not scan the deadline index again (issue 24: the
    scan passes over every settled delivery's tombstone, 10 % of a leader's CPU per SQS call).
    Before, it looked again once ``WAKE_WITHIN_MS`` less a tick had passed since its last look."""
    m = subscribed()
    loops, store = leader(m, [])
    hooked(m, loops)
    asyncio.run(loops.deliver_once())
    looked = store.scans
    time.sleep(0.85)  # past the horizon after which the loop looked again
    for _ in range(5):
        now = now_ms()
        got = m.apply(commands.receive(now, "g", T, [0], 10, 30_000))["messages"]
        m.apply(commands.ack(now, "g", T, [(x["queue"], x["offset"], m.index) for x in got]))
        m.produce(0, "c", now=now)
    assert 29 < asyncio.run(loops.deliver_once()) <= 30  # the deadlines added: 30 s away
    assert store.scans == looked
    soon = now_ms() + 300  # a deadline 300 ms away, the loop not woken: its wait shortens to it
    m.apply(commands.receive(soon - 300, "g", T, [0], 10, 300))
    assert 0.1 < asyncio.run(loops.deliver_once()) <= 0.3
    assert store.scans == looked


def test_a_deadline_known_from_the_applies_expires_on_time() -> None:
    m = subscribed()
    proposed: list[dict[str, Any]] = []
    loops, _store = leader(m, proposed)
    hooked(m, loops)
    expires_on_time(m, loops, proposed)


def test_the_runs_of_applies_account_for_every_entry_or_for_none() -> None:
    dues = AddedDues()
    replica = SimpleNamespace(applied_index=7)
    assert dues.since("0", 7, 8) == (False, None)  # no look yet
    assert dues.looked("0", replica) == 7  # type: ignore[arg-type]
    dues.applied("0", 7, 5)  # the look's store holds it: not counted again
    dues.applied("0", 8, None)
    dues.applied("0", 9, 900)
    dues.applied("0", 10, 400)
    assert dues.since("0", 7, 10) == (True, 400)
    assert dues.since("0", 7, 11) == (False, None)  # an apply not hooked yet
    dues.applied("0", 13, None)  # a gap (a snapshot installed): unknown until the next look
    assert dues.since("0", 7, 13) == (False, None)
