"""The chaos workload's drain: its limit is on a drain that stalls, not on one that is long."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from raftmq.chaos.client import Outcome
from raftmq.chaos.history import History
from raftmq.chaos.workload import Workload, WorkloadConfig


class SlowBroker:
    """Answers fetches from fixed queues, ``per_fetch`` messages a call, each call ``delay_s`` long
    (a broker holding a backlog that takes longer than the drain's limit to read); ``stalled``:
    every fetch fails."""

    def __init__(
        self, lengths: dict[int, int], per_fetch: int, delay_s: float, stalled: bool = False
    ) -> None:
        self.lengths = lengths
        self.per_fetch = per_fetch
        self.delay_s = delay_s
        self.stalled = stalled

    async def fetch(
        self, node: str, topic: str, queue: int, offset: int, max_messages: int, wait_ms: int, read_from: str
    ) -> Outcome:
        await asyncio.sleep(self.delay_s)
        if self.stalled:
            return Outcome("fail", "unavailable")
        end = min(self.lengths[queue], offset + min(max_messages, self.per_fetch))
        messages: list[dict[str, Any]] = [{"offset": o, "value": f"v{queue}-{o}"} for o in range(offset, end)]
        return Outcome("ok", body={"messages": messages, "high_offset": self.lengths[queue]})


def drain(tmp_path: Path, broker: SlowBroker, timeout_s: float) -> tuple[dict[str, Any], Workload]:
    config = WorkloadConfig(queues=3, drain_timeout_s=timeout_s)
    history = History(tmp_path / "history.jsonl")
    workload = Workload(broker, history, ["n1", "n2", "n3"], config, {})  # type: ignore[arg-type]
    try:
        return asyncio.run(workload.drain()), workload
    finally:
        history.close()


def test_a_drain_longer_than_its_limit_completes_while_it_reads(tmp_path: Path) -> None:
    # 3 queues x 40 messages, 1 a fetch, 20 ms a fetch: 2.4 s of reading, over the 1.5 s limit;
    # the two empty rounds that end it take about 1.1 s (0.5 s apart).
    broker = SlowBroker({0: 40, 1: 40, 2: 40}, per_fetch=1, delay_s=0.02)
    result, workload = drain(tmp_path, broker, timeout_s=1.5)
    assert result["complete"] is True
    assert workload.positions == {0: 40, 1: 40, 2: 40}
    assert workload.high_offsets == {0: 40, 1: 40, 2: 40}


def test_a_drain_that_reads_nothing_for_its_limit_is_incomplete(tmp_path: Path) -> None:
    broker = SlowBroker({0: 40, 1: 40, 2: 40}, per_fetch=10, delay_s=0.01, stalled=True)
    result, workload = drain(tmp_path, broker, timeout_s=0.3)
    assert result["complete"] is False
    assert result["errors"] > 0
    assert workload.positions == {0: 0, 1: 0, 2: 0}
