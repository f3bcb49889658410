"""The producer: an accumulator of per-queue batches plus one background sender (asyncio).

:class:`ProducerCore` lives in one event loop. :class:`AsyncProducer` runs it in the caller's loop;
the sync :class:`~raftmq.client.Producer` runs it in a background loop thread and appends to the
(thread-safe) accumulator from the application's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as _ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._accumulator import Accumulator, Batch, Delivery, buffer_full, encode_message
from ._api import connect
from ._limits import MAX_MESSAGES
from ._metadata import ClusterMetadata, key_queue
from ._retry import may_retry, outcome_error
from ._transport import AddressMap, path_part
from ._types import RecordMetadata, TopicDescription
from .errors import (
    ClientClosed,
    ConnectionFailed,
    DeliveryTimeout,
    MessageTooLarge,
    NotLeader,
    QueueNotFound,
    RaftmqError,
    Timeout,
    TopicNotFound,
    Unavailable,
    UnexpectedResponse,
    UnknownOutcome,
)

__all__ = ["AsyncProducer", "DeliveryCallback", "ProducerConfig", "ProducerCore"]

log = logging.getLogger("raftmq.client.producer")

DeliveryCallback = Callable[[RecordMetadata | None, RaftmqError | None], None]
"""``callback(metadata, error)``: exactly one of the two is None. Runs on the producer's I/O
thread (the event loop); keep it short and do not block in it."""

# Errors after which the cached leader of a queue may be stale.
_REFRESH_ON = (NotLeader, Unavailable, ConnectionFailed, UnknownOutcome, Timeout, TopicNotFound)


@dataclass(frozen=True)
class ProducerConfig:
    """The producer's settings (see :class:`AsyncProducer` for their meaning)."""

    linger_ms: int = 5
    max_batch_bytes: int = 256 * 1024
    max_batch_messages: int = 10_000
    max_buffer_bytes: int = 32 * 1024 * 1024
    max_block_ms: int = 60_000
    idempotent: bool = True
    producer_id: str | None = None
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 2_000
    metadata_max_age_ms: int = 30_000
    address_map: AddressMap | None = None
    token: str | None = field(default=None, repr=False)  # API token (never in a repr)
    ca_file: str | None = None
    ssl: _ssl.SSLContext | None = None

    def check(self) -> None:
        problems = [
            f"{name} must be positive"
            for name in (
                "max_batch_bytes",
                "max_batch_messages",
                "max_buffer_bytes",
                "delivery_timeout_ms",
                "request_timeout_ms",
                "metadata_max_age_ms",
            )
            if getattr(self, name) <= 0
        ]
        problems += [
            f"{name} must not be negative"
            for name in ("linger_ms", "max_block_ms", "retry_backoff_ms", "retry_backoff_max_ms")
            if getattr(self, name) < 0
        ]
        if self.max_batch_messages > MAX_MESSAGES:
            problems.append(
                f"max_batch_messages may not exceed the broker's {MAX_MESSAGES:,} messages per request"
            )
        if self.producer_id is not None and not 0 < len(self.producer_id.encode()) <= 200:
            problems.append("producer_id must be 1-200 bytes")
        if problems:
            raise ValueError("invalid producer settings: " + "; ".join(problems))


class _FutureDelivery:
    """Resolves an asyncio future (same loop) or a concurrent future, then calls the callback."""

    __slots__ = ("callback", "future")

    def __init__(self, future: Any, callback: DeliveryCallback | None) -> None:
        self.future = future
        self.callback = callback

    def resolve(self, metadata: RecordMetadata) -> None:
        if not self.future.done():
            self.future.set_result(metadata)
        self._call(metadata, None)

    def fail(self, error: RaftmqError) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            if self.callback is not None and isinstance(self.future, asyncio.Future):
                self.future.exception()  # the callback hears of it: asyncio need not warn
        self._call(None, error)

    def _call(self, metadata: RecordMetadata | None, error: RaftmqError | None) -> None:
        if self.callback is not None:
            try:
                self.callback(metadata, error)
            except Exception:
                log.exception("delivery callback raised")


