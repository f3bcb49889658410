"""The OpenAPI 3.1 description of the public HTTP API v1 (``GET /openapi.json``).

The spec is data, built by the small helpers below, and it states what the server enforces
(``cluster/validation.py``): exact types, required fields, ``additionalProperties: false`` where
unknown fields are rejected, and the limits of the node's :class:`~raftmq.cluster.config.Limits`.
Limits counted in UTF-8 bytes, which JSON Schema cannot express, are given as
``x-raftmq-max-utf8-bytes``. The ``/internal/*`` peer routes are not part of the public API.
"""

from __future__ import annotations

from typing import Any

from . import errors
from .commands import MAX_BACKOFF_LEVELS, MAX_RECEIPTS, MAX_RECEIVE
from .commands import MAX_NAME_BYTES as MAX_GROUP_BYTES
from .config import Limits
from .metadata import MAX_QUEUES, TOPIC_NAME
from .validation import (
    DEFAULT_FETCH_BYTES,
    MAX_FETCH_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_OFFSET,
    MAX_PRODUCER_ID_BYTES,
    MAX_QUEUE_NUMBER,
    MAX_SEQUENCE,
)

__all__ = ["openapi_spec"]

Schema = dict[str, Any]

TOPIC_NAME_PATTERN = TOPIC_NAME.pattern
U64 = 2**64 - 1  # the largest integer a request body can carry
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # standard, padded


# -- schema helpers ---------------------------------------------------------------------------------


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _int(minimum: int | None = None, maximum: int | None = None, **kw: Any) -> Schema:
    s: Schema = {"type": "integer", **kw}
    if minimum is not None:
        s["minimum"] = minimum
    if maximum is not None:
        s["maximum"] = maximum
    return s


def _str(**kw: Any) -> Schema:
    return {"type": "string", **kw}


def _nullable(s: Schema) -> Schema:
    if "type" not in s:  # a $ref
        return {"anyOf": [s, {"type": "null"}]}
    return {**s, "type": [s["type"], "null"]}


def _array(items: Schema, **kw: Any) -> Schema:
    return {"type": "array", "items": items, **kw}


def _obj(props: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True, **kw: Any) -> Schema:
    """An object; ``closed`` objects reject unknown fields (``additionalProperties: false``)."""
    s: Schema = {"type": "object", "properties": props, **kw}
    if required:
        s["required"] = list(required)
    if closed:
        s["additionalProperties"] = False
    return s


# -- operation helpers ------------------------------------------------------------------------------


