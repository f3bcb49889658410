"""Rolling upgrades of the produce path: a binary batch proposed as a JSON ``produce`` command.

A queue group's log must be readable by every voter. Until each voter of a group advertises that
it reads format v2 (``batch_formats`` in its status, docs/format.md), the leader turns accepted
binary batches into today's JSON command: per-message work, during the upgrade only. The JSON
command keeps what the batch says: values (text or binary), keys, headers, the producer's id and
sequence (idempotence), a delay as ``deliver_at_ms`` (``now_ms`` + delay, the same instant the
binary command gives) and a TTL (which counts from when the message becomes deliverable in both).
"""

from __future__ import annotations

import base64
from typing import Any

from raftmq import batch as rb

__all__ = ["BATCH_FORMATS", "to_json_batch"]

BATCH_FORMATS = (1, 2)
"""The record-batch formats this version reads (its status advertises them to peers)."""


def to_json_batch(now_ms: int, topic_id: int, queue: int, data: bytes | memoryview) -> dict[str, Any]:
    """The JSON ``produce`` batch (``cluster/commands/__init__.py``) equal to the v2 batch ``data``
    appended at ``now_ms``."""
    view = rb.read(data)
    messages: list[dict[str, Any]] = []
    for r in view.records():
        m: dict[str, Any] = (
            {"value_b64": base64.b64encode(r.value).decode()}
            if r.binary
            else {"value": r.value.decode("utf-8")}
        )
        if r.key is not None:
            m["key"] = r.key
        if r.headers:
            m["headers"] = r.headers
        if r.delay_ms:
            m["deliver_at_ms"] = now_ms + r.delay_ms
        if r.ttl_ms:
            m["ttl_ms"] = r.ttl_ms
        messages.append(m)
    out: dict[str, Any] = {"topic_id": topic_id, "queue": queue, "messages": messages}
    if view.producer_id is not None:
        out["producer_id"], out["sequence"] = view.producer_id, view.base_sequence
    return out
