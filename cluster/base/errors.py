"""The error catalogue: every error raftmq reports, as data.

Clients match on ``code`` (never on message text); ``status`` is the HTTP status the API answers
with; ``retriable`` says the same request may succeed later; ``definite=False`` says the write may or
may not have happened (the outcome is unknown, so a retry may duplicate it).

Codes are part of the wire API: never rename or reuse one. ``client.errors`` mirrors this table as
exception classes. Error bodies always have the shape built by :func:`error_body`::

    {"error": {"code": "not_leader", "message": "...", "retriable": true, "definite": true, ...}}

Every exception the server raises with a catalogue code is a :class:`RaftmqError`, carrying the
code, a message and the extra fields of its error body::

    RaftmqError(code, message, **extra)
    ├── BadCommand     a command's bytes are not a valid command (commands/, the state machines)
    ├── Refused        a valid command a state machine must not apply: nothing is written
    ├── ProduceFailed  a produce entry failed or was rejected (replication/group_commit.py)
    └── ApiError       a request failed (api/; the error middleware answers with its body)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

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
    "ErrorCode",
    "ProduceFailed",
    "RaftmqError",
    "Refused",
    "error_body",
    "outcome_code",
]


@dataclass(frozen=True, slots=True)
class ErrorCode:
    """One entry of the catalogue.

    Attributes:
        code: Stable snake_case identifier clients match on.
        status: HTTP status code of a response carrying this error.
        retriable: The same request may succeed if retried later.
        definite: True if the request certainly had no effect (or certainly had the effect it
            reports); False if a write may or may not have happened.
        description: One sentence for docs and the OpenAPI spec.
    """

    code: str
    status: int
    retriable: bool
    definite: bool
    description: str


# Request problems: the request itself is wrong; retrying it unchanged fails the same way.
BAD_REQUEST = ErrorCode("bad_request", 400, False, True, "The request is malformed or has invalid fields.")
INVALID_JSON = ErrorCode("invalid_json", 400, False, True, "The body is not valid JSON.")
BAD_BATCH = ErrorCode(
    "bad_batch",
    400,
    False,
    True,
    "A binary record batch is malformed or breaks a limit (reason, record and batch say where); "
    "nothing was stored.",
)
RESERVED_HEADER = ErrorCode(
    "reserved_header",
    400,
    False,
    True,
    "A message header's name starts with raftmq- (any ASCII case), the broker's own headers; "
    "nothing was stored.",
)
UNAUTHORIZED = ErrorCode("unauthorized", 401, False, True, "Credentials are missing or invalid.")
FORBIDDEN = ErrorCode("forbidden", 403, False, True, "The credentials do not allow this request.")
MEMBER_NOT_OWNED = ErrorCode(
    "member_not_owned",
    403,
    False,
    True,
    "The consumer-group member was created by another API token (only an admin on all its topics "
    "may act on it); nothing was done.",
)
NOT_FOUND = ErrorCode("not_found", 404, False, True, "No such route.")
TOPIC_NOT_FOUND = ErrorCode("topic_not_found", 404, False, True, "The topic does not exist.")
QUEUE_NOT_FOUND = ErrorCode("queue_not_found", 404, False, True, "The topic has no queue with this number.")
METHOD_NOT_ALLOWED = ErrorCode("method_not_allowed", 405, False, True, "The route does not take this method.")
TOPIC_EXISTS = ErrorCode("topic_exists", 409, False, True, "A topic with this name already exists.")
MESSAGE_TOO_LARGE = ErrorCode("message_too_large", 413, False, True, "A message exceeds the size limit.")
REQUEST_TOO_LARGE = ErrorCode(
    "request_too_large", 413, False, True, "The request exceeds the size or message-count limit."
)
OFFSET_OUT_OF_RANGE = ErrorCode(
    "offset_out_of_range", 416, False, True, "The offset is outside [low_offset, high_offset]."
)
STALE_RECEIPT = ErrorCode(
    "stale_receipt",
    409,
    False,
    True,
    "The receipt is no longer valid (the message was acked, redelivered since, or is unknown); "
    "nothing was done for it.",
)
STALE_EPOCH = ErrorCode(
    "stale_epoch", 409, False, True, "The queue's lock has another epoch (a newer holder); nothing was done."
)
STALE_SEQUENCE = ErrorCode(
    "stale_sequence",
    409,
    False,
    True,
    "The producer's sequence is older than its newest on the queue and no longer remembered (a late "
    "retry or a reused producer_id); nothing was stored.",
)
DEAD_LETTER_TOPIC_CONFLICT = ErrorCode(
    "dead_letter_topic_conflict",
    409,
    False,
    True,
    "A topic with the dead-letter topic's name exists and is not the recorded dead-letter topic of this "
    "topic and consumer group; nothing was done.",
)
TOO_MANY_GROUPS = ErrorCode(
    "too_many_groups",
    409,
    False,  # frees only when idle groups expire or an admin raises the limit
    True,
    "The topic or the token has as many consumer groups as [limits] allows; nothing was done.",
)
TOO_MANY_MEMBERS = ErrorCode(
    "too_many_members",
    409,
    False,
    True,
    "The token or a topic already has its most consumer-group members (limits.max_members_per_token, "
    "limits.max_members_per_topic); nothing was done.",
)
LOCK_HELD = ErrorCode(
    "lock_held",
    409,
    False,  # not a passing cluster condition: the caller decides whether to wait for lease_until_ms
    True,
    "Another consumer holds the queue's lock until lease_until_ms; nothing was done.",
)

# Cluster conditions: the request was fine; the cluster could not serve it now.
CHANGE_IN_PROGRESS = ErrorCode(
    "change_in_progress",
    409,
    True,
    True,
    "Another cluster change (node, replica or leadership move) is in progress; nothing was done.",
)
NOT_LEADER = ErrorCode("not_leader", 421, True, True, "This node does not lead the group; nothing was done.")
TOO_MANY_REQUESTS = ErrorCode(
    "too_many_requests", 429, True, True, "The node is overloaded; nothing was done."
)
INTERNAL = ErrorCode(
    "internal", 500, False, False, "An unexpected error; a write may or may not have happened (see the log)."
)
UNAVAILABLE = ErrorCode(
    "unavailable", 503, True, True, "The group has no leader or quorum; nothing was done."
)
UPGRADE_IN_PROGRESS = ErrorCode(
    "upgrade_in_progress",
    503,
    True,
    True,
    "A replica of the group runs an older release that cannot apply this write; nothing was done"
    " (retry once every node is upgraded).",
)
UNKNOWN_OUTCOME = ErrorCode(
    "unknown_outcome", 503, True, False, "The write may or may not have happened (e.g. the leader changed)."
)
TIMEOUT = ErrorCode("timeout", 504, True, False, "No answer in time; the write may or may not have happened.")

BY_CODE: Mapping[str, ErrorCode] = MappingProxyType(
    {
        e.code: e
        for e in (
            BAD_REQUEST,
            INVALID_JSON,
            BAD_BATCH,
            RESERVED_HEADER,
            UNAUTHORIZED,
            FORBIDDEN,
            MEMBER_NOT_OWNED,
            NOT_FOUND,
            TOPIC_NOT_FOUND,
            QUEUE_NOT_FOUND,
            METHOD_NOT_ALLOWED,
            TOPIC_EXISTS,
            MESSAGE_TOO_LARGE,
            REQUEST_TOO_LARGE,
            OFFSET_OUT_OF_RANGE,
            STALE_RECEIPT,
            STALE_EPOCH,
            STALE_SEQUENCE,
            LOCK_HELD,
            DEAD_LETTER_TOPIC_CONFLICT,
            TOO_MANY_MEMBERS,
            CHANGE_IN_PROGRESS,
            NOT_LEADER,
            TOO_MANY_GROUPS,
            TOO_MANY_REQUESTS,
            INTERNAL,
            UNAVAILABLE,
            UPGRADE_IN_PROGRESS,
            UNKNOWN_OUTCOME,
            TIMEOUT,
        )
    }
)
"""Every :class:`ErrorCode` by its ``code`` (read-only)."""


def error_body(code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON error body for ``code``.

    Args:
        code: The catalogue entry.
        message: Human-readable detail (clients must not parse it).
        **extra: Additional fields, e.g. ``low_offset``/``high_offset`` for
            ``offset_out_of_range``. They cannot override the four standard fields.

    Returns:
        ``{"error": {"code", "message", "retriable", "definite", **extra}}``.
    """
    body: dict[str, Any] = {
        "code": code.code,
        "message": message,
        "retriable": code.retriable,
        "definite": code.definite,
    }
    for key, value in extra.items():
        body.setdefault(key, value)
    return {"error": body}


