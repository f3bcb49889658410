"""The subscriber's settings, options and statistics, and the small helpers its receive and push
sources share (``_subscriber_core.py``, ``_push_source.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl as _ssl
import time
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ._limits import MAX_MESSAGES, MAX_WAIT_MS
from ._transport import AddressMap, path_part
from .errors import InternalError, RaftmqError

__all__ = [
    "MAX_IN_FLIGHT",
    "MAX_RECEIPTS",
    "ROUTES_MAX_AGE_S",
    "SubscribeMode",
    "SubscriberConfig",
    "SubscriberOptions",
    "SubscriberStats",
    "now_ms",
    "receiving_may_retry",
    "wait_event",
]

SubscribeMode = Literal["poll", "push"]
MAX_IN_FLIGHT = MAX_MESSAGES  # the API's most messages per receive (and RDY)
MAX_RECEIPTS = MAX_MESSAGES  # per settle request or frame
ROUTES_MAX_AGE_S = 10.0  # how long the leaders of the queue groups are trusted before a refresh


@dataclass(frozen=True)
class SubscriberConfig:
    """The subscriber's settings (documented on :class:`~raftmq.client.AsyncSubscriber`)."""

    topic: str
    group: str
    mode: SubscribeMode = "poll"
    max_in_flight: int = 1_000
    visibility_ms: int | None = None
    wait_ms: int = 5_000
    ack_batch_size: int = 256
    ack_interval_ms: int = 50
    heartbeat_ms: int = 5_000
    request_timeout_ms: int = 30_000
    retry_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2_000
    address_map: AddressMap | None = None
    token: str | None = field(default=None, repr=False)  # API token (never in a repr)
    ca_file: str | None = None
    ssl: _ssl.SSLContext | None = None

    def check(self) -> None:
        problems = []
        if self.mode not in ("poll", "push"):
            problems.append("mode must be 'poll' or 'push'")
        if not self.topic or not self.group:
            problems.append("topic and group are required")
        if not 1 <= self.max_in_flight <= MAX_IN_FLIGHT:
            problems.append(f"max_in_flight must be from 1 to {MAX_IN_FLIGHT}")
        if self.visibility_ms is not None and self.visibility_ms < 1:
            problems.append("visibility_ms must be at least 1")
        if not 0 <= self.wait_ms <= MAX_WAIT_MS:
            problems.append(f"wait_ms must be from 0 to {MAX_WAIT_MS}")
        if not 1 <= self.ack_batch_size <= MAX_RECEIPTS:
            problems.append(f"ack_batch_size must be from 1 to {MAX_RECEIPTS}")
        if self.ack_interval_ms < 0:
            problems.append("ack_interval_ms must be at least 0")
        if not 100 <= self.heartbeat_ms <= 60_000:
            problems.append("heartbeat_ms must be from 100 to 60000")
        for name in ("request_timeout_ms", "retry_timeout_ms", "retry_backoff_ms", "retry_backoff_max_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be at least 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def path(self) -> str:
        return f"/v1/topics/{path_part(self.topic)}/subscriptions/{path_part(self.group)}"


class SubscriberOptions(TypedDict, total=False):
    """The subscriber's optional keyword arguments (their defaults are SubscriberConfig's), typed
    for ``**options: Unpack[SubscriberOptions]`` in both subscribers' signatures."""

    mode: SubscribeMode
    max_in_flight: int
    visibility_ms: int | None
    wait_ms: int
    ack_batch_size: int
    ack_interval_ms: int
    heartbeat_ms: int
    request_timeout_ms: int
    retry_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    address_map: AddressMap | None
    token: str | None
    ca_file: str | None
    ssl: _ssl.SSLContext | None


@dataclass
class SubscriberStats:
    """Counts since the subscriber started.

    Attributes:
        received: Messages received (each delivery counts).
        acked, nacked, extended: Settlements the cluster applied.
        stale: Settlements refused with ``stale_receipt`` (the message had been redelivered, or was
            settled already: a retried ack after a lost answer ends here).
        failed: Settlements that failed otherwise, after retries; their messages come back after
            their deadline.
        reconnects: Push streams opened again after one broke.
    """

    received: int = 0
    acked: int = 0
    nacked: int = 0
    extended: int = 0
    stale: int = 0
    failed: int = 0
    reconnects: int = 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def receiving_may_retry(error: RaftmqError) -> bool:
    """A failed receive or push stream may be tried again: the error is retriable, or it is
    ``internal`` (an unexpected error at a node: a receive that fails hands nothing out, so the
    next may work). Settlements keep the usual rule (``_retry.may_retry``)."""
    return error.retriable or isinstance(error, InternalError)


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> None:
    """Until ``event`` is set or ``timeout_s`` (None: no limit) passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