def _json(schema: Schema, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    """Error responses by status, each described by the codes the catalogue gives that status."""
    out = {}
    for status in statuses:
        codes = sorted(c.code for c in errors.BY_CODE.values() if c.status == status)
        out[str(status)] = _json(_ref("Error"), " or ".join(f"`{c}`" for c in codes))
    return out


# The cluster conditions a request served by a Raft group (here or forwarded) can meet.
RAFT_ERRORS = (421, 503, 504)


def _param(name: str, where: str, schema: Schema, description: str, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }


def _op(
    op_id: str,
    summary: str,
    responses: dict[str, Any],
    params: tuple[Schema, ...] = (),
    body: Schema | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


TOPIC = _param("topic", "path", _str(pattern=TOPIC_NAME_PATTERN), "Topic name.")
GROUP = _param(
    "group",
    "path",
    _str(minLength=1, maxLength=MAX_GROUP_BYTES, **{"x-raftmq-max-utf8-bytes": MAX_GROUP_BYTES}),
    "Consumer group name (1-255 UTF-8 bytes).",
)


# -- component schemas ------------------------------------------------------------------------------


def _error_schema() -> Schema:
    return _obj(
        {
            "error": _obj(
                {
                    "code": {"enum": list(errors.BY_CODE), "description": "Stable code clients match on."},
                    "message": _str(description="Human-readable detail; never parse it."),
                    "retriable": {"type": "boolean", "description": "The same request may succeed later."},
                    "definite": {
                        "type": "boolean",
                        "description": "False: the write may or may not have happened.",
                    },
                    "low_offset": _int(0),
                    "high_offset": _int(0),
                    "results": _array(_nullable(_ref("ProduceResult"))),
                },
                required=("code", "message", "retriable", "definite"),
                closed=False,
            )
        },
        required=("error",),
    )


def _message_schema(limits: Limits) -> Schema:
    utf8 = "x-raftmq-max-utf8-bytes"
    return _obj(
        {
            "value": _str(description="UTF-8 text payload.", **{utf8: limits.max_message_bytes}),
            "value_b64": _str(
                pattern=BASE64, contentEncoding="base64", description="Binary payload, standard base64."
            ),
            "key": _nullable(_str(description="Routes to CRC32C(key) mod queues.", **{utf8: MAX_KEY_BYTES})),
            "headers": _nullable(
                {"type": "object", "additionalProperties": _str(), "maxProperties": MAX_HEADERS}
            ),
            "queue": _nullable(_int(0, description="Explicit queue; overrides the key.")),
            "delay_ms": _int(0, limits.max_delay_ms, description="Deliver this much later (0: now)."),
            "deliver_at_ms": _int(
                0,
                U64,
                description=f"Deliver at this time (ms since the epoch), at most {limits.max_delay_ms} ms "
                "ahead; a past time delivers at once.",
            ),
            "ttl_ms": _int(
                1, limits.max_ttl_ms, description="Expire this long after it is deliverable: never received."
            ),
        },
        oneOf=[{"required": ["value"]}, {"required": ["value_b64"]}],
        dependentSchemas={"delay_ms": {"not": {"required": ["deliver_at_ms"]}}},  # one of the two
        description=f"value or value_b64 (exactly one). value + key + headers: at most "
        f"{limits.max_message_bytes} UTF-8 bytes (413 message_too_large). A delayed message (delay_ms > 0 "
        "or deliver_at_ms ahead) gets its offset when it is released (docs/delivery.md).",
    )


def _topic(queues: Schema) -> Schema:
    """A topic: ``queues`` is its queue count, or (described) the list of its queues."""
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


def _together(given: str, kind: str, other: str) -> Schema:
    """When ``given`` is set (not null), ``other`` must be set too."""
    return {
        "if": {"required": [given], "properties": {given: {"type": kind}}},
        "then": {"required": [other], "properties": {other: {"not": {"type": "null"}}}},
    }


def _schemas(limits: Limits) -> dict[str, Schema]:
    nullable_pos = _nullable(_int(1, U64))
    return {
        "Error": _error_schema(),
        "CreateTopic": _obj(
            {
                "name": _str(pattern=TOPIC_NAME_PATTERN, **{"not": {"enum": [".", ".."]}}),
                "queues": _int(1, min(limits.max_queues_per_topic, MAX_QUEUES), default=8),
                "retention_ms": nullable_pos,
                "retention_bytes": nullable_pos,
                "max_message_bytes": _nullable(_int(1, limits.max_message_bytes)),
            },
            required=("name",),
        ),
        "Topic": _topic(_int(1)),
        "TopicDescription": _topic(_array(_ref("QueueInfo"))),
        "QueueInfo": _obj(
            {
                "queue": _int(0),
                "group_id": _int(0),
                "leader": _nullable(_str()),
                "replicas": _array(_str()),
                "low_offset": _nullable(_int(0)),
                "high_offset": _nullable(_int(0)),
            },
            required=("queue", "group_id", "leader", "replicas", "low_offset", "high_offset"),
            closed=False,
        ),
        "ProduceRequest": _obj(
            {
                "messages": _array(
                    _message_schema(limits), minItems=1, maxItems=limits.max_messages_per_request
                ),
                "producer_id": _nullable(
                    _str(minLength=1, **{"x-raftmq-max-utf8-bytes": MAX_PRODUCER_ID_BYTES})
                ),
                "sequence": _nullable(_int(0, MAX_SEQUENCE)),
            },
            required=("messages",),
            # producer_id and sequence come together (null counts as absent).
            allOf=[
                _together("producer_id", "string", "sequence"),
                _together("sequence", "integer", "producer_id"),
            ],
            description=f"At most {limits.max_request_bytes} bytes (413 request_too_large).",
        ),
        "ProduceResult": _obj(
            {
                "queue": _int(0),
                "offset": _nullable(_int(0, description="null for a delayed message")),
                "deliver_at_ms": _int(0, description="A delayed message: when it is released."),
            },
            required=("queue", "offset"),
        ),
        "ProduceResponse": _obj(
            {"results": _array(_ref("ProduceResult"), description="In request order.")},
            required=("results",),
        ),
        "FetchedMessage": _obj(
            {
                "offset": _int(0),
                "key": _nullable(_str()),
                "value": _str(),
                "value_b64": _str(contentEncoding="base64"),
                "headers": {"type": "object", "additionalProperties": _str()},
                "timestamp_ms": _int(0),
            },
            required=("offset", "key", "headers", "timestamp_ms"),
            oneOf=[{"required": ["value"]}, {"required": ["value_b64"]}],
        ),
        "FetchResponse": _obj(
            {
                "messages": _array(_ref("FetchedMessage")),
                "next_offset": _int(0),
                "low_offset": _int(0),
                "high_offset": _int(0),
            },
            required=("messages", "next_offset", "low_offset", "high_offset"),
        ),
        "CommitOffsets": _obj(
            {
                "topic": _str(pattern=TOPIC_NAME_PATTERN),
                "offsets": {
                    "type": "object",
                    "propertyNames": {"pattern": "^[0-9]+$"},
                    "additionalProperties": _int(0, MAX_OFFSET),
                    "minProperties": 1,
                    "description": 'queue number (as a string) -> offset, e.g. {"0": 42}',
                },
                "epoch": _int(
                    0,
                    MAX_OFFSET,
                    description="Fenced commit: refused (409 stale_epoch) unless each queue's lock has it.",
                ),
            },
            required=("topic", "offsets"),
        ),
        "Offsets": _obj(
            {
                "group": _str(),
                "topic": _str(),
                "offsets": {"type": "object", "additionalProperties": _nullable(_int(0))},
            },
            required=("group", "topic", "offsets"),
        ),
        "Cluster": _obj(
            {
                "node_id": _str(),
                "nodes": _array(
                    _obj(
                        {"id": _str(), "http": _str(), "raft": _str(), "reachable": {"type": "boolean"}},
                        required=("id", "http", "raft", "reachable"),
                    )
                ),
                "groups": _array(
                    _obj(
                        {
                            "group_id": _str(description='"meta" or the queue group number'),
                            "leader": _nullable(_str()),
                            "term": _int(0),
                            "replicas": _array({"type": "object", "required": ["node_id"]}),
                        },
                        required=("group_id", "leader", "term", "replicas"),
                        closed=False,
                    )
                ),
            },
            required=("node_id", "nodes", "groups"),
        ),
        "Status": _obj({"status": _str(), "node_id": _str()}, required=("status", "node_id")),
        "Membership": _obj(
            {
                "group": _str(),
                "member_id": _str(),
                "generation": _int(0),
                "members": _array(_str()),
                "assignment": {"type": "object", "additionalProperties": _array(_int(0))},
                "heartbeat_interval_ms": _int(1),
                "session_timeout_ms": _int(1),
            },
            required=("group", "member_id", "generation", "members", "assignment"),
        ),
    }


# -- paths ------------------------------------------------------------------------------------------


def _paths(limits: Limits) -> dict[str, Any]:
    out_of_range = _json(
        {"allOf": [_ref("Error")], "properties": {"error": {"required": ["low_offset", "high_offset"]}}},
        "`offset_out_of_range`, with the queue's `low_offset` and `high_offset`",
    )
    queue = _param("queue", "path", _int(0, MAX_QUEUE_NUMBER), "Queue number.")
    fetch_params = (
        TOPIC,
        queue,
        _param("offset", "query", _int(0, MAX_OFFSET), "First offset to return.", required=True),
        _param(
            "max",
            "query",
            _int(1, limits.max_fetch_messages, default=limits.default_fetch_messages),
            "Most messages.",
        ),
        _param("wait_ms", "query", _int(0, limits.max_wait_ms, default=0), "Long-poll this long if none."),
        _param("read_from", "query", {"enum": ["leader", "local"], "default": "leader"}, "Replica to read."),
        _param(
            "max_bytes", "query", _int(1, MAX_FETCH_BYTES, default=DEFAULT_FETCH_BYTES), "Value bytes cap."
        ),
    )
    too_large = _errors(413)
    return {
        "/healthz": {"get": _op("healthz", "Liveness", {"200": _json(_ref("Status"), "alive")})},
        "/readyz": {
            "get": _op(
                "readyz",
                "200 when every group on this node has a leader",
                {"200": _json(_ref("Status"), "ready"), **_errors(503)},
            )
        },
        "/v1/cluster": {
            "get": _op("getCluster", "Nodes and groups", {"200": _json(_ref("Cluster"), "cluster view")})
        },
        "/v1/topics": {
            "post": _op(
                "createTopic",
                "Create a topic",
                {
                    "201": _json(_ref("TopicDescription"), "created"),
                    **_errors(400, 409),
                    **too_large,
                    **_errors(*RAFT_ERRORS),
                },
                body=_ref("CreateTopic"),
            ),
            "get": _op(
                "listTopics",
                "List topics (linearizable)",
                {
                    "200": _json(_obj({"topics": _array(_ref("Topic"))}, required=("topics",)), "topics"),
                    **_errors(*RAFT_ERRORS),
                },
            ),
        },
        "/v1/topics/{topic}": {
            "get": _op(
                "describeTopic",
                "A topic and its queues",
                {"200": _json(_ref("TopicDescription"), "the topic"), **_errors(404, *RAFT_ERRORS)},
                params=(TOPIC,),
            ),
            "delete": _op(
                "deleteTopic",
                "Delete a topic and free its data",
                {
                    "200": _json(_obj({"deleted": _str()}, required=("deleted",)), "deleted"),
                    **_errors(404, *RAFT_ERRORS),
                },
                params=(TOPIC,),
            ),
        },
        "/v1/topics/{topic}/messages": {
            "post": _op(
                "produce",
                "Produce messages; answered once committed on a majority",
                {"200": _json(_ref("ProduceResponse"), "stored"), **_errors(400, 404, 413, *RAFT_ERRORS)},
                params=(TOPIC,),
                body=_ref("ProduceRequest"),
            )
        },
        "/v1/topics/{topic}/queues/{queue}/messages": {
            "get": _op(
                "fetch",
                "Messages of a queue from an offset (long-polls up to wait_ms)",
                {
                    "200": _fetch_ok(),
                    **_errors(400, 404),
                    "416": out_of_range,
                    **_errors(*RAFT_ERRORS),
                },
                params=fetch_params,
            )
        },
        "/v1/groups/{group}/offsets": {
            "put": _op(
                "commitOffsets",
                "Commit a consumer group's offsets (replicated; fenced with an epoch)",
                {
                    "200": _json(_obj({"ok": {"const": True}}, required=("ok",)), "committed"),
                    **_errors(400, 404, 409),
                    **too_large,
                    "416": out_of_range,
                    **_errors(*RAFT_ERRORS),
                },
                params=(GROUP,),
                body=_ref("CommitOffsets"),
            ),
            "get": _op(
                "getOffsets",
                "A consumer group's committed offsets (linearizable; null where none)",
                {"200": _json(_ref("Offsets"), "offsets"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(GROUP, _param("topic", "query", _str(pattern=TOPIC_NAME_PATTERN), "Topic.", True)),
            ),
        },
        "/v1/groups/{group}/members": {
            "post": _op(
                "joinGroup",
                "Join a consumer group or heartbeat; answers this member's queues (clustering mode)",
                {"200": _json(_ref("Membership"), "assignment"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(GROUP,),
                body=_obj(
                    {
                        "member_id": _str(minLength=1, maxLength=255, **{"x-raftmq-max-utf8-bytes": 255}),
                        "topics": _array(_str(pattern=TOPIC_NAME_PATTERN), minItems=1, maxItems=100),
                        "generation": _int(
                            0,
                            U64,
                            description="The generation of the last assignment this member has applied "
                            "(0 before its first): its revoked queues are stopped and committed. "
                            "Optional; without it the member's queues move without a revoke barrier.",
                        ),
                    },
                    required=("member_id", "topics"),
                ),
            )
        },
        "/v1/groups/{group}/members/{member_id}": {
            "delete": _op(
                "leaveGroup",
                "Leave a consumer group (its queues move to the other members)",
                {
                    "200": _json(
                        _obj(
                            {"group": _str(), "member_id": _str(), "left": {"type": "boolean"}},
                            required=("group", "member_id", "left"),
                        ),
                        "left",
                    ),
                    **_errors(400, *RAFT_ERRORS),
                },
                params=(
                    GROUP,
                    _param(
                        "member_id",
                        "path",
                        _str(minLength=1, maxLength=255, **{"x-raftmq-max-utf8-bytes": 255}),
                        "Member id (1-255 UTF-8 bytes).",
                    ),
                ),
            )
        },
        "/openapi.json": {
            "get": _op("openapi", "This document", {"200": _json({"type": "object"}, "OpenAPI 3.1")})
        },
        "/metrics": {
            "get": _op(
                "metrics",
                "Prometheus metrics",
                {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": _str()}},
                    }
                },
            )
        },
    }


def openapi_spec(limits: Limits | None = None) -> dict[str, Any]:
    """The spec of the public API, with the limits of ``limits`` (defaults: :class:`Limits`)."""
    limits = limits or Limits()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "raftmq",
            "version": "1",
            "description": "Raft-replicated message broker. Any node answers any request. Every error "
            'has the body {"error": {"code", "message", "retriable", "definite", ...}}. Integers in '
            "request bodies are JSON integers written without a fraction or exponent (1.0 is refused).",
        },
        "paths": {**_paths(limits), **_delivery_paths(limits), **_segment_paths()},
        "components": {"schemas": {**_schemas(limits), **_delivery_schemas(limits), **_segment_schemas()}},
    }


# -- receive/ack, dead letters, locks (cluster/subscriptions_api.py, docs/delivery.md) ---------------

_DIGITS = "(0|[1-9][0-9]{0,19})"
RECEIPT = _str(
    pattern=f"^{_DIGITS}\\.{_DIGITS}\\.{_DIGITS}\\.{_DIGITS}$",
    description="Opaque receipt of one delivery, as received.",
)
SUB_GROUP = _param(
    "group",
    "path",
    _str(pattern=TOPIC_NAME_PATTERN, **{"not": {"enum": [".", ".."]}}),
    "Consumer group; it names the dead-letter topic <topic>.<group>.dlq, so it must fit a topic name.",
)


def _delivery_schemas(limits: Limits) -> dict[str, Schema]:
    max_receive = min(limits.max_fetch_messages, MAX_RECEIVE)
    epoch = _int(0, MAX_OFFSET, description="The queue lock's epoch (ordered consumption): fenced.")
    visibility = _int(1, limits.max_visibility_ms, default=limits.default_visibility_ms)
    receipts = _array(RECEIPT, minItems=1, maxItems=MAX_RECEIPTS)
    error_detail = _error_schema()["properties"]["error"]
    queue_state = _obj(
        {"queue": _int(0), "redrive_offset": _int(0), "high_offset": _int(0)},
        required=("queue", "redrive_offset", "high_offset"),
    )
    return {
        "ReceiveRequest": _obj(
            {
                "max": _int(1, max_receive, default=limits.default_fetch_messages),
                "wait_ms": _int(0, limits.max_wait_ms, default=0, description="Long-poll this long if none."),
                "visibility_ms": visibility,
                "queue": _int(0, MAX_QUEUE_NUMBER, description="With epoch: receive under the queue's lock."),
                "epoch": epoch,
            },
            dependentRequired={"queue": ["epoch"], "epoch": ["queue"]},
        ),
        "ReceivedMessage": _obj(
            {
                "receipt": RECEIPT,
                "attempt": _int(1),
                "queue": _int(0),
                "offset": _int(0),
                "deadline_ms": _int(0, description="In flight until then; redelivered after it."),
                "key": _nullable(_str()),
                "value": _str(),
                "value_b64": _str(contentEncoding="base64"),
                "headers": {"type": "object", "additionalProperties": _str()},
                "timestamp_ms": _int(0),
            },
            required=(
                "receipt",
                "attempt",
                "queue",
                "offset",
                "deadline_ms",
                "key",
                "headers",
                "timestamp_ms",
            ),
            oneOf=[{"required": ["value"]}, {"required": ["value_b64"]}],
        ),
        "ReceiveResponse": _obj({"messages": _array(_ref("ReceivedMessage"))}, required=("messages",)),
        "AckRequest": _obj({"receipts": receipts, "epoch": epoch}, required=("receipts",)),
        "NackRequest": _obj(
            {
                "receipts": receipts,
                "delay_ms": _int(0, limits.max_delay_ms, description="Default: the backoff schedule."),
                "epoch": epoch,
            },
            required=("receipts",),
        ),
        "ExtendRequest": _obj(
            {"receipts": receipts, "visibility_ms": visibility, "epoch": epoch}, required=("receipts",)
        ),
        "ReceiptResults": _obj(
            {
                "results": _array(
                    _obj(
                        {
                            "receipt": _str(),
                            "ok": {"const": True},
                            "deadline_ms": _int(0),
                            "dead_lettered": {"const": True},
                            "error": error_detail,
                        },
                        required=("receipt",),
                        oneOf=[{"required": ["ok"]}, {"required": ["error"]}],
                    ),
                    description="One per receipt, in order; a stale receipt has error stale_receipt.",
                )
            },
            required=("results",),
        ),
        "SubscriptionSettings": _obj(
            {
                "max_deliveries": _int(1, 2**31, description="Deliveries before the dead-letter topic."),
                "backoff_ms": _array(
                    _int(0, limits.max_delay_ms),
                    minItems=1,
                    maxItems=MAX_BACKOFF_LEVELS,
                    description="Retry n waits [n-1].",
                ),
            },
            description="Omitted settings get the cluster's defaults.",
        ),
        "Subscription": _obj(
            {
                "topic": _str(),
                "group": _str(),
                "dead_letter_topic": _str(),
                "max_deliveries": _int(1),
                "backoff_ms": _array(_int(0)),
            },
            required=("topic", "group", "dead_letter_topic", "max_deliveries", "backoff_ms"),
        ),
        "DeadLetters": _obj(
            {
                "dead_letter_topic": _str(),
                "queues": _array(queue_state),
                "messages": _array(
                    {
                        "allOf": [_ref("FetchedMessage")],
                        "properties": {"queue": _int(0)},
                        "required": ["queue"],
                    }
                ),
            },
            required=("dead_letter_topic", "queues", "messages"),
        ),
        "RedriveRequest": _obj(
            {
                "max": _int(1, MAX_RECEIVE, default=1000, description="Most per queue."),
                "queue": _int(0, MAX_QUEUE_NUMBER),
            }
        ),
        "Redriven": _obj(
            {
                "dead_letter_topic": _str(),
                "redriven": _int(0),
                "queues": _array(
                    _obj(
                        {
                            "queue": _int(0),
                            "count": _int(0),
                            "redrive_offset": _int(0),
                            "high_offset": _int(0),
                        },
                        required=("queue", "count", "redrive_offset", "high_offset"),
                    )
                ),
                "more": {"type": "boolean"},
            },
            required=("dead_letter_topic", "redriven", "queues", "more"),
        ),
        "LockRequest": _obj(
            {
                "consumer": _str(minLength=1, maxLength=255, **{"x-raftmq-max-utf8-bytes": 255}),
                "lease_ms": _int(1, limits.max_visibility_ms),
            },
            required=("consumer", "lease_ms"),
        ),
        "Lock": _obj(
            {
                "topic": _str(),
                "queue": _int(0),
                "group": _str(),
                "consumer": _str(),
                "epoch": _int(1),
                "lease_until_ms": _int(0),
                "committed_offset": _nullable(_int(0, description="Resume here (null: from the start).")),
            },
            required=("topic", "queue", "group", "consumer", "epoch", "lease_until_ms", "committed_offset"),
        ),
    }


def _delivery_paths(limits: Limits) -> dict[str, Any]:
    base = "/v1/topics/{topic}/subscriptions/{group}"
    sub = (TOPIC, SUB_GROUP)
    writes = _errors(400, 404, 409, 413, *RAFT_ERRORS)

    def receipts_op(op_id: str, summary: str, body: str) -> dict[str, Any]:
        return {
            "post": _op(
                op_id,
                summary,
                {"200": _json(_ref("ReceiptResults"), "per receipt"), **writes},
                sub,
                _ref(body),
            )
        }

    queue = _param("queue", "path", _int(0, MAX_QUEUE_NUMBER), "Queue number.")
    return {
        base + "/receive": {
            "post": _op(
                "receive",
                "Receive messages (in flight until deadline_ms; long-polls up to wait_ms)",
                {"200": _json(_ref("ReceiveResponse"), "messages, possibly none"), **writes},
                sub,
                _ref("ReceiveRequest"),
            )
        },
        base + "/ack": receipts_op("ack", "Finish messages", "AckRequest"),
        base + "/nack": receipts_op(
            "nack", "Give messages back for a retry (after delay_ms or the backoff)", "NackRequest"
        ),
        base + "/extend": receipts_op("extend", "Push the visibility deadlines", "ExtendRequest"),
        base: {
            "put": _op(
                "configureSubscription",
                "Set a consumer group's max_deliveries and backoff on a topic",
                {"200": _json(_ref("Subscription"), "stored"), **writes},
                sub,
                _ref("SubscriptionSettings"),
            )
        },
        base + "/dlq": {
            "get": _op(
                "listDeadLetters",
                "Dead letters not yet redriven",
                {"200": _json(_ref("DeadLetters"), "dead letters"), **_errors(400, 404, *RAFT_ERRORS)},
                (
                    *sub,
                    _param(
                        "max",
                        "query",
                        _int(1, limits.max_fetch_messages, default=limits.default_fetch_messages),
                        "Most messages.",
                    ),
                    _param("queue", "query", _int(0, MAX_QUEUE_NUMBER), "Only this queue."),
                ),
            )
        },
        base + "/dlq/redrive": {
            "post": _op(
                "redriveDeadLetters",
                "Move dead letters back to the topic as new messages for this group",
                {"200": _json(_ref("Redriven"), "moved"), **writes},
                sub,
                _ref("RedriveRequest"),
            )
        },
        "/v1/topics/{topic}/queues/{queue}/locks/{group}": {
            "post": _op(
                "lockQueue",
                "Acquire or renew a queue's exclusive lock (ordered consumption)",
                {"200": _json(_ref("Lock"), "held"), **writes},
                (TOPIC, queue, GROUP),
                _ref("LockRequest"),
            ),
            "delete": _op(
                "unlockQueue",
                "Release a queue's lock",
                {
                    "200": _json(_obj({"released": {"type": "boolean"}}, required=("released",)), "released"),
                    **_errors(400, 404, *RAFT_ERRORS),
                },
                (
                    TOPIC,
                    queue,
                    GROUP,
                    _param(
                        "consumer",
                        "query",
                        _str(minLength=1, maxLength=255, **{"x-raftmq-max-utf8-bytes": 255}),
                        "The holder.",
                        True,
                    ),
                    _param("epoch", "query", _int(0, MAX_OFFSET), "The holder's epoch.", True),
                ),
            ),
        },
    }


# -- sealed segments and the Arrow fetch (cluster/segments_api.py, docs/spark.md) --------------------

ARROW_STREAM = "application/vnd.apache.arrow.stream"
BINARY = {"type": "string", "contentMediaType": "application/octet-stream"}


def _fetch_ok() -> dict[str, Any]:
    """The fetch answer: JSON, or an Arrow IPC stream with ``Accept: application/vnd.apache.arrow.stream``
    (Kafka's columns, up to 65,536 rows per call; ``max`` may then go up to 65,536)."""
    out = _json(_ref("FetchResponse"), "messages")
    out["description"] = (
        "messages; with `Accept: application/vnd.apache.arrow.stream` an Arrow IPC stream of Kafka's "
        "columns (up to 65,536 rows: `max` may go that high), next/low/high offsets in the "
        "`X-Raftmq-Next-Offset`, `X-Raftmq-Low-Offset` and `X-Raftmq-High-Offset` headers"
    )
    out["content"][ARROW_STREAM] = {"schema": BINARY}
    return out


def _segment_schemas() -> dict[str, Schema]:
    nullable_int = _nullable(_int(0))
    nullable_str = _nullable(_str())
    segment = _obj(
        {
            "base": _int(0),
            "end": _int(0),
            "rows": _int(0),
            "bytes": _int(0),
            "crc32c": _int(0),
            "parquet_crc32c": nullable_int,
            "node": _str(),
            "first_timestamp_ms": _int(0),
            "last_timestamp_ms": _int(0),
            "arrow_path": nullable_str,
            "parquet_path": nullable_str,
            "url": _str(),
        },
        required=("base", "end", "rows", "crc32c", "node", "arrow_path", "parquet_path", "url"),
        closed=False,
    )
    queue = _obj(
        {
            "queue": _int(0),
            "group_id": _int(0),
            "leader": nullable_str,
            "leader_url": nullable_str,
            "low_offset": _int(0),
            "high_offset": _int(0),
            "sealed_end": _int(0),
            "segments": _array(_ref("Segment")),
        },
        required=("queue", "low_offset", "high_offset", "sealed_end", "segments"),
        closed=False,
    )
    return {
        "Segment": segment,
        "SegmentManifest": _obj(
            {
                "topic": _str(),
                "topic_id": _int(0),
                "shared_store": {"type": "boolean"},
                "queues": _array(queue),
            },
            required=("topic", "topic_id", "queues"),
            closed=False,
        ),
    }


def _segment_paths() -> dict[str, Any]:
    return {
        "/v1/topics/{topic}/segments": {
            "get": _op(
                "listSegments",
                "Sealed segments per queue, with committed low/high offsets (the Spark source plans from it)",
                {
                    "200": _json(_ref("SegmentManifest"), "the manifest"),
                    **_errors(400, 404, *RAFT_ERRORS),
                },
                params=(TOPIC,),
            )
        },
        "/v1/topics/{topic}/segments/{queue}/{base}": {
            "get": _op(
                "getSegment",
                "One sealed segment's file (Arrow IPC file or Parquet), from any node",
                {
                    "200": {
                        "description": "the file; its CRC32C in `X-Raftmq-Crc32c`",
                        "content": {
                            "application/vnd.apache.arrow.file": {"schema": BINARY},
                            "application/vnd.apache.parquet": {"schema": BINARY},
                        },
                    },
                    **_errors(400, 404, *RAFT_ERRORS),
                },
                params=(
                    TOPIC,
                    _param("queue", "path", _int(0, MAX_QUEUE_NUMBER), "Queue number."),
                    _param("base", "path", _int(0, MAX_OFFSET), "The segment's first offset."),
                    _param(
                        "format", "query", {"enum": ["arrow", "parquet"], "default": "arrow"}, "File format."
                    ),
                ),
            )
        },
    }
