"""The sync flavour: each client wraps its asyncio twin, which runs in a background I/O thread of
the client's own (``_io_thread.py``); the twin checks the settings and owns the core."""

from __future__ import annotations

import concurrent.futures
import ssl as _ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ._accumulator import MAX_REQUESTS_PER_LEADER, Wire, buffer_full
from ._admin import UNCHANGED, AsyncAdmin, Unchanged
from ._consumer import AsyncConsumer
from ._consumer_config import FetchWire, Mode, Reset, TopicQueue
from ._io_thread import LoopThread, SyncClient
from ._limits import check_concurrency
from ._outcome import DeliveryCallback, FutureRecord
from ._producer import AsyncProducer
from ._transport import AddressMap
from ._types import ClusterStatus, Message, SubscriptionSettings, TopicDescription, TopicInfo, ack_messages
from .errors import RaftmqError

__all__ = ["Admin", "Consumer", "LoopThread", "Producer"]


class Admin(SyncClient):
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
        super().__init__("raftmq-admin")

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

    def create_topics(
        self,
        names: Sequence[str],
        queues: int = 8,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        max_message_bytes: int | None = None,
    ) -> dict[str, TopicInfo | RaftmqError]:
        return self._io.run(
            self._async.create_topics(
                names,
                queues,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                max_message_bytes=max_message_bytes,
            )
        )

    def set_topic_retention(
        self,
        name: str,
        *,
        retention_ms: int | Unchanged | None = UNCHANGED,
        retention_bytes: int | Unchanged | None = UNCHANGED,
    ) -> TopicDescription:
        return self._io.run(
            self._async.set_topic_retention(name, retention_ms=retention_ms, retention_bytes=retention_bytes)
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

    def set_subscription(
        self,
        topic: str,
        group: str,
        *,
        max_deliveries: int | None = None,
        backoff_ms: Sequence[int] | None = None,
    ) -> SubscriptionSettings:
        return self._io.run(
            self._async.set_subscription(topic, group, max_deliveries=max_deliveries, backoff_ms=backoff_ms)
        )

    def close(self) -> None:
        self._shut_down(self._async.close())


class Producer(SyncClient):
    """Produces messages in batches; the sync twin of :class:`AsyncProducer` (same arguments).

    ``send`` is thread-safe and returns a :class:`FutureRecord` (``result(timeout)`` blocks
    until the message is stored); batching, retries and delivery callbacks run on the producer's
    own I/O thread.
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
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        wire: Wire = "binary",
    ) -> None:
        self._async = AsyncProducer(
            bootstrap,
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
            token=token,
            ca_file=ca_file,
            ssl=ssl,
            wire=wire,
        )
        self._max_block_ms = max_block_ms
        super().__init__("raftmq-producer")
        self._start(self._async.start())
        self._core = self._async._get_core()  # made by start, in the I/O thread

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
    ) -> FutureRecord:
        """Add a message to its batch (see :meth:`AsyncProducer.send`).

        Returns:
            A :class:`FutureRecord`: ``result(timeout)`` is the message's :class:`RecordMetadata`
            once it is durable (or raises the :class:`RaftmqError` it failed with).

        Raises:
            TopicNotFound, QueueNotFound, MessageTooLarge, ReservedHeader: Refused before
                buffering.
            BufferFull: The buffer stayed full for ``max_block_ms``.
            ClientClosed: The producer is closed.
        """
        core = self._core
        desc = core.metadata.topic(topic)
        if desc is None:
            desc = self._io.run(core.topic(topic))
        handle = core.add(desc, value, key, headers, queue, callback)
        if handle is not None:
            return handle
        deadline = time.monotonic() + self._max_block_ms / 1000
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._io.in_loop:
                raise buffer_full(self._max_block_ms)
            core.acc.wait_space_blocking(min(remaining, 0.05))
            handle = core.add(desc, value, key, headers, queue, callback)
            if handle is not None:
                return handle

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send everything buffered now and wait for the outcomes; False if ``timeout_s`` passed."""
        return self._io.run(self._core.flush(timeout_s))

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``), then stop the I/O thread; unsent messages fail with
        ClientClosed."""
        self._shut_down(self._async.close(timeout_s))


SyncHandler = Callable[[Message], None]


class Consumer(SyncClient):
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
        max_batch: int = 32,
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
        wire: FetchWire = "binary",
        address_map: AddressMap | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._async = AsyncConsumer(
            bootstrap,
            group=group,
            topics=topics,
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
            wire=wire,
            address_map=address_map,
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        self._config = self._async._config
        self._local: deque[Message] = deque()
        self._last: Message | None = None
        super().__init__("raftmq-consumer")
        self._start(self._async.start())
        self._core = self._async._started()

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
        return self._run_or_closed(self._async.getmany(max_messages, timeout_ms), [])

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
        check_concurrency(concurrency)
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

    def ack(self, messages: Iterable[Message]) -> None:
        """Ack every one of ``messages`` at once: :meth:`AsyncConsumer.ack` (it runs in the
        calling thread, not the I/O thread)."""
        ack_messages(messages)

    def commit(self) -> None:
        """Commit finished offsets now (also done every ``auto_commit_interval_ms``)."""
        self._io.run(self._async.commit())

    def committed(self, topic: str) -> dict[int, int | None]:
        """The group's committed offset of each queue of ``topic`` (None where none)."""
        return self._io.run(self._async.committed(topic))

    def close(self, *, commit: bool = True) -> None:
        """Stop fetching, commit finished offsets (unless ``commit`` is False), leave the group.
        Safe to call from another thread (an iteration in progress ends)."""
        self._shut_down(self._async.close(commit=commit))
