"""The workload: producers and consumers through different nodes, then the drain and replica reads.

- Producer ``w`` enters the cluster at node ``w mod N`` and sends unique values ``"<w>-<seq>"``,
  one message per operation, to a random queue, one operation at a time, paced so that all
  producers together attempt about ``rate`` messages a second. Two kinds (``producer_client``;
  ``mixed`` alternates them): ``attempt`` producers make one attempt at their node and never
  retry (a retry would be a new value; the node forwards to the leader); ``producer`` producers
  are the client's idempotent ``AsyncProducer``, which sends to the leader itself and retries
  until its delivery timeout; it knows every node, so ``node`` is nominal for it and the nodes it
  addressed during the operation are recorded as ``nodes``.
- Consumer ``w`` owns the queues ``q`` with ``q mod consumers == w``, talks to node ``w mod N`` and
  reads each owned queue by offset from 0, sometimes from the node's own replica
  (``read_from=local``), recording every message it gets (a dequeue).
- After the heal: ``drain`` continues every queue from where its consumer stopped until two rounds
  in a row find nothing; ``read_replicas`` reads every queue from every replica with
  ``read_from=local`` (``f = "read"``), the evidence for the log-consistency checker.

Every call is an invoke followed by ok / fail / info in the history; after an info the worker
continues under a new process id.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from .client import BrokerClient, ClientProducer, Outcome
from .history import INVOKE, History

__all__ = ["Workload", "WorkloadConfig"]


@dataclass(frozen=True)
class WorkloadConfig:
    topic: str = "chaos"
    queues: int = 6
    producers: int = 24
    consumers: int = 3
    producer_client: str = "mixed"  # "attempt" | "producer" | "mixed"
    rate: float = 120.0  # produce attempts per second, all producers together
    fetch_max: int = 100
    fetch_wait_ms: int = 250
    local_read_share: float = 0.25  # consumers' fetches served by the node's own replica
    drain_timeout_s: float = 120.0
    replica_catch_up_s: float = 20.0


class Workload:
    def __init__(
        self,
        client: BrokerClient,
        history: History,
        nodes: list[str],
        config: WorkloadConfig,
        replicas: dict[int, list[str]],
        seed: int = 0,
    ) -> None:
        self.client = client
        self.history = history
        self.nodes = nodes
        self.config = config
        self.replicas = replicas  # queue -> nodes hosting it
        self.rng = random.Random(seed)
        self.positions: dict[int, int] = dict.fromkeys(range(config.queues), 0)
        self.high_offsets: dict[int, int] = {}

    # -- one operation --------------------------------------------------------------------------

    def producer_kind(self, w: int) -> str:
        kind = self.config.producer_client
        if kind == "mixed":
            return "attempt" if w % 2 == 0 else "producer"
        if kind not in ("attempt", "producer"):
            raise ValueError(f"producer_client must be attempt, producer or mixed, not {kind!r}")
        return kind

    async def _enqueue(
        self, process: int, node: str, queue: int, value: str, producer: ClientProducer | None
    ) -> Outcome:
        common = {"process": process, "f": "enqueue", "node": node, "queue": queue, "value": value,
                  "client": "attempt" if producer is None else "producer"}  # fmt: skip
        self.history.append(type=INVOKE, **common)
        extra: dict[str, Any] = {}
        if producer is None:
            out = await self.client.produce(node, self.config.topic, queue, value)
        else:
            producer.contacted.clear()
            out = await producer.produce(self.config.topic, queue, value)
            extra["nodes"] = list(producer.contacted)
        if out.type == "ok":
            extra["offset"] = out.body["offset"]
        else:
            extra["error"] = out.error
            if out.detail:
                extra["detail"] = out.detail
        self.history.append(type=out.type, **common, **extra)
        return out

    async def _fetch(
        self, f: str, process: int, node: str, queue: int, offset: int, max_messages: int, wait_ms: int,
        read_from: str,
    ) -> Outcome:  # fmt: skip
        common = {"process": process, "f": f, "node": node, "queue": queue, "offset": offset}
        self.history.append(type=INVOKE, read_from=read_from, **common)
        out = await self.client.fetch(
            node, self.config.topic, queue, offset, max_messages, wait_ms, read_from
        )
        if out.type == "ok":
            msgs = [[m["offset"], m.get("value", m.get("value_b64"))] for m in out.body.get("messages", [])]
            self.history.append(type="ok", messages=msgs, high_offset=out.body.get("high_offset"), **common)
        else:
            detail = {"detail": out.detail} if out.detail else {}
            self.history.append(type=out.type, error=out.error, **common, **detail)
        return out

    # -- generators -----------------------------------------------------------------------------

    async def producer(self, w: int, stop: asyncio.Event) -> None:
        node = self.nodes[w % len(self.nodes)]
        rng = random.Random(self.rng.random())
        producer = self.client.producer(node) if self.producer_kind(w) == "producer" else None
        process = self.history.new_process()
        interval = self.config.producers / self.config.rate
        next_at = time.monotonic() + rng.uniform(0, interval)
        seq = 0
        while not stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except TimeoutError:
                    pass
            next_at = max(next_at + interval, time.monotonic())
            out = await self._enqueue(
                process, node, rng.randrange(self.config.queues), f"{w}-{seq}", producer
            )
            seq += 1
            if out.type == "info":
                process = self.history.new_process()

    async def consumer(self, w: int, stop: asyncio.Event) -> None:
        node = self.nodes[w % len(self.nodes)]
        rng = random.Random(self.rng.random())
        owned = [q for q in range(self.config.queues) if q % self.config.consumers == w]
        process = self.history.new_process()
        while not stop.is_set() and owned:
            for q in owned:
                local = node in self.replicas.get(q, []) and rng.random() < self.config.local_read_share
                out = await self._fetch(
                    "fetch", process, node, q, self.positions[q], self.config.fetch_max,
                    self.config.fetch_wait_ms, "local" if local else "leader",
                )  # fmt: skip
                if out.type == "ok":
                    self._advance(q, out)
                elif out.type == "info":
                    process = self.history.new_process()
                if out.type != "ok":
                    await asyncio.sleep(0.1)  # do not spin against a node that is down

    def _advance(self, queue: int, out: Outcome) -> int:
        msgs = out.body.get("messages", [])
        if msgs:
            self.positions[queue] = msgs[-1]["offset"] + 1
        return len(msgs)

    # -- the end ---------------------------------------------------------------------------------

    async def drain(self) -> dict[str, Any]:
        """Read every queue on from its consumer's position, through the nodes in turn, until two
        rounds in a row find nothing, or until ``drain_timeout_s`` passed without a message read:
        the limit is on a stalled drain, not on a long one (a soak at production load leaves
        millions of messages behind its consumers, more than 120 s of reading)."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        process = self.history.new_process()
        empty_rounds = rounds = errors = 0
        turn = 0
        while empty_rounds < 2:
            if time.monotonic() > deadline:
                return {"complete": False, "rounds": rounds, "errors": errors}
            rounds += 1
            found = 0
            for q in range(self.config.queues):
                while time.monotonic() < deadline:
                    node = self.nodes[turn % len(self.nodes)]
                    turn += 1
                    out = await self._fetch("drain", process, node, q, self.positions[q], 1000, 0, "leader")
                    if out.type == "info":
                        process = self.history.new_process()
                    if out.type != "ok":
                        errors += 1
                        await asyncio.sleep(0.2)
                        continue
                    got = self._advance(q, out)
                    found += got
                    if got:
                        deadline = max(deadline, time.monotonic() + self.config.drain_timeout_s)
                    self.high_offsets[q] = max(self.high_offsets.get(q, 0), out.body.get("high_offset", 0))
                    if got == 0:
                        break
            empty_rounds = empty_rounds + 1 if found == 0 else 0
            if empty_rounds < 2:
                await asyncio.sleep(0.5)
        return {"complete": True, "rounds": rounds, "errors": errors}

    async def read_replicas(self) -> dict[str, Any]:
        """Every queue from every replica's own copy (``read_from=local``), waiting up to
        ``replica_catch_up_s`` for a replica to reach the drained high offset."""
        process = self.history.new_process()
        lagging: dict[str, int] = {}
        for q in range(self.config.queues):
            for node in self.replicas.get(q, []):
                deadline = time.monotonic() + self.config.replica_catch_up_s
                while True:
                    offset, high = 0, -1
                    ok = True
                    while True:
                        out = await self._fetch("read", process, node, q, offset, 1000, 0, "local")
                        if out.type == "info":
                            process = self.history.new_process()
                        if out.type != "ok":
                            ok = False
                            break
                        high = out.body.get("high_offset", 0)
                        if not out.body.get("messages"):
                            break
                        offset = out.body["messages"][-1]["offset"] + 1
                    caught_up = ok and high >= self.high_offsets.get(q, 0)
                    if caught_up or time.monotonic() > deadline:
                        if not caught_up:
                            lagging[f"{q}@{node}"] = high
                        break
                    await asyncio.sleep(0.5)
        return {"lagging_replicas": lagging}
