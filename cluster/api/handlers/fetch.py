"""Reading over the HTTP API v1: fetch (``GET /v1/topics/{topic}/queues/{queue}/messages``: the
fetch core, ``fetch_core.py``, with the encoder ``Accept`` asks for: JSON by default,
``fetch_json.py``; stored record batches, ``fetch_batches.py``; Arrow IPC, ``fetch_arrow.py``) and
a consumer group's committed offsets (``PUT/GET /v1/groups/{group}/offsets``).
"""

from __future__ import annotations

import urllib.parse
from collections import defaultdict

import orjson
import structlog
from aiohttp import web

from raftmq.cluster.api.common import group_name, json_response
from raftmq.cluster.api.core import ApiCore, GroupRecords
from raftmq.cluster.api.handlers.fetch_arrow import ARROW
from raftmq.cluster.api.handlers.fetch_batches import BATCHES
from raftmq.cluster.api.handlers.fetch_core import Encoder, encoder_for, serve_fetch
from raftmq.cluster.api.handlers.fetch_json import JSON
from raftmq.cluster.api.validation import bad, parse_json
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, RaftmqError
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node.router import body_error, peer_call
from raftmq.storage.queues import committed_offset

__all__ = ["ENCODERS", "FetchHandlers"]

# The fetch answers a request may ask for by its Accept header, in this order; otherwise JSON.
ENCODERS: tuple[Encoder, ...] = (ARROW, BATCHES)

log = structlog.get_logger(__name__)


