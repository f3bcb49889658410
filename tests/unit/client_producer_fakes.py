"""The fake cluster and helpers the producer tests share (``test_client_producer.py``,
``test_client_accumulator.py``, ``test_client_producer_wire.py``): no sockets."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import orjson

from raftmq.batch import BATCH_MEDIA_TYPE, Limits, join_frames, split_frames, validate
from raftmq.client import (
    AsyncProducer,
    InvalidJson,
    RaftmqError,
)
from raftmq.client._accumulator import Accumulator
from raftmq.client._types import TopicDescription

__all__ = [
    "TOPIC",
    "FakeCluster",
    "append_message",
    "binary_request",
    "json_request",
    "run",
    "start_producer",
]


TOPIC = {
    "id": 1,
    "name": "t",
    "queues": [
        {"queue": q, "group_id": q % 3, "leader": "n1", "replicas": ["n1"], "low_offset": 0, "high_offset": 0}
        for q in range(4)
    ],
    "queue_groups": [0, 1, 2, 0],
    "retention_ms": None,
    "retention_bytes": None,
    "max_message_bytes": 100,
    "created_ms": 0,
}


class FakeCluster:
    """Answers produce requests from a script of outcomes (an exception, or None for success).

    It takes both wires as a node does: a binary body is split and validated with
    ``raftmq.batch`` (the format's own reader), a JSON body parsed; either is recorded in one
    shape in ``produced``: ``{"wire", "queue", "producer_id", "sequence", "values", "raw"}``.
    """

    def __init__(self, script: list[RaftmqError | None] | None = None, *, binary: bool = True) -> None:
        self.script = list(script or [])
        self.binary = binary  # False: refuse binary bodies as a node older than the format does
        self.produced: list[dict[str, Any]] = []  # every produce attempt
        self.refused = 0
        self.stored: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (pid, q) -> (seq, base, n)
        self.high: dict[int, int] = {}
        self.gate: asyncio.Event | None = None
        self.requests: list[list[int | None]] = []  # the queues of each request of several frames

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if path == "/v1/topics/t" and method == "GET":
            return TOPIC
        if path == "/v1/cluster":
            return {"node_id": "n1", "nodes": [{"id": "n1", "http": "127.0.0.1:1", "raft": ""}], "groups": []}
        assert (method, path) == ("POST", "/v1/topics/t/messages"), (method, path)
        binary = kw["content_type"] == BATCH_MEDIA_TYPE
        if binary and not self.binary:
            self.refused += 1
            raise InvalidJson("the body is not valid JSON")
        if binary and len(frames := split_frames(kw["body"])) > 1:
            return await self._frames(frames, kw)
        got = binary_request(kw["body"]) if binary else json_request(kw["body"])
        self.produced.append(got)
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, RaftmqError) and outcome.definite:
            raise outcome
        queue, n = got["queue"], len(got["values"])
        key = (got["producer_id"], queue)
        remembered = {s: (b, n) for s, b, n in self.stored.get(key, [])}
        duplicate = got["producer_id"] is not None and got["sequence"] in remembered
        if duplicate:
            base, _ = remembered[got["sequence"]]
        else:
            base = self.high.get(queue, 0)
            self.high[queue] = base + n
            self.stored.setdefault(key, []).append((got["sequence"], base, n))
        if outcome is not None:
            raise outcome  # stored, but the answer is lost
        if binary:
            r = {
                "queue": queue,
                "base_offset": base,
                "count": n,
                **({"duplicate": True} if duplicate else {}),
            }
            return {"results": [r]}
        return {"results": [{"queue": queue, "offset": base + i} for i in range(n)]}

    async def _frames(self, frames: list[Any], kw: dict[str, Any]) -> Any:
        """A request of several frames, as a node answers it: one result per frame (None where
        it failed), and the first failure as the error, with the results in its details. Each
        frame takes the script's next outcome, in order."""
        self.requests.append([f.queue for f in frames])
        results: list[Any] = []
        failure: RaftmqError | None = None
        for frame in frames:
            single = {**kw, "body": join_frames([(frame.queue, None, frame.batch)])}
            try:
                results.append((await self.request("POST", "/v1/topics/t/messages", **single))["results"][0])
            except RaftmqError as e:
                results.append(None)
                failure = failure or e
        if failure is not None:
            raise type(failure)(failure.message, {"results": results})
        return {"results": results}


def binary_request(body: bytes) -> dict[str, Any]:
    (frame,) = split_frames(body)  # the producer sends one frame per request
    view = validate(frame.batch, Limits())
    assert frame.queue is not None and frame.topic is None
    values = [
        (bytes(r.value) if r.binary else str(r.value, "utf-8"), r.key, r.headers) for r in view.records()
    ]
    return {
        "wire": "binary",
        "queue": frame.queue,
        "producer_id": view.producer_id,
        "sequence": view.base_sequence if view.producer_id is not None else None,
        "values": values,
        "raw": body,
    }


def json_request(body: bytes) -> dict[str, Any]:
    parsed = orjson.loads(body)
    queue = parsed["messages"][0]["queue"]
    assert all(m["queue"] == queue for m in parsed["messages"])
    values = [
        (m["value"] if "value" in m else base64.b64decode(m["value_b64"]), m.get("key"), m.get("headers"))
        for m in parsed["messages"]
    ]
    return {
        "wire": "json",
        "queue": queue,
        "producer_id": parsed.get("producer_id"),
        "sequence": parsed.get("sequence"),
        "values": values,
        "raw": body,
    }


async def start_producer(fake: FakeCluster, **settings: Any) -> AsyncProducer:
    producer = AsyncProducer("127.0.0.1:1", retry_backoff_ms=1, retry_backoff_max_ms=5, **settings)
    await producer.start()
    core = producer._core
    assert core is not None
    core.transport.request = fake.request  # type: ignore[method-assign]
    core.metadata.update_topic(TopicDescription.from_wire(TOPIC), time.monotonic())
    return producer


def run(coro: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro(), 10))


def append_message(
    acc: Accumulator, value: str | bytes, queue: int | None = 0, key: str | None = None
) -> Any:
    return acc.try_append("t", queue, 4, value, key, None, len(value), None, now_s=0.0)
