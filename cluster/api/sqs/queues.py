"""SQS queue attributes: their bounds and defaults, and how a queue is kept as a raftmq topic.

A queue is a topic of the same name created by CreateQueue, which marks it with the topic attribute
``sqs.CreatedTimestamp``; its settable attributes are kept as topic attributes ``sqs.<Name>``
(``cluster/machines/metadata.py``: the metadata group replicates them with the topic). Its tags
are the topic's tags, a map of their own (no tag key can name an attribute), checked here as AWS
checks them (:func:`check_tags`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.machines.metadata import MAX_TAG_KEY_CHARS, MAX_TAG_VALUE_CHARS, MAX_TAGS, Topic

__all__ = [
    "ACCOUNT",
    "CREATED",
    "FIFO",
    "FIFO_RELEASE",
    "FIFO_SETTINGS",
    "FIFO_SUFFIX",
    "QUEUE_NAME",
    "REDRIVE",
    "REDRIVE_ALLOW_POLICY",
    "REDRIVE_POLICY",
    "SETTABLE",
    "STORED",
    "UNSUPPORTED",
    "Bound",
    "RedrivePolicy",
    "allows_redrive_from",
    "arn_queue",
    "check_attributes",
    "check_fifo_settings",
    "check_tag_keys",
    "check_tags",
    "fifo_setting",
    "is_fifo",
    "is_queue",
    "needs_fifo_release",
    "parse_redrive_policy",
    "queue_setting",
    "read_json",
    "reads_ahead",
    "redrive_policy",
]

ACCOUNT = "000000000000"
PREFIX = "sqs."
CREATED = PREFIX + "CreatedTimestamp"
MODIFIED = PREFIX + "LastModifiedTimestamp"
# 1-80 characters, of which a FIFO queue's name has its suffix .fifo.
QUEUE_NAME = re.compile(r"^(?=.{1,80}$)[A-Za-z0-9_-]+(?:\.fifo)?\Z")
FIFO_SUFFIX = ".fifo"
FIFO = PREFIX + "FifoQueue"


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
STORED = frozenset({"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled"})
# Dead-letter queues: checked here, kept normalized (compact JSON), acted on by the actions.
REDRIVE = ("RedrivePolicy", "RedriveAllowPolicy")
# Their topic attributes: the one spelling of these keys for every module that reads or filters them.
REDRIVE_POLICY, REDRIVE_ALLOW_POLICY = (PREFIX + name for name in REDRIVE)
MAX_RECEIVE_COUNT = 1000
MAX_SOURCE_ARNS = 10
# The settings of FIFO queues only (a standard queue knows none of them), with AWS's values; the
# first is the default.
FIFO_SETTINGS: dict[str, tuple[str, ...]] = {
    "ContentBasedDeduplication": ("false", "true"),
    "DeduplicationScope": ("queue", "messageGroup"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
UNSUPPORTED: frozenset[str] = frozenset()  # AWS attributes refused rather than kept without effect


@dataclass(frozen=True)
class RedrivePolicy:
    target: str  # the dead-letter queue's name
    max_receive_count: int


def _bad(name: str, value: str, reason: str) -> SqsError:
    return SqsError(
        "InvalidParameterValue", f"Value {value[:200]} for parameter {name} is invalid. Reason: {reason}."
    )


def arn_queue(arn: Any, region: str) -> str | None:
    """The queue an SQS ARN of this cluster names (``arn:aws:sqs:<region>:000000000000:<name>``)."""
    if not isinstance(arn, str):
        return None
    parts = arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or parts[3] != region or parts[4] != ACCOUNT:
        return None
    return parts[5] if QUEUE_NAME.match(parts[5]) else None


def read_json(text: str) -> Any:
    """The JSON value of a policy's text, or None when it is none. Python's parser raises
    ``RecursionError``, not ``ValueError``, for arrays or objects nested past its stack (a
    RedrivePolicy of 50,000 ``[`` is 50 KB): caught here, as every reader of a client's or a stored
    policy must, or the request failed with InternalError and a traceback in the node's log."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _json_map(name: str, value: str) -> dict[str, Any]:
    parsed = read_json(value)
    if not isinstance(parsed, dict):
        raise _bad(name, value, f"{name} is not a valid JSON map")
    return parsed


def check_redrive_policy(value: str, region: str) -> str:
    """A RedrivePolicy as given, checked and normalized ("" removes it)."""
    if value == "":
        return ""
    policy = _json_map("RedrivePolicy", value)
    if set(policy) != {"deadLetterTargetArn", "maxReceiveCount"}:
        raise _bad("RedrivePolicy", value, "it must have deadLetterTargetArn and maxReceiveCount, only")
    target = arn_queue(policy["deadLetterTargetArn"], region)
    if target is None:
        raise _bad("RedrivePolicy", value, f"deadLetterTargetArn must be the ARN of a queue in {region}")
    count = policy["maxReceiveCount"]
    if isinstance(count, str) and re.fullmatch(r"[0-9]{1,4}", count):
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RECEIVE_COUNT:
        raise _bad("RedrivePolicy", value, f"maxReceiveCount must be from 1 to {MAX_RECEIVE_COUNT}")
    return json.dumps(
        {"deadLetterTargetArn": policy["deadLetterTargetArn"], "maxReceiveCount": count},
        separators=(",", ":"),
    )


def check_redrive_allow_policy(value: str, region: str) -> str:
    """A RedriveAllowPolicy as given, checked and normalized ("" removes it: allowAll)."""
    if value == "":
        return ""
    policy = _json_map("RedriveAllowPolicy", value)
    permission = policy.get("redrivePermission")
    arns = policy.get("sourceQueueArns")
    if set(policy) - {"redrivePermission", "sourceQueueArns"} or permission not in (
        "allowAll",
        "denyAll",
        "byQueue",
    ):
        raise _bad("RedriveAllowPolicy", value, "redrivePermission must be allowAll, denyAll or byQueue")
    if permission != "byQueue":
        if arns is not None:
            raise _bad("RedriveAllowPolicy", value, "sourceQueueArns is only for redrivePermission byQueue")
        return json.dumps({"redrivePermission": permission}, separators=(",", ":"))
    if (
        not isinstance(arns, list)
        or not 1 <= len(arns) <= MAX_SOURCE_ARNS
        or any(arn_queue(a, region) is None for a in arns)
    ):
        raise _bad(
            "RedriveAllowPolicy",
            value,
            f"byQueue needs 1 to {MAX_SOURCE_ARNS} sourceQueueArns of queues in {region}",
        )
    return json.dumps({"redrivePermission": permission, "sourceQueueArns": arns}, separators=(",", ":"))


def reads_ahead(topic: Topic) -> bool:
    """Whether a delete of ``topic`` may take the node's next receive along (docs/sqs.md,
    Read-ahead): a standard queue without a RedrivePolicy. A FIFO queue's message in flight holds
    its message group; with a RedrivePolicy a read-ahead no consumer got (its node crashed) would
    count a receive, and maxReceiveCount could move a message never delivered."""
    return not is_fifo(topic) and redrive_policy(topic) is None


def redrive_policy(topic: Topic) -> RedrivePolicy | None:
    """The queue's RedrivePolicy, or None. The SQS API stores it checked
    (:func:`check_redrive_policy`); one the REST API stored unchecked, before it refused ``sqs.``
    names, is no policy rather than an InternalError of every receive and move task start."""
    return parse_redrive_policy(topic.attributes.get(REDRIVE_POLICY))


def parse_redrive_policy(raw: str | None) -> RedrivePolicy | None:
    """A stored or checked (:func:`check_redrive_policy`) RedrivePolicy's meaning, however written
    (None: none, or none the SQS API stored)."""
    if not raw:
        return None
    policy = read_json(raw)
    try:
        return RedrivePolicy(policy["deadLetterTargetArn"].rsplit(":", 1)[-1], int(policy["maxReceiveCount"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def allows_redrive_from(target: Topic, source_arn: str) -> bool:
    """The dead-letter queue ``target``'s RedriveAllowPolicy lets ``source_arn`` send it dead letters
    (a stored policy that cannot be read, see :func:`redrive_policy`, lets none). The sources must
    be a list: ``in`` a text stored there would match any part of it."""
    raw = target.attributes.get(REDRIVE_ALLOW_POLICY)
    if not raw:
        return True
    policy = read_json(raw)
    if not isinstance(policy, dict):
        return False
    permission = policy.get("redrivePermission")
    if permission == "byQueue":
        sources = policy.get("sourceQueueArns")
        return isinstance(sources, list) and source_arn in sources
    return permission == "allowAll"


def is_queue(topic: Topic) -> bool:
    return CREATED in topic.attributes


def is_fifo(topic: Topic) -> bool:
    """A FIFO queue: made by CreateQueue with FifoQueue true (kept as ``sqs.FifoQueue``)."""
    return topic.attributes.get(FIFO) == "true"


def fifo_setting(attributes: dict[str, str], name: str) -> str:
    """A FIFO queue's setting ``name`` of :data:`FIFO_SETTINGS` (its default when never set)."""
    value = attributes.get(PREFIX + name)
    return value if value in FIFO_SETTINGS[name] else FIFO_SETTINGS[name][0]


FIFO_RELEASE = "receive_ordered.delay"
"""The capability (a field level, ``cluster/commands`` ``FIELD_LEVELS``) of the release whose nodes
serve a FIFO queue's DelaySeconds, RedrivePolicy and move tasks. A node of the release before
served FIFO queues without them: its SQS API hands a delayed message out before it is due,
dead-letters with a plain append (the MessageGroupId lost, no deduplication) and moves a task's
messages unordered. Any node serves SQS, so every node of the cluster must advertise it before one
is set (docs/operations.md, rolling upgrades)."""


def needs_fifo_release(changes: dict[str, str]) -> bool:
    """Whether a FIFO queue's ``changes`` (as :func:`check_attributes` returns them) set what only
    nodes of :data:`FIFO_RELEASE` serve: a DelaySeconds other than 0 or a RedrivePolicy."""
    delay = changes.get(PREFIX + "DelaySeconds", "0")
    return delay != "0" or bool(changes.get(REDRIVE_POLICY))


def check_fifo_settings(attributes: dict[str, str]) -> None:
    """AWS's rule between the settings (the queue's stored ones with the changes applied):
    FifoThroughputLimit perMessageGroupId only with DeduplicationScope messageGroup."""
    if (
        fifo_setting(attributes, "FifoThroughputLimit") == "perMessageGroupId"
        and fifo_setting(attributes, "DeduplicationScope") != "messageGroup"
    ):
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoThroughputLimit. Reason: perMessageGroupId is "
            "allowed only when the value of DeduplicationScope is messageGroup.",
        )


def queue_setting(topic: Topic, name: str, cap: int | None = None) -> int:
    """A settable attribute of the queue (its default when never set), at most ``cap``. A value
    outside AWS's bounds (set through the REST API before it refused ``sqs.`` names) counts as
    the nearest bound."""
    bound = SETTABLE[name]
    raw = topic.attributes.get(PREFIX + name)
    value = int(raw) if raw is not None and raw.isascii() and raw.isdigit() else bound.default
    value = min(max(value, bound.low), bound.high)
    return value if cap is None else min(value, cap)


def check_attributes(
    raw: Any,
    max_message_bytes: int,
    region: str = "us-east-1",
    *,
    fifo: bool = False,
    creating: bool = False,
) -> dict[str, str]:
    """Queue attributes a client sets on a standard or ``fifo`` queue, checked: ``{"sqs.<Name>":
    value}`` for the topic. FifoQueue only when ``creating`` (its value against the name is the
    caller's to check), kept as ``sqs.FifoQueue`` for a FIFO queue."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SqsError("InvalidAttributeValue", "Attributes must be a map.")
    out: dict[str, str] = {}
    for name, value in raw.items():
        if (
            name in UNSUPPORTED
            or (name in FIFO_SETTINGS and not fifo)
            or (name == "FifoQueue" and not creating)
        ):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not isinstance(value, str):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        if name == "FifoQueue":
            if value not in ("true", "false"):
                raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
            if fifo:
                out[FIFO] = "true"
        elif name in FIFO_SETTINGS:
            if value not in FIFO_SETTINGS[name]:
                raise SqsError(
                    "InvalidAttributeValue",
                    f"Invalid value for the parameter {name}: it must be one of "
                    f"{', '.join(FIFO_SETTINGS[name])}.",
                )
            out[PREFIX + name] = value
        elif name in SETTABLE:
            bound = SETTABLE[name]
            high = min(bound.high, max_message_bytes) if name == "MaximumMessageSize" else bound.high
            if not re.fullmatch(r"[0-9]{1,10}", value) or not bound.low <= int(value) <= high:
                raise SqsError(
                    "InvalidAttributeValue",
                    f"Invalid value for the parameter {name}: "
                    f"it must be an integer from {bound.low} to {high}.",
                )
            out[PREFIX + name] = str(int(value))
        elif name == "RedrivePolicy":
            out[REDRIVE_POLICY] = check_redrive_policy(value, region)
        elif name == "RedriveAllowPolicy":
            out[REDRIVE_ALLOW_POLICY] = check_redrive_allow_policy(value, region)
        elif name in STORED:
            if len(value.encode("utf-8", "replace")) > 8192:
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            out[PREFIX + name] = value
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    return out


# What a tag key or value may hold, as AWS says: Unicode letters, digits and white space, and these.
_TAG_PUNCTUATION = frozenset("_.:/=+-@")
_RESERVED_TAG_PREFIX = "aws:"  # AWS's own tags; in any case


def _tag_text_problem(what: str, text: str) -> str | None:
    if text[: len(_RESERVED_TAG_PREFIX)].lower() == _RESERVED_TAG_PREFIX:
        return f"the tag {what} {text[:128]!r} starts with the reserved prefix aws:"
    for c in text:
        if c not in _TAG_PUNCTUATION and unicodedata.category(c)[0] not in "LNZ":
            return (
                f"the tag {what} {text[:128]!r} holds {c!r}: tags hold Unicode letters, digits, "
                "white space and _ . : / = + - @"
            )
    return None


def check_tags(raw: Any, queue: str) -> dict[str, str]:
    """Tags a client sets (CreateQueue's ``tags``, TagQueue's ``Tags``), checked as AWS checks
    them: at most MAX_TAGS, keys of 1-MAX_TAG_KEY_CHARS characters and values of at most
    MAX_TAG_VALUE_CHARS (case-sensitive), of the characters AWS allows, without the prefix aws:."""
    if not isinstance(raw, dict):
        raise SqsError("InvalidParameterValue", "Tags must be a map of tag keys to values.")
    if len(raw) > MAX_TAGS:
        raise SqsError(
            "InvalidParameterValue", f"Too many tags added for queue {queue} (at most {MAX_TAGS})."
        )
    for key, value in raw.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_TAG_KEY_CHARS:
            raise SqsError(
                "InvalidParameterValue",
                f"Tag keys must be between 1 and {MAX_TAG_KEY_CHARS} characters in length.",
            )
        if not isinstance(value, str) or len(value) > MAX_TAG_VALUE_CHARS:
            raise SqsError(
                "InvalidParameterValue",
                f"Tag values must be strings of at most {MAX_TAG_VALUE_CHARS} characters in length.",
            )
        problem = _tag_text_problem("key", key) or _tag_text_problem("value", value)
        if problem is not None:
            raise SqsError("InvalidParameterValue", f"Invalid tag: {problem}.")
    return dict(raw)


def check_tag_keys(raw: Any) -> list[str]:
    """UntagQueue's ``TagKeys``: 1 to MAX_TAGS distinct keys (a queue has no more), each of
    1-MAX_TAG_KEY_CHARS characters. A key the queue does not have is removed without a word."""
    if raw is None:
        raise SqsError("MissingParameter", "The request must contain the parameter TagKeys.")
    if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
        raise SqsError("InvalidParameterValue", "TagKeys must be a list of tag keys.")
    keys = list(dict.fromkeys(raw))
    if not keys or any(not 1 <= len(k) <= MAX_TAG_KEY_CHARS for k in keys):
        raise SqsError(
            "InvalidParameterValue",
            f"Tag keys must be between 1 and {MAX_TAG_KEY_CHARS} characters in length.",
        )
    if len(keys) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"At most {MAX_TAGS} tag keys can be removed at once.")
    return keys
