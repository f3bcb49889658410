"""The key ranges a removal freed (``Applied.freed``), for the node to compact: a dropped topic's
ranges, and those of a ``retain`` as its queues stand now (applied before: a replay's skipped
entry). Pure: reads the store, writes nothing."""

from __future__ import annotations

from raftmq.cluster import commands
from raftmq.cluster.commands import BadCommand
from raftmq.cluster.commands.append import is_append
from raftmq.storage import keys, queues
from raftmq.storage.store import Store

__all__ = ["freed_before", "topic_ranges"]

Ranges = tuple[tuple[bytes, bytes], ...]


def topic_ranges(topic_id: int) -> Ranges:
    """Every key range of topic ``topic_id`` (one per topic prefix: what ``drop_topic`` deletes)."""
    return tuple(keys.topic_range(prefix, topic_id) for prefix in keys.TOPIC_PREFIXES)


def freed_before(store: Store, command: bytes) -> Ranges:
    """The ranges a ``drop_topic`` or ``retain`` applied before removed, as they stand now: the
    dropped topic's ranges, each retained queue's records below its low offset. Nothing for any
    other command; the bytes are searched before anything is decoded, so replaying a journal of
    produces costs a substring search per entry."""
    if is_append(command) or (b"drop_topic" not in command and b"retain" not in command):
        return ()
    try:
        cmd = commands.decode(command)
    except BadCommand:
        return ()
    if cmd["op"] == "drop_topic":
        return topic_ranges(cmd["topic_id"])
    if cmd["op"] != "retain":
        return ()
    freed = []
    for entry in cmd["queues"]:
        topic_id, queue = entry["topic_id"], entry["queue"]
        meta = queues.queue_meta(store, topic_id, queue)
        if meta is not None and meta.low_offset > 0:
            start, _ = keys.queue_range(keys.RECORD, topic_id, queue)
            freed.append((start, keys.record_key(topic_id, queue, meta.low_offset)))
    return tuple(freed)
