"""A message handed out by receive/ack or the push stream, settled with ack, nack or extend."""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

__all__ = ["ReceivedMessage", "SettleOp", "Settler"]

_EMPTY: Mapping[str, str] = MappingProxyType({})

SettleOp = Literal["ack", "nack", "extend"]

# Guards the check-and-set of ``_settled``: an ack and a nack (or close) may race on two threads.
# One lock for all messages: it is held for two attribute accesses, so it is hardly contended.
_SETTLE_LOCK = threading.Lock()


class Settler(Protocol):
    """Takes the settlements of received messages (the subscriber's core; thread-safe)."""

    def settle(self, message: ReceivedMessage, op: SettleOp, value: int | None) -> None: ...


@dataclass(slots=True, eq=False)
class ReceivedMessage:
    """A message in flight for a consumer group: finish it with :meth:`ack`, give it back with
    :meth:`nack`, or keep it longer with :meth:`extend` before ``deadline_ms``.

    Settling is batched: the calls return at once and the subscriber sends them together (every
    ``ack_interval_ms``, or when ``ack_batch_size`` are waiting, and on flush and close). They
    may be called from any thread.

    Attributes:
        topic, queue, offset: Its place; ``(queue, offset)`` names it forever.
        value: ``str`` for a text message, ``bytes`` for a binary one.
        key, headers, timestamp_ms: As produced (``timestamp_ms``: when it was appended).
        receipt: The handle of this delivery (opaque); stale once the message is redelivered.
        attempt: The delivery number (1 the first time; after ``max_deliveries`` the message goes
            to the dead-letter topic instead).
        deadline_ms: When it is delivered again unless acked or extended (the leader's clock, ms
            since the epoch).
        first_delivery_ms: When the group first received it, by the group's time (ms since the
            epoch): the same on every attempt (SQS's ApproximateFirstReceiveTimestamp). None from
            a node of a release that does not record it.
    """

    topic: str
    queue: int
    offset: int
    value: str | bytes
    key: str | None
    headers: Mapping[str, str]
    timestamp_ms: int
    receipt: str
    attempt: int
    deadline_ms: int
    first_delivery_ms: int | None = None
    _settler: Settler | None = field(default=None, init=False, repr=False)
    _settled: bool = field(default=False, init=False, repr=False)

    def ack(self) -> None:
        """Finish it: it is never delivered to this group again (once the ack is sent).

        Idempotent; after :meth:`nack` it does nothing.
        """
        self._finish("ack", None)

    def nack(self, delay_ms: int | None = None) -> None:
        """Give it back for another delivery: after ``delay_ms`` (0: at once), or by default after
        the group's backoff for this attempt. At ``max_deliveries`` it is dead-lettered.

        Idempotent; after :meth:`ack` it does nothing.
        """
        if delay_ms is not None and delay_ms < 0:
            raise ValueError("delay_ms must be at least 0")
        self._finish("nack", delay_ms)

    def extend(self, visibility_ms: int) -> None:
        """Keep it in flight for ``visibility_ms`` more from now (NSQ's TOUCH)."""
        if visibility_ms < 1:
            raise ValueError("visibility_ms must be at least 1")
        if not self._settled and self._settler is not None:
            self._settler.settle(self, "extend", visibility_ms)

    @property
    def settled(self) -> bool:
        """:meth:`ack` or :meth:`nack` was called (or the subscriber gave it back on close)."""
        return self._settled

    def _finish(self, op: SettleOp, value: int | None) -> None:
        if self._claim() and self._settler is not None:
            self._settler.settle(self, op, value)

    def _claim(self) -> bool:
        """Mark it settled; False if it was already (only one of racing settlements is sent)."""
        with _SETTLE_LOCK:
            if self._settled:
                return False
            self._settled = True
            return True

    @classmethod
    def from_wire(cls, topic: str, m: Mapping[str, Any], settler: Settler | None) -> ReceivedMessage:
        value: str | bytes = m["value"] if "value" in m else base64.b64decode(m["value_b64"])
        message = cls(
            topic,
            m["queue"],
            m["offset"],
            value,
            m.get("key"),
            m.get("headers") or _EMPTY,
            m.get("timestamp_ms", 0),
            m["receipt"],
            m["attempt"],
            m["deadline_ms"],
            m.get("first_delivery_ms"),
        )
        message._settler = settler
        return message
