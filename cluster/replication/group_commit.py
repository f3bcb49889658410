"""Group commit: concurrent produce requests for one queue group become few Raft entries.

While ``max_inflight`` entries of a group are on their way through Raft, new requests wait and are
then proposed together as one entry (up to ``max_entry_bytes``). Under light load a request goes out
at once (no linger); under heavy load entries grow, so the per-entry costs (fsync, pickling,
encryption, one RocksDB write per replica) are shared by many requests.

Runs on the asyncio loop; Raft outcomes come back from the tick thread via ``call_soon`` (the
loop's ``call_soon_threadsafe``, or the node's ``LoopCalls``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ProduceFailed
from raftmq.cluster.replication.raft import Outcome, RaftGroup
from raftmq.cluster.replication.upgrade import to_json_batch

__all__ = ["GroupCommitter", "ProduceFailed"]


AppendItem = tuple[int, int, bytes | memoryview]
"""A binary batch to append: ``(topic_id, queue, batch bytes)`` (format v2, docs/format.md)."""

BinaryGate = Callable[[], bool]
"""Whether every voter of the group reads binary ``append`` commands (docs/format.md, rolling
upgrades); until then binary batches are proposed as JSON ``produce`` commands."""

TakeGate = Callable[[], bool]
"""Whether every voter of the group applies ``append.take`` (a binary append's take-along); asked
again when the entry is proposed, since the voters may have changed while the request waited."""


@dataclass
class _Request:
    batches: list[dict[str, Any]]  # JSON produce batches (empty for a binary request)
    size: int
    future: asyncio.Future[list[dict[str, Any]]]
    items: list[AppendItem] | None = None  # binary batches: proposed in an ``append`` command
    solo: bool = False  # propose alone (after a merged entry holding it was rejected)
    take: dict[str, Any] | None = None  # an ``append.take`` take-along (at most one an entry)
    taken: dict[str, Any] | None = None  # its result's token and messages, once applied

    @property
    def delayed_json(self) -> bool:
        """A JSON request carrying a delayed message (it is proposed alone: see ``_flush``)."""
        return any("deliver_at_ms" in m for b in self.batches for m in b["messages"])

    @property
    def count(self) -> int:
        return len(self.batches) if self.items is None else len(self.items)


class GroupCommitter:
    """Coalesces produce requests for one queue group. Not thread-safe: use from the loop only."""

    def __init__(
        self,
        group: RaftGroup,
        loop: asyncio.AbstractEventLoop,
        *,
        now_ms: Callable[[], int],
        max_entry_bytes: int,
        max_inflight: int,
        ack_before_replication: bool = False,
        binary_ok: BinaryGate = lambda: True,
        take_ok: TakeGate = lambda: True,
        call_soon: Callable[..., None] | None = None,
    ) -> None:
        self._group = group
        self._loop = loop
        # How an outcome reaches the loop from the tick thread (the node's LoopCalls).
        self._call_soon = call_soon or loop.call_soon_threadsafe
        self._now_ms = now_ms
        self._max_entry_bytes = max_entry_bytes
        self._max_inflight = max(1, max_inflight)
        self._pending: deque[_Request] = deque()
        self._inflight = 0
        self._ack_early = ack_before_replication
        self._binary_ok = binary_ok
        self._take_ok = take_ok

    async def produce(self, batches: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
        """Propose ``batches`` (commands.produce batch dicts); one result per batch, in order.

        Raises ProduceFailed when the entry failed or was rejected.
        """
        future: asyncio.Future[list[dict[str, Any]]] = self._loop.create_future()
        self._pending.append(_Request(batches, size, future))
        self._flush()
        if self._ack_early:  # TEST FAULT: the answer does not wait for replication
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            return [{"queue": b["queue"], "base_offset": None, "count": len(b["messages"])} for b in batches]
        return await future

    async def append(self, items: list[AppendItem], size: int) -> list[dict[str, Any]]:
        """Propose binary batches (checked by ``raftmq.batch.validate``); one result per item, in
        order, as :meth:`produce`. Binary requests are merged with each other, never with JSON
        ones (one entry is one command).

        Raises ProduceFailed when the entry failed or was rejected.
        """
        return await self._append(_Request([], size, self._loop.create_future(), items))

    async def append_taking(
        self, items: list[AppendItem], size: int, take: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """:meth:`append` with a take-along (``append.take``; the caller checked that every voter
        applies it, and ``take_ok`` is asked again when the entry is proposed), at most one an
        entry (a second one's request waits for the next entry): the results and the take-along's
        ``{"token", "messages"}`` (none when the entry went without it: proposed as a JSON
        ``produce``, a rolling upgrade from before binary appends, or a voter that does not apply
        ``append.take`` joined while the request waited)."""
        request = _Request([], size, self._loop.create_future(), items, take=take)
        results = await self._append(request)
        return results, request.taken or {"token": 0, "messages": []}

    async def _append(self, request: _Request) -> list[dict[str, Any]]:
        future, items = request.future, request.items or []
        self._pending.append(request)
        self._flush()
        if self._ack_early:  # TEST FAULT: the answer does not wait for replication
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            return [{"queue": q, "base_offset": None, "count": len(rb.read(b))} for _, q, b in items]
        return await future

    def _flush(self) -> None:
        while self._pending and self._inflight < self._max_inflight:
            taken = [self._pending.popleft()]
            size = taken[0].size
            binary = taken[0].items is not None
            # The JSON produce command keys a delayed message by its position in its own batch:
            # two requests' batches for one queue in one entry, with equal due times, would share
            # a key and one message would be lost. So a JSON request with a delayed message, and
            # binary requests proposed as JSON (a rolling upgrade), go alone. (The binary append
            # keys by the position in the whole command.)
            alone = taken[0].delayed_json or (binary and not self._binary_ok())
            take = taken[0].take is not None
            while (
                not alone
                and not taken[0].solo
                and self._pending
                and not self._pending[0].solo
                and not self._pending[0].delayed_json
                and (self._pending[0].items is not None) == binary
                and not (take and self._pending[0].take is not None)  # one take-along an entry
                and size + self._pending[0].size <= self._max_entry_bytes
            ):
                request = self._pending.popleft()
                taken.append(request)
                size += request.size
                take = take or request.take is not None
            self._propose([r for r in taken if not r.future.done()])

    def _propose(self, requests: list[_Request]) -> None:
        if not requests:
            return
        now_ms = self._now_ms()
        if requests[0].items is None:
            command = commands.produce(now_ms, [b for r in requests for b in r.batches])
        elif self._binary_ok():
            take = next((r.take for r in requests if r.take is not None), None)
            if take is not None and not self._take_ok():
                # A voter that does not apply append.take joined while the request waited: it
                # would refuse a version 2 entry whole (the replicas diverge). The entry goes
                # without it: its batches stand, and its receives are served as before.
                take = None
            command = commands.append(now_ms, [item for r in requests for item in r.items or ()], take)
        else:  # a voter may not read binary commands yet (a rolling upgrade): the JSON command
            command = commands.produce(
                now_ms, [to_json_batch(now_ms, *item) for r in requests for item in r.items or ()]
            )
        self._inflight += 1

        def on_done(outcome: Outcome) -> None:  # tick thread
            self._call_soon(self._complete, requests, outcome)

        self._group.submit(command, on_done)

    def _complete(self, requests: list[_Request], outcome: Outcome) -> None:
        self._inflight -= 1
        result = outcome.result
        if outcome.error is None and isinstance(result, dict) and "error" in result and len(requests) > 1:
            # The state machine rejected the merged entry (all or nothing); retry each request
            # alone so one bad request cannot fail the others.
            for request in reversed(requests):
                request.solo = True
                self._pending.appendleft(request)
        else:
            result = outcome.result
            for request, value in zip(requests, self._split(requests, outcome), strict=True):
                if request.take is not None and isinstance(result, dict) and "messages" in result:
                    request.taken = {"token": result["token"], "messages": result["messages"]}
                if request.future.done():
                    continue  # the caller timed out or went away
                if isinstance(value, ProduceFailed):
                    request.future.set_exception(value)
                else:
                    request.future.set_result(value)
        self._flush()

    @staticmethod
    def _split(requests: list[_Request], outcome: Outcome) -> list[list[dict[str, Any]] | ProduceFailed]:
        if outcome.error is not None:
            failed = ProduceFailed(
                errors.outcome_code(outcome.error, outcome.definite), f"raft: {outcome.error}"
            )
            return [failed] * len(requests)
        result = outcome.result
        if not isinstance(result, dict) or "results" not in result:
            error = result.get("error", {}) if isinstance(result, dict) else {}
            failed = ProduceFailed(
                errors.outcome_code(error.get("code", "internal"), True),
                error.get("message", "produce rejected"),
            )
            return [failed] * len(requests)
        results: list[dict[str, Any]] = result["results"]
        out: list[list[dict[str, Any]] | ProduceFailed] = []
        start = 0
        for request in requests:
            out.append(results[start : start + request.count])
            start += request.count
        return out
