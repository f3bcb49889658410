"""The one error root of raftmq and its catalogue, shared by the server, storage, batch and the client.

Every error raftmq reports has an entry in the catalogue, as data (:class:`ErrorCode`): a stable
``code`` clients match on (never the message text), the HTTP ``status`` the API answers with,
``retriable`` (the same request may succeed later) and ``definite`` (False: a write may or may not
have happened, so a retry may duplicate it). Codes are part of the wire API: never rename or reuse
one. Error bodies always have the shape built by :func:`error_body`::

    {"error": {"code": "not_leader", "message": "...", "retriable": true, "definite": true, ...}}

Every exception of raftmq derives from :class:`RaftmqError`, which carries its catalogue entry
(``error``, with ``code``, ``status``, ``retriable`` and ``definite`` copied from it), a ``message``
for people and the ``details`` of its error body::

    RaftmqError                 the root (client.errors draws the client's classes under it)
    ├── CatalogError            an entry picked where it is raised: CatalogError(entry, message, **details)
    │                           (cluster/base/errors.py: BadCommand, Refused, ProduceFailed, ApiError)
    ├── BadBatch                bad_batch 400: a record batch breaks the format (batch/, storage/, client)
    ├── OffsetOutOfRange        offset_out_of_range 416: a read outside [low_offset, high_offset]
    └── (the others)            configuration, journal, storage ... failures that are never an
                                answer's body (status 0, :data:`UNANSWERED`; builtins as second base)

One converter each way: :meth:`RaftmqError.body` turns an error into its wire body (the API's error
middleware answers any error with a status with it); back from the wire, ``client.errors.error_from_body``
gives the client's class of the code (:meth:`RaftmqError.from_wire`), and :meth:`CatalogError.from_body`
the server's error of a state machine's error result or another node's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Self

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
    "STANDARD_FIELDS",
    "TIMEOUT",
    "TOO_MANY_GROUPS",
    "TOO_MANY_MEMBERS",
    "TOO_MANY_REQUESTS",
    "TOPIC_EXISTS",
    "TOPIC_NOT_FOUND",
    "UNANSWERED",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "UNKNOWN_OUTCOME",
    "UPGRADE_IN_PROGRESS",
    "BadBatch",
    "CatalogError",
    "ErrorCode",
    "OffsetOutOfRange",
    "RaftmqError",
    "body_parts",
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
REQUEST_TIMEOUT = ErrorCode(
    "request_timeout",
    408,
    True,
    True,
    "The request's body did not arrive within limits.request_timeout_ms plus a second per 64 KiB of its"
    " Content-Length (counted up to limits.max_request_bytes); nothing was done"
    " (the connection is closed).",
)
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

DEDUP_WINDOW_FULL = ErrorCode(
    "dedup_window_full",
    429,
    True,  # entries expire 5 minutes after their send
    True,
    "The queue's deduplication window holds its most ids (100,000 within 5 minutes); nothing was "
    "stored (retry as ids expire).",
)

# Cluster conditions: the request was fine; the cluster could not serve it now.
CHANGE_IN_PROGRESS = ErrorCode(
    "change_in_progress",
    409,
    True,
    True,
    "Another cluster change (node, replica or leadership move) is in progress; nothing was done.",
)
NO_CHANGE_IN_PROGRESS = ErrorCode(
    "no_change_in_progress",
    409,
    False,
    True,
    "The change to cancel is not in progress (none is, or the one read ended before the cancel "
    "applied; another begun since is left as is); nothing was done.",
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

UNANSWERED = ErrorCode(
    "raftmq_error", 0, False, True, "An error that is no answer of the API (status 0); never on the wire."
)

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
            REQUEST_TIMEOUT,
            TOPIC_EXISTS,
            MESSAGE_TOO_LARGE,
            REQUEST_TOO_LARGE,
            OFFSET_OUT_OF_RANGE,
            STALE_RECEIPT,
            STALE_EPOCH,
            STALE_SEQUENCE,
            LOCK_HELD,
            DEAD_LETTER_TOPIC_CONFLICT,
            DEDUP_WINDOW_FULL,
            TOO_MANY_MEMBERS,
            CHANGE_IN_PROGRESS,
            NO_CHANGE_IN_PROGRESS,
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


STANDARD_FIELDS = frozenset({"code", "message", "retriable", "definite"})
"""The fields every error body has; the others are the error's ``details``."""


def body_parts(error: Mapping[str, Any]) -> tuple[Any, str, dict[str, Any]]:
    """The ``code`` (as sent: anything), ``message`` ("" when it is not a string) and other fields of
    an error body's ``error`` object: what both converters from the wire read."""
    message = error.get("message")
    details = {k: v for k, v in error.items() if k not in STANDARD_FIELDS}
    return error.get("code"), message if isinstance(message, str) else "", details


def outcome_code(code: str, definite: bool) -> ErrorCode:
    """The catalogue entry of a Raft outcome's error ``code``: an unknown code, or a definite one
    whose write may have happened after all (``definite`` False), is ``unknown_outcome``."""
    known = BY_CODE.get(code, UNKNOWN_OUTCOME)
    if known.definite and not definite:
        known = UNKNOWN_OUTCOME
    return known


