"""The server's errors: the catalogue of ``raftmq.errors`` (every code, its status and flags, one
table for server and client alike), and the exceptions the server raises with a code picked where it
raises them.

Every one is a :class:`CatalogError` under the one root :class:`RaftmqError`, carrying its catalogue
entry (``error``), a message and the extra fields of its error body (``details``); the API's error
middleware answers any of them with :meth:`RaftmqError.body`::

    CatalogError(entry, message, **details)
    ├── BadCommand     a command's bytes are not a valid command (commands/, the state machines)
    ├── Refused        a valid command a state machine must not apply: nothing is written
    ├── ProduceFailed  a produce entry failed or was rejected (replication/group_commit.py)
    └── ApiError       a request failed (api/; the error middleware answers with its body)
"""

from __future__ import annotations

import structlog

from raftmq.errors import (
    BAD_BATCH,
    BAD_REQUEST,
    BY_CODE,
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
    OFFSET_OUT_OF_RANGE,
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
    CatalogError,
    ErrorCode,
    RaftmqError,
    error_body,
    outcome_code,
)
from raftmq.storage.store import StoreClosed

__all__ = [
    "BAD_BATCH",
    "BAD_REQUEST",
    "BY_CODE",
    "CHANGE_IN_PROGRESS",
    "DEAD_LETTER_TOPIC_CONFLICT",
    "DEDUP_WINDOW_FULL",
    "FORBIDDEN",
    "INTERNAL",
    "INVALID_JSON",
    "LOCK_HELD",
    "MEMBER_NOT_OWNED",
    "MESSAGE_TOO_LARGE",
    "METHOD_NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_LEADER",
    "NO_CHANGE_IN_PROGRESS",
    "OFFSET_OUT_OF_RANGE",
    "QUEUE_NOT_FOUND",
    "REQUEST_TIMEOUT",
    "REQUEST_TOO_LARGE",
    "RESERVED_HEADER",
    "STALE_EPOCH",
    "STALE_RECEIPT",
    "STALE_SEQUENCE",
    "TIMEOUT",
    "TOO_MANY_GROUPS",
    "TOO_MANY_MEMBERS",
    "TOO_MANY_REQUESTS",
    "TOPIC_EXISTS",
    "TOPIC_NOT_FOUND",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "UNKNOWN_OUTCOME",
    "UPGRADE_IN_PROGRESS",
    "ApiError",
    "BadCommand",
    "CatalogError",
    "ErrorCode",
    "ProduceFailed",
    "RaftmqError",
    "Refused",
    "answerable",
    "error_body",
    "outcome_code",
]


class BadCommand(CatalogError):
    """The command bytes are not a valid command (``invalid_json`` or ``bad_request``); the message
    names the field (e.g. ``batches[0].messages[3].value_b64``)."""


class Refused(CatalogError):
    """A valid command that a state machine must not apply now: nothing is written but
    ``applied_index``, and the result carries the error."""


class ProduceFailed(CatalogError):
    """A produce did not happen (``definite``) or may have happened (``unknown_outcome``)."""


class ApiError(CatalogError):
    """A request failed with a catalogued error; its ``details`` go into the error body."""


log = structlog.get_logger(__name__)


def answerable(e: RaftmqError, *, write: bool) -> RaftmqError:
    """``e`` when it is an answer (a catalogued status); else what a client is told of it: a store
    closed under the request (a snapshot install replaced it, a storage failure stopped the group)
    is a retriable 503, ``unavailable`` for a read and ``unknown_outcome`` for a write; any other
    error that is no answer (status 0) is a 500 ``internal``, its detail only in the node's log.
    For the places that catch a call's :class:`RaftmqError` and pass it on (a receive's waiters,
    a push stream, per-item results): never an answer of status 0, never ``definite`` for a write
    whose outcome is unknown."""
    if e.status:
        return e
    if isinstance(e, StoreClosed):
        log.warning("store_closed_under_request", error=str(e))
        code = UNKNOWN_OUTCOME if write else UNAVAILABLE
        return CatalogError(code, "the queue group's store was closed under the request; retry")
    log.error("uncatalogued_error", error=repr(e))
    return CatalogError(INTERNAL, "internal error; see the node's log")
