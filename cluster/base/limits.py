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
    "MAX_RECEIPTS",
    "MAX_RECEIVE",
    "MAX_TICK_ITEMS",
    "MAX_TIME_MS",
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
DEFAULT_MAX_MEMBERS_PER_TOKEN = 256
"""Consumer-group members one API token may have at once, over all groups (below the per-topic
cap, so one token cannot take every member slot of a topic)."""
DEFAULT_MAX_MEMBERS_PER_TOPIC = 1024
"""Consumer-group members subscribed to one topic at once, over all groups (as many as a topic may
have queues)."""

DEFAULT_BACKOFF_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
"""RocketMQ's retry levels from 10 s on: attempt ``n`` failed -> due ``DEFAULT_BACKOFF_MS[n - 1]``
later (the last level repeats)."""
