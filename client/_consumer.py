"""The asyncio consumer (:class:`AsyncConsumer`): iteration, batches, and handler runs over a
:class:`~raftmq.client._consumer_core.ConsumerCore` in the caller's event loop.

The consumer is split by responsibility:

- ``_consumer_config.py``: the settings and their checks;
- ``_consumer_core.py``: owned queues, the delivery buffer, commits, lifecycle;
- ``_fetcher.py``: one long-polling fetch loop per owned queue;
- ``_group_member.py``: membership of a consumer group (clustering mode) and the revoke barrier;
- this module: the asyncio API; ``_sync.py`` has the sync twin.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ._consumer_config import ConsumerConfig, FetchWire, Mode, Reset, TopicQueue
from ._consumer_core import ConsumerCore
from ._limits import check_concurrency
from ._transport import AddressMap
from ._types import Message, ack_messages
from .errors import ClientClosed

__all__ = ["AsyncConsumer", "ConsumerConfig", "ConsumerCore", "Mode", "Reset", "TopicQueue"]


Handler = Callable[[Message], Awaitable[None]]


class AsyncConsumer:
    """Consumes topics with committed progress (asyncio).

    Two modes:

    - ``"clustering"`` (default): the consumers of ``group`` share the topics' queues; the broker
      assigns each queue to one live member (average allocation over sorted member ids) and the
      consumer follows the assignment as members join and leave. Progress is committed under
      ``group``.
    - ``"broadcast"``: this consumer reads every queue with its own progress, committed under
      ``f"{group}.{member_id}"`` (``member_id`` is required and must be stable across restarts).

    Read messages by iteration and ack each once processed, or hand a coroutine to :meth:`run`::

        async with AsyncConsumer(brokers, group="billing", topics=["orders"]) as consumer:
            async for msg in consumer:
                await handle(msg)
                msg.ack()

    The committed offset of a queue is the low edge of its acked offsets (a message that is not
    acked holds it back), committed every ``auto_commit_interval_ms``, on rebalance and on close.
    After a restart the group resumes from there: a message is delivered again unless its ack was
    committed (at-least-once).

    Args:
        bootstrap: Node addresses; any one will do.
        group: The consumer group (1-255 UTF-8 bytes).
        topics: The topics to consume.
        mode: ``"clustering"`` or ``"broadcast"``.
        member_id: This consumer's id in the group (default: random; required for broadcast).
        max_batch: Messages per fetch (at most; a fetch at the end of a queue returns what is
            there). Larger batches cost fewer requests: 500 instead of 32 cut the cluster's CPU per
            consumed message about threefold (docs/benchmarks.md).
        wait_ms: Long-poll wait of a fetch when a queue has nothing new (at most 15,000).
        max_backlog: Per queue, delivered-but-uncommittable messages (unacked, or acked behind an
            unacked one) at which fetching that queue pauses.
        max_fetches_in_flight: Per queue, fetches of consecutive ranges sent at once while the
            queue holds more than one batch beyond what was fetched (a lagging consumer catches up
            faster); at the end of the queue a single fetch long-polls.
        auto_commit_interval_ms: How often finished offsets are committed.
        reset: Where to start a queue without a committed offset, or whose offset is out of range
            (retention removed it): ``"earliest"`` or ``"latest"``.
        auto_ack: Iteration acks the previous message when the next one is requested.
        request_timeout_ms: One request's timeout.
        retry_backoff_ms, retry_backoff_max_ms: Backoff after failed fetches and commits.
        metadata_max_age_ms: How often queue leaders are refreshed.
        wire: ``"binary"`` (default): fetch the stored record batches (``Accept:
            application/vnd.raftmq.batch``) and build each message only when it is taken;
            ``"json"``: the JSON answer. A node that refuses the binary answer (415, 406) or
            answers JSON anyway turns this consumer to JSON by itself.
        address_map: ``address_map(url)``: where to connect for a node's advertised address (or
            None: the node is unreachable now), read on every request; for clients that cannot
            reach the addresses the cluster advertises (NAT, port mappings). Default: connect to
            the advertised address.
        token: API token (``Authorization: Bearer``), for clusters with tokens.
        ca_file: CA certificates (PEM) that ``https://`` nodes are verified against (default: the
            system's CAs); ``ssl``: an SSL context instead.
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
        self._bootstrap = bootstrap
        self._config = ConsumerConfig(
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
            wire=wire,
            address_map=address_map,
            token=token,
            ca_file=ca_file,
            ssl=ssl,
        )
        self._config.check()
        self._core: ConsumerCore | None = None
        self._last: Message | None = None
        self._closed = False

    @property
    def member_id(self) -> str | None:
        """This consumer's id in its group (known once started)."""
        return self._core.member_id if self._core else self._config.member_id

    @property
    def commit_group(self) -> str:
        """The consumer group its offsets are committed under."""
        return self._config.commit_group

    async def start(self) -> None:
        """Join the group (or take every queue, in broadcast mode) and start fetching."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._core is None:
            core = ConsumerCore(self._bootstrap, self._config)
            try:
                await core.start()
            except BaseException:
                await core.close(commit=False)
                raise
            self._core = core

    def _started(self) -> ConsumerCore:
        if self._core is None:
            raise RuntimeError("start the consumer first (await consumer.start() or async with)")
        return self._core

    def assignment(self) -> frozenset[TopicQueue]:
        """The (topic, queue) pairs this consumer currently owns."""
        return self._core.assignment() if self._core else frozenset()

    async def getmany(self, max_messages: int = 1_000, timeout_ms: int | None = None) -> list[Message]:
        """Up to ``max_messages`` messages, waiting up to ``timeout_ms`` (None: until one arrives
        or the consumer is closed). Returns [] on timeout or once closed."""
        return await self._started().get_many(max_messages, None if timeout_ms is None else timeout_ms / 1000)

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Message:
        if self._last is not None and self._config.auto_ack:
            self._last.ack()
        self._last = None
        core = self._started()
        got = core.take(1) or await core.get_many(1, None)
        if not got:
            raise StopAsyncIteration
        message = got[0]
        self._last = message
        return message

    async def run(self, handler: Handler, *, concurrency: int = 1, ordered: bool = True) -> None:
        """Process messages with ``handler`` until the consumer is closed; ack each on success.

        Args:
            handler: ``async def handler(msg)``; the message is acked when it returns.
            concurrency: Handlers running at once.
            ordered: True: one message at a time per queue, in offset order (queues in parallel).
                False: any messages in parallel.

        Raises:
            Exception: The first exception of ``handler``; ``run`` stops taking messages, waits for
                the running handlers, and re-raises it (the failed message stays unacked, so it is
                delivered again after a restart).
        """
        core = self._started()
        check_concurrency(concurrency)
        slots = asyncio.Semaphore(concurrency)
        lanes: dict[TopicQueue, deque[Message]] = {}
        running: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []
        stop = asyncio.Event()

        async def call(message: Message) -> bool:
            if failure:
                return False
            if message.revoked:  # its queue moved on: the new owner delivers it
                return True
            try:
                await handler(message)
            except Exception as e:
                failure.append(e)
                stop.set()
                return False
            message.ack()
            return True

        async def lane(key: TopicQueue) -> None:
            queue = lanes[key]
            try:
                while queue:
                    async with slots:
                        if not await call(queue[0]):
                            return
                    queue.popleft()
            finally:
                del lanes[key]

        async def single(message: Message) -> None:
            try:
                await call(message)
            finally:
                slots.release()

        def spawn(coro: Awaitable[None]) -> None:
            task: asyncio.Task[None] = asyncio.ensure_future(coro)
            running.add(task)
            task.add_done_callback(running.discard)

        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(core.get_many(1_000, None))
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                batch = getter.result()
                if not batch:
                    break
                for message in batch:
                    if ordered:
                        key = (message.topic, message.queue)
                        if key in lanes:
                            lanes[key].append(message)
                        else:
                            lanes[key] = deque([message])
                            spawn(lane(key))
                    else:
                        await slots.acquire()
                        if stop.is_set():
                            slots.release()
                            break
                        spawn(single(message))
        finally:
            stopper.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if failure:
            raise failure[0]

    def ack(self, messages: Iterable[Message]) -> None:
        """Ack every one of ``messages``, as ``msg.ack()`` each but cheaper: each queue's window
        is locked once and its committed offset moved once (at-least-once as before: a queue's
        committed offset still passes only messages that were acked, with every earlier one).

        Thread-safe and idempotent, like :meth:`Message.ack`; after a rebalance took a message's
        queue away its ack does nothing.
        """
        ack_messages(messages)

    async def commit(self) -> None:
        """Commit finished offsets now (also done every ``auto_commit_interval_ms``)."""
        await self._started().commit()

    async def committed(self, topic: str) -> dict[int, int | None]:
        """The group's committed offset of each queue of ``topic`` (None where none)."""
        core = self._started()
        return await core.api.committed_offsets(self._config.commit_group, topic)

    async def close(self, *, commit: bool = True) -> None:
        """Stop fetching, commit finished offsets (unless ``commit`` is False), leave the group."""
        self._closed = True
        if self._core is not None:
            await self._core.close(commit=commit)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
