"""SQS message bodies and message attributes: checks, how they are kept in a raftmq message, and
the MD5 digests AWS computes (boto3 checks ``MD5OfMessageBody`` and ``MD5OfMessageAttributes``).

A message is stored as a raftmq message whose value is the body (UTF-8) and whose headers carry
``sqs-id`` (the MessageId, a UUID) and, when it has any, ``sqs-attributes``: the message attributes
as JSON ``{name: [data type, value]}`` (a Binary value in base64); a FIFO queue's message also
``sqs-dedup-id`` (its MessageDeduplicationId), a dead letter ``sqs-dead-letter-source`` (the queue
a RedrivePolicy moved it from). A message moved to another queue keeps what :func:`moved_headers`
keeps.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
from typing import Any

import orjson

from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.commands import MAX_NAME_BYTES

__all__ = [
    "ATTRIBUTES_HEADER",
    "DEDUP_HEADER",
    "ID_HEADER",
    "MAX_MESSAGE_ATTRIBUTES",
    "SOURCE_HEADER",
    "attributes_from_header",
    "attributes_md5",
    "attributes_size",
    "body_md5",
    "check_body",
    "message_ids",
    "moved_fifo",
    "moved_headers",
    "parse_message_attributes",
    "stored_attributes",
]

ID_HEADER = "sqs-id"
ATTRIBUTES_HEADER = "sqs-attributes"
DEDUP_HEADER = "sqs-dedup-id"  # a FIFO message's MessageDeduplicationId (given or content-based)
SOURCE_HEADER = "sqs-dead-letter-source"  # on a message a RedrivePolicy moved: its source queue
MAX_MESSAGE_ATTRIBUTES = 10
_NAME = re.compile(r"^(?!aws\.|amazon\.)(?!\.)(?!.*\.\.)(?!.*\.$)[A-Za-z0-9_.-]{1,256}\Z", re.IGNORECASE)
_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\s]{1,250})?\Z")
# What AWS accepts in a body or a String value: #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
# #x10000-#x10FFFF (the XML 1.0 characters).
_NOT_XML_CHAR = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_U32 = struct.Struct(">I")


def check_body(body: Any, where: str = "MessageBody") -> str:
    """The body if it is 1 or more characters AWS allows, else :class:`SqsError`."""
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", f"The request must contain the parameter {where}.")
    if _NOT_XML_CHAR.search(body):
        raise SqsError("InvalidMessageContents", "Invalid characters found in the message body.")
    return body


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"{where} must be a string.")
    return value


def parse_message_attributes(raw: Any) -> dict[str, tuple[str, str | bytes]]:
    """``MessageAttributes`` (``{name: {"DataType", "StringValue" | "BinaryValue"}}``, a Binary
    value in base64) checked as AWS does: ``{name: (data type, str or bytes)}``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be a map.")
    if len(raw) > MAX_MESSAGE_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(raw)}] exceeds the allowed maximum "
            f"[{MAX_MESSAGE_ATTRIBUTES}].",
        )
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise SqsError("InvalidParameterValue", f"Message attribute name '{name}' is invalid.")
        if not isinstance(value, dict):
            raise SqsError("InvalidParameterValue", f"Message attribute '{name}' must be a structure.")
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not _DATA_TYPE.match(data_type):
            raise SqsError(
                "InvalidParameterValue",
                f"The message attribute '{name}' has an invalid message attribute type.",
            )
        if value.get("StringListValues") or value.get("BinaryListValues"):
            raise SqsError(
                "InvalidParameterValue", "StringListValues and BinaryListValues are not implemented."
            )
        if data_type.startswith("Binary"):
            encoded = _text(value.get("BinaryValue"), f"Message attribute '{name}' BinaryValue")
            try:
                data: str | bytes = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise SqsError(
                    "InvalidParameterValue", f"Message attribute '{name}' is not base64."
                ) from None
        else:
            data = _text(value.get("StringValue"), f"Message attribute '{name}' StringValue")
            if _NOT_XML_CHAR.search(data):
                raise SqsError("InvalidParameterValue", f"Message attribute '{name}' has invalid characters.")
            if data_type.startswith("Number") and not re.fullmatch(
                r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", data
            ):
                raise SqsError("InvalidParameterValue", f"Message attribute '{name}' is not a number.")
        if not data:
            raise SqsError(
                "InvalidParameterValue", f"Message attribute '{name}' must contain a non-empty value."
            )
        out[name] = (data_type, data)
    return out


def attributes_size(attributes: dict[str, tuple[str, str | bytes]]) -> int:
    """Bytes the attributes count toward the message size, as AWS counts them (name, type, value)."""
    total = 0
    for name, (data_type, value) in attributes.items():
        total += len(name.encode()) + len(data_type.encode())
        total += len(value) if isinstance(value, bytes) else len(value.encode())
    return total


