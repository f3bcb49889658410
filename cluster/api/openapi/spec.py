"""The OpenAPI 3.1 description of the public HTTP API v1 (``GET /openapi.json``).

The spec is data, built by the small helpers below, and it states what the server enforces
(``cluster/api/validation.py``): exact types, required fields, ``additionalProperties: false`` where
unknown fields are rejected, and the limits of the node's :class:`~raftmq.cluster.config.cluster_file.Limits`.
Limits counted in UTF-8 bytes, which JSON Schema cannot express, are given as
``x-raftmq-max-utf8-bytes``. The ``/internal/*`` peer routes are not part of the public API.
"""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.openapi.base import (
    BASE64,
    GROUP,
    RAFT_ERRORS,
    TOPIC,
    TOPIC_NAME_PATTERN,
    U64,
    Schema,
    _array,
    _error_schema,
    _errors,
    _int,
    _json,
    _nullable,
    _obj,
    _op,
    _param,
    _ref,
    _str,
)
from raftmq.cluster.api.openapi.cluster import _cluster_paths, _cluster_schemas
from raftmq.cluster.api.openapi.console import _console_paths, _console_schemas
from raftmq.cluster.api.openapi.delivery import _delivery_paths, _delivery_schemas
from raftmq.cluster.api.openapi.messages import VALUE_OR_B64, _handed_out, _max_messages_param
from raftmq.cluster.api.openapi.security import add_node_bounds, add_security
from raftmq.cluster.api.openapi.segments import _fetch_ok, _segment_paths, _segment_schemas
from raftmq.cluster.api.openapi.sqs import sqs_paths, sqs_schemas
from raftmq.cluster.api.openapi.topics import _attributes, _topic
from raftmq.cluster.api.validation import (
    DEFAULT_FETCH_BYTES,
    MAX_FETCH_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_OFFSET,
    MAX_PRODUCER_ID_BYTES,
    MAX_QUEUE_NUMBER,
    MAX_SEQUENCE,
)
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.metadata import MAX_QUEUES

__all__ = ["openapi_spec"]

# A queue's bounds in the topic's description (docs/api.md, "What the bounds and lag say").
_BOUND = (
    "Read at the queue group's leader once it has applied the first entry of its term; null when "
    "no such leader answered in time."
)


