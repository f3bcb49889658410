"""The workload's view of the broker, through ``raftmq.client``, with every outcome classified.

Every call ends in an ``Outcome`` whose ``type`` is what the history records:

- ``ok``: the broker answered 2xx.
- ``fail``: it certainly did not happen: a :class:`~raftmq.client.RaftmqError` with ``definite``
  (an API error such as ``not_leader``, a connection that was never opened, a stopped node).
- ``info``: the outcome is unknown: ``definite`` is False (``timeout``, ``unknown_outcome``, a
  connection lost or timed out after the request went out, an answer that is not the API's).
  Reads get ``info`` on the same grounds as writes (Jepsen's rule), though they change nothing.

Two ways in, both the project's client:

- :class:`RaftmqBrokerClient`: one client ``Transport`` per node, pinned to it (one bootstrap
  address, no ``node_url``), a fresh connection per request (a pooled one to a restarted node
  would make a certain failure uncertain): every call is **one attempt at one node**, so the
  history shows each attempt and the node that served it. Produce (a one-record batch on the
  binary path, docs/format.md), fetch (the binary answer: the stored batches), receive, ack.
- :class:`ClientProducer`: the client's :class:`~raftmq.client.AsyncProducer` with every node as
  a bootstrap address (as a real client is configured; it starts at one of them at random, and
  the history records the nodes it addressed during each operation): idempotent, it sends to
  the queue's leader itself and retries retriable failures until its delivery timeout. One
  ``send_and_wait`` is one operation; the producer reports ``definite`` only when every attempt
  was (an earlier unknown outcome makes the result ``unknown_outcome``), so its outcomes are as
  honest as single attempts, only coarser.

Nodes advertise ``http://n1:8080``, a name that exists only inside the docker network; the
client's ``address_map`` turns it into the node's port on 127.0.0.1 (it changes when the container
restarts; a stopped node has none, and nothing is sent).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from raftmq.batch import BATCH_MEDIA_TYPE, BatchBuilder, join_frames
from raftmq.client import AsyncProducer, ConnectionFailed, RaftmqError
from raftmq.client.lowlevel import Batches, Transport, get_batches, path_part

__all__ = ["BrokerClient", "ClientProducer", "NodeDown", "Outcome", "RaftmqBrokerClient"]

HTTP_PORT = 8080


class NodeDown(Exception):
    """The node has no address now (its container is stopped): nothing was sent."""


@dataclass
class Outcome:
    type: str  # "ok" | "fail" | "info"
    error: str | None = None  # the error code (the API's, or the client's connection_* codes)
    body: dict[str, Any] = field(default_factory=dict)
    detail: str | None = None  # for connection errors: what the client saw


def advertised_url(node: str) -> str:
    return f"http://{node}:{HTTP_PORT}"


def _outcome(e: RaftmqError) -> Outcome:
    detail = e.message[-160:] if isinstance(e, ConnectionFailed) else None
    return Outcome("fail" if e.definite else "info", e.code, detail=detail)


class BrokerClient(Protocol):
    async def produce(self, node: str, topic: str, queue: int, value: str) -> Outcome:
        """Produce one message to ``queue`` through ``node``; ``body["offset"]`` on ok."""

    async def fetch(
        self, node: str, topic: str, queue: int, offset: int, max_messages: int, wait_ms: int, read_from: str
    ) -> Outcome:
        """Read ``queue`` from ``offset`` through ``node``; ``body["messages"]`` on ok."""

    async def receive(
        self, node: str, topic: str, group: str, max_messages: int, wait_ms: int, visibility_ms: int
    ) -> Outcome:
        """Receive/ack: hand out messages with receipts; ``body["messages"]`` on ok."""

    async def ack(self, node: str, topic: str, group: str, receipts: Sequence[str]) -> Outcome:
        """Finish received messages; ``body["results"]`` (one per receipt) on ok."""

    async def call(
        self, node: str, method: str, path: str, body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
    ) -> Outcome:  # fmt: skip
        """Any other API call, one attempt at ``node``."""

    def producer(self, node: str) -> ClientProducer: ...

    async def close(self) -> None: ...


class RaftmqBrokerClient:
    """``BrokerClient`` over ``raftmq.client``. ``url_of(node)`` gives the node's current base URL
    from the host or raises ``NodeDown``."""

    def __init__(self, url_of: Callable[[str], str], nodes: Sequence[str], timeout_s: float = 3.0,
                 producer_delivery_timeout_s: float = 6.0) -> None:  # fmt: skip
        self._url_of = url_of
        self._nodes = list(nodes)
        self._timeout_ms = int(timeout_s * 1000)
        self._delivery_timeout_ms = int(producer_delivery_timeout_s * 1000)
        self._transports: dict[str, Transport] = {}
        self._producers: list[ClientProducer] = []

    def address_map(self, url: str) -> str | None:
        """``http://n2:8080`` -> ``http://127.0.0.1:<port>``, or None while n2 is stopped."""
        node = urlsplit(url).hostname or ""
        try:
            return self._url_of(node)
        except NodeDown:
            return None

    def _transport(self, node: str) -> Transport:
        t = self._transports.get(node)
        if t is None:
            t = self._transports[node] = Transport(
                [advertised_url(node)],
                request_timeout_ms=self._timeout_ms,
                address_map=self.address_map,
                keep_alive=False,
            )
        return t

    async def call(
        self, node: str, method: str, path: str, body: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None, extra_timeout_ms: int = 0,
    ) -> Outcome:  # fmt: skip
        try:
            answer = await self._transport(node).request(
                method, path, body=body, params=params, idempotent=False, extra_timeout_ms=extra_timeout_ms
            )
        except RaftmqError as e:
            return _outcome(e)
        return Outcome("ok", body=answer if isinstance(answer, dict) else {"answer": answer})

    async def produce(self, node: str, topic: str, queue: int, value: str) -> Outcome:
        """One attempt on the binary path (a one-record batch, docs/format.md), as the client's
        producer sends; ``body["offset"]`` on ok."""
        batch = BatchBuilder()
        batch.append(value)
        body = join_frames([(queue, None, batch.finish())])
        try:
            answer = await self._transport(node).request(
                "POST",
                f"/v1/topics/{path_part(topic)}/messages",
                body=body,
                idempotent=False,
                content_type=BATCH_MEDIA_TYPE,
            )
        except RaftmqError as e:
            return _outcome(e)
        return Outcome("ok", body={"offset": answer["results"][0]["base_offset"]})

    async def fetch(
        self, node: str, topic: str, queue: int, offset: int, max_messages: int, wait_ms: int, read_from: str
    ) -> Outcome:
        params: dict[str, str | int] = {
            "offset": offset, "max": max_messages, "wait_ms": wait_ms, "read_from": read_from
        }  # fmt: skip
        path = f"/v1/topics/{path_part(topic)}/queues/{queue}/messages"
        try:
            answer = await get_batches(
                self._transport(node), path, params, node_url=None, extra_timeout_ms=wait_ms
            )
        except RaftmqError as e:
            return _outcome(e)
        if not isinstance(answer, Batches):  # a node that answered JSON
            return Outcome("ok", body=answer)
        return Outcome("ok", body=fetched(answer, offset, max_messages))

    async def receive(
        self, node: str, topic: str, group: str, max_messages: int, wait_ms: int, visibility_ms: int
    ) -> Outcome:
        body = {"max": max_messages, "wait_ms": wait_ms, "visibility_ms": visibility_ms}
        path = f"/v1/topics/{path_part(topic)}/subscriptions/{path_part(group)}/receive"
        return await self.call(node, "POST", path, body=body, extra_timeout_ms=wait_ms)

    async def ack(self, node: str, topic: str, group: str, receipts: Sequence[str]) -> Outcome:
        path = f"/v1/topics/{path_part(topic)}/subscriptions/{path_part(group)}/ack"
        return await self.call(node, "POST", path, body={"receipts": list(receipts)})

    def producer(self, node: str) -> ClientProducer:
        bootstrap = [node, *(n for n in self._nodes if n != node)]
        p = ClientProducer(bootstrap, self.address_map, self._timeout_ms, self._delivery_timeout_ms)
        self._producers.append(p)
        return p

    async def close(self) -> None:
        for p in self._producers:
            await p.close()
        for t in self._transports.values():
            await t.close()
        self._transports.clear()


