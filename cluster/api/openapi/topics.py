"""The OpenAPI schemas of a topic (``cluster/api/openapi/spec.py`` uses them): the topic itself,
its attributes and its tags, with the metadata machine's limits."""

from __future__ import annotations

from raftmq.cluster.api.openapi.base import U64, Schema, _array, _int, _nullable, _obj, _str
from raftmq.cluster.machines.metadata import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_TAG_KEY_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
)


def _attributes(removals: bool, answer: bool = False) -> Schema:
    """A request's attributes (names starting with ``sqs.`` refused), or (``answer``) a topic's
    as the API answers them (an SQS queue's carry ``sqs.`` names)."""
    value = _str(**{"x-raftmq-max-utf8-bytes": MAX_ATTRIBUTE_VALUE_BYTES})
    if answer:
        names, said = "^[A-Za-z0-9._:-]{1,128}$", "the SQS API's, which only it sets"
    else:
        names, said = "^(?![Ss][Qq][Ss]\\.)[A-Za-z0-9._:-]{1,128}$", "which only it sets: refused here"
    return {
        "type": "object",
        "propertyNames": {"pattern": names},
        "additionalProperties": _nullable(value) if removals else value,
        "maxProperties": MAX_ATTRIBUTES,
        "description": "The topic's own settings, names to strings (the SQS API keeps a queue's "
        f"attributes here, under names starting with sqs., {said})"
        + (
            "; sqs.RedrivePolicy, sqs.RedriveAllowPolicy and sqs.MessageMoveTasks name other queues only "
            "where the token has some permission on them, but sqs.RedrivePolicy and sqs.RedriveAllowPolicy "
            "are shown as written to a token with admin on the topic, its own settings (docs/security.md, "
            "What a token can see)"
            if answer
            else ""
        )
        + ("; null removes one" if removals else ""),
    }


def _tags() -> Schema:
    return {
        "type": "object",
        "propertyNames": {"minLength": 1, "maxLength": MAX_TAG_KEY_CHARS},
        "additionalProperties": _str(maxLength=MAX_TAG_VALUE_CHARS),
        "maxProperties": MAX_TAGS,
        "description": "The topic's tags, keys to strings (the SQS API's queue tags: TagQueue, "
        "UntagQueue, ListQueueTags); absent when there are none",
    }


def _topic(queues: Schema, **extra: Schema) -> Schema:
    """A topic: ``queues`` is its queue count, or (described) the list of its queues; ``extra``:
    optional fields."""
    nullable_pos = _nullable(_int(1, U64))
    return _obj(
        {
            "id": _int(1),
            "name": _str(),
            "queues": queues,
            "queue_groups": _array(_int(0), description="queue q lives in queue_groups[q]"),
            "retention_ms": nullable_pos,
            "retention_bytes": nullable_pos,
            "max_message_bytes": nullable_pos,
            "created_ms": _int(0),
            "attributes": _attributes(False, answer=True),
            "tags": _tags(),
            **extra,
        },
        required=tuple(
            (
                "id",
                "name",
                "queues",
                "queue_groups",
                "retention_ms",
                "retention_bytes",
                "max_message_bytes",
                "created_ms",
            )
        ),
    )
