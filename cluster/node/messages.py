"""A stored message as fetch, receive and the dead-letter list hand it out, and reading the
messages a receive handed out. The leader's receive action (``delivery_actions.py``) answers its
peers in this form, and the API answers clients in it."""

from __future__ import annotations

import base64
from typing import Any

from raftmq.storage.queues import OffsetOutOfRange, read_messages
from raftmq.storage.records import Message
from raftmq.storage.store import Store

__all__ = ["message_item", "read_offsets"]


def message_item(item: dict[str, Any], m: Message) -> dict[str, Any]:
    """``item`` (the route's own fields first) with the message as fetch, receive and the
    dead-letter list hand it out: offset, key, timestamp_ms, headers, then value (UTF-8 text) or
    value_b64 (binary). Returns ``item``."""
    item["offset"] = m.offset
    item["key"] = m.key
    item["timestamp_ms"] = m.timestamp_ms
    item["headers"] = m.headers or {}
    if m.binary:
        item["value_b64"] = base64.b64encode(m.value).decode()
    else:
        item["value"] = m.value.decode()
    return item


def read_offsets(store: Store, topic_id: int, queue: int, offsets: list[int]) -> dict[int, Message]:
    """The messages at ``offsets`` of one queue, reading runs of consecutive offsets together."""
    found: dict[int, Message] = {}
    ordered = sorted(set(offsets))
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        try:
            count = end - start + 1
            for m in read_messages(store, topic_id, queue, ordered[start], count, first_chunk=1):
                found[m.offset] = m
        except OffsetOutOfRange:
            pass  # retention removed it after it was handed out; it will expire and be finished
        start = end + 1
    return found
