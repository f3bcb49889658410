"""The client's errors: one root class, one subclass per API error code, plus the client's own.

Clients match on classes (or on ``code``), never on message text. Every class carries the same
flags as the API's error catalogue:

- ``code``: the stable snake_case code (the API's, or a client-only one below);
- ``status``: the HTTP status the API answers with (0 for errors raised by the client itself);
- ``retriable``: the same request may succeed later;
- ``definite``: True if the request certainly had no effect; False if a write may or may not have
  happened (retrying it is safe only with ``producer_id``/``sequence``, which the producer sends).

Class tree::

    RaftmqError
    ├── BadRequest              bad_request          400
    ├── InvalidJson             invalid_json         400
    ├── BadBatch                bad_batch            400  (reason, record, batch)
    ├── ReservedHeader          reserved_header      400  (a raftmq-* header name)
    ├── Unauthorized            unauthorized         401
    ├── Forbidden               forbidden            403
    │   └── MemberNotOwned      member_not_owned     403  (another token's group member)
    ├── NotFound                not_found            404
    ├── TopicNotFound           topic_not_found      404
    ├── QueueNotFound           queue_not_found      404
    ├── MethodNotAllowed        method_not_allowed   405
    ├── TopicExists             topic_exists         409
    ├── StaleReceipt            stale_receipt        409
    ├── StaleEpoch              stale_epoch          409
    ├── StaleSequence           stale_sequence       409
    ├── LockHeld                lock_held            409
    ├── DeadLetterTopicConflict dead_letter_topic_conflict 409
    ├── TooManyMembers          too_many_members     409  (a token's or topic's member cap)
    ├── ChangeInProgress        change_in_progress   409  retriable (another cluster change)
    ├── MessageTooLarge         message_too_large    413
    ├── RequestTooLarge         request_too_large    413
    ├── OffsetOutOfRange        offset_out_of_range  416  (low_offset, high_offset)
    ├── NotLeader               not_leader           421  retriable
    ├── TooManyGroups           too_many_groups      409  (a [limits] cap on consumer groups)
    ├── TooManyRequests         too_many_requests    429  retriable
    ├── InternalError           internal             500  indefinite
    ├── Unavailable             unavailable          503  retriable
    ├── UpgradeInProgress       upgrade_in_progress  503  retriable
    ├── UnknownOutcome          unknown_outcome      503  retriable, indefinite
    ├── Timeout                 timeout              504  retriable, indefinite
    ├── UnexpectedResponse      unexpected_response    -  indefinite (not a raftmq error body)
    ├── ConnectionFailed        connection_failed      -  retriable (the request was never sent)
    │   └── ConnectionLost      connection_lost        -  retriable, indefinite (sent, no answer)
    ├── BufferFull              buffer_full            -  retriable (producer buffer, nothing sent)
    ├── DeliveryTimeout         delivery_timeout       -  retriable (never sent before the deadline)
    └── ClientClosed            client_closed          -  (you closed the client)

Following trio, :class:`ClientClosed` (you closed it) is apart from :class:`ConnectionFailed` (the
world failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

__all__ = [
    "BY_CODE",
    "CLIENT_CODES",
    "BadBatch",
    "BadRequest",
    "BufferFull",
    "ChangeInProgress",
    "ClientClosed",
    "ConnectionFailed",
    "ConnectionLost",
    "DeadLetterTopicConflict",
    "DeliveryTimeout",
    "Forbidden",
    "InternalError",
    "InvalidJson",
    "LockHeld",
    "MemberNotOwned",
    "MessageTooLarge",
    "MethodNotAllowed",
    "NotFound",
    "NotLeader",
    "OffsetOutOfRange",
    "QueueNotFound",
    "RaftmqError",
    "RequestTooLarge",
    "ReservedHeader",
    "StaleEpoch",
    "StaleReceipt",
    "StaleSequence",
    "Timeout",
    "TooManyGroups",
    "TooManyMembers",
    "TooManyRequests",
    "TopicExists",
    "TopicNotFound",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
    "UnknownOutcome",
    "UpgradeInProgress",
    "error_from_body",
]


class RaftmqError(Exception):
    """The root of every error the client raises.

    Attributes:
        message: Human-readable detail (do not parse it).
        details: Extra fields of the API's error body (e.g. ``results`` of a partly stored produce).
    """

    code: ClassVar[str] = "raftmq_error"
    status: ClassVar[int] = 0
    retriable: ClassVar[bool] = False
    definite: ClassVar[bool] = True  # False: the write may have happened

    def __init__(self, message: str = "", details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details: Mapping[str, Any] = MappingProxyType(dict(details or {}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# -- the API's codes (cluster/base/errors.py; a unit test keeps the two tables equal) ------------------


class BadRequest(RaftmqError):
    code, status = "bad_request", 400


class InvalidJson(RaftmqError):
    code, status = "invalid_json", 400


class BadBatch(RaftmqError):
    """A binary record batch was refused: ``details["reason"]``, ``details["record"]`` (the first
    bad record) and ``details["batch"]`` (the frame) say what and where; nothing was stored."""

    code, status = "bad_batch", 400


class ReservedHeader(RaftmqError):
    """A message header's name starts with ``raftmq-`` (any ASCII case): those are the broker's
    own (dead-letter provenance, redrive). The producer raises it before sending; a node answers
    it for a request sent otherwise. Nothing was stored."""

    code, status = "reserved_header", 400


class Unauthorized(RaftmqError):
    code, status = "unauthorized", 401


class Forbidden(RaftmqError):
    code, status = "forbidden", 403


class MemberNotOwned(Forbidden):
    """The consumer-group member id belongs to a member another API token created."""

    code = "member_not_owned"


class NotFound(RaftmqError):
    code, status = "not_found", 404


class TopicNotFound(RaftmqError):
    code, status = "topic_not_found", 404


class QueueNotFound(RaftmqError):
    code, status = "queue_not_found", 404


class MethodNotAllowed(RaftmqError):
    code, status = "method_not_allowed", 405


class TopicExists(RaftmqError):
    code, status = "topic_exists", 409


class DeadLetterTopicConflict(RaftmqError):
    """A topic with the dead-letter topic's name exists and is not the recorded dead-letter topic
    of this topic and consumer group; nothing was done."""

    code, status = "dead_letter_topic_conflict", 409


class TooManyGroups(RaftmqError):
    """The topic or the token has as many consumer groups as the cluster's ``[limits]`` allow."""

    code, status = "too_many_groups", 409


