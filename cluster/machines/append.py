"""Applying produced messages: the binary ``append`` command (``cluster/commands/append.py``),
producers' v2 record batches stored as they came with the leader's fields stamped in, and the
JSON ``produce`` command of earlier releases' logs, through the same steps (:func:`apply_append`).

Per batch the work is a constant number of Python steps: the producer's sequence check, one
:func:`raftmq.batch.stamp` (32 bytes and their CRC; the records and the batch CRC are untouched),
one store put and the queue's new bounds. Only a batch holding delayed records costs per-record
work: its delayed records go to the due-time index (``delivery.store_delayed``, as JSON produce's),
and the others are rebuilt into a batch of their own (deterministically: every replica stores the
same bytes). A TTL needs no work: it stays in the batch and readers count it from the append time
(``storage/records.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raftmq import batch as rb
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused, error_body
from raftmq.cluster.commands import AppendBatch, AppendCommand, ProduceBatch, ProduceCommand
from raftmq.cluster.machines import delivery
from raftmq.cluster.machines.apply import Apply
from raftmq.storage import keys
from raftmq.storage.keys import ProducerState, QueueMeta
from raftmq.storage.records import NewMessage, encode_batch

__all__ = ["append_messages", "apply_append", "check_sequence", "stale_message"]


def check_sequence(
    work: Apply, topic_id: int, queue: int, producer_id: str | None, sequence: int | None
) -> tuple[ProducerState, dict[str, Any] | None]:
    """The producer's state, and the answer when the batch must not be stored: the original
    offsets of a remembered ``(producer_id, sequence)`` (``duplicate``) or ``stale_sequence``."""
    if producer_id is None or sequence is None:
        return ProducerState(), None
    state = work.producer(topic_id, queue, producer_id)
    original = state.find(sequence)
    if original is not None:
        base_offset, count = original
        return state, {
            "topic_id": topic_id,
            "queue": queue,
            "base_offset": base_offset,
            "count": count,
            "duplicate": True,
        }
    if state.is_stale(sequence):
        # A command can be applied long after its request gave up (queued while the group had no
        # leader, or stuck in a partitioned connection): by then the producer may have retried it
        # and sent newer batches that pushed it out of the remembered window. Sequences only grow
        # per (producer, queue).
        return state, error_body(errors.STALE_SEQUENCE, stale_message(producer_id, sequence, state))
    return state, None


def stale_message(producer_id: str, sequence: int, state: ProducerState) -> str:
    newest = max(seq for seq, _, _ in state.entries)
    return (
        f"sequence {sequence} of producer {producer_id!r} is older than its newest on this queue "
        f"({newest}) and no longer remembered: nothing was stored (a late retry, or a reused producer_id)"
    )


def apply_append(work: Apply, cmd: AppendCommand | ProduceCommand, max_entry_messages: int) -> dict[str, Any]:
    """Append each batch at its queue's ``high_offset``: the one apply of produced messages, for
    the binary ``append`` and the JSON ``produce`` a log of an earlier release (or a leader during
    a rolling upgrade, ``cluster/replication/upgrade.py``) holds.

    Returns ``{"results": [r, ...]}``, one per batch, ``r`` being ``{"topic_id", "queue",
    "base_offset", "count"}`` (+ ``"duplicate": true`` with the original offsets for a remembered
    ``(producer_id, sequence)``, nothing stored; + ``"delayed": n``: ``base_offset``/``count`` then
    cover the undelayed records, in order) or an error body (``topic_not_found`` for a dropped
    topic, ``stale_sequence``).

    Raises:
        Refused: more than ``max_entry_messages`` messages in the entry (nothing is applied).
    """
    batches: Sequence[AppendBatch | ProduceBatch] = cmd["batches"]
    total = sum(_count(b) for b in batches)
    if total > max_entry_messages:
        raise Refused(errors.REQUEST_TOO_LARGE, f"{total} messages exceed the limit of {max_entry_messages}")
    results, first = [], 0
    for b in batches:
        results.append(_append_one(work, cmd["now_ms"], b, first))
        first += _count(b)
    return {"results": results}


def append_messages(
    work: Apply, now_ms: int, topic_id: int, queue: int, messages: list[NewMessage]
) -> dict[str, Any]:
    """Append ``messages`` (none delayed, no producer) to a queue as one record batch, through the
    steps of a JSON ``produce`` batch: its result (``base_offset``, ``count``) or an error body."""
    batch: ProduceBatch = {
        "topic_id": topic_id,
        "queue": queue,
        "producer_id": None,
        "sequence": None,
        "messages": messages,
        "deliver_at_ms": None,
    }
    return _append_one(work, now_ms, batch, 0)


def _count(b: AppendBatch | ProduceBatch) -> int:
    return b.view.count if isinstance(b, AppendBatch) else len(b["messages"])


def _append_one(work: Apply, now_ms: int, b: AppendBatch | ProduceBatch, first: int) -> dict[str, Any]:
    """The steps of one batch; only :func:`_stored` (what bytes the batch becomes) depends on the
    wire the batch came in."""
    if isinstance(b, AppendBatch):
        topic_id, queue = b.topic_id, b.queue
        producer_id = b.view.producer_id
        sequence = b.view.base_sequence if producer_id is not None else None
    else:
        topic_id, queue, producer_id, sequence = b["topic_id"], b["queue"], b["producer_id"], b["sequence"]
    if work.is_dropped(topic_id):
        return error_body(errors.TOPIC_NOT_FOUND, f"topic {topic_id} was dropped")
    state, answer = check_sequence(work, topic_id, queue, producer_id, sequence)
    if answer is not None:
        return answer
    meta = work.meta(topic_id, queue)
    base_offset = meta.high_offset
    value, count, delayed = _stored(work, now_ms, b, first, base_offset)
    if value is not None:
        work.batch.put(keys.record_key(topic_id, queue, base_offset), value)
        high = base_offset + count
        if work.appended is not None:
            work.appended.setdefault((topic_id, queue), []).append((base_offset, high, bytes(value), now_ms))
        work.set_meta(topic_id, queue, QueueMeta(meta.low_offset, high, meta.retained_bytes + len(value)))
        work.grown[(topic_id, queue)] = high
    if producer_id is not None and sequence is not None:
        timed_ms = now_ms if work.producers_timed() else None
        work.set_producer(topic_id, queue, producer_id, state.add(sequence, base_offset, count, timed_ms))
    result = {"topic_id": topic_id, "queue": queue, "base_offset": base_offset, "count": count}
    return {**result, "delayed": delayed} if delayed else result


def _stored(
    work: Apply, now_ms: int, b: AppendBatch | ProduceBatch, first: int, base_offset: int
) -> tuple[bytes | None, int, int]:
    """The record batch stored at ``base_offset`` (None when every record is delayed), its record
    count and the number of delayed records, which go to the due-time index.

    A v2 batch is stored as it came with the leader's fields stamped in; a delayed record's key
    holds its position in the whole command (several producers' batches for one queue share an
    entry: per batch, equal delays collided and one was lost). A JSON ``produce`` batch is stored
    as the release that wrote it stored it: a format-1 batch, a delayed message keyed by its
    position in its own batch (its leader proposed a batch with delays alone in its entry)."""
    if isinstance(b, AppendBatch):
        view = b.view
        data: bytes | memoryview | None = view.buffer
        count, delayed = view.count, 0
        if len(view.delays):
            data, count, delayed = _hold_delayed(work, now_ms, b.topic_id, b.queue, view, first)
        return (None if data is None else rb.stamp(data, base_offset, now_ms, work.index)), count, delayed
    messages, delayed = b["messages"], 0
    if b["deliver_at_ms"] is not None:
        messages = []
        for position, (message, due_ms) in enumerate(zip(b["messages"], b["deliver_at_ms"], strict=True)):
            if due_ms is None:
                messages.append(message)
            else:
                delivery.store_delayed(work, now_ms, b["topic_id"], b["queue"], position, due_ms, message)
                delayed += 1
    value = encode_batch(work.index, now_ms, base_offset, messages) if messages else None
    return value, len(messages), delayed


def _hold_delayed(
    work: Apply, now_ms: int, topic_id: int, queue: int, view: rb.BatchView, first: int
) -> tuple[bytes | None, int, int]:
    """Move the delayed records of ``view`` (whose first record is record ``first`` of the
    command) to the due-time index; returns the batch of the others (None if none is left), their
    count and the number delayed."""
    rest = rb.BatchBuilder(view.producer_id, view.base_sequence, base_timestamp_ms=view.base_timestamp_ms)
    delayed = 0
    for position, r in enumerate(view.records()):
        if r.delay_ms:
            due_ms = now_ms + r.delay_ms
            expires_at_ms = due_ms + r.ttl_ms if r.ttl_ms else None
            message = NewMessage(r.value, r.binary, r.key, r.headers, expires_at_ms)
            delivery.store_delayed(work, now_ms, topic_id, queue, first + position, due_ms, message)
            delayed += 1
        else:
            rest.append(
                r.value if r.binary else r.value.decode("utf-8"),
                r.key,
                r.headers,
                ttl_ms=r.ttl_ms,
                timestamp_ms=r.timestamp_ms,
            )
    return (rest.finish() if len(rest) else None), len(rest), delayed