def fetched(answer: Batches, offset: int, max_messages: int) -> dict[str, Any]:
    """A binary fetch answer in the JSON answer's shape (``messages``: ``offset`` and ``value``
    or ``value_b64``; ``next_offset``, ``high_offset``), which the history records. The records
    below ``offset`` (the first batch may begin before it) and past ``max_messages`` are left out,
    as the JSON answer does; so are records whose TTL ran out (the workload sets none)."""
    messages: list[dict[str, Any]] = []
    for view in answer.views:
        for r in view.records(offset, max_messages - len(messages)):
            value = (
                {"value_b64": base64.b64encode(r.value).decode()} if r.binary else {"value": r.value.decode()}
            )
            messages.append({"offset": r.offset, **value})
    return {"messages": messages, "next_offset": answer.next_offset, "high_offset": answer.high_offset}


class ClientProducer:
    """An idempotent :class:`~raftmq.client.AsyncProducer` over the ``bootstrap`` nodes.
    ``contacted`` lists the nodes its client addressed (metadata included), in order."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        address_map: Callable[[str], str | None],
        timeout_ms: int,
        delivery_timeout_ms: int,
    ) -> None:
        self.node = bootstrap[0]
        self.contacted: list[str] = []
        self._address_map = address_map
        self._producer = AsyncProducer(
            [advertised_url(n) for n in bootstrap],
            linger_ms=0,
            request_timeout_ms=timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=50,
            retry_backoff_max_ms=500,
            address_map=self._map,
        )

    def _map(self, url: str) -> str | None:
        node = urlsplit(url).hostname or "?"
        if not self.contacted or self.contacted[-1] != node:
            self.contacted.append(node)
        return self._address_map(url)

    async def produce(self, topic: str, queue: int, value: str) -> Outcome:
        """One ``send_and_wait``; ``body["offset"]`` on ok."""
        try:
            meta = await self._producer.send_and_wait(topic, value, queue=queue)
        except RaftmqError as e:
            return _outcome(e)
        return Outcome("ok", body={"offset": meta.offset})

    async def close(self) -> None:
        await self._producer.close(timeout_s=2.0)