class RaftmqError(Exception):
    """The root of every raftmq error.

    A subclass names its catalogue entry once (``error = NOT_LEADER``); ``code``, ``status``,
    ``retriable`` and ``definite`` follow from it. An error that is never an answer (a bad
    configuration, a corrupt journal, the client's own failures) has status 0: the root's entry
    :data:`UNANSWERED`, or one of the client's. Were one to reach the API's error middleware, it
    answers 500 ``internal`` as any unexpected error does, its message only in the node's log.

    Attributes:
        message: Human-readable detail (do not parse it).
        details: The extra fields of the error body (e.g. ``low_offset``), read-only.
    """

    error: ErrorCode = UNANSWERED
    code: str = UNANSWERED.code
    status: int = UNANSWERED.status
    retriable: bool = UNANSWERED.retriable
    definite: bool = UNANSWERED.definite  # False: the write may have happened

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "error" in cls.__dict__:
            cls.code, cls.status = cls.error.code, cls.error.status
            cls.retriable, cls.definite = cls.error.retriable, cls.error.definite

    def __init__(self, message: str = "", details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details: Mapping[str, Any] = MappingProxyType(dict(details or {}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its class, args and attributes: the constructors differ (CatalogError takes
        # its entry, BadBatch its reason), so the default (the class called with args) would fail.
        return _restore, (type(self), self.args), {**self.__dict__, "details": dict(self.details)}

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        self.__dict__.update(state or {})
        self.details = MappingProxyType(dict(self.details))

    def body(self) -> dict[str, Any]:
        """The wire body of this error (:func:`error_body`): the one way from an error to an answer."""
        return error_body(self.error, self.message, **self.details)

    @classmethod
    def from_wire(cls, message: str, details: Mapping[str, Any]) -> Self:
        """The error of a wire body's ``message`` and extra fields (``client.errors.error_from_body``)."""
        return cls(message, details)


def _restore(cls: type[RaftmqError], args: tuple[Any, ...]) -> RaftmqError:
    """An unpickled error: made without its constructor; pickle then sets its attributes."""
    error = cls.__new__(cls)
    error.args = args
    return error


class CatalogError(RaftmqError):
    """An error whose catalogue entry is chosen where it is raised:
    ``CatalogError(NOT_LEADER, "...", leader="n2")``; the keyword arguments are its ``details``."""

    def __init__(self, error: ErrorCode, message: str, **details: Any) -> None:
        self.error = error
        self.code, self.status, self.retriable, self.definite = (
            error.code,
            error.status,
            error.retriable,
            error.definite,
        )
        super().__init__(message, details)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_body(cls, error: Mapping[str, Any], unknown: ErrorCode = INTERNAL) -> Self:
        """The error of an error body's ``error`` object (a state machine's result, another node's
        answer): its code's entry (``unknown`` for a code not in the catalogue), message and fields."""
        code, message, details = body_parts(error)
        return cls(BY_CODE.get(code, unknown) if isinstance(code, str) else unknown, message, **details)


class BadBatch(RaftmqError):
    """A binary record batch or frame is malformed, or breaks a limit; nothing of it may be applied
    (raised by ``batch``'s reader and by storage; the client raises it for such an answer).

    Attributes:
        reason: A stable short name of the check that failed (``crc_mismatch``, ``truncated``,
            ``message_too_large``, ``bad_utf8``, ...): docs/format.md lists them.
        record: Index (0-based, within the batch) of the first bad record, or None when the batch
            as a whole is bad (its CRC, its header, its length).
        batch: Index of the batch within a frame sequence, or None for a single batch.
    """

    error = BAD_BATCH

    def __init__(
        self,
        reason: str,
        message: str,
        record: int | None = None,
        batch: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        # The body's fields: these three, or (from a wire answer) the fields the body had.
        fields = {"reason": reason, "record": record, "batch": batch} if details is None else details
        super().__init__(message, fields)
        self.reason = reason
        self.record = record
        self.batch = batch

    def in_batch(self, batch: int) -> BadBatch:
        """The same error, naming the batch ``batch`` of a frame sequence."""
        return BadBatch(self.reason, f"batch {batch}: {self.message}", self.record, batch)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_wire(cls, message: str, details: Mapping[str, Any]) -> Self:
        reason, record, batch = details.get("reason"), details.get("record"), details.get("batch")
        return cls(
            reason if isinstance(reason, str) else "",
            message,
            record if isinstance(record, int) else None,
            batch if isinstance(batch, int) else None,
            details,
        )


class OffsetOutOfRange(RaftmqError):
    """A read asked for an offset outside ``[low_offset, high_offset]`` of its queue.

    Attributes:
        offset: The offset asked for (None when a wire answer did not say).
        low_offset: The queue's first retained offset at the time of the read (None: not said).
        high_offset: The queue's next offset to be written at the time of the read (None: not said).
    """

    error = OFFSET_OUT_OF_RANGE

    def __init__(
        self,
        offset: int | None,
        low_offset: int | None,
        high_offset: int | None,
        message: str = "",
        details: Mapping[str, Any] | None = None,
    ) -> None:
        message = message or f"offset {offset} is outside [{low_offset}, {high_offset}]"
        fields = {"low_offset": low_offset, "high_offset": high_offset} if details is None else details
        super().__init__(message, fields)
        self.offset = offset
        self.low_offset = low_offset
        self.high_offset = high_offset

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_wire(cls, message: str, details: Mapping[str, Any]) -> Self:
        low, high = details.get("low_offset"), details.get("high_offset")
        return cls(
            None,
            low if isinstance(low, int) else None,
            high if isinstance(high, int) else None,
            message,
            details,
        )
