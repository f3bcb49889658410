"""HTTP routes of sealed segments and the Arrow fetch (``docs/spark.md``, ``docs/api.md``).

Public:

- ``GET /v1/topics/{topic}/segments``: the manifest. Per queue: ``low_offset``, ``high_offset``
  (committed, as applied by the queue group's leader) and the sealed segments still holding
  retained data, with where their files are (``arrow_path``/``parquet_path``: a path on the node
  that wrote them, or a URI of a shared store) and ``url``, which serves the bytes over HTTP.
- ``GET /v1/topics/{topic}/segments/{queue}/{base}?format=arrow|parquet``: one sealed segment's
  file. Any node answers: it reads the file (its own, or a shared store) or proxies the writer.

The Arrow fetch (``Accept: application/vnd.apache.arrow.stream`` on the fetch route) is an encoder of
the fetch core: ``cluster/api/handlers/fetch_arrow.py``.

Internal (peer key): ``GET /internal/groups/{group}/segments?topic_id=&queues=`` (the
manifest part of one queue group, from its leader) and ``POST /internal/segments/seal``
(seal every unsealed committed range of the groups this node leads now; tests and operators).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftmq.cluster.api.common import ResponseAborted, json_response
from raftmq.cluster.api.handlers.fetch_core import only_params, queue_number
from raftmq.cluster.api.validation import MAX_OFFSET, bad, query_int
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.machines.segments import manifest
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.router import FORWARDED
from raftmq.cluster.node.sealer import locate, segment_root

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore
    from raftmq.cluster.machines.metadata import Topic
    from raftmq.storage.segments import Readable

__all__ = ["ARROW_FILE", "CRC32C", "PARQUET", "SegmentsApi", "add_segment_routes"]

ARROW_FILE = "application/vnd.apache.arrow.file"
PARQUET = "application/vnd.apache.parquet"
CRC32C = "X-Raftmq-Crc32c"  # a segment file's checksum, as the manifest has it
# A segment passed on from the node that wrote it: how long its next bytes may take to come.
SEGMENT_PROXY_READ_S = 30.0


class SegmentsApi:
    def __init__(self, node: Node, api: ApiCore) -> None:
        self.node = node
        self.api = api

    # -- manifest ---------------------------------------------------------------------------------

    async def _group_manifest(self, g: int, topic: Topic, qs: list[int]) -> tuple[str | None, dict[int, Any]]:
        """(leader id, per-queue manifest) of queue group ``g``, read at its leader."""
        name = str(g)
        # Only a leader that serves reads answers (leader_reads.py): ``high_offset`` is then every
        # acknowledged message, not a follower's or a new leader's lagging replica's.
        if await self.api.router.reads_here(name):
            local = self.node.groups[name]
            return self.node.me.id, manifest(local.machine.store, topic.id, qs)
        query = f"topic_id={topic.id}&queues={','.join(map(str, qs))}"
        answer = await self.api.router.read_at_leader(
            name, f"/internal/groups/{name}/segments?{query}", timeout_s=10.0
        )
        # The answering leader names itself (a node of a release before that does not).
        known = self.node.leader_of(name)
        leader = answer.get("node") or (known.id if known is not None else None)
        return leader, {int(q): v for q, v in answer["queues"].items()}

    def _describe_segment(self, topic: Topic, q: int, s: dict[str, Any]) -> dict[str, Any]:
        writer = self._node_config(s["node"])
        root = segment_root(self.node.config.segments.store, writer) if writer else None
        http_url = (writer or self.node.me).http_url
        return {
            "base": s["base"],
            "end": s["end"],
            "rows": s["rows"],
            "bytes": s["bytes"],
            "crc32c": s["crc32c"],
            "parquet_crc32c": s["parquet_crc32c"],
            "node": s["node"],
            "first_timestamp_ms": s["first_ts_ms"],
            "last_timestamp_ms": s["last_ts_ms"],
            "arrow_path": locate(root, s["arrow"]) if root else None,
            "parquet_path": locate(root, s["parquet"]) if root and s["parquet"] else None,
            "url": f"{http_url}/v1/topics/{topic.name}/segments/{q}/{s['base']}",
        }

    def _node_config(self, node_id: str) -> Any:
        for n in self.node.config.nodes:
            if n.id == node_id:
                return n
        return None

    async def get_manifest(self, request: web.Request) -> web.Response:

        topic = await self.api.topic(request.match_info["topic"])
        only_params(request, set())
        by_group: dict[int, list[int]] = defaultdict(list)
        for q, g in enumerate(topic.queue_groups):
            by_group[g].append(q)
        parts = await asyncio.gather(*(self._group_manifest(g, topic, qs) for g, qs in by_group.items()))
        per_queue: dict[int, tuple[int, str | None, dict[str, Any]]] = {}
        for (g, _), (leader, got) in zip(by_group.items(), parts, strict=True):
            for q, info in got.items():
                per_queue[q] = (g, leader, info)
        out = []
        for q in range(topic.queues):
            g, leader, info = per_queue[q]
            segs = [self._describe_segment(topic, q, s) for s in info["segments"]]
            out.append(
                {
                    "queue": q,
                    "group_id": g,
                    "leader": leader,
                    "leader_url": (self._node_config(leader) or self.node.me).http_url if leader else None,
                    "low_offset": info["low_offset"],
                    "high_offset": info["high_offset"],
                    "sealed_end": segs[-1]["end"] if segs else info["low_offset"],
                    "segments": segs,
                }
            )
        settings = self.node.config.segments
        return json_response(
            {
                "topic": topic.name,
                "topic_id": topic.id,
                "shared_store": bool(settings.store),
                "queues": out,
            }
        )

    # -- one segment's bytes ----------------------------------------------------------------------

    async def get_segment(self, request: web.Request) -> web.StreamResponse:
        topic = await self.api.topic(request.match_info["topic"])
        q = queue_number(topic, request.match_info["queue"])
        base = query_int({"base": request.match_info["base"]}, "base", None, 0, MAX_OFFSET)
        only_params(request, {"format"})
        fmt = request.query.get("format", "arrow")
        if fmt not in ("arrow", "parquet"):
            raise bad("format must be 'arrow' or 'parquet'")
        _, got = await self._group_manifest(topic.queue_groups[q], topic, [q])
        entry = next((s for s in got[q]["segments"] if s["base"] == base), None)
        if entry is None:
            raise ApiError(errors.NOT_FOUND, f"queue {q} of {topic.name!r} has no sealed segment at {base}")
        rel = entry["arrow"] if fmt == "arrow" else entry["parquet"]
        if rel is None:
            raise ApiError(errors.NOT_FOUND, f"the segment at {base} has no {fmt} file")
        content_type = ARROW_FILE if fmt == "arrow" else PARQUET
        crc = entry["crc32c"] if fmt == "arrow" else entry["parquet_crc32c"]
        headers = {CRC32C: str(crc)}
        writer = self._node_config(entry["node"])
        settings = self.node.config.segments
        if entry["node"] == self.node.me.id or settings.store:
            from raftmq.storage.segments import SegmentStore

            store = (
                self.node.sealer.store
                if entry["node"] == self.node.me.id and self.node.sealer is not None
                else SegmentStore(segment_root(settings.store, writer or self.node.me))
            )
            try:
                opened, size = await asyncio.get_running_loop().run_in_executor(None, store.open_file, rel)
            except (FileNotFoundError, OSError):
                raise ApiError(
                    errors.NOT_FOUND, f"the {fmt} file of the segment at {base} is gone (retention?)"
                ) from None
            return await send_file(request, opened, size, content_type, headers)
        if writer is None or request.headers.get(FORWARDED):
            raise ApiError(errors.UNAVAILABLE, f"segment at {base} was written by {entry['node']}, not here")
        return await self.api.forward_to(
            request, writer, f"{writer.id}, which holds the segment", (CRC32C,), SEGMENT_PROXY_READ_S
        )

    # -- internal -----------------------------------------------------------------------------------

    async def internal_manifest(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        local = self.node.groups.get(name)
        if local is None or name == "meta":
            raise ApiError(errors.NOT_FOUND, f"node {self.node.me.id} hosts no replica of queue group {name}")
        topic_id = query_int(request.query, "topic_id", None, 0, 2**32 - 1)
        raw = request.query.get("queues", "")
        try:
            qs = [int(x) for x in raw.split(",") if x]
        except ValueError:
            raise bad("queues must be comma-separated queue numbers") from None
        if not await self.api.router.reads_here(name):
            raise ApiError(errors.NOT_LEADER, f"{self.node.me.id} does not lead group {name}")
        got = manifest(local.machine.store, topic_id, qs)
        return json_response({"node": self.node.me.id, "queues": {str(q): v for q, v in got.items()}})

    async def internal_seal(self, request: web.Request) -> web.Response:
        if self.node.sealer is None:
            raise ApiError(errors.UNAVAILABLE, "segment sealing is not running")
        results = await self.node.sealer.once(force=True)
        return json_response({"results": results})

    async def internal_gc(self, request: web.Request) -> web.Response:
        if self.node.sealer is None:
            raise ApiError(errors.UNAVAILABLE, "segment sealing is not running")
        loop = asyncio.get_running_loop()
        deleted = await loop.run_in_executor(None, self.node.sealer.collect_garbage)
        return json_response({"deleted": deleted})


def add_segment_routes(app: web.Application, s: SegmentsApi) -> None:
    """Register the segment routes of ``s``."""
    r = app.router
    r.add_get("/v1/topics/{topic}/segments", s.get_manifest)
    r.add_get("/v1/topics/{topic}/segments/{queue}/{base}", s.get_segment)
    r.add_get("/internal/groups/{group}/segments", s.internal_manifest)
    r.add_post("/internal/segments/seal", s.internal_seal)
    r.add_post("/internal/segments/gc", s.internal_gc)


SEND_PART_BYTES = 1 << 20


async def send_file(
    request: web.Request, opened: Readable, size: int, content_type: str, headers: dict[str, str]
) -> web.StreamResponse:
    """``opened`` (``size`` bytes) as the answer, a part of ``SEND_PART_BYTES`` at a time, each
    written before the next is read: a segment (up to ``segments.max_bytes``, 64 MiB) read whole
    was held for as long as its client took to read it, so many downloads that read slowly held
    their whole segments at once. A ``HEAD`` gets the headers only (aiohttp's ``StreamResponse``
    would send the whole file after them, read by the client as its next answer). A client that
    goes away (or is cut for not reading, ``limits.http_write_timeout_ms``) ends the answer; a
    file that ends short or fails to read (an ``OSError``) drops the connection, as no error can
    follow the first bytes (the error middleware wrote a whole 500 inside the 200's body). The
    file is closed in every case."""
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers=headers)
    response.content_type = content_type
    response.content_length = size
    try:
        await response.prepare(request)
        if request.method != "HEAD":
            await _send_parts(response, opened, size)
        await response.write_eof()
    except ConnectionError:  # the client left, or was cut: the rest has nowhere to go
        pass
    finally:
        await loop.run_in_executor(None, opened.close)
    return response


async def _send_parts(response: web.StreamResponse, opened: Readable, size: int) -> None:
    """Write ``size`` bytes of ``opened`` to the prepared ``response``, a part at a time."""
    loop = asyncio.get_running_loop()
    sent = 0
    while sent < size:
        try:
            part = await loop.run_in_executor(None, opened.read, min(SEND_PART_BYTES, size - sent))
        except OSError as e:  # a disk's EIO: the body cannot be completed
            raise ResponseAborted(f"reading the file failed at {sent} of its {size} bytes: {e!r}") from e
        if not part:
            raise ResponseAborted(f"the file ended at {sent} of its {size} bytes")
        await response.write(part)
        sent += len(part)
