"""Limits every room shares: the bounds of names, times and counts a command may carry, and the
default retry levels. Here, below both, so the cluster file (``config/``) and the commands
(``commands/``) read the same numbers instead of copies."""

from __future__ import annotations

__all__ = [
    "DEFAULT_BACKOFF_MS",
    "DEFAULT_MAX_MEMBERS_PER_TOKEN",
    "DEFAULT_MAX_MEMBERS_PER_TOPIC",
    "MAX_BACKOFF_LEVELS",
    "MAX_DURATION_MS",
    "MAX_NAME_BYTES",
    "MAX_PRODUCER_STATES",
    "MAX_RECEIPTS",
    "MAX_RECEIVE",
    "MAX_REQUEST_BYTES_CEILING",
    "MAX_TICK_ITEMS",
    "MAX_TIME_MS",
    "MAX_TOPICS_PER_ENTRY",
    "RAFT_MAX_FRAME_BYTES",
]

MAX_NAME_BYTES = 255
"""Longest ``producer_id``, consumer ``group`` or ``consumer``, in UTF-8 bytes."""
MAX_TIME_MS = 2**62
"""Largest point in time (ms since the epoch) a command may carry: sums with durations fit u64."""
MAX_DURATION_MS = 2**40
"""Largest duration (ms; about 35 years) a command may carry."""
MAX_RECEIVE = 10_000
"""Most messages one ``receive`` or ``redrive`` hands out (per queue for redrive)."""
MAX_RECEIPTS = 10_000
"""Most receipts in one ``ack``, ``nack`` or ``extend``."""
MAX_TICK_ITEMS = 100_000
"""Largest ``max`` of a ``deliver_tick``."""
MAX_BACKOFF_LEVELS = 64
MAX_PRODUCER_STATES = 10_000_000
"""Largest ``limits.max_producer_states`` (an ``expire_producers``' ``max_states``)."""
MAX_TOPICS_PER_ENTRY = 10_000
"""Most topics one ``create_topics`` entry creates (``limits.max_topics_per_request`` is at most
this)."""
DEFAULT_MAX_MEMBERS_PER_TOKEN = 256
"""Consumer-group members one API token may have at once, over all groups (below the per-topic
cap, so one token cannot take every member slot of a topic)."""
DEFAULT_MAX_MEMBERS_PER_TOPIC = 1024
"""Consumer-group members subscribed to one topic at once, over all groups (as many as a topic may
have queues)."""

RAFT_MAX_FRAME_BYTES = 256 << 20
"""Longest Raft frame a node sends or accepts: a longer length prefix is garbage to the receiver,
which drops the connection (``replication/wire.py``)."""
MAX_REQUEST_BYTES_CEILING = 32 << 20
"""Largest ``limits.max_request_bytes`` a node starts with, so that no Raft message it sends is
longer than :data:`RAFT_MAX_FRAME_BYTES`. An entry is at most a request plus 64 KiB; a leader sends a
follower that is behind entries in one message until they add up to twice that, plus one more
entry (pysyncobj's batching), each with some 20 bytes of pickle around it. At 32 MiB that is at
most about 96 MiB of entries, under 160 MiB with the overhead of entries as small as 32 bytes: well
inside the frame limit. Above about 85 MiB a follower behind by a few large entries would hang up
on every append."""

DEFAULT_BACKOFF_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
"""RocketMQ's retry levels from 10 s on: attempt ``n`` failed -> due ``DEFAULT_BACKOFF_MS[n - 1]``
later (the last level repeats)."""
