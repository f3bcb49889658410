"""The ``dedup_produce`` command: messages appended to one queue unless their deduplication id was
seen within the window (``cluster/machines/dedup.py``; the SQS API's FIFO queues send with it).

Wire shape (``cluster/commands/__init__.py``)::

    {"op": "dedup_produce", "now_ms": time, "topic_id": u32, "queue": u32, "messages": [
        {"value": str} | {"value_b64": str}, "key"?: str, "headers"?: {str: str},
         "ttl_ms"?: duration, "dedup": str (1..MAX_DEDUP_BYTES UTF-8 bytes),
         "id": str (1..MAX_NAME_BYTES)] (1..MAX_DEDUP_MESSAGES)}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from raftmq.cluster.commands.fields import _bad, _fields, _list, _name, _uint
from raftmq.cluster.commands.produce import _message
from raftmq.cluster.commands.shapes import MAX_TIME_MS, VERSION, DedupMessage, DedupProduceCommand
from raftmq.storage.keys import MAX_U32

__all__ = [
    "MAX_DEDUP_BYTES",
    "MAX_DEDUP_MESSAGES",
    "DedupMessage",
    "DedupProduceCommand",
    "decode_dedup_produce",
    "dedup_produce",
]

MAX_DEDUP_BYTES = 512  # an SQS scope key: a message group (128) and a deduplication id (128)
MAX_DEDUP_MESSAGES = 100  # an SQS batch sends 10


def dedup_produce(now_ms: int, topic_id: int, queue: int, messages: Sequence[dict[str, Any]]) -> bytes:
    """Append ``messages`` (each a produce message with ``dedup`` and ``id``) to one queue, those
    whose ``dedup`` the queue's window does not hold."""
    return orjson.dumps(
        {
            "v": VERSION,
            "op": "dedup_produce",
            "now_ms": now_ms,
            "topic_id": topic_id,
            "queue": queue,
            "messages": list(messages),
        }
    )


def decode_dedup_produce(obj: dict[str, Any]) -> DedupProduceCommand:
    _fields(obj, "command", {"v", "op", "now_ms", "topic_id", "queue", "messages"})
    now_ms = _uint(obj, "now_ms", MAX_TIME_MS, "")
    raw = _list(obj, "messages", "")
    if len(raw) > MAX_DEDUP_MESSAGES:
        raise _bad(f"messages: at most {MAX_DEDUP_MESSAGES}")
    messages: list[DedupMessage] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if type(m) is not dict:
            raise _bad(f"{where}: expected an object")
        dedup = m.get("dedup")
        if type(dedup) is not str or not 1 <= len(dedup.encode("utf-8")) <= MAX_DEDUP_BYTES:
            raise _bad(f"{where}.dedup: expected a string of 1..{MAX_DEDUP_BYTES} UTF-8 bytes")
        message_id = _name(m, "id", f"{where}.")
        rest = {k: v for k, v in m.items() if k not in ("dedup", "id")}
        if "deliver_at_ms" in rest:
            raise _bad(f"{where}: a deduplicated message cannot be delayed")
        message, _ = _message(rest, where, now_ms)
        messages.append(DedupMessage(message, dedup.encode("utf-8"), message_id))
    return {
        "v": VERSION,
        "op": "dedup_produce",
        "now_ms": now_ms,
        "topic_id": _uint(obj, "topic_id", MAX_U32, ""),
        "queue": _uint(obj, "queue", MAX_U32, ""),
        "messages": messages,
    }
