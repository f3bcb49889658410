"""OpenAPI pieces of messages as the API hands them out, shared by fetch (``cluster/api/openapi/spec.py``),
receive and dead letters (``cluster/api/openapi/delivery.py``)."""

from __future__ import annotations

from raftmq.cluster.api.openapi.base import Schema, _int, _nullable, _obj, _param, _str
from raftmq.cluster.config.cluster_file import Limits

# A message carries exactly one of value (UTF-8 text) and value_b64 (binary, base64).
VALUE_OR_B64 = [{"required": ["value"]}, {"required": ["value_b64"]}]


def _handed_out(leading: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """A message as an answer carries it: the ``leading`` fields (all present), the ``optional``
    ones, then key, value or value_b64, headers and timestamp_ms."""
    return _obj(
        {
            **leading,
            **(optional or {}),
            "key": _nullable(_str()),
            "value": _str(),
            "value_b64": _str(contentEncoding="base64"),
            "headers": {"type": "object", "additionalProperties": _str()},
            "timestamp_ms": _int(0),
        },
        required=(*leading, "key", "headers", "timestamp_ms"),
        oneOf=VALUE_OR_B64,
    )


def _max_messages_param(limits: Limits) -> Schema:
    """The ``max`` query parameter of the routes that return messages."""
    return _param(
        "max",
        "query",
        _int(1, limits.max_fetch_messages, default=limits.default_fetch_messages),
        "Most messages.",
    )
