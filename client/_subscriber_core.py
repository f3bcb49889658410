"""The subscriber's core, in one event loop: received messages, batched settlement, the receive
(long poll) source and the lifecycle. The push source is ``_push_source.py``; the asyncio and sync
APIs are ``_subscriber.py``.

Flow control: at most ``max_in_flight`` messages are received and not yet settled (acked or
nacked; a message past its deadline no longer counts, since it is redelivered anyway). In poll
mode the core asks for no more than that; in push mode the stream's credit (RDY), which the node
enforces, is what the messages of earlier streams leave of it (``_push_source.py``).

Settlements over HTTP (poll mode, and push mode when the stream is gone) go straight to the leader
of each message's queue group, as the client's cached metadata has it (one request per leader and
op); any node forwards them there anyway, so a stale guess costs a hop, never a result.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from ._api import connect
from ._metadata import ClusterMetadata
from ._push_source import PushSource
from ._received import ReceivedMessage, SettleOp
from ._retry import retrying
from ._subscriber_config import (
    MAX_RECEIPTS,
    ROUTES_MAX_AGE_S,
    SubscriberConfig,
    SubscriberStats,
    now_ms,
    receiving_may_retry,
    wait_event,
)
from ._transport import path_part
from .errors import RaftmqError, UnexpectedResponse

__all__ = ["SubscriberCore"]

log = structlog.get_logger(__name__)


class SubscriberCore:
    """Create and use inside one event loop (the sync subscriber runs it in its I/O thread)."""

    def __init__(self, bootstrap: str | Sequence[str], config: SubscriberConfig) -> None:
        config.check()
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.api = connect(
            bootstrap, config, retry_timeout_ms=config.retry_timeout_ms, address_map=config.address_map
        )
        self.transport, self.backoff = self.api.transport, self.api.backoff
        self.stats = SubscriberStats()
        self.buffer: deque[ReceivedMessage] = deque()  # received, not handed out yet
        self.arrived = asyncio.Event()
        # Invariant: unsettled holds every received message not yet acked or nacked (receipt ->
        # deadline_ms); those past their deadline are dropped when the room is counted.
        self.unsettled: dict[str, int] = {}
        self.room_changed = asyncio.Event()
        # Settlements to send, per (op, value, queue): the queue says which leader takes them.
        self.pending: dict[tuple[SettleOp, int | None, int], list[str]] = {}
        self.queued = 0
        self.flush_now = asyncio.Event()
        self.flushed = asyncio.Condition()
        self.sending = False
        self.error: RaftmqError | None = None  # why the source stopped for good
        self.closing = False
        self.closed = False
        self.push = PushSource(self) if config.mode == "push" else None
        self._tasks: list[asyncio.Task[None]] = []
        push_threshold = max(1, config.max_in_flight // 2)  # the node frees credit on FIN/REQ
        self.flush_threshold = (
            min(config.ack_batch_size, push_threshold) if self.push else config.ack_batch_size
        )
        # A receive waits until this many fit: asking as soon as one message was settled makes
        # receives of a message or two, each a request and a Raft entry on the nodes.
        self.receive_threshold = max(1, config.max_in_flight // 2)
        # Settlements made on other threads, handed to the loop with one wake-up per burst (a
        # wake-up per message costs more than the rest of an ack).
        self._incoming: deque[tuple[str, int, SettleOp, int | None]] = deque()
        self._drain_scheduled = False
        # Where settlements go: the leader of each queue's group (refreshed in the background).
        self.metadata = ClusterMetadata()
        self._routes_at: float | None = None  # monotonic time of the last refresh (None: never)
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Check that the topic exists (a missing one raises TopicNotFound here) and start."""
        await self.api.call("GET", f"/v1/topics/{path_part(self.config.topic)}", idempotent=True)
        self._refresh_routes_soon()  # where settlements go
        source = asyncio.create_task(self.push.run() if self.push is not None else self._poll_forever())
        source.add_done_callback(self._source_ended)
        self._tasks = [source, asyncio.create_task(self._flush_forever())]

    def _source_ended(self, task: asyncio.Task[None]) -> None:
        """A source that died of an unexpected exception (an answer that is not raftmq's) stops
        the subscriber with an error; else iteration would wait forever."""
        if task.cancelled() or task.exception() is None or self.error is not None:
            return
        e = task.exception()
        self.fail(UnexpectedResponse(f"receiving stopped: {type(e).__name__}: {e}"))

    # -- receiving --------------------------------------------------------------------------------

    def deliver(self, messages: list[dict[str, Any]]) -> None:
        """Take messages from the cluster (a receive answer or a push frame)."""
        for m in messages:
            message = ReceivedMessage.from_wire(self.config.topic, m, self)
            self.buffer.append(message)
            self.unsettled[message.receipt] = message.deadline_ms
        self.stats.received += len(messages)
        if messages:
            self.arrived.set()

    def room(self) -> int:
        now = now_ms()
        for receipt in [r for r, deadline in self.unsettled.items() if deadline <= now]:
            del self.unsettled[receipt]
        return self.config.max_in_flight - len(self.unsettled)

    async def _poll_forever(self) -> None:
        config = self.config
        body: dict[str, Any] = {"wait_ms": config.wait_ms}
        if config.visibility_ms is not None:
            body["visibility_ms"] = config.visibility_ms
        failures = 0
        while not self.closing:
            self.room_changed.clear()
            room = self.room()
            if room < self.receive_threshold:
                timeout = max(0.001, (min(self.unsettled.values()) - now_ms()) / 1000)
                await wait_event(self.room_changed, timeout)
                continue
            try:
                answer = await self.transport.request(
                    "POST",
                    config.path + "/receive",
                    body={**body, "max": room},
                    idempotent=True,  # a repeated receive hands out other messages; none is lost
                    extra_timeout_ms=config.wait_ms,
                )
            except RaftmqError as e:
                failures += 1
                if await self.back_off(e, failures):
                    continue
                return
            failures = 0
            self.deliver(answer["messages"])

    async def back_off(self, error: RaftmqError, failures: int) -> bool:
        """After the ``failures``-th failed receive (or stream open) in a row: True once the backoff
        has passed, or False with the subscriber stopped if ``error`` is for good."""
        if not receiving_may_retry(error):
            self.fail(error)
            return False
        if not error.retriable:
            log.warning("subscriber_receive_failed", topic=self.config.topic, error=repr(error))
        await asyncio.sleep(self.backoff.delay_s(failures))
        return True

    def fail(self, error: RaftmqError) -> None:
        """The source stopped for good: iteration raises ``error`` once the buffer is empty."""
        log.warning("subscriber_failed", topic=self.config.topic, group=self.config.group, error=repr(error))
        self.error = error
        self.arrived.set()

    async def get_many(self, max_messages: int, timeout_s: float | None) -> list[ReceivedMessage]:
        """Up to ``max_messages``, waiting up to ``timeout_s`` (None: until one arrives or the
        subscriber is closed). [] on timeout or once closed; raises the source's error."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self.buffer:
                return [self.buffer.popleft() for _ in range(min(max_messages, len(self.buffer)))]
            if self.error is not None:
                raise self.error
            if self.closing:
                return []
            self.arrived.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            await wait_event(self.arrived, remaining)

    # -- settling ---------------------------------------------------------------------------------

    def settle(self, message: ReceivedMessage, op: SettleOp, value: int | None) -> None:
        """Queue a settlement (from any thread; after close it is dropped and the message comes
        back after its deadline)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._queue(message.receipt, message.queue, op, value)
        elif not self.loop.is_closed():
            # Appended before the flag is read: a drain that already ran re-arms, one that has
            # not run yet will find it.
            self._incoming.append((message.receipt, message.queue, op, value))
            if not self._drain_scheduled:
                self._drain_scheduled = True
                self.loop.call_soon_threadsafe(self._drain_incoming)

    def _drain_incoming(self) -> None:
        self._drain_scheduled = False
        while self._incoming:
            self._queue(*self._incoming.popleft())

    def _queue(self, receipt: str, queue: int, op: SettleOp, value: int | None) -> None:
        if self.closed:
            return
        if op != "extend":
            self.unsettled.pop(receipt, None)
            # The poll loop only needs waking once a receive's worth fits (waking it for each
            # settlement costs a count of the unsettled each time); the push stream's credit
            # follows every settlement.
            room = self.config.max_in_flight - len(self.unsettled)
            if self.push is not None or room >= self.receive_threshold:
                self.room_changed.set()
        self.pending.setdefault((op, value, queue), []).append(receipt)
        self.queued += 1
        if self.queued >= self.flush_threshold:
            self.flush_now.set()
        elif self.queued == 1:
            self.loop.call_later(self.config.ack_interval_ms / 1000, self.flush_now.set)

    async def _flush_forever(self) -> None:
        while True:
            await self.flush_now.wait()
            self.flush_now.clear()
            batch, self.pending, self.queued = self.pending, {}, 0
            self.sending = True
            try:
                await asyncio.gather(
                    *(
                        self._send(op, value, receipts[i : i + MAX_RECEIPTS], url)
                        for (op, value, url), receipts in self._by_target(batch).items()
                        for i in range(0, len(receipts), MAX_RECEIPTS)
                    )
                )
            finally:
                self.sending = False
                async with self.flushed:
                    self.flushed.notify_all()

    def _by_target(
        self, batch: dict[tuple[SettleOp, int | None, int], list[str]]
    ) -> dict[tuple[SettleOp, int | None, str | None], list[str]]:
        """The batch per (op, value, node to send to): the leader of the queue's group over HTTP
        (None: unknown, any node), or one request per (op, value) over the push stream."""
        out: dict[tuple[SettleOp, int | None, str | None], list[str]] = {}
        routed = self.push is None or self.push.ws is None
        if routed:
            self._refresh_routes_soon()
        for (op, value, queue), receipts in batch.items():
            url = self.metadata.leader_url(self.config.topic, queue) if routed else None
            out.setdefault((op, value, url), []).extend(receipts)
        return out

    def _refresh_routes_soon(self, force: bool = False) -> None:
        """Reload the topic's leaders (and the node addresses) in the background when they are
        older than ``ROUTES_MAX_AGE_S`` (or ``force``: a settlement failed)."""
        if self._refresher is not None or self.closed:
            return
        at = self._routes_at
        if not force and at is not None and time.monotonic() - at < ROUTES_MAX_AGE_S:
            return
        self._routes_at = time.monotonic()
        self._refresher = asyncio.create_task(self._refresh_routes())

    async def _refresh_routes(self) -> None:
        try:
            await self.api.load_topic(self.metadata, self.config.topic)
        except Exception as e:  # (RaftmqError, a broken answer) settlements go to any node meanwhile
            log.debug("subscriber_routes_not_refreshed", topic=self.config.topic, error=repr(e))
        finally:
            self._routes_at = time.monotonic()
            self._refresher = None

    async def flush(self) -> None:
        """Send every settlement queued so far and wait for the answers."""
        async with self.flushed:
            while self.queued or self.sending:
                self.flush_now.set()
                await self.flushed.wait()

    async def _send(self, op: SettleOp, value: int | None, receipts: list[str], url: str | None) -> None:
        fields: dict[str, Any] = {}
        if op == "nack" and value is not None:
            fields["delay_ms"] = value
        elif op == "extend":
            fields["visibility_ms"] = value
        try:
            results = await self._settle_remote(op, receipts, fields, url)
        except Exception as e:  # (RaftmqError, or a broken answer) the flusher must go on
            self.stats.failed += len(receipts)
            log.warning("subscriber_settle_failed", op=op, receipts=len(receipts), error=repr(e))
            return
        stats = self.stats
        for r in results:
            if r.get("ok"):
                if op == "ack":
                    stats.acked += 1
                elif op == "nack":
                    stats.nacked += 1
                else:
                    stats.extended += 1
                    if r["receipt"] in self.unsettled:
                        self.unsettled[r["receipt"]] = r["deadline_ms"]
            elif r.get("error", {}).get("code") == "stale_receipt":
                stats.stale += 1
            else:
                stats.failed += 1

    async def _settle_remote(
        self, op: SettleOp, receipts: list[str], fields: Mapping[str, Any], url: str | None
    ) -> list[dict[str, Any]]:
        if self.push is not None:
            try:  # over the stream: that frees its credit
                return await self.push.settle(op, receipts, fields)
            except RaftmqError as e:
                if not e.retriable:
                    raise
                # No stream, it broke, or the node could not apply it now: settling is idempotent,
                # so it goes again over HTTP (with retries).
        node_url = url
        body = {"receipts": receipts, **fields}

        async def once() -> Any:
            return await self.transport.request(
                "POST", f"{self.config.path}/{op}", body=body, node_url=node_url, idempotent=True
            )

        def on_error(_: RaftmqError) -> None:
            nonlocal node_url
            node_url = None  # retries go to any node (the leader guess may be what failed)
            self._refresh_routes_soon(force=True)

        answer = await retrying(
            once,
            idempotent=True,
            timeout_ms=self.config.retry_timeout_ms,
            backoff=self.backoff,
            on_error=on_error,
        )
        results: list[dict[str, Any]] = answer["results"]
        return results

    # -- closing ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop receiving, give back the messages never handed out (nack, ``delay_ms`` 0), send
        the queued settlements, close the connections. Handed-out messages that were not settled
        stay in flight until their deadline."""
        if self.closing:
            return
        self.closing = True
        self.room_changed.set()
        self.arrived.set()
        if self.push is not None:
            await self.push.drain()  # no more pushes; what was pushed before is in the buffer
        elif self._tasks:
            # A long poll cut here may have been handed messages: they come back after their
            # visibility deadline (nothing is lost; waiting out wait_ms would make close slow).
            self._tasks[0].cancel()
            await asyncio.gather(self._tasks[0], return_exceptions=True)
        leftovers = list(self.buffer)
        self.buffer.clear()
        for message in leftovers:
            if message._claim():
                self._queue(message.receipt, message.queue, "nack", 0)
        try:
            await asyncio.wait_for(self.flush(), self.config.retry_timeout_ms / 1000 + 5)
        except TimeoutError:
            log.warning("subscriber_close_flush_timed_out", topic=self.config.topic)
        self.closed = True
        tasks = [*self._tasks, *([self._refresher] if self._refresher is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.push is not None:
            await self.push.close()
        await self.transport.close()
