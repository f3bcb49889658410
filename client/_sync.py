"""The sync flavour: each client runs its asyncio core in a background I/O thread of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl as _ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ._accumulator import buffer_full
from ._admin import AsyncAdmin
from ._consumer_config import ConsumerConfig, Mode, Reset, TopicQueue
from ._consumer_core import ConsumerCore
from ._producer import DeliveryCallback, ProducerConfig, ProducerCore, _FutureDelivery
from ._types import ClusterStatus, Message, RecordMetadata, TopicDescription, TopicInfo
from .errors import ClientClosed

__all__ = ["Admin", "Consumer", "LoopThread", "Producer"]

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; ``run`` executes a coroutine there."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    @property
    def in_loop(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` in the loop and wait for its result (from any other thread)."""
        if self.in_loop:
            coro.close()
            raise RuntimeError(
                "a blocking raftmq call from the client's own I/O thread (e.g. in a delivery callback)"
            )
        if not self._thread.is_alive() or self.loop.is_closed():
            coro.close()
            raise ClientClosed("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s} s") from None

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if not self.in_loop:
                self._thread.join()


class Admin:
    """Topics, consumer-group offsets and cluster status; the sync twin of :class:`AsyncAdmin`
    (same arguments, same methods, blocking)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retry_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 2_000,
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._async = AsyncAdmin(
            bootstrap,
            request_timeout_ms=request_timeout_ms,
            retry_timeout_ms=retry_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        self._io = LoopThread("raftmq-admin")

    def create_topic(
        self,
        name: str,
        queues: int = 8,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        max_message_bytes: int | None = None,
    ) -> TopicDescription:
        return self._io.run(
            self._async.create_topic(
                name,
                queues,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                max_message_bytes=max_message_bytes,
            )
        )

    def list_topics(self) -> list[TopicInfo]:
        return self._io.run(self._async.list_topics())

    def describe_topic(self, name: str) -> TopicDescription:
        return self._io.run(self._async.describe_topic(name))

    def delete_topic(self, name: str) -> None:
        self._io.run(self._async.delete_topic(name))

    def cluster_status(self) -> ClusterStatus:
        return self._io.run(self._async.cluster_status())

    def committed_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        return self._io.run(self._async.committed_offsets(group, topic))

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        self._io.run(self._async.commit_offsets(group, topic, offsets))

    def close(self) -> None:
        with contextlib.suppress(ClientClosed):
            self._io.run(self._async.close())
        self._io.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Producer:
    """Produces messages in batches; the sync twin of :class:`AsyncProducer` (same arguments).

    ``send`` is thread-safe and returns a :class:`concurrent.futures.Future`; batching, retries
    and delivery callbacks run on the producer's own I/O thread.
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
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        config = ProducerConfig(
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
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        config.check()
        self._max_block_ms = max_block_ms
        self._io = LoopThread("raftmq-producer")

        async def make() -> ProducerCore:
            return ProducerCore(bootstrap, config)

        self._core = self._io.run(make())

    @property
    def producer_id(self) -> str | None:
        """The id sent with every batch (None when not idempotent)."""
        return self._core.producer_id

    def send(
        self,
        topic: str,
        value: str | bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        queue: int | None = None,
        callback: DeliveryCallback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Add a message to its batch (see :meth:`AsyncProducer.send`).

        Returns:
            A future resolving to the message's :class:`RecordMetadata` once it is durable.

        Raises:
            TopicNotFound, QueueNotFound, MessageTooLarge: Refused before buffering.
            BufferFull: The buffer stayed full for ``max_block_ms``.
            ClientClosed: The producer is closed.
        """
        core = self._core
        desc = core.metadata.topic(topic)
        if desc is None:
            desc = self._io.run(core.topic(topic))
        encoded, q = core.prepare(desc, value, key, headers, queue)
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        delivery = _FutureDelivery(future, callback)
        deadline = time.monotonic() + self._max_block_ms / 1000
        while not core.append(desc, encoded, q, delivery):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._io.in_loop:
                raise buffer_full(self._max_block_ms)
            core.acc.wait_space_blocking(min(remaining, 0.05))
        return future

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send everything buffered now and wait for the outcomes; False if ``timeout_s`` passed."""
        return self._io.run(self._core.flush(timeout_s))

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``), then stop the I/O thread; unsent messages fail with
        ClientClosed."""
        if not self._core.closed:
            self._io.run(self._core.close(timeout_s))
        self._io.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SyncHandler = Callable[[Message], None]


class Consumer:
    """Consumes topics with committed progress; the sync twin of :class:`AsyncConsumer` (same
    arguments). Iterate (``for msg in consumer: ...; msg.ack()``) or call :meth:`run`.

    Messages may be acked from any thread. :meth:`close` may be called from another thread: the
    iteration then ends.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        group: str,
        topics: str | Sequence[str],
        mode: Mode = "clustering",
        member_id: str | None = None,
        max_batch: int = 500,
        wait_ms: int = 5_000,
        max_backlog: int = 2_000,
        max_fetches_in_flight: int = 4,
        auto_commit_interval_ms: int = 1_000,
        reset: Reset = "earliest",
        auto_ack: bool = False,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 2_000,
        metadata_max_age_ms: int = 30_000,
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        config = ConsumerConfig(
            group=group,
            topics=(topics,) if isinstance(topics, str) else tuple(topics),
            mode=mode,
            member_id=member_id,
            max_batch=max_batch,
            wait_ms=wait_ms,
            max_backlog=max_backlog,
            max_fetches_in_flight=max_fetches_in_flight,
            auto_commit_interval_ms=auto_commit_interval_ms,
            reset=reset,
            auto_ack=auto_ack,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        config.check()
        self._config = config
        self._io = LoopThread("raftmq-consumer")
        self._local: deque[Message] = deque()
        self._last: Message | None = None

        async def make() -> ConsumerCore:
            core = ConsumerCore(bootstrap, config)
            try:
                await core.start()
            except BaseException:
                await core.close(commit=False)
                raise
            return core

        try:
            self._core = self._io.run(make())
        except BaseException:
            self._io.stop()
            raise

    @property
    def member_id(self) -> str:
        return self._core.member_id

    @property
    def commit_group(self) -> str:
        return self._config.commit_group

    def assignment(self) -> frozenset[TopicQueue]:
        """The (topic, queue) pairs this consumer currently owns."""
        return self._core.assignment()

    def poll(self, timeout_ms: int | None = None, max_messages: int = 1_000) -> list[Message]:
        """Up to ``max_messages`` messages, waiting up to ``timeout_ms`` (None: until one arrives or
        the consumer is closed). Returns [] on timeout or once closed."""
        out: list[Message] = []
        while self._local and len(out) < max_messages:
            message = self._local.popleft()
            if not message.revoked:  # not handed out yet: its queue's new owner delivers it
                out.append(message)
        if out or self._core.closed:
            return out
        timeout_s = None if timeout_ms is None else timeout_ms / 1000
        try:
            return self._io.run(self._core.get_many(max_messages, timeout_s))
        except (ClientClosed, concurrent.futures.CancelledError):  # closed by another thread
            return []

    def __iter__(self) -> Iterator[Message]:
        while True:
            if self._last is not None and self._config.auto_ack:
                self._last.ack()
            self._last = None
            if not self._local:
                batch = self.poll(None, 10_000)
                if not batch:
                    return
                self._local.extend(batch)
            message = self._local.popleft()
            if message.revoked:  # not handed out yet: its queue's new owner delivers it
                continue
            self._last = message
            yield message

    def run(self, handler: SyncHandler, *, concurrency: int = 1, ordered: bool = True) -> None:
        """Process messages with ``handler`` in ``concurrency`` threads until the consumer is
        closed; ack each on success (see :meth:`AsyncConsumer.run`).

        Raises:
            Exception: The first exception of ``handler`` (after the running handlers finished).
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        lock = threading.Lock()
        lanes: dict[TopicQueue, deque[Message]] = {}
        failure: list[BaseException] = []
        slots = threading.BoundedSemaphore(concurrency)

        def call(message: Message) -> bool:
            if failure:
                return False
            if message.revoked:  # its queue moved on: the new owner delivers it
                return True
            try:
                handler(message)
            except Exception as e:
                with lock:
                    failure.append(e)
                return False
            message.ack()
            return True

        def lane(key: TopicQueue) -> None:
            while True:
                with lock:
                    queue = lanes[key]
                    if not queue or failure:
                        del lanes[key]
                        return
                    message = queue[0]
                if not call(message):
                    with lock:
                        del lanes[key]
                    return
                with lock:
                    queue.popleft()

        def single(message: Message) -> None:
            try:
                call(message)
            finally:
                slots.release()

        with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="raftmq-handler") as pool:
            while not failure:
                batch = self.poll(200)
                if not batch:
                    if self._core.closed or self._core.error is not None:
                        if self._core.error is not None and not failure:
                            raise self._core.error
                        break
                    continue
                for message in batch:
                    if ordered:
                        key = (message.topic, message.queue)
                        with lock:
                            if key in lanes:
                                lanes[key].append(message)
                                continue
                            lanes[key] = deque([message])
                        pool.submit(lane, key)
                    else:
                        slots.acquire()
                        if failure:
                            slots.release()
                            break
                        pool.submit(single, message)
        if failure:
            raise failure[0]

    def commit(self) -> None:
        """Commit finished offsets now (also done every ``auto_commit_interval_ms``)."""
        self._io.run(self._core.commit())

    def committed(self, topic: str) -> dict[int, int | None]:
        """The group's committed offset of each queue of ``topic`` (None where none)."""
        return self._io.run(self._core.api.committed_offsets(self._config.commit_group, topic))

    def close(self, *, commit: bool = True) -> None:
        """Stop fetching, commit finished offsets (unless ``commit`` is False), leave the group.
        Safe to call from another thread (an iteration in progress ends)."""
        if not self._core.closed:
            self._io.run(self._core.close(commit=commit))
        self._io.stop()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
