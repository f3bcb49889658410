"""The client's errors: one root class, one subclass per API error code, plus the client's own.

The root, :class:`RaftmqError`, and the catalogue are ``raftmq.errors``', shared with the server:
each class below names its catalogue entry (``error``), and :class:`BadBatch` and
:class:`OffsetOutOfRange` are the very classes the batch reader and storage raise. Clients match on
classes (or on ``code``), never on message text. Every class carries the catalogue's flags:

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
    ├── RequestTimeout          request_timeout      408  retriable (the body did not arrive in time)
    ├── TopicExists             topic_exists         409
    ├── StaleReceipt            stale_receipt        409
    ├── StaleEpoch              stale_epoch          409
    ├── StaleSequence           stale_sequence       409
    ├── LockHeld                lock_held            409
    ├── DeadLetterTopicConflict dead_letter_topic_conflict 409
    ├── TooManyMembers          too_many_members     409  (a token's or topic's member cap)
    ├── ChangeInProgress        change_in_progress   409  retriable (another cluster change)
    ├── NoChangeInProgress      no_change_in_progress 409 (the change to cancel is not in progress)
    ├── MessageTooLarge         message_too_large    413
    ├── RequestTooLarge         request_too_large    413
    ├── OffsetOutOfRange        offset_out_of_range  416  (low_offset, high_offset)
    ├── NotLeader               not_leader           421  retriable
    ├── TooManyGroups           too_many_groups      409  (a [limits] cap on consumer groups)
    ├── TooManyRequests         too_many_requests    429  retriable
    ├── DedupWindowFull         dedup_window_full    429  retriable (a queue's deduplication window)
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
from typing import Any

from raftmq.errors import (
    BAD_REQUEST,
    CHANGE_IN_PROGRESS,
    DEAD_LETTER_TOPIC_CONFLICT,
    DEDUP_WINDOW_FULL,
    FORBIDDEN,
    INTERNAL,
    INVALID_JSON,
    LOCK_HELD,
    MEMBER_NOT_OWNED,
    MESSAGE_TOO_LARGE,
    METHOD_NOT_ALLOWED,
    NO_CHANGE_IN_PROGRESS,
    NOT_FOUND,
    NOT_LEADER,
    QUEUE_NOT_FOUND,
    REQUEST_TIMEOUT,
    REQUEST_TOO_LARGE,
    RESERVED_HEADER,
    STALE_EPOCH,
    STALE_RECEIPT,
    STALE_SEQUENCE,
    TIMEOUT,
    TOO_MANY_GROUPS,
    TOO_MANY_MEMBERS,
    TOO_MANY_REQUESTS,
    TOPIC_EXISTS,
    TOPIC_NOT_FOUND,
    UNAUTHORIZED,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    UPGRADE_IN_PROGRESS,
    BadBatch,
    ErrorCode,
    OffsetOutOfRange,
    RaftmqError,
    body_parts,
)

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
    "DedupWindowFull",
    "DeliveryTimeout",
    "Forbidden",
    "InternalError",
    "InvalidJson",
    "LockHeld",
    "MemberNotOwned",
    "MessageTooLarge",
    "MethodNotAllowed",
    "NoChangeInProgress",
    "NotFound",
    "NotLeader",
    "OffsetOutOfRange",
    "QueueNotFound",
    "RaftmqError",
    "RequestTimeout",
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


# -- the API's codes: each class names its entry of the catalogue (raftmq.errors) -------------------
# BadBatch and OffsetOutOfRange are raftmq.errors' own (the batch reader and storage raise them too).


class BadRequest(RaftmqError):
    error = BAD_REQUEST


class InvalidJson(RaftmqError):
    error = INVALID_JSON


class ReservedHeader(RaftmqError):
    """A message header's name starts with ``raftmq-`` (any ASCII case): those are the broker's
    own (dead-letter provenance, redrive). The producer raises it before sending; a node answers
    it for a request sent otherwise. Nothing was stored."""

    error = RESERVED_HEADER


class Unauthorized(RaftmqError):
    error = UNAUTHORIZED


class Forbidden(RaftmqError):
    error = FORBIDDEN


class MemberNotOwned(Forbidden):
    """The consumer-group member id belongs to a member another API token created."""

    error = MEMBER_NOT_OWNED


class NotFound(RaftmqError):
    error = NOT_FOUND


class TopicNotFound(RaftmqError):
    error = TOPIC_NOT_FOUND


class QueueNotFound(RaftmqError):
    error = QUEUE_NOT_FOUND


class MethodNotAllowed(RaftmqError):
    error = METHOD_NOT_ALLOWED


class RequestTimeout(RaftmqError):
    """The request's body did not all arrive within the node's time for it; nothing was done."""

    error = REQUEST_TIMEOUT


class TopicExists(RaftmqError):
    error = TOPIC_EXISTS


class DeadLetterTopicConflict(RaftmqError):
    """A topic with the dead-letter topic's name exists and is not the recorded dead-letter topic
    of this topic and consumer group; nothing was done."""

    error = DEAD_LETTER_TOPIC_CONFLICT


class DedupWindowFull(RaftmqError):
    """A queue's deduplication window holds its most ids (sends with a deduplication id within 5
    minutes); nothing was stored. Retriable: ids expire 5 minutes after their send."""

    error = DEDUP_WINDOW_FULL


class TooManyGroups(RaftmqError):
    """The topic or the token has as many consumer groups as the cluster's ``[limits]`` allow."""

    error = TOO_MANY_GROUPS


