"""A node's waits for a queue to grow (``cluster/node/waiters.py``): a fetch long poll
(``fetch_core.long_poll``) and a receive's wait (``delivery_actions.await_available``) look at the
replica and then wait; an apply that lands between the look and the wait must still wake them.
Its wake reaches the loop as a call (``Node._applied``), which may run while a long poll's read is
still in the executor, or before a receive's wait has started: the waiter must be listening from
before its look. The replica is a real queue-group machine over a MemoryStore; the apply's wake is
the call the tick thread makes."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from test_delivery import G, Machine, T

from raftmq.cluster.api.handlers import fetch_core
from raftmq.cluster.node import delivery_actions
from raftmq.cluster.node.waiters import QueueWaiters

WAIT_S = 5.0  # each wait's timeout: a lost wake-up sleeps all of it


def test_a_long_poll_wakes_for_an_apply_after_its_read_in_the_executor() -> None:
    async def main() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        waiters = QueueWaiters()
        node = SimpleNamespace(waiters=waiters)
        query = SimpleNamespace(topic=SimpleNamespace(id=T), queue=0, wait_ms=int(WAIT_S * 1000))
        reads: list[int] = []

        def read() -> list[str]:  # in the executor, as a fetch of many bytes reads
            reads.append(1)
            if len(reads) == 1:
                # The apply lands right after this read looked: the tick thread's wake reaches
                # the loop before this read's answer does.
                loop.call_soon_threadsafe(waiters.wake, [(T, 0)])
                return []
            return ["m"]

        started = time.monotonic()
        got = await asyncio.wait_for(
            fetch_core.long_poll(node, query, read, bool, in_executor=True),  # type: ignore[arg-type]
            WAIT_S + 1,
        )
        return got, time.monotonic() - started

    got, took_s = asyncio.run(main())
    assert got == ["m"]
    assert took_s < WAIT_S / 2, f"the wake-up was lost: the long poll slept {took_s:.1f} s"


def test_a_receive_wait_wakes_for_an_apply_after_its_look(monkeypatch: pytest.MonkeyPatch) -> None:
    m = Machine()
    m.subscribe()
    waiters = QueueWaiters()
    node = SimpleNamespace(groups={"0": SimpleNamespace(machine=m.machine)}, waiters=waiters)
    looked = delivery_actions._available
    applied: list[int] = []

    def look_then_apply(*args: Any, **kwargs: Any) -> tuple[bool, int | None]:
        answer = looked(*args, **kwargs)
        if not applied:  # once, right after the first look found nothing
            applied.append(1)
            m.produce(0, "a")  # the apply on the tick thread ...
            asyncio.get_running_loop().call_soon(waiters.wake, [(T, 0)])  # ... and its wake
        return answer

    monkeypatch.setattr(delivery_actions, "_available", look_then_apply)

    async def main() -> tuple[bool, float]:
        started = time.monotonic()
        ok = await asyncio.wait_for(
            delivery_actions.await_available(node, "0", T, G, [0], None, WAIT_S),  # type: ignore[arg-type]
            WAIT_S + 1,
        )
        return ok, time.monotonic() - started

    ok, took_s = asyncio.run(main())
    assert ok
    assert took_s < WAIT_S / 2, f"the wake-up was lost: the receive's wait slept {took_s:.1f} s"
