"""Production load: thousands of messages a second through the client's batch path, every outcome
in the history.

``LoadConfig.producers`` producers, each the client's idempotent :class:`~raftmq.client.AsyncProducer`
with every node as a bootstrap address and its default wire (binary batches,
``application/vnd.raftmq.batch``), a linger of a few milliseconds, so that its batches hold many
messages. Together they offer ``rate`` messages a second, paced in ticks of ``tick_ms``: each tick
a producer sends its share, half of them keyed (``key_share``: the client hashes the key to a
queue), the rest unkeyed (the client spreads them). Values are unique: ``"L<w>-<seq>"``.

Each message is an ``enqueue`` operation of the history (``client`` = ``"load"``): its invoke when
it is handed to the producer, its ``ok`` (with the queue and offset the producer was told) or
``fail``/``info`` (the error's ``definite`` flag) when its batch finishes, from the producer's
done callback. The messages of one producer are in flight together, so each is its own process (a
Jepsen process does one operation at a time: the availability checker pairs an invoke with the
next completion of its process); the queue-order checker's per-process order is therefore not
asked of the load, only of the workload's one-at-a-time producers.

A producer stuck behind a full buffer (its cluster down) waits in ``send``: the offered rate is
what the cluster can take then, and the figures say what was offered and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftmq.client import AsyncProducer, FutureRecord, RaftmqError

from .client import advertised_url
from .history import INVOKE, History

__all__ = ["LoadConfig", "LoadProducers"]


@dataclass(frozen=True)
class LoadConfig:
    producers: int = 4
    rate: float = 10_000.0  # messages a second, all producers together
    key_share: float = 0.5
    keys: int = 1000  # distinct keys
    tick_ms: int = 20
    linger_ms: int = 5
    delivery_timeout_ms: int = 10_000
    request_timeout_ms: int = 3_000


class LoadProducers:
    def __init__(
        self,
        history: History,
        nodes: Sequence[str],
        address_map: Callable[[str], str | None],
        topic: str,
        config: LoadConfig,
        seed: int = 0,
    ) -> None:
        self.history = history
        self.nodes = list(nodes)
        self.address_map = address_map
        self.topic = topic
        self.config = config
        self.rng = random.Random(seed)
        self.offered = 0
        self.acknowledged = 0

    async def producer(self, w: int, stop: asyncio.Event) -> None:
        cfg = self.config
        rng = random.Random(self.rng.random())
        bootstrap = [advertised_url(n) for n in self.nodes[w % len(self.nodes) :] + self.nodes]
        producer = AsyncProducer(
            list(dict.fromkeys(bootstrap)),
            linger_ms=cfg.linger_ms,
            request_timeout_ms=cfg.request_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
            address_map=self.address_map,
        )
        per_tick = cfg.rate / cfg.producers * cfg.tick_ms / 1000
        seq = 0
        owed = 0.0
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                owed += per_tick
                while owed >= 1 and not stop.is_set():
                    owed -= 1
                    process = self.history.new_process()
                    value = f"L{w}-{seq}"
                    seq += 1
                    key = f"k{rng.randrange(cfg.keys)}" if rng.random() < cfg.key_share else None
                    self.history.append(type=INVOKE, process=process, f="enqueue", value=value, client="load",
                                        key=key, queue=None)  # fmt: skip
                    self.offered += 1
                    try:
                        handle = await producer.send(self.topic, value, key=key)
                    except RaftmqError as e:
                        self._finished(process, value, key, None, e)
                        continue
                    handle.add_done_callback(functools.partial(self._done, process, value, key))
                next_at += cfg.tick_ms / 1000
                delay = next_at - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                else:
                    next_at = time.monotonic()  # behind (a full buffer): do not make up for it in a burst
                    await asyncio.sleep(0)
        finally:
            await producer.close(timeout_s=cfg.delivery_timeout_ms / 1000 + 2)

    def _done(self, process: int, value: str, key: str | None, handle: FutureRecord) -> None:
        self._finished(process, value, key, handle, None)

    def _finished(
        self,
        process: int,
        value: str,
        key: str | None,
        handle: FutureRecord | None,
        error: RaftmqError | None,
    ) -> None:
        common: dict[str, Any] = {
            "process": process,
            "f": "enqueue",
            "value": value,
            "client": "load",
            "key": key,
        }
        if handle is not None:
            error = handle.exception(0)
        if error is None and handle is not None:
            meta = handle.result(0)
            self.acknowledged += 1
            self.history.append(type="ok", queue=meta.queue, offset=meta.offset, **common)
        else:
            assert error is not None
            kind = "fail" if error.definite else "info"
            self.history.append(type=kind, queue=None, error=error.code, **common)
