"""OpenAPI entries of segments and the Arrow fetch (cluster/api/handlers/segments.py, docs/spark.md)."""

from __future__ import annotations

from typing import Any

from raftmq.batch import BATCH_MEDIA_TYPE
from raftmq.cluster.api.openapi.base import (
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
from raftmq.cluster.api.validation import MAX_OFFSET, MAX_QUEUE_NUMBER

ARROW_STREAM = "application/vnd.apache.arrow.stream"
BINARY = {"type": "string", "contentMediaType": "application/octet-stream"}


def _fetch_ok() -> dict[str, Any]:
    """The fetch answer: JSON, an Arrow IPC stream with ``Accept: application/vnd.apache.arrow.stream``
    (Kafka's columns, up to 65,536 rows per call; ``max`` may then go up to 65,536), or the stored
    record batches with ``Accept: application/vnd.raftmq.batch`` (cluster/api/handlers/fetch_batches.py)."""
    out = _json(_ref("FetchResponse"), "messages")
    out["description"] = (
        "messages; with `Accept: application/vnd.apache.arrow.stream` an Arrow IPC stream of Kafka's "
        "columns (up to 65,536 rows: `max` may go that high), next/low/high offsets in the "
        "`X-Raftmq-Next-Offset`, `X-Raftmq-Low-Offset` and `X-Raftmq-High-Offset` headers; with "
        f"`Accept: {BATCH_MEDIA_TYPE}` the stored record batches as frames (docs/format.md), whole "
        "batches from the one holding `offset` (it may begin below it: skip those records), "
        "messages expired at the node's clock included, and in headers `X-Raftmq-Next-Offset`, "
        "`X-Raftmq-Low-Offset`, `X-Raftmq-High-Offset`, `X-Raftmq-Now-Ms` (the node's clock) and "
        "`X-Raftmq-Max-Age-Ms` (the topic's `retention_ms`, absent without one)"
    )
    out["content"][ARROW_STREAM] = {"schema": BINARY}
    out["content"][BATCH_MEDIA_TYPE] = {"schema": BINARY}
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
                        "description": (
                            "the file; its CRC32C in `X-Raftmq-Crc32c`. `HEAD` answers these headers"
                            " and `Content-Length` only (the file's size, also through a node that"
                            " passes the request on to the segment's writer). A read of the file"
                            " failing after the headers (or the writer, for a download passed on,"
                            " going away or sending nothing for 30 s) drops the connection: the body"
                            " ends short of `Content-Length`, never a file that looks whole"
                        ),
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
