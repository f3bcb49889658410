"""Group commit for settlements: concurrent ``ack``, ``nack`` and ``extend`` requests for one queue
group become few Raft entries.

Receivers of a consumer group settle in batches, each batch a request to the leaders of the queue
groups holding its messages. A Raft entry costs about the same whatever it carries, so at the
leader, while ``max_inflight`` settlement entries of the group are on their way, new requests wait
and are then proposed together: one command per (op, topic, consumer group, fields), up to
``commands.MAX_RECEIPTS`` receipts. Under light load a request goes out at once (no linger).

Merging keeps each request's meaning: receipts are applied one by one in order, each with its own
result (a receipt named twice is settled once, the second gets ``stale_receipt`` as it would in a
later request), and the results go back to each request in its order. Requests with an ``epoch``
are never merged, since a stale epoch refuses a whole command. A failed entry fails every request
it carried alike (they share the topic, the group and the fields).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from raftmq.cluster import commands

__all__ = ["SettleCommitter"]

Propose = Callable[[bytes], Awaitable[dict[str, Any]]]
_Key = tuple[str, int, str, int | None, int | None]  # op, topic_id, group, delay_ms, visibility_ms


@dataclass
class _Request:
    receipts: list[list[int]]
    future: asyncio.Future[list[dict[str, Any]]]


class SettleCommitter:
    """Coalesces settlement requests for one queue group (use from the event loop only).

    Args:
        propose: Proposes a command to the group and returns its result (raising on failure).
        now_ms: The leader's clock, stamped into each command when it is proposed.
        max_inflight: Settlement entries on their way before requests accumulate.
    """

    def __init__(self, propose: Propose, now_ms: Callable[[], int], max_inflight: int = 1) -> None:
        self._propose = propose
        self._now_ms = now_ms
        self._max_inflight = max(1, max_inflight)
        self._inflight = 0
        self._waiting: dict[_Key, list[_Request]] = {}

    async def settle(
        self, op: str, topic_id: int, group: str, receipts: list[list[int]], fields: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Apply ``op`` to ``receipts`` (``[queue, offset, token]``, checked by the caller);
        ``fields``: ``delay_ms`` (nack) or ``visibility_ms`` (extend). One result per receipt.

        Raises:
            RaftmqError: the entry failed or the command was refused (for every merged request).
        """
        key: _Key = (op, topic_id, group, fields.get("delay_ms"), fields.get("visibility_ms"))
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(_Request(receipts, future))
        self._flush()
        return await future

    def _flush(self) -> None:
        while self._waiting and self._inflight < self._max_inflight:
            key = next(iter(self._waiting))
            queue = self._waiting[key]
            taken: list[_Request] = []
            count = 0
            while queue and (not taken or count + len(queue[0].receipts) <= commands.MAX_RECEIPTS):
                request = queue.pop(0)
                if not request.future.done():  # the caller went away
                    taken.append(request)
                    count += len(request.receipts)
            if not queue:
                del self._waiting[key]
            if taken:
                self._inflight += 1
                task = asyncio.create_task(self._run(key, taken))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _run(self, key: _Key, requests: list[_Request]) -> None:
        op, topic_id, group, delay_ms, visibility_ms = key
        fields = {"delay_ms": delay_ms, "visibility_ms": visibility_ms}
        command = orjson.dumps(
            {
                "v": commands.VERSION,
                "op": op,
                "now_ms": self._now_ms(),
                "group": group,
                "topic_id": topic_id,
                "receipts": [r for request in requests for r in request.receipts],
                **{k: v for k, v in fields.items() if v is not None},
            }
        )
        try:
            results = (await self._propose(command))["results"]
        except Exception as e:
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(e)
        else:
            start = 0
            for request in requests:
                end = start + len(request.receipts)
                if not request.future.done():
                    request.future.set_result(results[start:end])
                start = end
        finally:
            self._inflight -= 1
            self._flush()