class StaleReceipt(RaftmqError):
    """The receipt is no longer valid (the message was acked, redelivered since, or is unknown)."""

    code, status = "stale_receipt", 409


class StaleEpoch(RaftmqError):
    """The queue's lock has another epoch (a newer holder); nothing was done."""

    code, status = "stale_epoch", 409


class StaleSequence(RaftmqError):
    """The producer's sequence is older than its newest on the queue and no longer remembered (a
    late retry, or a ``producer_id`` reused from 0); nothing was stored."""

    code, status = "stale_sequence", 409


class LockHeld(RaftmqError):
    """Another consumer holds the queue's lock until ``details["lease_until_ms"]``; nothing was
    done (not retried by the client: the caller decides whether to wait)."""

    code, status = "lock_held", 409


class TooManyMembers(RaftmqError):
    """The token or a topic already has its most consumer-group members; nothing was done."""

    code, status = "too_many_members", 409


class ChangeInProgress(RaftmqError):
    """Another cluster change (node, replica or leadership move) is in progress; retry when it
    ends (``details["change"]`` describes it)."""

    code, status, retriable = "change_in_progress", 409, True


class MessageTooLarge(RaftmqError):
    code, status = "message_too_large", 413


class RequestTooLarge(RaftmqError):
    code, status = "request_too_large", 413


class OffsetOutOfRange(RaftmqError):
    """The offset is outside ``[low_offset, high_offset]`` of the queue.

    Attributes:
        low_offset: The first retained offset (None if the body did not say).
        high_offset: The next offset to be written (None if the body did not say).
    """

    code, status = "offset_out_of_range", 416

    def __init__(self, message: str = "", details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, details)
        low, high = self.details.get("low_offset"), self.details.get("high_offset")
        self.low_offset: int | None = low if isinstance(low, int) else None
        self.high_offset: int | None = high if isinstance(high, int) else None


