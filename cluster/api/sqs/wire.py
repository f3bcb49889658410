"""The two SQS wire protocols: reading a request into an action's parameters (the JSON protocol's
shape), and writing a result or an error back.

- JSON 1.0: ``POST /``, ``X-Amz-Target: AmazonSQS.<Action>``, a JSON object; answers
  ``application/x-amz-json-1.0``.
- Query: ``Action=<Action>&...`` form-encoded (to ``/`` or a queue URL); flattened members
  (``Attribute.1.Name``, ``MessageAttribute.1.Value.StringValue``,
  ``SendMessageBatchRequestEntry.1.Id``, ...) become the JSON shape here; answers XML in the
  ``http://queue.amazonaws.com/doc/2012-11-05/`` namespace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape

import orjson
from aiohttp import web

from raftmq.cluster.api.sqs.errors import SqsError

__all__ = [
    "CREDENTIALS_PATH",
    "JSON_TYPE",
    "QUEUE_PATH",
    "QUEUE_ROUTE",
    "error_answer",
    "is_json_request",
    "json_answer",
    "query_answer",
    "query_params",
]

JSON_TYPE = "application/x-amz-json-1.0"
QUEUE_PATH = "/{account:[0-9]{12}}/{queue}"  # a queue URL's path: the query protocol posts there
QUEUE_ROUTE = "/{account}/{queue}"  # its canonical form (aiohttp's, what auth.ROUTES is keyed by)
CREDENTIALS_PATH = "/v1/sqs/credentials"  # a token's SigV4 credentials (routes.SqsHandler)
XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"

# Query names of the list and map members (flattened: Name.N, Name.N.Key ...) -> JSON member.
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
}
_ENTRIES = {
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
}
_INTS = {
    "DelaySeconds",
    "MaxNumberOfMessages",
    "VisibilityTimeout",
    "WaitTimeSeconds",
    "MaxResults",
    "MaxNumberOfMessagesPerSecond",
}
_INDEXED = re.compile(r"^([A-Za-z]+)\.([0-9]{1,3})(?:\.(.+))?\Z")
# XML element names of list members in answers (flattened, as AWS writes them).
_XML_LISTS = {
    "QueueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "queueUrls": "QueueUrl",
    "Results": "ListMessageMoveTasksResultEntry",
}


def is_json_request(request: web.Request) -> bool:
    return request.content_type.startswith("application/x-amz-json")


def _int_or_text(name: str, value: str) -> Any:
    if name in _INTS and re.fullmatch(r"-?[0-9]{1,10}", value):
        return int(value)
    return value


def _message_attributes(fields: dict[str, str]) -> dict[str, Any]:
    """``MessageAttribute.N.Name`` / ``.Value.DataType`` / ``.Value.StringValue`` / ``.Value.BinaryValue``."""
    out: dict[str, Any] = {}
    for n in sorted({k.split(".")[1] for k in fields}, key=int):
        name = fields.get(f"MessageAttribute.{n}.Name")
        if name is None:
            raise SqsError("InvalidParameterValue", f"MessageAttribute.{n}.Name is missing.")
        value = {}
        for part in ("DataType", "StringValue", "BinaryValue"):
            if f"MessageAttribute.{n}.Value.{part}" in fields:
                value[part] = fields[f"MessageAttribute.{n}.Value.{part}"]
        out[name] = value
    return out


def _members(form: Mapping[str, str], entry: bool = False) -> dict[str, Any]:
    """The JSON shape of flattened ``form`` fields; ``entry``: the fields of one batch entry, read
    one level down only (a field naming an entry again, ``...Entry.1.SendMessageBatchRequestEntry.1.``
    over and over, is an unknown field of the entry: read as entries, it recursed once per level
    until Python's stack ran out, an InternalError for any signed form)."""
    params: dict[str, Any] = {}
    lists: dict[str, dict[int, str]] = {}
    maps: dict[str, dict[int, dict[str, str]]] = {}
    message_attributes: dict[str, str] = {}
    entries: dict[str, dict[int, dict[str, str]]] = {}
    for key, value in form.items():
        match = _INDEXED.match(key)
        if match is None:
            params[key] = _int_or_text(key, value)
            continue
        name, index, rest = match.group(1), int(match.group(2)), match.group(3)
        if name in _LISTS and rest is None:
            lists.setdefault(_LISTS[name], {})[index] = value
        elif name in ("Attribute", "Tag") and rest in ("Name", "Value", "Key"):
            maps.setdefault(name, {}).setdefault(index, {})[rest] = value
        elif name == "MessageAttribute" and rest is not None:
            message_attributes[key] = value
        elif name in _ENTRIES and rest is not None and not entry:
            entries.setdefault(name, {}).setdefault(index, {})[rest] = value
        else:
            params[key] = value  # unknown: the action refuses what it does not take
    for member, items in lists.items():
        params[member] = [items[i] for i in sorted(items)]
    for name, pairs in maps.items():
        key_field = "Name" if name == "Attribute" else "Key"
        member = "Attributes" if name == "Attribute" else "tags"
        params[member] = {p.get(key_field, ""): p.get("Value", "") for _, p in sorted(pairs.items())}
    if message_attributes:
        params["MessageAttributes"] = _message_attributes(message_attributes)
    for name, by_index in entries.items():
        params[_ENTRIES[name]] = [_members(by_index[i], entry=True) for i in sorted(by_index)]
    return params


def query_params(form: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The action and its parameters of a query-protocol request (its form, or query string)."""
    action = form.get("Action")
    if not action:
        raise SqsError("MissingParameter", "The request must contain the parameter Action.")
    fields = {k: v for k, v in form.items() if k not in ("Action", "Version")}
    params = _members(fields)
    # Tag.N.Key / Tag.N.Value: CreateQueue's member is "tags" on the JSON protocol, TagQueue's "Tags".
    if action == "TagQueue" and "tags" in params:
        params["Tags"] = params.pop("tags")
    return action, params


def json_answer(result: dict[str, Any], request_id: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(result),
        content_type=JSON_TYPE,
        headers={"x-amzn-RequestId": request_id},
    )


def error_answer(e: SqsError, request_id: str, json_wire: bool) -> web.Response:
    """``e`` in the request's wire. A ``RequestTimeout`` closes the connection: the rest of its body
    is never read, and aiohttp would otherwise wait for it before the next request."""
    answer = _json_error(e, request_id) if json_wire else _query_error(e, request_id)
    if e.aws.code == "RequestTimeout":
        answer.force_close()
    return answer


def _json_error(e: SqsError, request_id: str) -> web.Response:
    side = "Sender" if e.aws.sender else "Receiver"
    return web.Response(
        body=orjson.dumps({"__type": f"com.amazonaws.sqs#{e.aws.shape}", "message": e.message}),
        status=e.aws.status,
        content_type=JSON_TYPE,
        headers={"x-amzn-query-error": f"{e.aws.code};{side}", "x-amzn-RequestId": request_id},
    )


def _xml(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return f"<{name}>{'true' if value else 'false'}</{name}>"
    if isinstance(value, list):
        item = _XML_LISTS.get(name, name)
        return "".join(_xml(item, v) for v in value)
    if isinstance(value, dict):
        if name in ("Attributes", "Tags"):  # string maps: <Attribute><Name/><Value/></Attribute>
            element, key = ("Attribute", "Name") if name == "Attributes" else ("Tag", "Key")
            return "".join(
                f"<{element}><{key}>{escape(k)}</{key}><Value>{escape(str(v))}</Value></{element}>"
                for k, v in value.items()
            )
        if name == "MessageAttributes":
            return "".join(
                f"<MessageAttribute><Name>{escape(k)}</Name><Value>{_inner(v)}</Value></MessageAttribute>"
                for k, v in value.items()
            )
        return f"<{name}>{_inner(value)}</{name}>"
    return f"<{name}>{escape(str(value))}</{name}>"


def _inner(value: dict[str, Any]) -> str:
    return "".join(_xml(k, v) for k, v in value.items())


def query_answer(action: str, result: dict[str, Any], request_id: str) -> web.Response:
    if action.endswith("Batch"):  # <SendMessageBatchResultEntry> ... as AWS names them
        entry = action + "ResultEntry"
        result = {**result}
        successful = result.pop("Successful", [])
        body = "".join(_xml(entry, e) for e in successful) + _inner(result)
    else:
        body = _inner(result)
    xml = (
        f'<?xml version="1.0"?><{action}Response xmlns="{XMLNS}"><{action}Result>{body}</{action}Result>'
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
    )
    return web.Response(body=xml.encode(), content_type="text/xml")


def _query_error(e: SqsError, request_id: str) -> web.Response:
    side = "Sender" if e.aws.sender else "Receiver"
    xml = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error><Type>{side}</Type>'
        f"<Code>{escape(e.aws.code)}</Code><Message>{escape(e.message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return web.Response(body=xml.encode(), status=e.aws.status, content_type="text/xml")
