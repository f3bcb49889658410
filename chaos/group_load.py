"""Consumers in a group beside the production load: the client's :class:`~raftmq.client.AsyncConsumer`
(clustering mode, binary fetch path, auto commit) reading the load's topic while the faults run.

``GroupLoadConfig.members`` members of group ``chaos-load`` (``load-<w>``), each with every node as
a bootstrap address and the harness's ``address_map``, take what their queues deliver with
``getmany`` and ack every message at once: the consumer commits the low edge of the acked offsets
every ``auto_commit_interval_ms``, on rebalance and on close. A member whose consumer fails (a
fault it cannot ride out: its group coordinator gone for longer than its request timeout) closes it
without a commit and joins again as a new consumer, as an application would restart it.

History (``client`` ``"group"``):

- ``consume``: one ``getmany`` that returned messages, ``messages`` ``[[queue, offset, value], ...]``
  and ``member``; its invoke and ``ok`` are written together when the messages are in hand (the
  wait before is not an operation: nothing was asked of the broker that could fail).
- ``committed``: one process reads the group's committed offsets (``GET /v1/groups/chaos-load/
  offsets``: linearizable, a barrier through each queue group's leader) every ``observe_s``, one
  read at a time, and once more after the drain (``final``: true). ``offsets`` ``{"<queue>":
  offset | null}``. A read that fails ends ``fail``/``info`` as any operation.

``group_checker.group_consume`` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raftmq.client import AsyncConsumer, Message, RaftmqError
from raftmq.client.lowlevel import Transport, path_part

from .client import advertised_url
from .history import INVOKE, History

__all__ = ["GROUP", "GroupConsumers", "GroupLoadConfig"]

log = logging.getLogger("raftmq.chaos.group_load")

GROUP = "chaos-load"


@dataclass(frozen=True)
class GroupLoadConfig:
    members: int = 3
    max_batch: int = 500  # the client's advice for throughput (docs/client.md)
    auto_commit_interval_ms: int = 1_000
    request_timeout_ms: int = 3_000
    observe_s: float = 2.0  # how often the committed offsets are read during the run
    restart_backoff_s: float = 1.0


class GroupConsumers:
    def __init__(
        self,
        history: History,
        nodes: Sequence[str],
        address_map: Callable[[str], str | None],
        topic: str,
        config: GroupLoadConfig,
    ) -> None:
        self.history = history
        self.bootstrap = [advertised_url(n) for n in nodes]
        self.address_map = address_map
        self.topic = topic
        self.config = config
        self.consumed = 0  # deliveries (a message delivered twice counts twice)
        self.restarts = 0
        self._observer = Transport(
            self.bootstrap, request_timeout_ms=config.request_timeout_ms, address_map=address_map
        )

    async def member(self, w: int, stop: asyncio.Event) -> None:
        """Consume as ``load-<w>`` until ``stop``; a failed consumer is replaced by a new one."""
        while not stop.is_set():
            consumer = AsyncConsumer(
                self.bootstrap, group=GROUP, topics=self.topic, member_id=f"load-{w}-{self.restarts}",
                max_batch=self.config.max_batch, max_backlog=4 * self.config.max_batch, wait_ms=1_000,
                auto_commit_interval_ms=self.config.auto_commit_interval_ms,
                request_timeout_ms=self.config.request_timeout_ms, address_map=self.address_map,
            )  # fmt: skip
            commit = True
            try:
                await consumer.start()
                while not stop.is_set():
                    got = await consumer.getmany(5_000, timeout_ms=500)
                    if got:
                        self._record(w, got)
                        for m in got:
                            m.ack()
            except RaftmqError as e:
                log.info("group member %s failed (%s): a new consumer joins", w, e.code)
                commit = False
                self.restarts += 1
            finally:
                # A close that fails or hangs (its cluster down) leaves the member's queues to the
                # group's session expiry, as a crashed application would.
                with contextlib.suppress(RaftmqError, TimeoutError):
                    await asyncio.wait_for(consumer.close(commit=commit), 15)
            if not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.restart_backoff_s)

    def _record(self, w: int, got: Sequence[Message]) -> None:
        process = self.history.new_process()
        messages = [[m.queue, m.offset, m.value if isinstance(m.value, str) else m.value.hex()] for m in got]
        common = {"process": process, "f": "consume", "client": "group", "member": f"load-{w}"}
        self.history.append(type=INVOKE, **common)
        self.history.append(type="ok", messages=messages, **common)
        self.consumed += len(messages)

    async def observe(self, stop: asyncio.Event) -> None:
        """Read the committed offsets every ``observe_s`` until ``stop``."""
        while not stop.is_set():
            await self.read_committed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.observe_s)

    async def read_committed(self, final: bool = False) -> dict[str, int | None] | None:
        process = self.history.new_process()
        common = {"process": process, "f": "committed", "client": "group", "group": GROUP,
                  **({"final": True} if final else {})}  # fmt: skip
        self.history.append(type=INVOKE, **common)
        try:
            answer = await self._observer.request(
                "GET", f"/v1/groups/{path_part(GROUP)}/offsets", params={"topic": self.topic}, idempotent=True
            )
        except RaftmqError as e:
            self.history.append(type="fail" if e.definite else "info", error=e.code, **common)
            return None
        offsets: dict[str, int | None] = answer["offsets"]
        self.history.append(type="ok", offsets=offsets, **common)
        return offsets

    async def close(self) -> None:
        await self._observer.close()