def _message_schema(limits: Limits) -> Schema:
    utf8 = "x-raftmq-max-utf8-bytes"
    return _obj(
        {
            "value": _str(description="UTF-8 text payload.", **{utf8: limits.max_message_bytes}),
            "value_b64": _str(
                pattern=BASE64, contentEncoding="base64", description="Binary payload, standard base64."
            ),
            "key": _nullable(
                _str(description="Routes to fmix32(CRC32C(key)) mod queues.", **{utf8: MAX_KEY_BYTES})
            ),
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
        oneOf=VALUE_OR_B64,
        dependentSchemas={"delay_ms": {"not": {"required": ["deliver_at_ms"]}}},  # one of the two
        description=f"value or value_b64 (exactly one). value + key + headers: at most "
        f"{limits.max_message_bytes} UTF-8 bytes (413 message_too_large). A delayed message (delay_ms > 0 "
        "or deliver_at_ms ahead) gets its offset when it is released (docs/delivery.md).",
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
                "attributes": _nullable(_attributes(False)),
            },
            required=("name",),
        ),
        "CreateTopics": _obj(
            {
                "topics": _array(
                    _ref("CreateTopic"),
                    minItems=1,
                    maxItems=limits.max_topics_per_request,
                    description="Topics created in one metadata entry (limits.max_topics_per_request; "
                    "more: 413 request_too_large); no name twice.",
                )
            },
            required=("topics",),
        ),
        "CreateTopicsResults": _obj(
            {
                "results": _array(
                    _obj(
                        {
                            "name": _str(),
                            "topic": _ref("Topic"),
                            "error": _error_schema()["properties"]["error"],
                        },
                        required=("name",),
                        oneOf=[{"required": ["topic"]}, {"required": ["error"]}],
                    ),
                    description="One per topic asked for, in order: the topic created, or why that "
                    "topic alone was not (e.g. topic_exists).",
                )
            },
            required=("results",),
        ),
        "TopicChange": _obj(
            {
                "attributes": _attributes(True),
                "retention_ms": _nullable(_int(1, U64)),
                "retention_bytes": _nullable(_int(1, U64)),
            },
            minProperties=1,
            description="Either attributes (merged into the topic's) or retention_ms and/or "
            "retention_bytes (each set, or removed with null; a field left out is kept): not both "
            "in one request. Retention turned on or tightened frees the messages past it at the "
            "queue groups' next retention look (raft.retention_check_ms).",
        ),
        "Topic": _topic(
            _int(1),
            dead_letter_of=_obj(
                {"topic": _str(), "group": _str()},
                required=("topic", "group"),
                description="Only on a dead-letter topic: its source topic and consumer group "
                "(the list puts it right after its source).",
            ),
        ),
        "TopicDescription": _topic(_array(_ref("QueueInfo"))),
        "QueueInfo": _obj(
            {
                "queue": _int(0),
                "group_id": _int(0),
                "leader": _nullable(_str()),
                "replicas": _array(_str()),
                "low_offset": _nullable(_int(0, description=_BOUND)),
                "high_offset": _nullable(
                    _int(0, description=_BOUND + " Never below an offset a producer was given.")
                ),
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
        "FetchedMessage": _handed_out({"offset": _int(0)}),
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
                "advance": {
                    "type": "boolean",
                    "description": (
                        "A consumer's commit: a queue's offset is stored only if it is above the committed "
                        "one, else kept (applied: false, still 200), so a late copy of an older commit "
                        "cannot move the group back. Without it (false) the offsets are set as given: "
                        "a rewind."
                    ),
                },
            },
            required=("topic", "offsets"),
        ),
        "Committed": _obj(
            {
                "ok": {"const": True},
                "offsets": {
                    "type": "object",
                    "additionalProperties": _obj(
                        {
                            "offset": _int(0, description="the queue's committed offset now"),
                            "applied": {
                                "type": "boolean",
                                "description": "false: kept, the committed offset was not below it (advance)",
                            },
                        },
                        required=("offset", "applied"),
                    ),
                    "description": "per queue of the request (as a string)",
                },
            },
            required=("ok", "offsets"),
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
                        {
                            "id": _str(),
                            "http": _str(),
                            "raft": _str(description="cluster admin only"),
                            "reachable": {"type": "boolean"},
                        },
                        required=("id", "http", "reachable"),
                    )
                ),
                "groups": _array(
                    _obj(
                        {
                            "group_id": _str(description='"meta" or the queue group number'),
                            "leader": _nullable(_str()),
                            "term": _int(0),
                            "replicas": _array({"type": "object", "required": ["node_id"]}),
                            "placement": _array(
                                _str(), description="the nodes that hold a replica, reachable or not"
                            ),
                        },
                        required=("group_id", "leader", "term", "replicas", "placement"),
                        closed=False,
                    )
                ),
                "tokens_required": {"type": "boolean"},
            },
            required=("node_id", "nodes", "groups", "tokens_required"),
        ),
        "Status": _obj({"status": _str(), "node_id": _str()}, required=("status", "node_id")),
        "Membership": _obj(
            {
                "group": _str(),
                "member_id": _str(),
                "generation": _int(0),
                "members": _array(
                    _str(),
                    description="The member itself only: the answer names no other member "
                    "(older clients read this field).",
                ),
                "assignment": {"type": "object", "additionalProperties": _array(_int(0))},
                "allocation": {
                    "type": "object",
                    "additionalProperties": _array(_int(0)),
                    "description": "The member's queues per topic once the revoke barrier lets them "
                    "go: the assignment plus the queues still withheld.",
                },
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
        _max_messages_param(limits),
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
            "get": _op(
                "getCluster",
                "Nodes and groups. Raft addresses (nodes[].raft, a replica's members and term_rises) "
                "only for a cluster admin: any other token gets node ids, HTTP addresses, "
                "reachability and each group's leader, term, placement and replicas' indexes",
                {"200": _json(_ref("Cluster"), "cluster view")},
            )
        },
        "/v1/topics": {
            "post": _op(
                "createTopic",
                "Create a topic ({name, ...}), or many in one metadata entry ({topics: [{name, ...}]})",
                {
                    "200": _json(_ref("CreateTopicsResults"), "many: one result per topic"),
                    "201": _json(_ref("TopicDescription"), "one: created"),
                    **_errors(400, 409),
                    **too_large,
                    **_errors(*RAFT_ERRORS),
                },
                body={"oneOf": [_ref("CreateTopic"), _ref("CreateTopics")]},
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
            "patch": _op(
                "changeTopic",
                "Set or remove attributes of a topic (merged into its attributes), or change its retention",
                {"200": _json(_ref("TopicDescription"), "the topic"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(TOPIC,),
                body=_ref("TopicChange"),
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
                {
                    "200": _json(_ref("ProduceResponse"), "stored"),
                    **_errors(400, 404, 409, 413, *RAFT_ERRORS),
                },
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
                "Commit a consumer group's offsets (replicated; forward only with advance; fenced by epoch). "
                "A new group of a token without admin on the topic counts against "
                "limits.max_groups_per_topic and max_groups_per_token (409 too_many_groups, nothing "
                "stored); its offsets expire after limits.offset_retention_ms unused",
                {
                    "200": _json(_ref("Committed"), "committed"),
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
                "A consumer group's committed offsets, in queue order (linearizable; null where none)",
                {"200": _json(_ref("Offsets"), "offsets"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(GROUP, _param("topic", "query", _str(pattern=TOPIC_NAME_PATTERN), "Topic.", True)),
            ),
        },
        "/v1/groups/{group}/members": {
            "post": _op(
                "joinGroup",
                "Join a consumer group or heartbeat; answers this member's queues (clustering mode). "
                "With tokens a member belongs to the token that created it: another token's heartbeat "
                "under its id is 403 member_not_owned (unless admin on all its topics); a new member "
                "beyond limits.max_members_per_token or max_members_per_topic is 409 too_many_members; "
                "more topics than limits.max_topics_per_request is 413 request_too_large",
                {"200": _json(_ref("Membership"), "assignment"), **_errors(400, 404, 409, 413, *RAFT_ERRORS)},
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
                "Leave a consumer group (its queues move to the other members); removing a member "
                "needs consume on every topic it consumes and, with tokens, to be its owner (the token "
                "that created it) or admin on all its topics (else 403 member_not_owned)",
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
                "Prometheus metrics: in full to a cluster admin, a token with metrics = true, or anyone with "
                "security.metrics_open; to any other token only the series of topics it has some "
                "permission on and none labelled with a Raft address (peer)",
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
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "raftmq",
            "version": "1",
            "description": "Raft-replicated message broker. Any node answers any request. Every error "
            'has the body {"error": {"code", "message", "retriable", "definite", ...}}. Integers in '
            "request bodies are JSON integers written without a fraction or exponent (1.0 is refused).",
        },
        "paths": {
            **_paths(limits),
            **_delivery_paths(limits),
            **_segment_paths(),
            **_console_paths(),
            **_cluster_paths(),
            **sqs_paths(),
        },
        "components": {
            "schemas": {
                **_schemas(limits),
                **_delivery_schemas(limits),
                **_segment_schemas(),
                **_console_schemas(),
                **_cluster_schemas(),
                **sqs_schemas(),
            }
        },
    }
    return add_node_bounds(add_security(spec))


# -- receive/ack, dead letters, locks (cluster/api/handlers/subscriptions.py, docs/delivery.md) ---
