"""Read-only views of one queue group's store: queue bounds and consumer progress.

The metrics collector (``cluster/api/metrics.py``) and the consumer-group API
(``cluster/api/handlers/consumers.py``) read them from the replica that leads the group. They
cost a few small range scans: one key per queue (``Q``), per committed offset (``O``), per
subscription (``U``) and per pending delivery (``I``, ``Y``); record batches are never read, so the
cost does not grow with the messages stored. :func:`delayed_messages` (the SQS API's
ApproximateNumberOfMessagesDelayed) is the exception: it reads the group's due-time index, bounded.

Any thread may call them (the store takes one writer and many readers); a store being swapped for
a restored checkpoint raises ``StoreError``, which callers treat as "no figures this time".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

from raftmq.storage import keys
from raftmq.storage.keys import QueueMeta
from raftmq.storage.queues import redrive_offset, scan_prefix
from raftmq.storage.store import Store

__all__ = [
    "DELAYED_SCAN_MAX",
    "ConsumerQueue",
    "consumer_queues",
    "delayed_by_topic",
    "delayed_messages",
    "queue_metas",
]

DELAYED_SCAN_MAX = 50_000
"""Delayed messages :func:`delayed_messages` reads at most (of every topic of the group): about a
quarter of a second of one core; the figure is then a lower bound."""

_QUEUE = struct.Struct(">II")  # topic_id, queue after the prefix byte


@dataclass(frozen=True, slots=True)
class ConsumerQueue:
    """The progress of one consumer group on one queue, as the group's store has it.

    Attributes:
        committed_offset: The committed offset (for receive/ack: the floor), None if never set.
        high_offset: The queue's next offset to be written.
        lag: Messages the group has not finished: ``high_offset - committed_offset`` (from
            ``low_offset`` when nothing was committed), never below 0.
        in_flight: Messages handed out (by ``receive`` or a push stream) and not yet acked, nacked
            or expired: counted by their state in the store, so one whose deadline has passed
            counts until the leader's ``deliver_tick`` expires it (within ``delivery.tick_ms``).
        retrying: Messages waiting for a retry (nacked or expired, not yet due again).
        dead_letters: Messages in this queue of the group's dead-letter topic not redriven yet.
    """

    topic_id: int
    queue: int
    group: str
    committed_offset: int | None
    high_offset: int
    lag: int
    in_flight: int = 0
    retrying: int = 0
    dead_letters: int = 0


def _prefix(prefix: bytes, topic_id: int | None) -> bytes:
    return prefix if topic_id is None else prefix + struct.pack(">I", topic_id)


def queue_metas(store: Store, topic_id: int | None = None) -> dict[tuple[int, int], QueueMeta]:
    """``(topic_id, queue) -> QueueMeta`` of every queue in the store (or of one topic)."""
    out = {}
    for key, value in scan_prefix(store, _prefix(keys.META, topic_id)):
        out[_QUEUE.unpack_from(key, 1)] = QueueMeta.decode(value)
    return out


def _group_after(key: bytes, at: int) -> tuple[str, int]:
    """A length-prefixed group name at ``key[at:]`` and the index after it."""
    size = key[at]
    return key[at + 1 : at + 1 + size].decode("utf-8"), at + 1 + size


def consumer_queues(store: Store, topic_id: int | None = None) -> list[ConsumerQueue]:
    """Every (topic, queue, consumer group) with a committed offset or receive/ack state, sorted
    (of one topic, or of every topic: then the cost grows with the groups, not the queues).

    A group known on some queue of a topic gets a row for every queue of that topic in this
    store, so a queue it has not reached yet shows its whole backlog as lag. A receive/ack group is
    known by its subscription, stored in every queue group of the topic at its first receive, with
    or without a dead-letter topic: before it received from this queue group, all is lag here.
    """
    committed: dict[tuple[int, int, str], int] = {}
    for key, value in scan_prefix(store, _prefix(keys.OFFSET, topic_id)):
        t, q = _QUEUE.unpack_from(key, 1)
        committed[(t, q, key[9:].decode("utf-8"))] = keys.decode_u64(value)
    in_flight: dict[tuple[int, int, str], int] = {}
    retrying: dict[tuple[int, int, str], int] = {}
    for key, value in scan_prefix(store, _prefix(keys.PENDING, topic_id)):
        t, q = _QUEUE.unpack_from(key, 1)
        sub = (t, q, _group_after(key, 9)[0])
        counts = in_flight if value[:1] == bytes([keys.STATE_INFLIGHT]) else retrying
        counts[sub] = counts.get(sub, 0) + 1
    cursors: set[tuple[int, int, str]] = set()
    for key, _ in scan_prefix(store, _prefix(keys.SUB_CURSOR, topic_id)):
        t, q = _QUEUE.unpack_from(key, 1)
        cursors.add((t, q, _group_after(key, 9)[0]))
    subscribed: set[tuple[int, str]] = set()
    dlq_ids: dict[tuple[int, str], int] = {}
    for key, value in scan_prefix(store, _prefix(keys.SUBSCRIPTION, topic_id)):
        (t,) = struct.unpack_from(">I", key, 1)
        sub_key = (t, _group_after(key, 5)[0])
        subscribed.add(sub_key)
        stored = orjson.loads(value)
        dlq_id = stored.get("dlq_topic_id")
        # Only a link checked against the dead-letter topic's record counts (an older release's
        # link, found by name, could name another topic's; the leader checks it at the next refresh).
        if dlq_id is not None and stored.get("dlq_checked"):
            dlq_ids[sub_key] = int(dlq_id)
    groups = {(t, g) for t, _, g in (*committed, *in_flight, *retrying, *cursors)} | subscribed
    # The queues of the topics with a group only: a store's other queues cost nothing here.
    metas: dict[tuple[int, int], QueueMeta] = {}
    for t in {t for t, _ in groups}:
        metas.update(queue_metas(store, t))
    queues_of: dict[tuple[int, str | None], set[int]] = {}  # (topic, None): its queues here
    for mt, q in metas:
        queues_of.setdefault((mt, None), set()).add(q)
    for ct, q, cg in committed:
        queues_of.setdefault((ct, cg), set()).add(q)
    rows = []
    for t, g in sorted(groups):
        queues = queues_of.get((t, None), set()) | queues_of.get((t, g), set())
        for q in sorted(queues):
            meta = metas.get((t, q), QueueMeta())
            done = committed.get((t, q, g))
            lag = meta.high_offset - (meta.low_offset if done is None else done)
            rows.append(
                ConsumerQueue(
                    topic_id=t,
                    queue=q,
                    group=g,
                    committed_offset=done,
                    high_offset=meta.high_offset,
                    lag=max(0, lag),
                    in_flight=in_flight.get((t, q, g), 0),
                    retrying=retrying.get((t, q, g), 0),
                    dead_letters=_dead_letters(store, dlq_ids.get((t, g)), q),
                )
            )
    return rows


def _dead_letters(store: Store, dlq_topic_id: int | None, queue: int) -> int:
    """Messages of dead-letter queue ``(dlq_topic_id, queue)`` after its redrive offset. Queue q of a
    dead-letter topic lives in the same queue group as queue q of its source (docs/delivery.md)."""
    if dlq_topic_id is None:
        return 0
    data = store.get(keys.meta_key(dlq_topic_id, queue))
    if data is None:
        return 0
    meta = QueueMeta.decode(data)
    start = max(meta.low_offset, redrive_offset(store, dlq_topic_id, queue) or 0)
    return max(0, meta.high_offset - start)


def delayed_messages(
    store: Store, topic_id: int, max_keys: int = DELAYED_SCAN_MAX
) -> tuple[dict[int, int], bool]:
    """``({queue: n}, complete)``: the delayed messages of ``topic_id`` in this store (produced
    with a delay, not released yet: they have no offset, so no lag counts them), per queue; see
    :func:`delayed_by_topic`."""
    counts, complete = delayed_by_topic(store, max_keys)
    return counts.get(topic_id, {}), complete


def delayed_by_topic(
    store: Store, max_keys: int = DELAYED_SCAN_MAX
) -> tuple[dict[int, dict[int, int]], bool]:
    """``({topic_id: {queue: n}}, complete)``: the delayed messages of every topic in this store.

    The due-time index is ordered by due time, not by topic, so this reads the whole group's
    index: at most ``max_keys`` entries, those due first; ``complete`` is False when there were
    more (the counts are then those due first). Unlike the views above, its cost grows with the
    delayed messages stored (every topic's), which is why it is a function of its own."""
    counts: dict[int, dict[int, int]] = {}
    for seen, (key, _) in enumerate(scan_prefix(store, keys.DELAYED, limit=max_keys + 1)):
        if seen == max_keys:
            return counts, False
        _, t, q = keys.decode_delayed_key(key)
        topic = counts.setdefault(t, {})
        topic[q] = topic.get(q, 0) + 1
    return counts, True