class StaleReceipt(RaftmqError):
    """The receipt is no longer valid (the message was acked, redelivered since, or is unknown)."""

    error = STALE_RECEIPT


class StaleEpoch(RaftmqError):
    """The queue's lock has another epoch (a newer holder); nothing was done."""

    error = STALE_EPOCH


class StaleSequence(RaftmqError):
    """The producer's sequence is older than its newest on the queue and no longer remembered (a
    late retry, or a ``producer_id`` reused from 0); nothing was stored."""

    error = STALE_SEQUENCE


class LockHeld(RaftmqError):
    """Another consumer holds the queue's lock until ``details["lease_until_ms"]``; nothing was
    done (not retried by the client: the caller decides whether to wait)."""

    error = LOCK_HELD


class TooManyMembers(RaftmqError):
    """The token or a topic already has its most consumer-group members; nothing was done."""

    error = TOO_MANY_MEMBERS


class ChangeInProgress(RaftmqError):
    """Another cluster change (node, replica or leadership move) is in progress; retry when it
    ends (``details["change"]`` describes it)."""

    error = CHANGE_IN_PROGRESS


class NoChangeInProgress(RaftmqError):
    """No cluster change is in progress: a cancel has nothing to cancel; nothing was done."""

    error = NO_CHANGE_IN_PROGRESS


class MessageTooLarge(RaftmqError):
    error = MESSAGE_TOO_LARGE


class RequestTooLarge(RaftmqError):
    error = REQUEST_TOO_LARGE


class NotLeader(RaftmqError):
    error = NOT_LEADER


class TooManyRequests(RaftmqError):
    error = TOO_MANY_REQUESTS


class InternalError(RaftmqError):
    error = INTERNAL


class Unavailable(RaftmqError):
    error = UNAVAILABLE


class UpgradeInProgress(RaftmqError):
    """A replica of the group runs an older release that cannot apply this write (a rolling
    upgrade is under way); nothing was done."""

    error = UPGRADE_IN_PROGRESS


class UnknownOutcome(RaftmqError):
    error = UNKNOWN_OUTCOME


class Timeout(RaftmqError):
    error = TIMEOUT


# -- the client's own ------------------------------------------------------------------------------


class UnexpectedResponse(RaftmqError):
    """The server answered something that is not a raftmq answer (or an error code this client does
    not know; ``details["code"]`` then holds it)."""

    error = ErrorCode("unexpected_response", 0, False, False, "Not a raftmq answer, or an unknown code.")


class ConnectionFailed(RaftmqError):
    """No node could be reached; the request was never sent."""

    error = ErrorCode("connection_failed", 0, True, True, "No node could be reached; nothing was sent.")


class ConnectionLost(ConnectionFailed):
    """The connection broke after the request was sent: a write may or may not have happened."""

    error = ErrorCode("connection_lost", 0, True, False, "The connection broke after the request was sent.")


class BufferFull(RaftmqError):
    """The producer's buffer (``max_buffer_bytes``) stayed full for ``max_block_ms``; nothing was
    sent."""

    error = ErrorCode("buffer_full", 0, True, True, "The producer's buffer stayed full; nothing was sent.")


class DeliveryTimeout(RaftmqError):
    """A batch waited ``delivery_timeout_ms`` without being sent; nothing was written."""

    error = ErrorCode("delivery_timeout", 0, True, True, "A batch was never sent before its deadline.")


class ClientClosed(RaftmqError):
    """The client was closed (by you); it takes no more requests."""

    error = ErrorCode("client_closed", 0, False, True, "The client was closed; it takes no more requests.")


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
    RequestTimeout,
    TopicExists,
    StaleReceipt,
    StaleEpoch,
    StaleSequence,
    LockHeld,
    DeadLetterTopicConflict,
    DedupWindowFull,
    TooManyMembers,
    ChangeInProgress,
    NoChangeInProgress,
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
    code, message, details = body_parts(error)
    cls = BY_CODE.get(code)
    if cls is None:
        details.update(code=code, status=status)
        return UnexpectedResponse(f"unknown error code {code!r}: {message}", details)
    return cls.from_wire(message, details)
