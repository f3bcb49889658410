"""The SQS errors raftmq answers, as data: AWS's error code (the query protocol's ``Code``), its
JSON-protocol shape name, HTTP status and fault side (docs/sqs.md lists them).

The JSON protocol answers ``{"__type": "com.amazonaws.sqs#<shape>", "message"}`` with the header
``x-amzn-query-error: <code>;<Sender|Receiver>``: botocore takes the exception class from the shape
name and ``Error.Code`` from the header, as against AWS. The query protocol answers an
``ErrorResponse`` XML document with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftmq.errors import (
    BAD_BATCH,
    BAD_REQUEST,
    DEDUP_WINDOW_FULL,
    MESSAGE_TOO_LARGE,
    REQUEST_TIMEOUT,
    REQUEST_TOO_LARGE,
    TOO_MANY_REQUESTS,
    TOPIC_NOT_FOUND,
    RaftmqError,
)

__all__ = ["SQS_ERRORS", "SqsError", "SqsErrorCode", "from_raftmq_error", "quoted"]


@dataclass(frozen=True)
class SqsErrorCode:
    code: str  # AWS's query-protocol code, what boto3's ``e.response["Error"]["Code"]`` shows
    shape: str  # the JSON protocol's __type shape (boto3's exception class where it is modeled)
    status: int
    sender: bool = True  # the client's fault ("Sender") or the server's ("Receiver")


def _e(code: str, status: int = 400, shape: str | None = None, sender: bool = True) -> SqsErrorCode:
    return SqsErrorCode(code, shape or code.rsplit(".", 1)[-1], status, sender)


_PREFIX = "AWS.SimpleQueueService."
SQS_ERRORS: dict[str, SqsErrorCode] = {
    e.shape: e
    for e in (
        _e(_PREFIX + "NonExistentQueue", shape="QueueDoesNotExist"),
        _e("QueueAlreadyExists", shape="QueueNameExists"),
        _e("ReceiptHandleIsInvalid", 404),
        _e(_PREFIX + "MessageNotInflight", shape="MessageNotInflight"),
        _e("InvalidParameterValue"),
        _e("InvalidAttributeName"),
        _e("InvalidAttributeValue"),
        _e("InvalidMessageContents"),
        _e("MissingParameter"),
        _e("InvalidAddress", 404),
        _e("ResourceNotFoundException", 404),
        _e("InvalidAction"),
        _e(_PREFIX + "UnsupportedOperation", shape="UnsupportedOperation"),
        _e(_PREFIX + "TooManyEntriesInBatchRequest", shape="TooManyEntriesInBatchRequest"),
        _e(_PREFIX + "EmptyBatchRequest", shape="EmptyBatchRequest"),
        _e(_PREFIX + "BatchEntryIdsNotDistinct", shape="BatchEntryIdsNotDistinct"),
        _e(_PREFIX + "InvalidBatchEntryId", shape="InvalidBatchEntryId"),
        _e(_PREFIX + "BatchRequestTooLong", shape="BatchRequestTooLong"),
        _e("MalformedQueryString"),
        _e("SerializationException"),
        _e("InvalidClientTokenId", 403),
        _e("MissingAuthenticationToken", 403),
        _e("IncompleteSignature"),
        _e("SignatureDoesNotMatch", 403),
        _e("RequestExpired"),
        _e("AccessDenied", 403),
        _e("RequestThrottled", 403),
        _e("RequestTimeout"),
        _e("ServiceUnavailable", 503, sender=False),
        _e("InternalError", 500, sender=False),
    )
}


def quoted(value: Any) -> str:
    """A client's parameter as an error message quotes it (the caller cuts it short): a string or a
    number as written, anything else by its JSON type. ``str()`` of an array or object nested 1,000
    deep, which the JSON wire's parser reads, ran out of Python's stack (an InternalError, by any
    token: ListQueues' MaxResults)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return {list: "(an array)", dict: "(an object)", type(None): "null"}.get(type(value), "(a value)")


class SqsError(RaftmqError):
    """An SQS refusal: ``shape`` names its :data:`SQS_ERRORS` entry (``aws``), which its own wire
    renders (``wire.error_answer``), not raftmq's error body."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        self.aws = SQS_ERRORS[shape]
        self.message = message


def from_raftmq_error(e: RaftmqError) -> SqsError:
    """A raftmq error met while running an action, in SQS's terms."""
    if e.error is TOPIC_NOT_FOUND:
        return SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if e.error in (MESSAGE_TOO_LARGE, REQUEST_TOO_LARGE, BAD_REQUEST, BAD_BATCH):
        return SqsError("InvalidParameterValue", e.message)
    if e.error is TOO_MANY_REQUESTS or e.error is DEDUP_WINDOW_FULL:
        # 403 RequestThrottled, as AWS: botocore retries it in its legacy mode (its SQS rule wants
        # that code and status) and standard mode (a throttling code); raftmq's 429 was neither.
        return SqsError("RequestThrottled", e.message)
    if e.error is REQUEST_TIMEOUT:  # a body trickled past its deadline: botocore's standard mode
        return SqsError("RequestTimeout", e.message)  # retries this code (a transient error)
    if e.retriable and e.definite:
        return SqsError("ServiceUnavailable", e.message)
    # internal, unknown_outcome, timeout: the write may have happened; a retry may duplicate it
    # (at least once, as SQS).
    return SqsError("InternalError", e.message)
