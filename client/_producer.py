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
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from raftmq.batch import BATCH_MEDIA_TYPE, RESERVED_HEADER_PREFIX, is_reserved_header

from ._accumulator import MAX_REQUESTS_PER_LEADER, Accumulator, Batch, Wire, buffer_full, message_size
from ._api import connect
from ._io_thread import runs_loop
from ._metadata import ClusterMetadata, key_queue
from ._outcome import DeliveryCallback, FutureRecord
from ._producer_config import ProducerConfig
from ._requests import frame_results, in_requests, refuses_binary, resolve
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
    ReservedHeader,
    Timeout,
    TopicNotFound,
    Unavailable,
    UnknownOutcome,
)

__all__ = ["AsyncProducer", "DeliveryCallback", "ProducerCore"]

log = logging.getLogger("raftmq.client.producer")

JSON_MEDIA_TYPE = "application/json"

# Errors after which the cached leader of a queue may be stale.
_REFRESH_ON = (NotLeader, Unavailable, ConnectionFailed, UnknownOutcome, Timeout, TopicNotFound)


class ProducerCore:
    """Metadata, accumulator and sender of one producer; create it inside its event loop."""

    def __init__(self, bootstrap: str | Sequence[str], config: ProducerConfig) -> None:
        config.check()
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.api = connect(
            bootstrap, config, retry_timeout_ms=config.request_timeout_ms, address_map=config.address_map
        )
        self.transport, self.backoff = self.api.transport, self.api.backoff
        self.metadata = ClusterMetadata()
        # Idempotence: one random id per producer; the broker keeps its last sequences per queue.
        self.producer_id = (config.producer_id or f"p-{uuid.uuid4().hex}") if config.idempotent else None
        self.acc = Accumulator(
            linger_s=config.linger_ms / 1000,
            max_requests_per_leader=config.max_requests_per_leader,
            max_batch_bytes=config.max_batch_bytes,
            max_batch_messages=config.max_batch_messages,
            max_buffer_bytes=config.max_buffer_bytes,
            wire=config.wire,
            producer_id=self.producer_id,
            loop=self.loop,
        )
        self.wire: Wire = config.wire  # "json" once a node refused the binary format
        self.space = asyncio.Event()
        self.acc.on_space = self.space.set
        self.acc.on_wake = self.wake
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

    def add(
        self,
        desc: TopicDescription,
        value: str | bytes,
        key: str | None,
        headers: Mapping[str, str] | None,
        queue: int | None,
        callback: DeliveryCallback | None,
    ) -> FutureRecord | None:
        """Check the message against the topic, then add it to its queue's batch (from any
        thread): the queue given, else the key's, else the sticky one. None when the buffer is
        full (nothing was added)."""
        if self._closing:
            raise ClientClosed("the producer is closed")
        if type(value) is not str and not isinstance(value, str | bytes):
            raise TypeError(f"value must be str or bytes, not {type(value).__name__}")
        if headers:
            reserved = [name for name in headers if is_reserved_header(name)]
            if reserved:
                raise ReservedHeader(
                    f"header {reserved[0]!r}: names starting with {RESERVED_HEADER_PREFIX!r} (any case) "
                    "are the broker's own"
                )
        size = message_size(value, key, headers)
        limit = desc.info.max_message_bytes
        if limit is not None and size > limit:
            raise MessageTooLarge(f"the message is {size} bytes; topic {desc.name!r} allows {limit}")
        if queue is not None:
            if not 0 <= queue < desc.queues:
                raise QueueNotFound(f"topic {desc.name!r} has {desc.queues} queues, no queue {queue}")
        elif key is not None:
            queue = key_queue(key, desc.queues)
        handle = self.acc.try_append(desc.name, queue, desc.queues, value, key, headers, size, callback)
        if handle is None:
            self.wake()  # the accumulator is under pressure: send what it holds now
        return handle

    def wake(self) -> None:
        if runs_loop(self.loop):
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
            # Batches share requests when the node can tell a resent frame from a new one.
            node_of = self._leader_of if self.producer_id is not None and self.wire == "binary" else None
            now_s, cfg = time.monotonic(), self.config
            batches, next_s = self.acc.ready(
                now_s, all_now=self._flushing > 0 or self._closing, node_of=node_of
            )
            for request in in_requests(batches, node_of, cfg.max_batch_bytes, cfg.max_batch_messages):
                self._spawn(self._send_batches(request))
            if self._closing and self.acc.empty():
                return
            timeout = None if next_s is None else max(0.0, next_s - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation
                    await self._wakeup.wait()

    def _leader_of(self, key: tuple[str, int]) -> str | None:
        return self.metadata.leader_url(*key)

    async def _send_batches(self, batches: list[Batch]) -> None:
        try:
            if len(batches) == 1:
                await self._deliver(batches[0])
            else:
                await self._deliver_together(batches)
        except asyncio.CancelledError:  # close() gave up waiting
            for b in batches:
                if b.maybe_stored:
                    self._fail(b, UnknownOutcome("the producer was closed while this batch was in flight"))
                else:
                    self._fail(b, ClientClosed("the producer was closed before this batch was stored"))
            raise
        except Exception as e:  # a bug here must not leave the handles hanging
            log.exception("sending a batch failed")
            error = e if isinstance(e, RaftmqError) else UnknownOutcome(f"client error: {e!r}")
            for b in batches:
                b.outcome.fail(error)
        finally:
            for b in batches:
                self.acc.complete(b)
            self.wake()

    async def _deliver_together(self, batches: list[Batch]) -> None:
        """Send the batches (binary, idempotent, one leader) as one request's frames; a batch
        the answer does not acknowledge goes on alone, as :meth:`_deliver` sends it: with the
        request's error as its first attempt's when that error is surely its own (it was the only
        one left, or the outcome is unknown for all), else at once (an idempotent resend)."""
        b0 = batches[0]
        deadline = b0.created_s + self.config.delivery_timeout_ms / 1000
        if self._aborting or time.monotonic() > deadline:
            await asyncio.gather(*(self._deliver(b) for b in batches))
            return
        for b in batches:
            b.maybe_stored = True
        try:
            answer, error = (
                await self.transport.request(
                    "POST",
                    f"/v1/topics/{path_part(b0.topic)}/messages",
                    body=b"".join(b.body(self.producer_id) for b in batches),
                    content_type=BATCH_MEDIA_TYPE,
                    node_url=self.metadata.leader_url(b0.topic, b0.queue),
                    idempotent=True,
                ),
                None,
            )
        except RaftmqError as e:
            answer, error = None, e
        self._release(batches)
        results, error = frame_results(answer, error, len(batches))
        for b, r in zip(batches, results, strict=True):
            if r is not None:
                resolve(b, {"results": [r]}, True)
        left = [b for b, r in zip(batches, results, strict=True) if r is None]
        if not left or error is None:
            return
        if isinstance(error, _REFRESH_ON):
            self._refresh_soon(b0.topic)
        # A definite error stored none of the batches left, and may be one frame's (a 400 names
        # one batch; an answer's error is its first failure): each learns its own at once.
        own = error if len(left) == 1 or not error.definite else None
        await asyncio.gather(*(self._deliver(b, own) for b in left))

    async def _deliver(self, b: Batch, failed: RaftmqError | None = None) -> None:
        """Send one batch until it is stored, fails for good or times out; ``failed``: the error
        of an attempt already made (the first, in a request of several batches)."""
        deadline = b.created_s + self.config.delivery_timeout_ms / 1000
        if self._aborting:
            self._fail(b, ClientClosed("the producer was closed before this batch was sent"))
            return
        if time.monotonic() > deadline:
            self._fail(b, DeliveryTimeout(f"not sent within {self.config.delivery_timeout_ms} ms"))
            return
        idempotent = self.producer_id is not None
        path = f"/v1/topics/{path_part(b.topic)}/messages"
        indefinite: RaftmqError | None = None
        attempt = 0
        while True:
            b.maybe_stored = True
            binary = b.wire == "binary" and self.wire == "binary"
            try:
                if failed is not None:
                    e, failed = failed, None
                    raise e
                answer = await self.transport.request(
                    "POST",
                    path,
                    body=b.body(self.producer_id) if binary else b.as_json(self.producer_id),
                    content_type=BATCH_MEDIA_TYPE if binary else JSON_MEDIA_TYPE,
                    node_url=self.metadata.leader_url(b.topic, b.queue),
                    idempotent=idempotent,
                )
            except RaftmqError as e:
                self._release([b])
                if binary and refuses_binary(e):
                    self._fall_back_to_json(e)
                    b.maybe_stored = indefinite is not None
                    continue  # nothing was stored: the same batch as JSON at once
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
            self._release([b])
            resolve(b, answer, binary)
            return

    def _release(self, batches: list[Batch]) -> None:
        if self.acc.release(batches):  # the first attempt is answered: the leader is idle
            self.wake()

    def _fall_back_to_json(self, error: RaftmqError) -> None:
        if self.wire == "binary":
            log.warning(
                "a node does not take the binary batch format (%s: %s); this producer sends JSON from now on",
                error.code,
                error.message,
            )
            self.wire = "json"
            self.acc.wire = "json"

    @staticmethod
    def _fail(b: Batch, error: RaftmqError) -> None:
        b.outcome.fail(error)

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
    batches as Kafka's KIP-794), and joins its queue's batch, sent straight to the leader of the
    queue's group, one batch in flight per queue (order per queue is kept across retries). A batch
    goes at once when its queue has none in flight and its leader fewer than
    ``max_requests_per_leader`` (1) requests; else it gathers messages until that answer comes (or
    ``max_batch_bytes``/``max_batch_messages``), and the batches waiting for one leader
    (idempotent binary producers: one topic's) go in one request. A batch travels in the
    binary record-batch format (docs/format.md); ``send`` returns a :class:`FutureRecord`.

    Idempotence is on by default: the producer has a random ``producer_id`` and numbers its batches
    per queue, so the broker stores a retried batch once; failures that are retriable, including
    unknown outcomes, are retried with exponential backoff until ``delivery_timeout_ms``. With
    ``idempotent=False`` an unknown outcome is reported, never resent.

    Use it as ``async with AsyncProducer(...) as producer:`` (close flushes).

    Args:
        bootstrap: Node addresses (``"127.0.0.1:7001,127.0.0.1:7002"`` or a list); any one will do.
        linger_ms: 0 (default): no wait but for the queue's batch in flight and the leader's
            requests (``max_requests_per_leader``); > 0: a batch that is not full waits this
            long from its first message instead.
        max_requests_per_leader: With ``linger_ms`` 0, a queue's batch goes at once while its
            leader has fewer requests than this in flight from the producer. 1 (default): a
            batch waits for the answer to its leader's other queues and goes with them (fewer,
            larger requests); more: it waits only for its own queue's batch.
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
        wire: ``"binary"`` (default): record batches (``application/vnd.raftmq.batch``); a node
            that does not take them (HTTP 415, or ``invalid_json`` from a node older than the
            format) makes the producer send JSON from then on. ``"json"``: the JSON API's
            messages, always.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        linger_ms: int = 0,
        max_requests_per_leader: int = MAX_REQUESTS_PER_LEADER,
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
        wire: Wire = "binary",
    ) -> None:
        self._bootstrap = bootstrap
        self._config = ProducerConfig(
            linger_ms=linger_ms,
            max_requests_per_leader=max_requests_per_leader,
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
            wire=wire,
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
    ) -> FutureRecord:
        """Add a message to its batch; waits only while the buffer is full.

        Args:
            topic: The topic.
            value: ``str`` (sent as ``value``) or ``bytes`` (sent as ``value_b64``).
            key: Routes the message (same key, same queue) and is stored with it.
            headers: String headers stored with the message. Names starting with ``raftmq-``
                (any ASCII case) are the broker's own and refused.
            queue: An explicit queue (overrides the key's).
            callback: ``callback(metadata, error)`` once the message is stored or failed.

        Returns:
            A :class:`FutureRecord`: ``await`` it for the message's :class:`RecordMetadata` once
            it is durable (or the :class:`RaftmqError` it failed with); it also offers
            ``done()``, ``result()``, ``exception()`` and ``add_done_callback(fn)``.

        Raises:
            TopicNotFound, QueueNotFound, MessageTooLarge, ReservedHeader: Refused before
                buffering.
            BufferFull: The buffer stayed full for ``max_block_ms``.
            ClientClosed: The producer is closed.
        """
        core = self._core or self._get_core()
        desc = core.metadata.topic(topic) or await core.topic(topic)
        handle = core.add(desc, value, key, headers, queue, callback)
        if handle is not None:
            return handle
        deadline = time.monotonic() + self._config.max_block_ms / 1000
        while True:
            core.space.clear()
            handle = core.add(desc, value, key, headers, queue, callback)
            if handle is not None:
                return handle
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