class ProducerCore:
    """Metadata, accumulator and sender of one producer; create it inside its event loop."""

    def __init__(self, bootstrap: str | Sequence[str], config: ProducerConfig) -> None:
        config.check()
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.api = connect(
            bootstrap, config, retry_timeout_ms=config.request_timeout_ms, address_map=config.address_map
        )
        self.transport, self.backoff = self.api.transport, self.api.backoff
        self.metadata = ClusterMetadata()
        # Idempotence: one random id per producer; the broker keeps its last sequences per queue.
        self.producer_id = (config.producer_id or f"p-{uuid.uuid4().hex}") if config.idempotent else None
        self.acc = Accumulator(
            linger_s=config.linger_ms / 1000,
            max_batch_bytes=config.max_batch_bytes,
            max_batch_messages=config.max_batch_messages,
            max_buffer_bytes=config.max_buffer_bytes,
        )
        self.space = asyncio.Event()
        self.acc.on_space = self.space.set
        self._wakeup = asyncio.Event()
        self._closing = False
        self._aborting = False
        self.closed = False
        self._flushing = 0
        self._loading: dict[str, asyncio.Task[TopicDescription]] = {}
        self._refreshing: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sender = asyncio.create_task(self._send_loop(), name="raftmq-producer-sender")
        self._refresher = asyncio.create_task(self._refresh_loop(), name="raftmq-producer-metadata")

    # -- metadata --------------------------------------------------------------------------------

    async def topic(self, name: str) -> TopicDescription:
        """The topic's cached description, loading it on first use."""
        desc = self.metadata.topic(name)
        if desc is not None:
            return desc
        task = self._loading.get(name)
        if task is None:
            task = self._loading[name] = asyncio.create_task(self._load_topic(name))
            task.add_done_callback(lambda _: self._loading.pop(name, None))
        return await asyncio.shield(task)

    async def _load_topic(self, name: str) -> TopicDescription:
        return await self.api.load_topic(self.metadata, name)

    def _refresh_soon(self, topic: str) -> None:
        if topic in self._refreshing or self._aborting:
            return
        self._refreshing.add(topic)

        async def refresh() -> None:
            try:
                await self._load_topic(topic)
            except TopicNotFound:
                self.metadata.forget_topic(topic)  # the next send to it fails at once
            except RaftmqError as e:
                log.debug("metadata refresh of %s failed: %s", topic, e)
            finally:
                self._refreshing.discard(topic)

        self._spawn(refresh())

    async def _refresh_loop(self) -> None:
        period_s = self.config.metadata_max_age_ms / 1000
        while True:
            await asyncio.sleep(min(period_s, 1.0))
            for topic in self.metadata.stale_topics(time.monotonic(), period_s):
                self._refresh_soon(topic)

    # -- appending -------------------------------------------------------------------------------

    def prepare(
        self,
        desc: TopicDescription,
        value: str | bytes,
        key: str | None,
        headers: Mapping[str, str] | None,
        queue: int | None,
    ) -> tuple[bytes, int | None]:
        """The encoded message and its queue (None: unkeyed, sticky), checked against the topic."""
        if self._closing:
            raise ClientClosed("the producer is closed")
        if not isinstance(value, str | bytes):
            raise TypeError(f"value must be str or bytes, not {type(value).__name__}")
        encoded, size = encode_message(value, key, dict(headers) if headers else None)
        limit = desc.info.max_message_bytes
        if limit is not None and size > limit:
            raise MessageTooLarge(f"the message is {size} bytes; topic {desc.name!r} allows {limit}")
        if queue is not None:
            if not 0 <= queue < desc.queues:
                raise QueueNotFound(f"topic {desc.name!r} has {desc.queues} queues, no queue {queue}")
        elif key is not None:
            queue = key_queue(key, desc.queues)
        return encoded, queue

    def append(self, desc: TopicDescription, encoded: bytes, queue: int | None, delivery: Delivery) -> bool:
        """Add the message to its batch from any thread; False when the buffer is full."""
        added = self.acc.try_append(desc.name, queue, desc.queues, encoded, delivery, time.monotonic())
        if added is None:
            self.wake()  # the accumulator is under pressure: send what it holds now
            return False
        if added[1]:
            self.wake()
        return True

    def wake(self) -> None:
        if threading.get_ident() == self.loop_thread:
            self._wakeup.set()
        else:
            self.loop.call_soon_threadsafe(self._wakeup.set)

    # -- sending ---------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_loop(self) -> None:
        while True:
            self._wakeup.clear()
            batches, next_s = self.acc.ready(time.monotonic(), all_now=self._flushing > 0 or self._closing)
            for b in batches:
                self._spawn(self._send_batch(b))
            if self._closing and self.acc.empty():
                return
            timeout = None if next_s is None else max(0.0, next_s - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation
                    await self._wakeup.wait()

    async def _send_batch(self, b: Batch) -> None:
        try:
            await self._deliver(b)
        except asyncio.CancelledError:  # close() gave up waiting
            if b.maybe_stored:
                self._fail(b, UnknownOutcome("the producer was closed while this batch was in flight"))
            else:
                self._fail(b, ClientClosed("the producer was closed before this batch was stored"))
            raise
        except Exception as e:  # a bug here must not leave the futures hanging
            log.exception("sending a batch failed")
            error = e if isinstance(e, RaftmqError) else UnknownOutcome(f"client error: {e!r}")
            for d in b.deliveries:
                d.fail(error)
        finally:
            self.acc.complete(b)
            self.wake()

    async def _deliver(self, b: Batch) -> None:
        deadline = b.created_s + self.config.delivery_timeout_ms / 1000
        if self._aborting:
            self._fail(b, ClientClosed("the producer was closed before this batch was sent"))
            return
        if time.monotonic() > deadline:
            self._fail(b, DeliveryTimeout(f"not sent within {self.config.delivery_timeout_ms} ms"))
            return
        idempotent = self.producer_id is not None
        if idempotent and b.sequence is None:
            b.sequence = self.acc.next_sequence(b.key)
        body = b.body(self.producer_id)
        path = f"/v1/topics/{path_part(b.topic)}/messages"
        indefinite: RaftmqError | None = None
        attempt = 0
        while True:
            b.maybe_stored = True
            try:
                answer = await self.transport.request(
                    "POST",
                    path,
                    body=body,
                    node_url=self.metadata.leader_url(b.topic, b.queue),
                    idempotent=idempotent,
                )
            except RaftmqError as e:
                if not e.definite:
                    indefinite = e
                b.maybe_stored = indefinite is not None
                if isinstance(e, _REFRESH_ON):
                    self._refresh_soon(b.topic)
                delay = self.backoff.delay_s(attempt)
                if self._aborting or not may_retry(e, idempotent) or time.monotonic() + delay > deadline:
                    self._fail(b, outcome_error(e, indefinite))
                    return
                attempt += 1
                log.debug("produce to %s/%d failed (%s); retry %d", b.topic, b.queue, e.code, attempt)
                await asyncio.sleep(delay)
                continue
            self._resolve(b, answer)
            return

    def _resolve(self, b: Batch, answer: Any) -> None:
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(b.deliveries):
            self._fail(b, UnexpectedResponse(f"produce answer without {len(b.deliveries)} results"))
            return
        for d, r in zip(b.deliveries, results, strict=True):
            d.resolve(RecordMetadata(b.topic, r["queue"], r["offset"]))

    @staticmethod
    def _fail(b: Batch, error: RaftmqError) -> None:
        for d in b.deliveries:
            d.fail(error)

    # -- flush and close -------------------------------------------------------------------------

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Send every buffered message now and wait until each succeeded or failed.

        Returns:
            False if ``timeout_s`` passed first.
        """
        pending = [b for b in self.acc.unfinished() if not b.done]
        if not pending:
            return True
        remaining = len(pending)
        all_done = asyncio.Event()

        def one_done() -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0:
                all_done.set()

        for b in pending:
            b.waiters.append(one_done)
            if b.done:  # completed while we subscribed
                one_done()
        self._flushing += 1
        self.wake()
        try:
            async with asyncio.timeout(timeout_s):
                await all_done.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``), then fail what is left with ClientClosed and stop."""
        if self.closed:
            return
        self._closing = True
        flushed = await self.flush(timeout_s)
        if not flushed:
            self._aborting = True
            in_flight = list(self._tasks)
            for task in in_flight:
                task.cancel()  # each fails its batch's messages (UnknownOutcome or ClientClosed)
            await asyncio.gather(*in_flight, return_exceptions=True)
            for b in self.acc.drain():
                self._fail(b, ClientClosed("the producer was closed before this batch was sent"))
                self.acc.complete(b)
        self.wake()
        await asyncio.gather(self._sender, return_exceptions=True)
        self._refresher.cancel()
        await asyncio.gather(self._refresher, *self._tasks, return_exceptions=True)
        await self.transport.close()
        self.closed = True


class AsyncProducer:
    """Produces messages in batches (asyncio).

    Each message goes to a queue: the one given, else the key's queue (CRC32C of the key, as the
    broker routes), else a sticky queue (16 KiB to one queue, then the least-loaded; uniform sticky
    batches as Kafka's KIP-794). Messages wait in
    their queue's batch up to ``linger_ms`` (or until ``max_batch_bytes``/``max_batch_messages``),
    and each batch is sent straight to the leader of its queue's group, one batch in flight per
    queue (order per queue is kept across retries).

    Idempotence is on by default: the producer has a random ``producer_id`` and numbers its batches
    per queue, so the broker stores a retried batch once; failures that are retriable, including
    unknown outcomes, are retried with exponential backoff until ``delivery_timeout_ms``. With
    ``idempotent=False`` an unknown outcome is reported, never resent.

    Use it as ``async with AsyncProducer(...) as producer:`` (close flushes).

    Args:
        bootstrap: Node addresses (``"127.0.0.1:7001,127.0.0.1:7002"`` or a list); any one will do.
        linger_ms: How long a batch waits for more messages.
        max_batch_bytes: A batch is sent once it reaches this size.
        max_batch_messages: ... or this many messages (at most the broker's 10,000).
        max_buffer_bytes: Memory for unsent and in-flight messages; ``send`` waits (up to
            ``max_block_ms``, then raises BufferFull) while it is full.
        max_block_ms: See ``max_buffer_bytes``; 0 raises BufferFull at once.
        idempotent: Send ``producer_id``/``sequence`` so retries never store a batch twice.
        producer_id: Fixed id (default: random per producer).
        delivery_timeout_ms: A batch fails if it is not stored this long after it was started.
        request_timeout_ms: One attempt's timeout.
        retry_backoff_ms, retry_backoff_max_ms: Exponential backoff between attempts.
        metadata_max_age_ms: Topic metadata (queue leaders) is refreshed this often, and after
            errors that suggest it is stale.
        address_map: ``address_map(url)``: where to connect for a node's advertised address (or
            None: unreachable now), for clients behind NAT or container port mappings.
        token: API token (``Authorization: Bearer``), for clusters with tokens.
        ca_file: CA certificates (PEM) that ``https://`` nodes are verified against (default: the
            system's CAs); ``ssl``: an SSL context instead.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        linger_ms: int = 5,
        max_batch_bytes: int = 256 * 1024,
        max_batch_messages: int = 10_000,
        max_buffer_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        idempotent: bool = True,
        producer_id: str | None = None,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 2_000,
        metadata_max_age_ms: int = 30_000,
        address_map: AddressMap | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._config = ProducerConfig(
            linger_ms=linger_ms,
            max_batch_bytes=max_batch_bytes,
            max_batch_messages=max_batch_messages,
            max_buffer_bytes=max_buffer_bytes,
            max_block_ms=max_block_ms,
            idempotent=idempotent,
            producer_id=producer_id,
            delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            address_map=address_map,
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        self._config.check()
        self._core: ProducerCore | None = None
        self._closed = False

    @property
    def producer_id(self) -> str | None:
        """The id sent with every batch (None when not idempotent); known once started."""
        return self._core.producer_id if self._core else self._config.producer_id

    async def start(self) -> None:
        """Start the background sender (done by the first ``send`` or by ``async with``)."""
        self._get_core()

    def _get_core(self) -> ProducerCore:
        if self._closed:
            raise ClientClosed("the producer is closed")
        if self._core is None:
            self._core = ProducerCore(self._bootstrap, self._config)
        return self._core

    async def send(
        self,
        topic: str,
        value: str | bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        queue: int | None = None,
        callback: DeliveryCallback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Add a message to its batch; waits only while the buffer is full.

        Args:
            topic: The topic.
            value: ``str`` (sent as ``value``) or ``bytes`` (sent as ``value_b64``).
            key: Routes the message (same key, same queue) and is stored with it.
            headers: String headers stored with the message.
            queue: An explicit queue (overrides the key's).
            callback: ``callback(metadata, error)`` once the message is stored or failed.

        Returns:
            A future resolving to the message's :class:`RecordMetadata` once it is durable, or
            failing with a :class:`RaftmqError`.

        Raises:
            TopicNotFound, QueueNotFound, MessageTooLarge: Refused before buffering.
            BufferFull: The buffer stayed full for ``max_block_ms``.
            ClientClosed: The producer is closed.
        """
        core = self._get_core()
        desc = await core.topic(topic)
        encoded, q = core.prepare(desc, value, key, headers, queue)
        future: asyncio.Future[RecordMetadata] = core.loop.create_future()
        delivery = _FutureDelivery(future, callback)
        deadline = time.monotonic() + self._config.max_block_ms / 1000
        while True:
            core.space.clear()
            if core.append(desc, encoded, q, delivery):
                return future
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise buffer_full(self._config.max_block_ms)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await core.space.wait()

    async def send_and_wait(
        self,
        topic: str,
        value: str | bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        queue: int | None = None,
    ) -> RecordMetadata:
        """``await (await send(...))``: the message's place once it is durable."""
        return await (await self.send(topic, value, key=key, headers=headers, queue=queue))

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Send everything buffered now and wait for the outcomes; False if ``timeout_s`` passed."""
        if self._core is None:
            return True
        return await self._core.flush(timeout_s)

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``; default: until every batch succeeded or failed), then
        release connections. Messages still unsent after the timeout fail with ClientClosed."""
        self._closed = True
        if self._core is not None:
            await self._core.close(timeout_s)

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
