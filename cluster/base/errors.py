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

from raftmq.errors import (
    BAD_BATCH,
    BAD_REQUEST,
    BY_CODE,
    CHANGE_IN_PROGRESS,
    DEAD_LETTER_TOPIC_CONFLICT,
    FORBIDDEN,
    INTERNAL,
    INVALID_JSON,
    LOCK_HELD,
    MEMBER_NOT_OWNED,
    MESSAGE_TOO_LARGE,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    NOT_LEADER,
    OFFSET_OUT_OF_RANGE,
    QUEUE_NOT_FOUND,
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

__all__ = [
    "BAD_BATCH",
    "BAD_REQUEST",
    "BY_CODE",
    "CHANGE_IN_PROGRESS",
    "DEAD_LETTER_TOPIC_CONFLICT",
    "FORBIDDEN",
    "INTERNAL",
    "INVALID_JSON",
    "LOCK_HELD",
    "MEMBER_NOT_OWNED",
    "MESSAGE_TOO_LARGE",
    "METHOD_NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_LEADER",
    "OFFSET_OUT_OF_RANGE",
    "QUEUE_NOT_FOUND",
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
