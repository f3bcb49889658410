"""OpenAPI parts of the consumer-group view and the web console (``cluster/api/handlers/consumers.py``,
``cluster/api/console.py``)."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.handlers.groups import MEMBERS_MAX
from raftmq.cluster.api.openapi.base import (
    GROUP,
    RAFT_ERRORS,
    TOPIC,
    Schema,
    _array,
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

_FIGURES = ("lag", "in_flight", "retrying", "dead_letters")


def _figures() -> dict[str, Schema]:
    return {
        "lag": _int(0, description="Messages not finished: high_offset - committed_offset."),
        "in_flight": _int(0, description="Received, visibility deadline not passed."),
        "retrying": _int(0, description="Waiting for a retry."),
        "dead_letters": _int(0, description="In the group's dead-letter queue, not redriven."),
    }


def _console_schemas() -> dict[str, Schema]:
    queue = _obj(
        {
            "queue": _int(0),
            "group_id": _int(0),
            "committed_offset": _nullable(_int(0)),
            "high_offset": _int(0),
            **_figures(),
        },
        required=("queue", "group_id", "committed_offset", "high_offset", *_FIGURES),
    )
    group = _obj(
        {"group": _str(), **_figures(), "queues": _array(queue)},
        required=("group", *_FIGURES, "queues"),
    )
    return {
        "TopicGroups": _obj(
            {
                "topic": _str(),
                "groups": _array(group),
                "unavailable_queues": _array(
                    _int(0), description="Queues whose queue group's leader could not be asked."
                ),
            },
            required=("topic", "groups", "unavailable_queues"),
        ),
        "GroupMembers": _obj(
            {
                "group": _str(),
                "topic": _str(),
                "state": _str(
                    enum=["empty", "stable", "rebalancing"],
                    description="empty: no member consumes the topic; rebalancing: a member has not yet "
                    "been sent or applied the topic's current assignment, or waits for a queue; else stable.",
                ),
                "generation": _nullable(
                    _int(
                        0,
                        description="The topic's generation in the group: it moves only when the topic's "
                        "members change, not when the group's other topics rebalance (null: no member).",
                    )
                ),
                "member_count": _int(0, description="Members consuming the topic (all, listed or not)."),
                "members": _array(
                    _obj(
                        {
                            "member_id": _str(),
                            "queues": _array(
                                _int(0),
                                description="Queues of the topic its last heartbeat answer handed it.",
                            ),
                            "pending": _array(
                                _int(0),
                                description="Queues its allocation gives it, held back until their "
                                "previous holder lets go (the revoke barrier).",
                            ),
                            "last_seen_ms": _int(0, description="Its last heartbeat, Unix ms."),
                            "last_seen_ago_ms": _int(0, description="How long ago that was."),
                            "applied_generation": _nullable(
                                _int(
                                    0,
                                    description="The topic generation of the last assignment it says it "
                                    "has applied (null: it sends none, or has applied none yet).",
                                )
                            ),
                        },
                        required=(
                            "member_id",
                            "queues",
                            "pending",
                            "last_seen_ms",
                            "last_seen_ago_ms",
                            "applied_generation",
                        ),
                    ),
                    description=f"At most {MEMBERS_MAX:,}, by member id.",
                ),
                "truncated": {"type": "boolean", "description": "More members than listed."},
                "unassigned_queues": _array(_int(0), description="Queues of the topic no member holds."),
                "session_timeout_ms": _int(0),
            },
            required=(
                "group",
                "topic",
                "state",
                "generation",
                "member_count",
                "members",
                "truncated",
                "unassigned_queues",
                "session_timeout_ms",
            ),
        ),
        "LagHistory": _obj(
            {
                "topic": _str(),
                "node": _str(description="The node that sampled it (each node keeps its own)."),
                "interval_ms": _int(1, description="How often the node samples (limits.lag_sample_ms)."),
                "history_ms": _int(1, description="How far back samples are kept (15 minutes)."),
                "groups": _array(
                    _obj(
                        {
                            "group": _str(),
                            "samples": _array(
                                _array(_int(0), description="[time_ms, lag]"),
                                description="Oldest first.",
                            ),
                        },
                        required=("group", "samples"),
                    )
                ),
            },
            required=("topic", "node", "interval_ms", "history_ms", "groups"),
        ),
    }


def _page(content_types: tuple[str, ...], description: str) -> dict[str, Any]:
    return {"description": description, "content": {t: {"schema": _str()} for t in content_types}}


def _console_paths() -> dict[str, Any]:
    index = _op(
        "console",
        "The web console (HTML; its data comes from the API with the token typed in)",
        {"200": _page(("text/html",), "the console page")},
    )
    return {
        "/v1/topics/{topic}/groups": {
            "get": _op(
                "topicGroups",
                "Consumer groups of a topic: lag, in-flight, retrying and dead letters per queue",
                {"200": _json(_ref("TopicGroups"), "the groups"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(TOPIC,),
            )
        },
        "/v1/topics/{topic}/groups/lag": {
            "get": _op(
                "topicGroupsLag",
                "Each consumer group's lag on a topic over the last 15 minutes, as this node sampled it",
                {"200": _json(_ref("LagHistory"), "the samples"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(TOPIC,),
            )
        },
        "/v1/topics/{topic}/groups/{group}/members": {
            "get": _op(
                "topicGroupMembers",
                "A consumer group's members on a topic, the queues each holds, and the topic's state "
                "(from the membership coordinator, the metadata leader)",
                {"200": _json(_ref("GroupMembers"), "the members"), **_errors(400, 404, *RAFT_ERRORS)},
                params=(TOPIC, GROUP),
            )
        },
        "/": {
            "get": _op(
                "root",
                "Redirects to the web console (302, Location: /ui)",
                {"302": {"description": "to /ui"}},
            )
        },
        "/ui": {"get": {**index, "operationId": "consoleIndex"}},
        "/ui/": {"get": {**index, "operationId": "consoleIndexSlash"}},
        "/ui/{file}": {
            "get": _op(
                "consoleFile",
                "A file of the web console",
                {
                    "200": _page(("text/html", "text/javascript", "text/css", "image/svg+xml"), "the file"),
                    **_errors(404),
                },
                params=(_param("file", "path", _str(pattern="^[A-Za-z0-9._-]+$"), "File name."),),
            )
        },
    }
