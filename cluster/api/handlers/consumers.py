"""``GET /v1/topics/{topic}/groups``: the consumer groups of a topic and their progress per queue.

For every consumer group with a committed offset or receive/ack state on the topic: per queue the
committed offset, the high offset, the lag, the messages in flight and waiting for a retry, and the
dead letters not redriven yet (``cluster/machines/views.py`` reads them from a queue group's store). Each
queue group's figures come from its leader (``/internal/groups/{g}/consumers``); queues whose
leader cannot be reached are listed in ``unavailable_queues`` instead of failing the request.
It is a monitoring read (the web console's consumer view), not a linearizable one.

``GET /v1/topics/{topic}/groups/lag``: each group's lag over the last minutes, as this node sampled
it (``cluster/node/lag_history.py``), so the console's charts have history when the page opens.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftmq.cluster.api.common import json_response
from raftmq.cluster.api.validation import bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.base.limits import MAX_DURATION_MS
from raftmq.cluster.machines.apply import group_now
from raftmq.cluster.machines.delivery import not_due
from raftmq.cluster.machines.views import ConsumerQueue, consumer_queues, queue_metas
from raftmq.cluster.node.lag_history import LagHistory, Lags, sample_forever
from raftmq.cluster.node.node import Node
from raftmq.storage.store import Store, StoreError

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["add_consumer_routes"]

_FIGURES = ("lag", "in_flight", "retrying", "dead_letters")


class _ConsumersApi:
    def __init__(self, node: Node, api: ApiCore) -> None:
        self.node = node
        self.api = api
        self.history = LagHistory(node.config.limits.lag_sample_ms)
        # Per queue group led here: every topic's consumer rows at an applied index.
        self._all_rows: dict[str, tuple[int, list[dict[str, Any]]]] = {}

    async def topic_groups(self, request: web.Request) -> web.Response:

        if request.query:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(request.query))}")
        topic = await self.api.topic(request.match_info["topic"])
        groups, unavailable = await self._groups(topic.id, topic.queue_groups)
        return json_response(
            {"topic": topic.name, "groups": list(groups.values()), "unavailable_queues": sorted(unavailable)}
        )

    async def lag_history(self, request: web.Request) -> web.Response:

        if request.query:
            raise bad(f"unknown query parameter(s): {', '.join(sorted(request.query))}")
        topic = await self.api.topic(request.match_info["topic"])
        series = self.history.of_topic(topic.id)
        return json_response(
            {
                "topic": topic.name,
                "node": self.node.me.id,
                "interval_ms": self.history.interval_ms,
                "history_ms": self.history.history_ms,
                "groups": [
                    {"group": g, "samples": [[t, lag] for t, lag in series[g]]} for g in sorted(series)
                ],
            }
        )

    async def sampled_lags(self) -> Lags:
        """Each consumer group's lag per topic id, for the history: the consumer rows of every
        queue group at once (from its leader), so a round costs the groups that exist, not the
        topics; a topic is left out when one of its queue groups did not answer (a gap, not a false
        dip) or this node has no metadata replica to know it."""
        machine = self.node.metadata
        if machine is None:
            return {}
        names = list(range(self.node.config.queue_groups))
        parts = await asyncio.gather(*(self._rows(g, None) for g in names))
        answered = {g for g, part in zip(names, parts, strict=True) if part is not None}
        by_id = {t.id: t for t in machine.topics()}
        lags: dict[int, dict[str, int]] = {}
        for g, part in zip(names, parts, strict=True):
            for r in part or ():
                topic = by_id.get(r["topic_id"])
                if (
                    topic is None
                    or r["queue"] >= len(topic.queue_groups)
                    or topic.queue_groups[r["queue"]] != g
                ):
                    continue  # a topic deleted meanwhile, or a row of a queue another group holds
                of_topic = lags.setdefault(topic.id, {})
                of_topic[r["group"]] = of_topic.get(r["group"], 0) + r["lag"]
        return {
            topic_id: sorted(groups.items())
            for topic_id, groups in lags.items()
            if answered.issuperset(by_id[topic_id].queue_groups)
        }

    async def _groups(
        self, topic_id: int, queue_groups: tuple[int, ...]
    ) -> tuple[dict[str, dict[str, Any]], list[int]]:
        by_group: dict[int, list[int]] = defaultdict(list)
        for q, g in enumerate(queue_groups):
            by_group[g].append(q)
        parts = await asyncio.gather(*(self._rows(g, topic_id) for g in by_group))
        rows: list[dict[str, Any]] = []
        unavailable: list[int] = []
        for g, part in zip(by_group, parts, strict=True):
            if part is None:
                unavailable += by_group[g]
            else:
                rows += [{**r, "group_id": g} for r in part if r["queue"] in by_group[g]]
        groups: dict[str, dict[str, Any]] = {}
        for r in sorted(rows, key=lambda r: (r["group"], r["queue"])):
            entry = groups.setdefault(
                r["group"], {"group": r["group"], **dict.fromkeys(_FIGURES, 0), "queues": []}
            )
            for f in _FIGURES:
                entry[f] += r[f]
            entry["queues"].append({k: r[k] for k in r if k not in ("group", "topic_id")})
        return groups, unavailable

    async def _rows(self, group_id: int, topic_id: int | None) -> list[dict[str, Any]] | None:
        """The consumer rows of one queue group at its leader (of one topic, or of all), or None
        if it cannot be asked."""
        name = str(group_id)
        query = "" if topic_id is None else f"?topic_id={topic_id}"
        try:
            # Only a leader that serves reads answers (leader_reads.py): a follower's or a new
            # leader's replica may lack acknowledged messages and commits, a lag that is not there.
            if await self.api.router.reads_here(name):
                return await self._local_rows(name, self.node.groups[name], topic_id)
            answer = await self.api.router.read_at_leader(
                name, f"/internal/groups/{name}/consumers{query}", timeout_s=3.0
            )
        except RaftmqError:
            return None
        rows: list[dict[str, Any]] = answer["rows"]
        return rows

    async def _local_rows(self, name: str, local: Any, topic_id: int | None) -> list[dict[str, Any]] | None:
        """The consumer rows of group ``name`` from this node's store (None: it is being swapped
        for a restored checkpoint). Every topic's rows (each node's lag round asks for them) are
        kept until the group applies another entry: an idle group is read once, not once per
        node and round."""
        index = local.machine.applied_index
        cached = self._all_rows.get(name)
        if topic_id is None and cached is not None and cached[0] == index:
            return cached[1]
        loop = asyncio.get_running_loop()
        try:
            rows = await loop.run_in_executor(None, _rows_of, local.machine.store, topic_id)
        except StoreError:  # the store is being swapped for a restored checkpoint
            return None
        if topic_id is None:
            self._all_rows[name] = (index, rows)
        return rows

    async def internal_consumers(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        local = self.node.groups.get(name)
        if local is None or not await self.api.router.reads_here(name):
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not lead group {name}")
        # Without topic_id: every topic's rows (the lag sampler's one read of the group).
        topic_id = (
            query_int(request.query, "topic_id", None, 0, 2**32 - 1) if "topic_id" in request.query else None
        )
        rows = await self._local_rows(name, local, topic_id)
        if rows is None:
            raise ApiError(errors.UNAVAILABLE, f"group {name} is restoring a checkpoint")
        answer: dict[str, Any] = {"rows": rows}
        if topic_id is not None and request.query.get("delayed") == "1":
            # The topic's delayed messages per queue (the SQS API's ApproximateNumberOfMessagesDelayed).
            delayed = await self._delayed(name, local, topic_id)
            if delayed is None:
                raise ApiError(errors.UNAVAILABLE, f"group {name} is restoring a checkpoint")
            answer["delayed"] = {str(q): n for q, n in delayed.items()}
        if topic_id is not None and "not_due_ms" in request.query:
            # Messages an ordered receive with this delay has not reached (an SQS FIFO queue's
            # delayed messages), of the consumer group not_due_group.
            delay_ms = query_int(request.query, "not_due_ms", None, 0, MAX_DURATION_MS)
            group = request.query.get("not_due_group", "")
            if not group:
                raise bad("'not_due_group' is required with not_due_ms")
            counted = await not_due_counts(local.machine.store, group, topic_id, delay_ms)
            if counted is None:
                raise ApiError(errors.UNAVAILABLE, f"group {name} is restoring a checkpoint")
            answer["not_due"] = {str(q): n for q, n in counted.items()}
        return json_response(answer)

    async def _delayed(self, name: str, local: Any, topic_id: int) -> dict[int, int] | None:
        """The delayed messages of ``topic_id`` per queue in this node's replica of group
        ``name``, one scan of the group shared by the asks (``delayed_counts.py``; None: the store
        is being swapped for a restored checkpoint)."""
        try:
            machine = local.machine
            return await self.api.delayed_counts.of(
                name, machine.store, lambda: machine.applied_index, topic_id
            )
        except StoreError:
            return None


_FIELDS = tuple(f.name for f in fields(ConsumerQueue))


def _rows_of(store: Any, topic_id: int | None) -> list[dict[str, Any]]:
    return [{f: getattr(r, f) for f in _FIELDS} for r in consumer_queues(store, topic_id)]


def add_consumer_routes(app: web.Application, node: Node, api: ApiCore) -> None:
    handlers = _ConsumersApi(node, api)
    app.router.add_get("/v1/topics/{topic}/groups", handlers.topic_groups)
    app.router.add_get("/v1/topics/{topic}/groups/lag", handlers.lag_history)

    async def start_sampling(app: web.Application) -> None:
        task = asyncio.create_task(
            sample_forever(
                handlers.history,
                handlers.sampled_lags,
                lambda: int(time.time() * 1000),
            )
        )

        async def stop(app: web.Application) -> None:
            task.cancel()

        app.on_cleanup.append(stop)

    app.on_startup.append(start_sampling)
    app.router.add_get("/internal/groups/{group}/consumers", handlers.internal_consumers)


async def not_due_counts(store: Store, group: str, topic_id: int, delay_ms: int) -> dict[int, int] | None:
    """Per queue of ``topic_id`` in ``store`` (a queue group led here): the messages an ordered
    receive of ``group`` with ``delay_ms`` has not reached because they are not due
    (``delivery.not_due``: a few reads per queue, off the event loop). None: the store is being
    swapped for a restored checkpoint."""
    loop = asyncio.get_running_loop()
    now = group_now(store, now_ms())  # due times are on the group's time

    def count() -> dict[int, int]:
        return {
            q: not_due(store, group, topic_id, q, now, delay_ms)
            for q in sorted(q for _, q in queue_metas(store, topic_id))
        }

    try:
        return await loop.run_in_executor(None, count)
    except StoreError:
        return None
