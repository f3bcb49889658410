"""Dead letters in the delivery state machine (``cluster/machines/delivery/__init__.py``): moving a message
that used up its deliveries to the dead-letter topic, and redriving dead letters back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftmq.cluster.machines.delivery.state import (
    DLQ_HEADER_PREFIX,
    PARK_MS,
    REDRIVE_GROUP_HEADER,
    REDRIVE_MAX_PER_COMMAND,
    _check_topic,
    _Work,
)
from raftmq.storage import keys, queues
from raftmq.storage.keys import STATE_INFLIGHT, PendingRecord
from raftmq.storage.queues import read_messages
from raftmq.storage.records import NewMessage

if TYPE_CHECKING:
    from raftmq.cluster.commands import RedriveCommand
    from raftmq.cluster.machines.apply import Apply


def _dead_letter(
    w: _Work, topic_id: int, queue: int, group: str, offset: int, rec: PendingRecord, reason: str
) -> str:
    """Move a message that used up its deliveries to the dead-letter topic (same queue number,
    same queue group: one apply). Returns ``dead_lettered``; ``discarded`` when the message
    expired or retention removed it; ``parked`` when there is no dead-letter topic (none created
    yet, or it was deleted) or its link was not checked against the topic's record
    (``Subscription.dlq_checked``: a link an older release stored by name).

    A parked message stays in flight on a deadline ``PARK_MS`` later (the last backoff level when
    it was parked already), under a token that names its reason (:data:`PARKED_TOKENS`; no
    delivery has it: tokens are raft indexes), and the apply reports it (``Applied.parked``): the
    leader then records the group's dead-letter topic in the subscription as the metadata group's
    record has it, creating the topic only for a configured subscription
    (``SubscriptionsApi.on_parked``); the dead letters of an unconfigured group stay parked. When
    the deadline passes, ``deliver_tick`` calls this again with the kept reason: the message moves
    to the dead-letter topic if there is one by then, else it is parked again and reported again.
    A parked message is never handed out again, and it needs no receiver to move; it is dropped
    only with its subscription (an unconfigured one that expired, ``delivery/expiry.py``) or by
    the topic's retention."""
    settings = w.settings(topic_id, group)
    message = w.message(topic_id, queue, offset)
    if message is None or message.expired(w.now_ms):
        w.finish(topic_id, queue, group, offset)
        return "discarded"
    dlq = settings.dlq_topic_id
    if dlq is None or not settings.dlq_checked or w.work.is_dropped(dlq):
        wait_ms = settings.backoff_ms[-1] if rec.token in PARKED_REASONS else PARK_MS
        parked = PendingRecord(
            STATE_INFLIGHT, rec.attempts, w.now_ms + wait_ms, PARKED_TOKENS[reason], rec.first_ms, rec.last_ms
        )
        w.set_pending(topic_id, queue, group, offset, parked)
        w.work.parked[(topic_id, settings.topic, group)] = None
        return "parked"
    headers = dict(message.headers or {})
    headers.update(
        {
            f"{DLQ_HEADER_PREFIX}topic": settings.topic,
            f"{DLQ_HEADER_PREFIX}queue": str(queue),
            f"{DLQ_HEADER_PREFIX}offset": str(offset),
            f"{DLQ_HEADER_PREFIX}group": group,
            f"{DLQ_HEADER_PREFIX}attempts": str(rec.attempts),
            f"{DLQ_HEADER_PREFIX}first-delivery-ms": str(rec.first_ms),
            f"{DLQ_HEADER_PREFIX}last-delivery-ms": str(rec.last_ms),
            f"{DLQ_HEADER_PREFIX}timestamp-ms": str(message.timestamp_ms),
            f"{DLQ_HEADER_PREFIX}reason": reason,
        }
    )
    w.append(dlq, queue, NewMessage(message.value, message.binary, message.key, headers))
    w.finish(topic_id, queue, group, offset)
    return "dead_lettered"


PARKED_TOKENS = {"expired": 2**64 - 1, "nacked": 2**64 - 2}
"""The token of a parked dead letter, by its reason (the ``raftmq-dlq-reason`` header)."""
PARKED_REASONS = {token: reason for reason, token in PARKED_TOKENS.items()}


def expiry_reason(rec: PendingRecord) -> str:
    """The dead-letter reason of an in-flight record whose deadline passed: ``expired``, or the
    reason it was parked with."""
    return PARKED_REASONS.get(rec.token, "expired")


# -- dead letters back --------------------------------------------------------------------------


def redrive(work: Apply, cmd: RedriveCommand) -> dict[str, Any]:
    """Move dead letters back: up to ``max`` messages per queue from the dead-letter queue's
    redrive offset are appended to the same queue of the source topic as new messages (new
    offsets; the dead-letter headers removed, ``raftmq-redrive-group`` set, so that other consumer
    groups skip them) and the redrive offset moves past them.

    Result: ``{"queues": [{"queue", "count", "redrive_offset", "high_offset"}], "more": bool}``.
    """
    topic_id, dlq, group, now_ms = cmd["topic_id"], cmd["dlq_topic_id"], cmd["group"], cmd["now_ms"]
    _check_topic(work, topic_id)
    _check_topic(work, dlq)
    w = _Work(work, now_ms)
    results = []
    total, more = 0, False
    for queue in cmd["queues"]:
        low, high = queues.queue_bounds(work.store, dlq, queue)
        stored = queues.redrive_offset(work.store, dlq, queue)
        start = max(low, stored or 0)
        room = min(cmd["max"], REDRIVE_MAX_PER_COMMAND - total)
        messages = read_messages(work.store, dlq, queue, start, room) if start < high and room > 0 else []
        for m in messages:
            headers = {k: v for k, v in (m.headers or {}).items() if not k.startswith(DLQ_HEADER_PREFIX)}
            headers[REDRIVE_GROUP_HEADER] = group
            w.append(topic_id, queue, NewMessage(m.value, m.binary, m.key, headers))
        end = messages[-1].offset + 1 if messages else start
        if end != stored:
            work.batch.put(keys.redrive_key(dlq, queue), keys.encode_u64(end))
        total += len(messages)
        more = more or end < high
        results.append({"queue": queue, "count": len(messages), "redrive_offset": end, "high_offset": high})
    w.finish_op()
    return {"queues": results, "more": more}
