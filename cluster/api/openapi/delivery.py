"""OpenAPI entries of receive/ack, dead letters and locks (cluster/api/handlers/subscriptions.py,
docs/delivery.md)."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.handlers.push import (
    DEFAULT_HEARTBEAT_MS,
    MAX_FRAME_ID_CHARS,
    MAX_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
)
from raftmq.cluster.api.openapi.base import (
    GROUP,
    RAFT_ERRORS,
    TOPIC,
    TOPIC_NAME_PATTERN,
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
from raftmq.cluster.api.openapi.messages import _handed_out, _max_messages_param
from raftmq.cluster.api.validation import MAX_OFFSET, MAX_QUEUE_NUMBER
from raftmq.cluster.commands import MAX_BACKOFF_LEVELS, MAX_RECEIPTS, MAX_RECEIVE
from raftmq.cluster.config.cluster_file import Limits

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
        **_push_schemas(limits, receipts, visibility, error_detail),
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
        "ReceivedMessage": _handed_out(
            {
                "receipt": RECEIPT,
                "attempt": _int(1),
                "queue": _int(0),
                "offset": _int(0),
                "deadline_ms": _int(0, description="In flight until then; redelivered after it."),
            },
            {
                "first_delivery_ms": _int(
                    0,
                    description=(
                        "When the message was first handed out to this group (the leader's clock, "
                        "ms); kept through redeliveries. Absent from a leader of an older release."
                    ),
                ),
            },
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


def _push_schemas(limits: Limits, receipts: Schema, visibility: Schema, error: Schema) -> dict[str, Schema]:
    """The frames of the push stream (WebSocket text frames, JSON; docs/delivery.md "Push")."""
    frame_id = {
        "anyOf": [_int(-(2**53) + 1, 2**53 - 1), _str(maxLength=MAX_FRAME_ID_CHARS)],
        "description": "Echoed in the reply.",
    }

    def client(op: str, props: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
        return _obj({"op": {"const": op}, "id": frame_id, **props}, required=("op", *required))

    def server(kind: str, props: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
        return _obj({"type": {"const": kind}, **props}, required=("type", *required))

    max_rdy = min(limits.max_fetch_messages, MAX_RECEIVE)
    return {
        "PushClientFrame": {
            "description": "A frame the client sends on the push stream.",
            "oneOf": [
                client("rdy", {"n": _int(0, max_rdy, description="Messages in flight at most.")}, ("n",)),
                client("fin", {"receipts": receipts}, ("receipts",)),
                client(
                    "req",
                    {"receipts": receipts, "delay_ms": _int(0, limits.max_delay_ms)},
                    ("receipts",),
                ),
                client("touch", {"receipts": receipts, "visibility_ms": visibility}, ("receipts",)),
                client("ping", {}),
            ],
        },
        "PushServerFrame": {
            "description": "A frame the node sends on the push stream.",
            "oneOf": [
                server(
                    "hello",
                    {
                        "topic": _str(),
                        "group": _str(),
                        "node": _str(),
                        "visibility_ms": _int(1),
                        "heartbeat_ms": _int(1),
                        "max_rdy": _int(1),
                    },
                    ("topic", "group", "node", "visibility_ms", "heartbeat_ms", "max_rdy"),
                ),
                server("messages", {"messages": _array(_ref("ReceivedMessage"))}, ("messages",)),
                server(
                    "result",
                    {
                        "op": {"enum": ["fin", "req", "touch"]},
                        "id": frame_id,
                        "results": {"$ref": "#/components/schemas/ReceiptResults/properties/results"},
                    },
                    ("op", "results"),
                ),
                server("pong", {"id": frame_id}),
                server(
                    "error",
                    {"op": _str(), "id": frame_id, "error": error, "fatal": {"const": True}},
                    ("error",),
                ),
            ],
        },
    }


def _push_path(limits: Limits) -> dict[str, Any]:
    return {
        "get": {
            **_op(
                "pushStream",
                "Push delivery over a WebSocket: RDY credits, FIN/REQ/TOUCH (frames: docs/delivery.md)",
                {
                    "101": {
                        "description": "Switching Protocols: the stream (PushClientFrame, PushServerFrame)"
                    },
                    **_errors(400, 404, *RAFT_ERRORS),
                },
                (
                    TOPIC,
                    SUB_GROUP,
                    _param(
                        "visibility_ms",
                        "query",
                        _int(1, limits.max_visibility_ms, default=limits.default_visibility_ms),
                        "Visibility of the pushed messages.",
                    ),
                    _param(
                        "heartbeat_ms",
                        "query",
                        _int(MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS, default=DEFAULT_HEARTBEAT_MS),
                        "The node pings after this much silence and drops the stream without a pong "
                        "within half of it.",
                    ),
                ),
            ),
            "x-raftmq-websocket": {
                "client_frames": _ref("PushClientFrame"),
                "server_frames": _ref("PushServerFrame"),
            },
        }
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
        base + "/stream": _push_path(limits),
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
                    _max_messages_param(limits),
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


# -- sealed segments and the Arrow fetch (cluster/api/handlers/segments.py, docs/spark.md) -----