def outcome_code(code: str, definite: bool) -> ErrorCode:
    """The catalogue entry of a Raft outcome's error ``code``: an unknown code, or a definite one
    whose write may have happened after all (``definite`` False), is ``unknown_outcome``."""
    known = BY_CODE.get(code, UNKNOWN_OUTCOME)
    if known.definite and not definite:
        known = UNKNOWN_OUTCOME
    return known


class RaftmqError(Exception):
    """The root: an error with a catalogue ``code``, a ``message`` for people and ``extra`` fields
    for its error body (e.g. ``low_offset``)."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON error body of this error."""
        return error_body(self.code, self.message, **self.extra)


class BadCommand(RaftmqError):
    """The command bytes are not a valid command (``invalid_json`` or ``bad_request``); the message
    names the field (e.g. ``batches[0].messages[3].value_b64``)."""


class Refused(RaftmqError):
    """A valid command that a state machine must not apply now: nothing is written but
    ``applied_index``, and the result carries the error."""


class ProduceFailed(RaftmqError):
    """A produce did not happen (``code.definite``) or may have happened (``unknown_outcome``)."""

    @property
    def definite(self) -> bool:
        return self.code.definite


class ApiError(RaftmqError):
    """A request failed with a catalogued error; ``extra`` goes into the error body."""
