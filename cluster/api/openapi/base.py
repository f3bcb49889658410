"""Building blocks of the OpenAPI spec (``cluster/api/openapi/spec.py``): schema helpers and shared
parameters."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.base import errors
from raftmq.cluster.commands import MAX_NAME_BYTES as MAX_GROUP_BYTES
from raftmq.cluster.machines.metadata import TOPIC_NAME

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
