"""Validation of client requests: bad input becomes an :class:`ApiError` before anything is proposed.

Pure functions over parsed JSON; the HTTP layer turns ``ApiError`` into the stable error body.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from raftmq.batch import RESERVED_HEADER_PREFIX, is_reserved_header
from raftmq.cluster.api.sqs.queues import PREFIX as SQS_PREFIX
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.metadata import validate_attributes, validate_topic_name

__all__ = [
    "ApiError",
    "ProduceMessage",
    "ProduceRequest",
    "parse_create_topic",
    "parse_create_topics",
    "parse_json",
    "parse_produce",
    "query_int",
]

MAX_KEY_BYTES = 64 * 1024
MAX_HEADERS = 64
MAX_PRODUCER_ID_BYTES = 255
MAX_SEQUENCE = 2**63 - 1
MAX_OFFSET = 2**63 - 1
MAX_QUEUE_NUMBER = 2**31  # largest queue number a fetch path may name (above a topic's: queue_not_found)
DEFAULT_FETCH_BYTES = 8 * 1024 * 1024
MAX_FETCH_BYTES = 64 * 1024 * 1024


def bad(message: str) -> ApiError:
    return ApiError(errors.BAD_REQUEST, message)


def parse_json(body: bytes) -> Any:
    """Parse a request body (strict UTF-8 JSON; lone surrogates and invalid UTF-8 are rejected)."""
    if not body:
        raise ApiError(errors.INVALID_JSON, "the request body is empty; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ApiError(errors.INVALID_JSON, f"the body is not valid JSON: {e}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_fields(obj: dict[str, Any], allowed: set[str] | frozenset[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise bad(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")


class ProduceMessage(NamedTuple):  # a tuple: built per produced message, so cheap to make
    value: str | bytes  # a text value, or the bytes of value_b64 (decoded once, here)
    key: str | None
    queue: int | None
    size: int  # bytes counted against max_message_bytes
    headers: dict[str, str] | None = None  # None when absent or empty
    deliver_at_ms: int | None = None  # a delayed message: when it is due (in the future)
    ttl_ms: int = 0  # 0: no TTL


@dataclass(frozen=True)
class ProduceRequest:
    messages: list[ProduceMessage]
    producer_id: str | None
    sequence: int | None


def parse_produce(body: Any, limits: Limits, max_message_bytes: int, now_ms: int = 0) -> ProduceRequest:
    """Validate a produce body ``{"messages": [...], "producer_id"?, "sequence"?}``.

    A message's ``delay_ms`` (> 0) or ``deliver_at_ms`` (in the future; ``now_ms`` is this node's
    clock) makes it delayed: its command body then carries the absolute ``deliver_at_ms``; both
    at most ``limits.max_delay_ms`` ahead. ``ttl_ms`` (1..``limits.max_ttl_ms``) goes as given."""
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object with a 'messages' list")
    _check_fields(body, {"messages", "producer_id", "sequence"}, "body")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("'messages' must be a non-empty list")
    if len(raw) > limits.max_messages_per_request:
        raise ApiError(
            errors.REQUEST_TOO_LARGE,
            f"{len(raw)} messages in one request; the limit is {limits.max_messages_per_request}",
        )
    producer_id, sequence = body.get("producer_id"), body.get("sequence")
    if producer_id is not None:
        if not isinstance(producer_id, str) or not producer_id:
            raise bad("'producer_id' must be a non-empty string")
        if len(producer_id.encode()) > MAX_PRODUCER_ID_BYTES:
            raise bad(f"'producer_id' is longer than {MAX_PRODUCER_ID_BYTES} bytes")
    if sequence is not None and (not _is_int(sequence) or not 0 <= sequence <= MAX_SEQUENCE):
        raise bad("'sequence' must be a non-negative integer")
    if (producer_id is None) != (sequence is None):
        raise bad("'producer_id' and 'sequence' go together")
    return ProduceRequest(_parse_messages(raw, max_message_bytes, limits, now_ms), producer_id, sequence)


_MESSAGE_FIELDS = frozenset(
    {"value", "value_b64", "key", "headers", "queue", "delay_ms", "deliver_at_ms", "ttl_ms"}
)
_TIMING_FIELDS = frozenset({"delay_ms", "deliver_at_ms", "ttl_ms"})
_PLAIN_FIELDS = frozenset({"value", "key", "queue"})


def _parse_messages(
    raw: list[Any], max_message_bytes: int, limits: Limits, now_ms: int
) -> list[ProduceMessage]:
    """Every message of a produce body checked, in order: a plain one (a text value, maybe a key
    and a queue, nothing else) in one pass of a few type checks, any other by
    :func:`_parse_message`, which checks it field by field and names its first problem.

    Invariant: the plain path only accepts, and only what :func:`_parse_message` accepts, with
    the same :class:`ProduceMessage`; anything in doubt (text that is not ASCII, whose UTF-8
    length needs an encode; a wrong type; a size near a limit) goes the long way, which decides.
    ``str.isascii`` reads a flag CPython keeps, and an ASCII string's length is its UTF-8 length
    (tests/unit/test_parse_produce.py compares the two paths)."""
    out: list[ProduceMessage] = []
    append = out.append
    for i, m in enumerate(raw):
        if type(m) is dict and m.keys() <= _PLAIN_FIELDS:
            value, key, queue = m.get("value"), m.get("key"), m.get("queue")
            if (
                type(value) is str
                and value.isascii()
                and (queue is None or (type(queue) is int and queue >= 0))
                and (key is None or (type(key) is str and key.isascii() and len(key) <= MAX_KEY_BYTES))
            ):
                size = len(value) if key is None else len(value) + len(key)
                if size <= max_message_bytes:
                    append(ProduceMessage(value, key, queue, size))
                    continue
        append(_parse_message(m, i, max_message_bytes, limits, now_ms))
    return out


def _present_int(raw: dict[str, Any], name: str, lo: int, hi: int, where: str) -> int | None:
    """``raw[name]`` if present (it must be an integer in [lo, hi]; null is not absent), else None."""
    if name not in raw:
        return None
    value = raw[name]
    if not _is_int(value) or not lo <= value <= hi:
        raise bad(f"{where}.{name} must be an integer from {lo} to {hi}")
    return int(value)


def _timing(raw: dict[str, Any], where: str, limits: Limits, now_ms: int) -> tuple[int | None, int]:
    """``deliver_at_ms`` (None: not delayed) and ``ttl_ms`` (0: none) from ``delay_ms`` /
    ``deliver_at_ms`` / ``ttl_ms``."""
    if "delay_ms" in raw and "deliver_at_ms" in raw:
        raise bad(f"{where}: give delay_ms or deliver_at_ms, not both")
    deliver_at_ms: int | None = None
    delay = _present_int(raw, "delay_ms", 0, limits.max_delay_ms, where)
    if delay:
        deliver_at_ms = now_ms + delay
    at = _present_int(raw, "deliver_at_ms", 0, now_ms + limits.max_delay_ms, where)
    if at is not None and at > now_ms:  # a due time in the past delivers at once
        deliver_at_ms = at
    ttl = _present_int(raw, "ttl_ms", 1, limits.max_ttl_ms, where)
    return deliver_at_ms, ttl or 0


def _parse_message(raw: Any, i: int, max_message_bytes: int, limits: Limits, now_ms: int) -> ProduceMessage:
    where = f"messages[{i}]"
    if type(raw) is not dict:
        raise bad(f"{where} must be an object")
    fields = raw.keys()
    if not fields <= _MESSAGE_FIELDS:
        _check_fields(raw, _MESSAGE_FIELDS, where)
    deliver_at_ms, ttl_ms = (None, 0)
    if not fields.isdisjoint(_TIMING_FIELDS):
        deliver_at_ms, ttl_ms = _timing(raw, where, limits, now_ms)
    value: str | bytes
    if ("value" in raw) == ("value_b64" in raw):
        raise bad(f"{where} needs exactly one of 'value' (a string) or 'value_b64' (base64)")
    if "value" in raw:
        value = raw["value"]
        if not isinstance(value, str):
            raise bad(f"{where}.value must be a string (use value_b64 for binary)")
        size = _utf8_len(value, f"{where}.value")
    else:
        text = raw["value_b64"]
        if not isinstance(text, str):
            raise bad(f"{where}.value_b64 must be a base64 string")
        try:
            value = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise bad(f"{where}.value_b64 is not valid base64") from None
        size = len(value)
    key = raw.get("key")
    if key is not None:
        if not isinstance(key, str):
            raise bad(f"{where}.key must be a string")
        key_len = _utf8_len(key, f"{where}.key")
        if key_len > MAX_KEY_BYTES:
            raise bad(f"{where}.key is longer than {MAX_KEY_BYTES} bytes")
        size += key_len
    headers = raw.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
            raise bad(f"{where}.headers must be an object of at most {MAX_HEADERS} string values")
        for hk, hv in headers.items():
            if not isinstance(hv, str):
                raise bad(f"{where}.headers[{hk!r}] must be a string")
            if is_reserved_header(hk):
                raise ApiError(
                    errors.RESERVED_HEADER,
                    f"{where}.headers[{hk!r}]: names starting with {RESERVED_HEADER_PREFIX!r} (any case) "
                    "are the broker's own",
                    index=i,
                    header=hk,
                )
            size += _utf8_len(hk, f"{where}.headers") + _utf8_len(hv, f"{where}.headers")
    queue = raw.get("queue")
    if queue is not None and (not _is_int(queue) or queue < 0):
        raise bad(f"{where}.queue must be a non-negative integer")
    if size > max_message_bytes:
        raise ApiError(
            errors.MESSAGE_TOO_LARGE,
            f"{where} is {size} bytes; the limit is {max_message_bytes}",
            index=i,
            limit=max_message_bytes,
        )
    return ProduceMessage(value, key, queue, size, headers or None, deliver_at_ms, ttl_ms)


def _utf8_len(text: str, where: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:  # lone surrogates cannot be stored as UTF-8
        raise bad(f"{where} is not valid Unicode (lone surrogate)") from None


def _ends_in_newline(name: Any) -> bool:
    """The metadata machine's name patterns end in ``$``, which matches before a final newline, so
    they take ``"name\n"``; such a name is refused here, at the API, where no replica of an older
    release can disagree (the machine's patterns stay as every release applies them)."""
    return isinstance(name, str) and name.endswith("\n")


def _refuse_front_end_attributes(attributes: dict[str, Any]) -> None:
    """Attributes named ``sqs.`` (any ASCII case) are the SQS API's: it sets them only after its
    own checks (a RedrivePolicy's target, its rights and RedriveAllowPolicy, the values its
    actions parse), so the REST API may neither set nor remove them. Set through this route, a
    RedrivePolicy moved a queue's messages into a queue the token could not produce to, and a bad
    value made every ReceiveMessage fail. (A name ending in a newline is refused too.)"""
    for name in attributes:
        if _ends_in_newline(name):
            raise bad(f"attribute {name!r}: attribute names are 1-128 characters of A-Z a-z 0-9 . _ : -")
        if name.lower().startswith(SQS_PREFIX.lower()):
            raise bad(
                f"attribute {name!r}: names starting with {SQS_PREFIX!r} are set through the SQS API only"
            )


def parse_create_topic(body: Any, limits: Limits) -> dict[str, Any]:
    """Validate ``{"name", "queues"=8, "retention_ms"?, "retention_bytes"?, "max_message_bytes"?,
    "attributes"?}``."""
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    _check_fields(
        body, {"name", "queues", "retention_ms", "retention_bytes", "max_message_bytes", "attributes"}, "body"
    )
    problem = validate_topic_name(body.get("name"))
    if problem is None and _ends_in_newline(body["name"]):
        problem = "topic names are 1-200 characters of A-Z a-z 0-9 . _ - (no newline)"
    if problem:
        raise bad(problem)
    queues = body.get("queues", 8)
    if not _is_int(queues) or not 1 <= queues <= limits.max_queues_per_topic:
        raise bad(f"'queues' must be an integer from 1 to {limits.max_queues_per_topic}")
    out: dict[str, Any] = {"name": body["name"], "queues": queues}
    for key in ("retention_ms", "retention_bytes", "max_message_bytes"):
        v = body.get(key)
        if v is None:
            continue
        if not _is_int(v) or v < 1:
            raise bad(f"'{key}' must be a positive integer")
        out[key] = v
    if out.get("max_message_bytes", 0) > limits.max_message_bytes:
        raise bad(f"'max_message_bytes' may not exceed the cluster limit {limits.max_message_bytes}")
    if body.get("attributes") is not None:
        problem = validate_attributes(body["attributes"], removals=False)
        if problem:
            raise bad(problem)
        _refuse_front_end_attributes(body["attributes"])
        out["attributes"] = body["attributes"]
    return out


def parse_create_topics(body: Any, limits: Limits) -> list[dict[str, Any]]:
    """Validate ``{"topics": [spec, ...]}``: 1 to ``limits.max_topics_per_request`` specs (more:
    ``request_too_large``), each checked as :func:`parse_create_topic` checks one (its error names
    the spec: ``topics[3]: ...``, with ``index``), no name twice."""
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    _check_fields(body, {"topics"}, "body")
    raw = body.get("topics")
    if not isinstance(raw, list) or not raw:
        raise bad("'topics' must be a non-empty list of topic specs")
    if len(raw) > limits.max_topics_per_request:
        raise ApiError(
            errors.REQUEST_TOO_LARGE,
            f"{len(raw)} topics in one request; the limit is {limits.max_topics_per_request}",
            limit=limits.max_topics_per_request,
        )
    specs: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        try:
            spec = parse_create_topic(item, limits)
        except ApiError as e:
            raise ApiError(e.error, f"topics[{i}]: {e.message}", index=i) from None
        first = seen.setdefault(spec["name"], i)
        if first != i:
            raise ApiError(
                errors.BAD_REQUEST, f"topics[{i}]: {spec['name']!r} is topics[{first}] too", index=i
            )
        specs.append(spec)
    return specs


def parse_topic_patch(body: Any) -> dict[str, Any]:
    """Validate ``PATCH /v1/topics/{topic}``: ``{"attributes": {name: value or null}}`` or
    ``{"retention_ms"?: int or null, "retention_bytes"?: int or null}`` (at least one; null
    removes the bound). Returns the metadata command's op and fields (without the topic's name).
    The two kinds go in separate requests: each is one metadata entry, applied whole or not at all."""
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    _check_fields(body, {"attributes", "retention_ms", "retention_bytes"}, "body")
    retention = {k: body[k] for k in ("retention_ms", "retention_bytes") if k in body}
    if retention and "attributes" in body:
        raise bad("change the attributes and the retention in separate requests")
    if not retention:
        problem = validate_attributes(body.get("attributes"), removals=True)
        if problem:
            raise bad(problem)
        _refuse_front_end_attributes(body["attributes"])
        return {"op": "set_topic_attributes", "attributes": body["attributes"]}
    for key, v in retention.items():
        if v is not None and (not _is_int(v) or v < 1):
            raise bad(f"'{key}' must be a positive integer or null (no bound)")
    return {"op": "set_topic_retention", **retention}


def query_int(query: Any, name: str, default: int | None, lo: int, hi: int) -> int:
    """An integer query parameter in [lo, hi] (digits only: no sign, no decimals)."""
    raw = query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise bad(f"query parameter '{name}' is required")
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise bad(f"query parameter '{name}' must be a non-negative integer, got {raw!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise bad(f"query parameter '{name}' must be from {lo} to {hi}")
    return value
