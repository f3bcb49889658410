"""The receive/ack workload: receivers of one consumer group, then a drain until every message is finished.

- ``subscribe`` sets the group's subscription first: ``max_deliveries`` so high that nothing reaches
  the dead-letter topic during a run, and a short retry backoff (the default waits 10 s and more).
- Receiver ``w`` talks to node ``w mod N``: ``POST .../subscriptions/{group}/receive`` (a long poll),
  then acks every receipt it got at once, on the same node. One attempt per call, never retried:
  a receive whose answer is lost hands its messages to nobody (they come back after their
  visibility deadline), and a lost ack leaves its messages to come back or not.
- ``drain`` (after the heal and the offset drain, which gives each queue's high offset): receive
  and ack through the nodes in turn until the group's committed offset (the low edge of finished
  messages) has reached the high offset of every queue and the last receive found nothing.

History (see ``history``): ``f`` is ``receive`` / ``ack`` during the run and ``drain-receive`` /
``drain-ack`` in the drain. A receive completes ``ok`` with ``messages``: ``[[queue, offset, value,
attempt], ...]``; an ack's invoke and completion carry ``messages``: ``[[queue, offset, value,
receipt], ...]`` and its ``ok`` has ``results``: ``"ok"`` or the error code, one per receipt.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from .client import BrokerClient, Outcome
from .history import INVOKE, History

__all__ = ["ReceiveConfig", "Receivers"]


@dataclass(frozen=True)
class ReceiveConfig:
    topic: str = "chaos"
    group: str = "chaos-rx"
    receivers: int = 3
    max_messages: int = 32
    wait_ms: int = 500
    visibility_ms: int = 5000
    max_deliveries: int = 1000
    backoff_ms: tuple[int, ...] = (200, 500, 1000)
    drain_timeout_s: float = 90.0


class Receivers:
    def __init__(
        self, client: BrokerClient, history: History, nodes: list[str], config: ReceiveConfig
    ) -> None:
        self.client = client
        self.history = history
        self.nodes = nodes
        self.config = config

    @property
    def _base(self) -> str:
        return f"/v1/topics/{self.config.topic}/subscriptions/{self.config.group}"

    async def subscribe(self, timeout_s: float = 60.0) -> None:
        """Store the subscription's settings, through the nodes in turn until one accepts them."""
        body = {"max_deliveries": self.config.max_deliveries, "backoff_ms": list(self.config.backoff_ms)}
        deadline = time.monotonic() + timeout_s
        for attempt in range(10_000):
            out = await self.client.call(self.nodes[attempt % len(self.nodes)], "PUT", self._base, body=body)
            if out.type == "ok":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not set up subscription {self.config.group}: {out.error}")
            await asyncio.sleep(0.5)

    # -- one operation --------------------------------------------------------------------------

    async def _receive(self, f: str, process: int, node: str) -> Outcome:
        cfg = self.config
        common = {"process": process, "f": f, "node": node, "group": cfg.group}
        self.history.append(type=INVOKE, **common)
        out = await self.client.receive(
            node, cfg.topic, cfg.group, cfg.max_messages, cfg.wait_ms, cfg.visibility_ms
        )
        if out.type == "ok":
            msgs = [[m["queue"], m["offset"], m.get("value", m.get("value_b64")), m.get("attempt")]
                    for m in out.body.get("messages", [])]  # fmt: skip
            self.history.append(type="ok", messages=msgs, **common)
        else:
            self.history.append(type=out.type, error=out.error, **common, **_detail(out))
        return out

    async def _ack(self, f: str, process: int, node: str, received: list[dict[str, Any]]) -> Outcome:
        cfg = self.config
        msgs = [[m["queue"], m["offset"], m.get("value", m.get("value_b64")), m["receipt"]] for m in received]
        common = {"process": process, "f": f, "node": node, "group": cfg.group, "messages": msgs}
        self.history.append(type=INVOKE, **common)
        out = await self.client.ack(node, cfg.topic, cfg.group, [m[3] for m in msgs])
        if out.type == "ok":
            by_receipt = {
                r.get("receipt"): "ok" if r.get("ok") else (r.get("error") or {}).get("code", "?")
                for r in out.body.get("results", [])
            }
            results = [by_receipt.get(m[3], "missing") for m in msgs]
            self.history.append(type="ok", results=results, **common)
        else:
            self.history.append(type=out.type, error=out.error, **common, **_detail(out))
        return out

    async def _receive_and_ack(self, prefix: str, process: int, node: str) -> tuple[int, int]:
        """One receive and, if it got anything, its ack. Returns (messages received, process)."""
        out = await self._receive(prefix + "receive", process, node)
        if out.type == "info":
            process = self.history.new_process()
        if out.type != "ok":
            return -1, process
        received = out.body.get("messages", [])
        if received:
            ack = await self._ack(prefix + "ack", process, node, received)
            if ack.type == "info":
                process = self.history.new_process()
        return len(received), process

    # -- generators -----------------------------------------------------------------------------

    async def receiver(self, w: int, stop: asyncio.Event) -> None:
        node = self.nodes[w % len(self.nodes)]
        process = self.history.new_process()
        while not stop.is_set():
            got, process = await self._receive_and_ack("", process, node)
            if got < 0:
                await asyncio.sleep(0.1)  # do not spin against a node that is down

    async def drain(self, high_offsets: dict[int, int]) -> dict[str, Any]:
        """Receive and ack until the group has finished every queue up to ``high_offsets``."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        process = self.history.new_process()
        rounds = errors = received = 0
        while time.monotonic() < deadline:
            node = self.nodes[rounds % len(self.nodes)]
            rounds += 1
            got, process = await self._receive_and_ack("drain-", process, node)
            if got < 0:
                errors += 1
                await asyncio.sleep(0.2)
                continue
            received += got
            if got == 0:
                behind = await self._behind(node, high_offsets)
                if behind == {}:
                    return {"complete": True, "rounds": rounds, "errors": errors, "received": received}
        behind = await self._behind(self.nodes[0], high_offsets)
        return {"complete": False, "rounds": rounds, "errors": errors, "received": received,
                "behind": behind}  # fmt: skip

    async def _behind(self, node: str, high_offsets: dict[int, int]) -> dict[str, Any] | None:
        """Queues whose committed offset for the group is below the high offset (None: unknown)."""
        params = {"topic": self.config.topic}
        out = await self.client.call(node, "GET", f"/v1/groups/{self.config.group}/offsets", params=params)
        if out.type != "ok":
            return None
        committed = {int(q): o for q, o in out.body.get("offsets", {}).items()}
        return {
            str(q): {"committed": committed.get(q), "high": high}
            for q, high in sorted(high_offsets.items())
            if high > 0 and (committed.get(q) or 0) < high
        }


def _detail(out: Outcome) -> dict[str, str]:
    return {"detail": out.detail} if out.detail else {}