def stored_attributes(attributes: dict[str, tuple[str, str | bytes]]) -> str:
    """The ``sqs-attributes`` header of these attributes."""
    return orjson.dumps(
        {
            n: [t, base64.b64encode(v).decode() if isinstance(v, bytes) else v]
            for n, (t, v) in attributes.items()
        }
    ).decode()


def attributes_from_header(header: str | None) -> dict[str, tuple[str, str | bytes]]:
    """The attributes kept in an ``sqs-attributes`` header (none when absent or not ours). Any
    producer over REST can write the header: an entry that SendMessage could not have stored (a
    name or data type it refuses, a value that is not a string, a Binary value that is not
    base64) is left out, so a forged one cannot fail the receives that render it."""
    if not header:
        return {}
    try:
        raw = orjson.loads(header)
    except orjson.JSONDecodeError:
        return {}  # a header a raftmq producer wrote: not SQS attributes
    if not isinstance(raw, dict):
        return {}
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, entry in raw.items():
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            continue
        data_type, value = entry
        if not _DATA_TYPE.match(data_type):
            continue
        if data_type.startswith("Binary"):
            try:
                out[name] = (data_type, base64.b64decode(value, validate=True))
            except (ValueError, binascii.Error):
                continue
        else:
            out[name] = (data_type, value)
    return out


def message_ids(n: int) -> list[str]:
    """``n`` random (version 4) UUIDs in their text form, for MessageIds and RequestIds: one read
    of the system's random source for them all (``uuid.uuid4`` reads it once per UUID and builds
    an object; on the send path of 10 messages a call that was 2-3 % of a node's busy time)."""
    raw = bytearray(os.urandom(16 * n))
    out = []
    for i in range(0, 16 * n, 16):
        raw[i + 6] = (raw[i + 6] & 0x0F) | 0x40  # version 4
        raw[i + 8] = (raw[i + 8] & 0x3F) | 0x80  # the RFC 4122 variant
        h = raw[i : i + 16].hex()
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


def body_md5(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def attributes_md5(attributes: dict[str, tuple[str, str | bytes]]) -> str:
    """AWS's MD5OfMessageAttributes: for each attribute by name, the name, the data type (each a
    4-byte big-endian length and UTF-8 bytes), a transport byte (1 String/Number, 2 Binary) and
    the value (length-prefixed)."""
    md5 = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        data_type, value = attributes[name]
        for text in (name, data_type):
            encoded = text.encode()
            md5.update(_U32.pack(len(encoded)) + encoded)
        data = value if isinstance(value, bytes) else value.encode()
        md5.update(b"\x02" if isinstance(value, bytes) else b"\x01")
        md5.update(_U32.pack(len(data)) + data)
    return md5.hexdigest()


def moved_headers(m: dict[str, Any], fifo: bool) -> dict[str, str]:
    """The headers a message ``m`` (as ``take`` handed it out) keeps when it is moved to another
    queue (a dead-letter move, a move task): its MessageId and message attributes, and on FIFO
    queues its MessageDeduplicationId (a message produced there through the REST API has none:
    its MessageId stands in). A MessageId a REST producer wrote itself (``sqs-id`` is no reserved
    header) that is no 1..MAX_NAME_BYTES name is replaced by the message's place: ``dedup_produce``
    would refuse every move of it, and a FIFO group would wait behind it forever."""
    kept = (ID_HEADER, ATTRIBUTES_HEADER, DEDUP_HEADER) if fifo else (ID_HEADER, ATTRIBUTES_HEADER)
    headers = {k: v for k, v in (m.get("headers") or {}).items() if k in kept}
    if not 1 <= len(headers.get(ID_HEADER, "").encode("utf-8")) <= MAX_NAME_BYTES:
        headers[ID_HEADER] = f"{m['queue']}-{m['offset']}"
    if fifo:
        headers.setdefault(DEDUP_HEADER, headers[ID_HEADER])
    return headers


def moved_fifo(
    m: dict[str, Any], topic_id: int, headers: dict[str, str], retention_ms: int
) -> dict[str, Any]:
    """A FIFO message ``m`` of topic ``topic_id`` (as ``take`` handed it out) as ``dedup_produce``
    appends it to another FIFO queue: in its message group (its key), with ``headers``
    (:func:`moved_headers`). Its deduplication key names the place it is moved from (topic id,
    queue, offset), never its MessageDeduplicationId: a move repeated after a failed delete is
    stored once within the window, and no client's send of the same id makes a move a duplicate
    (nor a move a client's send)."""
    moved: dict[str, Any] = {
        "headers": headers,
        "ttl_ms": retention_ms,
        "dedup": f"m:{topic_id}.{m['queue']}.{m['offset']}",
        "id": headers[ID_HEADER],
    }
    if "value" in m:
        moved["value"] = m["value"]
    else:
        moved["value_b64"] = m["value_b64"]
    if m.get("key") is not None:
        moved["key"] = m["key"]
    return moved
