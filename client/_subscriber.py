"""The subscriber: receive/ack consumption with per-message acknowledgement, over long-polling
receives (``mode="poll"``) or the push stream (``mode="push"``); :class:`AsyncSubscriber` for
asyncio, :class:`Subscriber` for threads. The work is done by ``_subscriber_core.py`` and
``_push_source.py``; docs/client.md is the guide.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Unpack

from ._io_thread import SyncClient
from ._received import ReceivedMessage
from ._subscriber_config import SubscriberConfig, SubscriberOptions, SubscriberStats
from ._subscriber_core import SubscriberCore
from .errors import ClientClosed

__all__ = ["AsyncSubscriber", "Subscriber"]

Bootstrap = str | Sequence[str]  # node addresses: "h1:8080,h2:8080" or a list of them


class AsyncSubscriber:
    """Receives the messages of a topic for a consumer group, each acked on its own (asyncio).

    Any number of subscribers of one group share the topic's messages, whatever its queue count;
    each message goes to one of them at a time and is in flight until its deadline
    (``visibility_ms``): ack it when done, nack it to have it again, extend it to keep it longer.
    A message neither acked nor extended comes back after its deadline with ``attempt`` + 1; after
    the group's ``max_deliveries`` it goes to the dead-letter topic ``<topic>.<group>.dlq``::

        async with AsyncSubscriber(brokers, topic="orders", group="billing") as subscriber:
            async for msg in subscriber:
                await handle(msg.value)
                msg.ack()

    Acks, nacks and extends are batched: they return at once and are sent every
    ``ack_interval_ms`` or when ``ack_batch_size`` are waiting, on :meth:`flush` and on close.
    Failover: requests move on to the next node and retry retriable errors; the push stream is
    opened again at another node. Nothing is lost on failure, it is delivered again
    (at-least-once): process messages idempotently.

    :meth:`close` stops receiving, gives back the messages never handed out (nack with delay 0,
    so another subscriber gets them at once) and sends the queued acks; messages handed out but
    not settled stay in flight until their deadline.

    Args:
        bootstrap: Node addresses; any one will do.
        topic: The topic.
        group: The consumer group (it names the dead-letter topic, so it must fit a topic name).
        **options: The settings below, as keyword arguments (typed by
            :class:`~raftmq.client.SubscriberOptions`; defaults in parentheses).
        mode: ``"poll"`` (default): long-polling receives. ``"push"``: a WebSocket stream on which
            the node pushes messages as credit allows (NSQ's RDY) and settlements go back
            (FIN/REQ/TOUCH).
        max_in_flight: Received and not yet acked or nacked messages at most (1,000; the push
            stream's credit); a message past its deadline no longer counts. Poll mode receives
            once half of it fits. Lower it when a message takes long to handle: every message
            taken must be settled or extended within ``visibility_ms``.
        visibility_ms: How long a message stays in flight (None: the cluster's, 30 s).
        wait_ms: Poll mode: how long a receive waits for messages (5,000; at most 15,000).
        ack_batch_size: Settlements sent together (256; push mode: at most half the credit).
        ack_interval_ms: The longest a settlement waits before it is sent (50).
        heartbeat_ms: Push mode: ping interval on the stream both ways (5,000); a silent peer is
            dropped after one and a half of it.
        request_timeout_ms: One request's timeout (30,000).
        retry_timeout_ms: How long failed requests are retried (30,000).
        retry_backoff_ms, retry_backoff_max_ms: Backoff between retries and reconnects (100, 2,000).
        address_map: Where to connect for a node's advertised address (see the transport; None).
        token: API token (``Authorization: Bearer``), for clusters with tokens (None).
        ca_file, ssl: Certificates for ``https://`` nodes (None: the system's CAs).
    """

    def __init__(
        self, bootstrap: Bootstrap, *, topic: str, group: str, **options: Unpack[SubscriberOptions]
    ) -> None:
        self._bootstrap = bootstrap
        self._config = SubscriberConfig(topic=topic, group=group, **options)
        self._config.check()
        self._core: SubscriberCore | None = None
        self._closed = False

    @property
    def stats(self) -> SubscriberStats:
        """A copy of the counts (received, acked, nacked, extended, stale, failed, reconnects)."""
        return dataclasses.replace(self._core.stats) if self._core else SubscriberStats()

    @property
    def node(self) -> str | None:
        """Push mode: the id of the node serving the stream now (None between streams)."""
        push = self._core.push if self._core else None
        return push.node if push is not None and push.ws is not None else None

    async def start(self) -> None:
        """Check the topic (TopicNotFound is raised here) and start receiving."""
        if self._closed:
            raise ClientClosed("the subscriber is closed")
        if self._core is None:
            core = SubscriberCore(self._bootstrap, self._config)
            try:
                await core.start()
            except BaseException:
                await core.close()
                raise
            self._core = core

    def _started(self) -> SubscriberCore:
        if self._core is None:
            raise RuntimeError("start the subscriber first (await subscriber.start() or async with)")
        return self._core

    async def receive(self, max_messages: int = 100, timeout_ms: int | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, waiting up to ``timeout_ms`` (None: until one arrives
        or the subscriber is closed). [] on timeout or once closed.

        Raises:
            RaftmqError: Why receiving stopped for good (e.g. TopicNotFound after a deletion).
        """
        timeout_s = None if timeout_ms is None else timeout_ms / 1000
        return await self._started().get_many(max_messages, timeout_s)

    def __aiter__(self) -> AsyncSubscriber:
        return self

    async def __anext__(self) -> ReceivedMessage:
        got = await self._started().get_many(1, None)
        if not got:
            raise StopAsyncIteration
        return got[0]

    async def flush(self) -> None:
        """Send the queued acks, nacks and extends now and wait for their answers."""
        await self._started().flush()

    async def close(self) -> None:
        """Stop, give back what was never handed out, send the queued settlements (see above)."""
        self._closed = True
        if self._core is not None:
            await self._core.close()

    async def __aenter__(self) -> AsyncSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Subscriber(SyncClient):
    """The sync twin of :class:`AsyncSubscriber` (same arguments): iterate, or call
    :meth:`receive`; messages may be settled from any thread. The work runs in the subscriber's
    own I/O thread. :meth:`close` may be called from another thread: iteration then ends."""

    def __init__(
        self, bootstrap: Bootstrap, *, topic: str, group: str, **options: Unpack[SubscriberOptions]
    ) -> None:
        self._async = AsyncSubscriber(bootstrap, topic=topic, group=group, **options)
        self._local: deque[ReceivedMessage] = deque()  # taken from the core, not yet yielded
        super().__init__("raftmq-subscriber")
        self._start(self._async.start())

    @property
    def stats(self) -> SubscriberStats:
        """A copy of the counts (see :class:`AsyncSubscriber`)."""
        return self._async.stats

    @property
    def node(self) -> str | None:
        """Push mode: the node serving the stream now."""
        return self._async.node

    def receive(self, max_messages: int = 100, timeout_ms: int | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, waiting up to ``timeout_ms`` (None: until one arrives
        or the subscriber is closed); [] on timeout or once closed."""
        if self._local:
            return [self._local.popleft() for _ in range(min(max_messages, len(self._local)))]
        return self._run_or_closed(self._async.receive(max_messages, timeout_ms), [])

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while True:
            if not self._local:
                self._local.extend(self.receive(1_000))
                if not self._local:
                    return
            yield self._local.popleft()

    def flush(self) -> None:
        """Send the queued acks, nacks and extends now and wait for their answers."""
        self._io.run(self._async.flush())

    def close(self) -> None:
        """Stop, give back what was never handed out, send the queued settlements."""
        while self._local:  # taken by an iteration that stopped early: never handed out
            self._local.popleft().nack(0)
        self._shut_down(self._async.close())
