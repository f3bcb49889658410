"""Typed calls of the HTTP API v1, shared by the admin, producer, consumer and subscriber."""

from __future__ import annotations

import ssl as _ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ._metadata import ClusterMetadata
from ._retry import Backoff, retrying
from ._transport import AddressMap, Transport, path_part
from ._types import ClusterStatus, SubscriptionSettings, TopicDescription, TopicInfo
from .errors import RaftmqError, error_from_body

__all__ = ["ApiClient", "ConnectionSettings", "connect"]


class ConnectionSettings(Protocol):
    """The settings of a client's connections, as its (frozen) config holds them."""

    @property
    def request_timeout_ms(self) -> int: ...
    @property
    def retry_backoff_ms(self) -> int: ...
    @property
    def retry_backoff_max_ms(self) -> int: ...
    @property
    def token(self) -> str | None: ...
    @property
    def ca_file(self) -> str | None: ...
    @property
    def ssl(self) -> _ssl.SSLContext | None: ...


def connect(
    bootstrap: str | Sequence[str],
    settings: ConnectionSettings,
    *,
    retry_timeout_ms: int,
    address_map: AddressMap | None = None,
) -> ApiClient:
    """The API client of a producer, consumer or subscriber core: its transport (``.transport``)
    to ``bootstrap`` and its backoff (``.backoff``) made from ``settings``."""
    transport = Transport(
        bootstrap,
        request_timeout_ms=settings.request_timeout_ms,
        address_map=address_map,
        token=settings.token,
        ca_file=settings.ca_file,
        ssl=settings.ssl,
    )
    backoff = Backoff(settings.retry_backoff_ms, settings.retry_backoff_max_ms)
    return ApiClient(transport, retry_timeout_ms=retry_timeout_ms, backoff=backoff)


class ApiClient:
    """API calls with retries of retriable failures (for ``retry_timeout_ms`` in total).

    A write that is not idempotent (create or delete a topic) is retried only after failures that
    certainly did nothing; an unknown outcome is raised, never resent.
    """

    def __init__(self, transport: Transport, *, retry_timeout_ms: int, backoff: Backoff) -> None:
        self.transport = transport
        self.retry_timeout_ms = retry_timeout_ms
        self.backoff = backoff

    async def call(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        body: Mapping[str, Any] | bytes | None = None,
        params: Mapping[str, str | int] | None = None,
        node_url: str | None = None,
        retry_timeout_ms: int | None = None,
    ) -> Any:
        async def once() -> Any:
            return await self.transport.request(
                method, path, body=body, params=params, node_url=node_url, idempotent=idempotent
            )

        return await retrying(
            once,
            idempotent=idempotent,
            timeout_ms=self.retry_timeout_ms if retry_timeout_ms is None else retry_timeout_ms,
            backoff=self.backoff,
        )

    # -- topics and cluster ----------------------------------------------------------------------

    async def create_topic(self, spec: Mapping[str, Any]) -> TopicDescription:
        return TopicDescription.from_wire(await self.call("POST", "/v1/topics", body=spec, idempotent=False))

    async def create_topics(self, specs: Sequence[Mapping[str, Any]]) -> list[TopicInfo | RaftmqError]:
        """One ``POST /v1/topics {"topics": specs}``: per spec, its topic or why it was not created."""
        answer = await self.call("POST", "/v1/topics", body={"topics": list(specs)}, idempotent=False)
        return [
            TopicInfo.from_wire(r["topic"]) if "topic" in r else error_from_body(200, r)
            for r in answer["results"]
        ]

    async def list_topics(self) -> list[TopicInfo]:
        answer = await self.call("GET", "/v1/topics", idempotent=True)
        return [TopicInfo.from_wire(t) for t in answer["topics"]]

    async def describe_topic(self, name: str) -> TopicDescription:
        answer = await self.call("GET", f"/v1/topics/{path_part(name)}", idempotent=True)
        return TopicDescription.from_wire(answer)

    async def change_topic(self, name: str, change: Mapping[str, Any]) -> TopicDescription:
        # Setting is idempotent: a resent PATCH sets the same values.
        answer = await self.call("PATCH", f"/v1/topics/{path_part(name)}", idempotent=True, body=change)
        return TopicDescription.from_wire(answer)

    async def delete_topic(self, name: str) -> None:
        await self.call("DELETE", f"/v1/topics/{path_part(name)}", idempotent=False)

    async def cluster_status(self) -> ClusterStatus:
        return ClusterStatus.from_wire(await self.call("GET", "/v1/cluster", idempotent=True))

    async def load_topic(self, metadata: ClusterMetadata, name: str) -> TopicDescription:
        """Describe the topic into ``metadata``, with the cluster's node addresses when a leader of
        one of its queues is a node ``metadata`` does not know yet."""
        desc = await self.describe_topic(name)
        leaders = {q.leader for q in desc.queue_states if q.leader}
        if not all(metadata.leader_known(n) for n in leaders):
            metadata.update_cluster(await self.cluster_status())
        metadata.update_topic(desc, time.monotonic())
        return desc

    # -- consumer groups -------------------------------------------------------------------------

    async def set_subscription(
        self, topic: str, group: str, settings: Mapping[str, Any]
    ) -> SubscriptionSettings:
        # Setting is idempotent: a resent PUT stores the same settings.
        answer = await self.call(
            "PUT",
            f"/v1/topics/{path_part(topic)}/subscriptions/{path_part(group)}",
            body=settings,
            idempotent=True,
        )
        return SubscriptionSettings.from_wire(answer)

    async def committed_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        answer = await self.call(
            "GET", f"/v1/groups/{path_part(group)}/offsets", params={"topic": topic}, idempotent=True
        )
        return {int(q): o for q, o in answer["offsets"].items()}

    async def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        *,
        advance: bool = False,
        retry_timeout_ms: int | None = None,
    ) -> None:
        """Commit ``offsets``; ``advance`` (a consumer's commit): a queue's offset only moves
        forward, and an offset the cluster kept (it had a newer one) is success too.

        Idempotent either way: a resent commit stores the same value. A set (no ``advance``) that
        is resent may land after a newer commit and move it back; an advance-only one may not."""
        body: dict[str, object] = {"topic": topic, "offsets": {str(q): o for q, o in offsets.items()}}
        if advance:
            body["advance"] = True
        await self.call(
            "PUT",
            f"/v1/groups/{path_part(group)}/offsets",
            body=body,
            idempotent=True,
            retry_timeout_ms=retry_timeout_ms,
        )

    async def join_group(
        self,
        group: str,
        member_id: str,
        topics: Sequence[str],
        *,
        generation: int | None = None,
        retry: bool = True,
    ) -> dict[str, Any]:
        """Join or heartbeat. ``generation``: that of the last assignment applied (0 before the
        first; None: take no part in the revoke barrier). ``retry=False``: one attempt (a
        heartbeat is sent again soon)."""
        body: dict[str, Any] = {"member_id": member_id, "topics": list(topics)}
        if generation is not None:
            body["generation"] = generation
        answer: dict[str, Any] = await self.call(
            "POST",
            f"/v1/groups/{path_part(group)}/members",
            body=body,
            idempotent=True,
            retry_timeout_ms=None if retry else 0,
        )
        return answer

    async def leave_group(self, group: str, member_id: str) -> None:
        await self.transport.request(
            "DELETE", f"/v1/groups/{path_part(group)}/members/{path_part(member_id)}", idempotent=True
        )