class FetchHandlers(ApiCore):
    """Fetch and offsets handlers, mixed into ``Api`` (``cluster/api/app.py``)."""

    # The consumer groups' subscription records, which the offset API keeps as receives do (a
    # commit under a new group counts against the same caps): Api's constructor sets it.
    group_records: GroupRecords

    async def fetch(self, request: web.Request) -> web.StreamResponse:
        return await serve_fetch(self, request, encoder_for(request, ENCODERS, JSON))

    # -- consumer group offsets -------------------------------------------------------------------

    async def put_offsets(self, request: web.Request) -> web.Response:
        group = group_name(request)
        body = parse_json(await request.read())
        if not isinstance(body, dict) or set(body) - {"topic", "offsets", "epoch", "advance"}:
            raise bad(
                'body must be {"topic": str, "offsets": {"<queue>": offset}, "epoch"?: int, "advance"?: bool}'
            )
        # advance: a consumer's commit, applied per queue only where it moves the offset forward
        # (a late copy of an older commit is kept out); without it, an explicit set (a rewind).
        advance = body.get("advance", False)
        if not isinstance(advance, bool):
            raise bad("'advance' must be true or false")
        epoch = body.get("epoch")  # an ordered consumer's lock epoch: the commit is fenced
        if "epoch" in body and (
            not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 2**63
        ):
            raise bad("'epoch' must be a non-negative integer")
        name = body.get("topic")
        if not isinstance(name, str):
            raise bad("'topic' must be a topic name")
        topic = await self.topic(name)
        offsets = body.get("offsets")
        if not isinstance(offsets, dict) or not offsets:
            raise bad("'offsets' must be a non-empty object of queue -> offset")
        by_group: dict[int, dict[str, int]] = defaultdict(dict)
        for k, v in offsets.items():
            # ASCII digits only (str.isdigit() also accepts e.g. "²", which int() refuses), and
            # few of them (int() refuses more than 4300 digits).
            if not (k.isascii() and k.isdigit() and len(k) <= 10) or int(k) >= topic.queues:
                raise ApiError(errors.QUEUE_NOT_FOUND, f"topic {topic.name!r} has no queue {k!r}")
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**63:
                raise bad(f"offset for queue {k} must be a non-negative integer")
            by_group[topic.queue_groups[int(k)]][str(int(k))] = v
        known = self.group_records.known(topic, group)
        if len(by_group) > 1 or not known:
            # One commit per queue group: check every offset first, so that a request is not
            # half-applied when a later group refuses its part, and leaves no group record behind.
            # high_offset only grows, so an offset accepted here is still in range when its commit
            # applies.
            await self._check_offsets(
                topic, {int(q): o for offs in by_group.values() for q, o in offs.items()}
            )
        if not known:
            await self._record_group(topic, group, request)
        answer: dict[str, dict[str, int | bool]] = {}
        for g, offs in by_group.items():
            commit: dict[str, object] = {"group": group, "topic_id": topic.id, "offsets": offs}
            if advance:
                commit["advance"] = True
            if epoch is None:
                result = await self.router.group_call(g, "commit", commit)
            else:
                # The fenced commit's body becomes its command's fields at the leader: a leader of a
                # release before advance refuses the field, so it goes only once every voter has it
                # (until then the commit is a set, as the unfenced commit's leader decides itself).
                if advance and not await self.node.await_group_supports(str(g), "commit_offsets.advance"):
                    commit.pop("advance")
                result = await self.router.group_call(g, "commit_fenced", {**commit, "epoch": epoch})
            applied = result.get("offsets") or {}  # a leader of an older release answers {"ok": true}
            for q, o in offs.items():
                answer[q] = applied.get(q) or {"offset": o, "applied": True}
        return json_response({"ok": True, "offsets": answer})

    async def _record_group(self, topic: Topic, group: str, request: web.Request) -> None:
        """Keep the committing group as a receive's is (docs/delivery.md, "Subscriptions and their
        bounds"): a new one counts against the caps (409 ``too_many_groups``, nothing stored), made
        by the request's token; an unconfigured group's offsets expire once unused. While a voter
        runs a release that cannot record a new unconfigured group (503 ``upgrade_in_progress``), a
        group that has committed offsets on the topic already commits on as it did there; a new
        one is refused."""
        try:
            await self.group_records.ensure_subscription(topic, group, request)
        except RaftmqError as e:
            if e.error is not errors.UPGRADE_IN_PROGRESS:
                raise
            if all(o is None for o in (await self._committed(topic, group)).values()):
                raise

    async def _check_offsets(self, topic: Topic, offsets: dict[int, int]) -> None:
        described = await self._describe(topic)
        for q, offset in offsets.items():
            info = described["queues"][q]
            low, high = info["low_offset"], info["high_offset"]
            if high is None:
                raise ApiError(errors.UNAVAILABLE, f"cannot read the bounds of queue {q} now")
            if offset > high:
                raise ApiError(
                    errors.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is above high_offset {high} of queue {q}",
                    queue=q,
                    offset=offset,
                    low_offset=low,
                    high_offset=high,
                )

    async def get_offsets(self, request: web.Request) -> web.Response:
        group = group_name(request)
        if not request.query.get("topic"):
            raise bad("query parameter 'topic' is required")
        topic = await self.topic(request.query["topic"])
        result = await self._committed(topic, group)
        if any(o is not None for o in result.values()):
            await self._offsets_read(topic, group)
        return json_response({"group": group, "topic": topic.name, "offsets": result})

    async def _committed(self, topic: Topic, group: str) -> dict[str, int | None]:
        """``group``'s committed offset of each queue of ``topic`` (None: none), read at each
        queue group's leader after a barrier (linearizable), listed by queue as a reader expects."""
        result: dict[str, int | None] = {}
        for g in sorted(set(topic.queue_groups)):
            name = str(g)
            queues = [q for q, qg in enumerate(topic.queue_groups) if qg == g]
            if self.router.leads(name):
                await self.router.barrier(name)  # linearizable: a (shared) barrier first
                store = self.node.groups[name].machine.store
                for q in queues:
                    result[str(q)] = committed_offset(store, group, topic.id, q)
            else:
                leader = await self.router.wait_leader(name, 3.0)
                query = urllib.parse.urlencode({"group": group, "topic_id": topic.id})
                with peer_call("GET", f"the leader {leader.id} of group {name}"):
                    status, data, _ = await self.node.peer_request(
                        "GET", leader, f"/internal/groups/{name}/offsets?{query}"
                    )
                    if status != 200:
                        raise body_error(status, data)
                    got = orjson.loads(data)["offsets"]
                for q in queues:
                    result[str(q)] = got.get(str(q))
        return {str(q): result[str(q)] for q in range(len(topic.queue_groups))}  # in queue order

    async def _offsets_read(self, topic: Topic, group: str) -> None:
        """A read of ``group``'s committed offsets is a use: its record is refreshed (at most once
        a minute per node), so the offsets of a consumer that reads them do not expire
        (``limits.offset_retention_ms``). Offsets committed before groups were recorded get their
        record here, made by no token (only the topic's cap counts it). The read is answered even
        when the refresh fails (over the topic's cap, during an upgrade, a leader change): the
        next read tries again."""
        try:
            await self.group_records.ensure_subscription(topic, group, None)
        except RaftmqError as e:
            log.info("offsets_read_not_recorded", topic=topic.name, group=group, error=e.error.code)
