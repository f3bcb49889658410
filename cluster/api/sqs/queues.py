"""SQS queue attributes: their bounds and defaults, and how a queue is kept as a raftmq topic.

A queue is a topic of the same name created by CreateQueue, which marks it with the topic attribute
``sqs.CreatedTimestamp``; its settable attributes are kept as topic attributes ``sqs.<Name>``
(``cluster/machines/metadata.py``: the metadata group replicates them with the topic).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.machines.metadata import Topic

__all__ = [
    "ACCOUNT",
    "CREATED",
    "QUEUE_NAME",
    "SETTABLE",
    "STORED",
    "UNSUPPORTED",
    "Bound",
    "check_attributes",
    "is_queue",
    "queue_setting",
]

ACCOUNT = "000000000000"
PREFIX = "sqs."
CREATED = PREFIX + "CreatedTimestamp"
MODIFIED = PREFIX + "LastModifiedTimestamp"
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


@dataclass(frozen=True)
class Bound:
    low: int
    high: int
    default: int


# The settable attributes raftmq acts on, with AWS's bounds and defaults (seconds; bytes).
SETTABLE: dict[str, Bound] = {
    "VisibilityTimeout": Bound(0, 43_200, 30),
    "DelaySeconds": Bound(0, 900, 0),
    "ReceiveMessageWaitTimeSeconds": Bound(0, 20, 0),
    "MessageRetentionPeriod": Bound(60, 1_209_600, 345_600),
    "MaximumMessageSize": Bound(1024, 1_048_576, 1_048_576),
}
# Kept and answered as given, not acted on (docs/sqs.md says so).
STORED = frozenset(
    {"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled", "RedriveAllowPolicy"}
)
# AWS attributes this slice refuses rather than keep without their effect.
UNSUPPORTED = frozenset(
    {"RedrivePolicy", "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
)


def is_queue(topic: Topic) -> bool:
    return CREATED in topic.attributes


def queue_setting(topic: Topic, name: str, cap: int | None = None) -> int:
    """A settable attribute of the queue (its default when never set), at most ``cap``. A value
    set through the REST API (admin) outside AWS's bounds counts as the nearest bound."""
    bound = SETTABLE[name]
    raw = topic.attributes.get(PREFIX + name)
    value = int(raw) if raw is not None and raw.isascii() and raw.isdigit() else bound.default
    value = min(max(value, bound.low), bound.high)
    return value if cap is None else min(value, cap)


def check_attributes(raw: Any, max_message_bytes: int) -> dict[str, str]:
    """Queue attributes a client sets, checked: ``{"sqs.<Name>": value}`` for the topic."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SqsError("InvalidAttributeValue", "Attributes must be a map.")
    out: dict[str, str] = {}
    for name, value in raw.items():
        if name in UNSUPPORTED:
            raise SqsError(
                "InvalidAttributeName", f"Attribute {name} is not supported by raftmq yet (see docs/sqs.md)."
            )
        if not isinstance(value, str):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        if name in SETTABLE:
            bound = SETTABLE[name]
            high = min(bound.high, max_message_bytes) if name == "MaximumMessageSize" else bound.high
            if not re.fullmatch(r"\d{1,10}", value) or not bound.low <= int(value) <= high:
                raise SqsError(
                    "InvalidAttributeValue",
                    f"Invalid value for the parameter {name}: "
                    f"it must be an integer from {bound.low} to {high}.",
                )
            out[PREFIX + name] = str(int(value))
        elif name in STORED:
            if len(value.encode("utf-8", "replace")) > 8192:
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            out[PREFIX + name] = value
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    return out
