"""Topic and cluster administration (asyncio)."""

from __future__ import annotations

import enum
import ssl as _ssl
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ._api import ApiClient
from ._retry import Backoff
from ._transport import Transport
from ._types import ClusterStatus, SubscriptionSettings, TopicDescription, TopicInfo
from .errors import RaftmqError, RequestTooLarge

__all__ = ["UNCHANGED", "AsyncAdmin", "Unchanged"]

BULK_CHUNK = 1000  # topics per request: a node's limits.max_topics_per_request, by default


class Unchanged(enum.Enum):
    """The type of :data:`UNCHANGED`: a setting a call leaves as it is."""

    UNCHANGED = "unchanged"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged.UNCHANGED
"""A setting left as it is (the default of :meth:`AsyncAdmin.set_topic_retention`'s bounds)."""


def _topic_settings(
    queues: int, retention_ms: int | None, retention_bytes: int | None, max_message_bytes: int | None
) -> dict[str, Any]:
    """A topic spec's settings: ``queues`` and those given (None: the cluster's default)."""
    given = {
        "retention_ms": retention_ms,
        "retention_bytes": retention_bytes,
        "max_message_bytes": max_message_bytes,
    }
    return {"queues": queues, **{k: v for k, v in given.items() if v is not None}}


class AsyncAdmin:
    """Topics, consumer-group offsets and cluster status (asyncio).

    Retriable failures are retried with backoff for up to ``retry_timeout_ms``; creating and
    deleting a topic are not idempotent, so those are retried only after failures that certainly
    did nothing (an unknown outcome is raised as such).

    Args:
        bootstrap: Node addresses; any one will do.
        request_timeout_ms: One attempt's timeout.
        retry_timeout_ms: Time for all attempts of one call.
        token: API token (``Authorization: Bearer``), for clusters with tokens.
        ca_file: CA certificates (PEM) that ``https://`` nodes are verified against (default: the
            system's CAs); ``ssl``: an SSL context instead.
    """

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
        self._transport = Transport(
            bootstrap, request_timeout_ms=request_timeout_ms, token=token, ca_file=ca_file, ssl=ssl
        )
        self._api = ApiClient(
            self._transport,
            retry_timeout_ms=retry_timeout_ms,
            backoff=Backoff(retry_backoff_ms, retry_backoff_max_ms),
        )

    async def create_topic(
        self,
        name: str,
        queues: int = 8,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        max_message_bytes: int | None = None,
    ) -> TopicDescription:
        """Create a topic.

        Raises:
            TopicExists: A topic with this name exists.
            BadRequest: An invalid name or setting.
        """
        settings = _topic_settings(queues, retention_ms, retention_bytes, max_message_bytes)
        return await self._api.create_topic({"name": name, **settings})

    async def create_topics(
        self,
        names: Sequence[str],
        queues: int = 8,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        max_message_bytes: int | None = None,
    ) -> dict[str, TopicInfo | RaftmqError]:
        """Create many topics with the same settings: one request and one Raft entry per 1,000
        (fewer when the cluster's ``limits.max_topics_per_request`` is lower).

        Returns:
            Per name, its topic, or the error that topic alone failed with (e.g.
            :class:`TopicExists`); the other topics are created.

        Raises:
            BadRequest: An invalid name or setting, or a name given twice (nothing created).
            Forbidden: The token lacks admin on one of the names (nothing of that request created).
            UpgradeInProgress: A metadata voter runs a release that cannot create topics in bulk
                (create them with :meth:`create_topic`). When the node asked or the metadata
                leader runs that release itself, the request is a :class:`BadRequest` whose
                details name no ``index`` (the CLI then creates the topics one by one).
        """
        settings = _topic_settings(queues, retention_ms, retention_bytes, max_message_bytes)
        out: dict[str, TopicInfo | RaftmqError] = {}
        chunk, done = BULK_CHUNK, 0
        while done < len(names):
            part = names[done : done + chunk]
            try:
                results = await self._api.create_topics([{"name": name, **settings} for name in part])
            except RequestTooLarge as e:
                limit = e.details.get("limit")
                if not isinstance(limit, int) or not 1 <= limit < chunk:
                    raise
                chunk = limit
                continue
            out.update(zip(part, results, strict=True))
            done += len(part)
        return out

    async def set_topic_retention(
        self,
        name: str,
        *,
        retention_ms: int | Unchanged | None = UNCHANGED,
        retention_bytes: int | Unchanged | None = UNCHANGED,
    ) -> TopicDescription:
        """Set a topic's retention bounds: a bound left out keeps its value, None removes it (the
        topic keeps its messages for as long, or as many bytes, as the other allows, or forever).
        Turning retention on or tightening it frees the messages past it at the queue groups'
        next retention look (the nodes' ``raft.retention_check_ms``, 10 s by default), without a
        restart.

        Raises:
            TypeError: Neither bound given (nothing to change; nothing is sent).
            TopicNotFound: No such topic.
            BadRequest: A bound below 1.
            UpgradeInProgress: A metadata voter runs a release that cannot change retention.
        """
        given = {"retention_ms": retention_ms, "retention_bytes": retention_bytes}
        change = {k: v for k, v in given.items() if v is not UNCHANGED}
        if not change:
            raise TypeError("set_topic_retention() needs retention_ms or retention_bytes (None: no bound)")
        return await self._api.change_topic(name, change)

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic (linearizable)."""
        return await self._api.list_topics()

    async def describe_topic(self, name: str) -> TopicDescription:
        """The topic with each queue's group, leader, replicas and offsets.

        Raises:
            TopicNotFound: No such topic.
        """
        return await self._api.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        """Delete the topic and its data.

        Raises:
            TopicNotFound: No such topic.
        """
        await self._api.delete_topic(name)

    async def cluster_status(self) -> ClusterStatus:
        """Nodes and Raft groups: leader, term, commit/applied index per replica."""
        return await self._api.cluster_status()

    async def committed_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        """The consumer group's committed offset per queue of ``topic`` (None where none)."""
        return await self._api.committed_offsets(group, topic)

    async def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Set the consumer group's offsets (``{queue: offset}``), e.g. to rewind it.

        Raises:
            OffsetOutOfRange: An offset is above its queue's ``high_offset``.
        """
        await self._api.commit_offsets(group, topic, offsets)

    async def set_subscription(
        self,
        topic: str,
        group: str,
        *,
        max_deliveries: int | None = None,
        backoff_ms: Sequence[int] | None = None,
    ) -> SubscriptionSettings:
        """Set a receive/ack group's settings on ``topic`` (creating its dead-letter topic
        ``<topic>.<group>.dlq`` if needed). A setting left None is set to the cluster's default
        (``[delivery]`` in the cluster file), as the route does with an omitted field. Applies to
        deliveries from now on; returns what is stored.

        Args:
            max_deliveries: Deliveries of a message before it becomes a dead letter (1 or more).
            backoff_ms: Delay before the retry of a nacked message, per attempt (the last
                repeating); an expired one comes back at its deadline regardless.

        Raises:
            TopicNotFound: No such topic.
            BadRequest: A setting out of range (see docs/delivery.md).
        """
        settings: dict[str, Any] = {}
        if max_deliveries is not None:
            settings["max_deliveries"] = max_deliveries
        if backoff_ms is not None:
            settings["backoff_ms"] = list(backoff_ms)
        return await self._api.set_subscription(topic, group, settings)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