class NotLeader(RaftmqError):
    code, status, retriable = "not_leader", 421, True


class TooManyRequests(RaftmqError):
    code, status, retriable = "too_many_requests", 429, True


class InternalError(RaftmqError):
    code, status, definite = "internal", 500, False


class Unavailable(RaftmqError):
    code, status, retriable = "unavailable", 503, True


class UpgradeInProgress(RaftmqError):
    """A replica of the group runs an older release that cannot apply this write (a rolling
    upgrade is under way); nothing was done."""

    code, status, retriable = "upgrade_in_progress", 503, True


class UnknownOutcome(RaftmqError):
    code, status, retriable, definite = "unknown_outcome", 503, True, False


class Timeout(RaftmqError):
    code, status, retriable, definite = "timeout", 504, True, False


# -- the client's own ------------------------------------------------------------------------------


class UnexpectedResponse(RaftmqError):
    """The server answered something that is not a raftmq answer (or an error code this client does
    not know; ``details["code"]`` then holds it)."""

    code, definite = "unexpected_response", False


class ConnectionFailed(RaftmqError):
    """No node could be reached; the request was never sent."""

    code, retriable = "connection_failed", True


class ConnectionLost(ConnectionFailed):
    """The connection broke after the request was sent: a write may or may not have happened."""

    code, definite = "connection_lost", False


class BufferFull(RaftmqError):
    """The producer's buffer (``max_buffer_bytes``) stayed full for ``max_block_ms``; nothing was
    sent."""

    code, retriable = "buffer_full", True


class DeliveryTimeout(RaftmqError):
    """A batch waited ``delivery_timeout_ms`` without being sent; nothing was written."""

    code, retriable = "delivery_timeout", True


class ClientClosed(RaftmqError):
    """The client was closed (by you); it takes no more requests."""

    code = "client_closed"


_SERVER_CLASSES: tuple[type[RaftmqError], ...] = (
    BadRequest,
    InvalidJson,
    BadBatch,
    ReservedHeader,
    Unauthorized,
    Forbidden,
    MemberNotOwned,
    NotFound,
    TopicNotFound,
    QueueNotFound,
    MethodNotAllowed,
    TopicExists,
    StaleReceipt,
    StaleEpoch,
    StaleSequence,
    LockHeld,
    DeadLetterTopicConflict,
    TooManyMembers,
    ChangeInProgress,
    MessageTooLarge,
    RequestTooLarge,
    OffsetOutOfRange,
    NotLeader,
    TooManyGroups,
    TooManyRequests,
    InternalError,
    Unavailable,
    UpgradeInProgress,
    UnknownOutcome,
    Timeout,
)

BY_CODE: Mapping[str, type[RaftmqError]] = MappingProxyType({c.code: c for c in _SERVER_CLASSES})
"""The exception class for every error code of the API (read-only)."""

CLIENT_CODES: Mapping[str, type[RaftmqError]] = MappingProxyType(
    {
        c.code: c
        for c in (
            UnexpectedResponse,
            ConnectionFailed,
            ConnectionLost,
            BufferFull,
            DeliveryTimeout,
            ClientClosed,
        )
    }
)
"""The codes the client raises on its own (never sent by a server)."""

_STANDARD_FIELDS = frozenset({"code", "message", "retriable", "definite"})


def error_from_body(status: int, body: Any) -> RaftmqError:
    """The exception for an API error answer.

    Args:
        status: The HTTP status of the answer.
        body: The parsed JSON body (anything: a body that is not the API's error shape gives
            :class:`UnexpectedResponse`).

    Returns:
        An instance of the class mapped from ``body["error"]["code"]``, with the body's extra
        fields in ``details``.
    """
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return UnexpectedResponse(f"HTTP {status} without a raftmq error body", {"status": status})
    message = error.get("message")
    message = message if isinstance(message, str) else ""
    details = {k: v for k, v in error.items() if k not in _STANDARD_FIELDS}
    cls = BY_CODE.get(error["code"])
    if cls is None:
        details.update(code=error["code"], status=status)
        return UnexpectedResponse(f"unknown error code {error['code']!r}: {message}", details)
    return cls(message, details)
