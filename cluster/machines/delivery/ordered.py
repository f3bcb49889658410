"""Ordered receive (``receive_ordered``): receive/ack where a message's key is its **message group**,
as in an SQS FIFO queue. Within a subscription queue, the messages of one key are handed out in
offset order, and a key with a message in flight (or waiting for its retry's due time) hands out no
other message of that key; other keys go on.

How it keeps the model's invariants (``docs/delivery.md``): a new message met at the cursor whose
key is blocked gets a pending record in the retry state with ``attempts`` 0, due now (a
**waiting** record), so the cursor can move past it and the floor stays below it; a later ordered
receive hands it out (attempt 1) once its key is free. Waiting records are retries to every other
op: a plain ``receive`` of the same group hands them out as due retries (without the rule).

Bounded work: the pending records of a queue are read up to :data:`SCAN_BUDGET`, each with its
message's key; new messages as in ``receive``. Pure: time only from the command.

Bounded look-ahead: a queue holds at most :data:`PENDING_CAP` pending records (in flight, retries
and waiting) for the receive to pass blocked messages. At the cap, the cursor stops at the next
message of a blocked key: a message group with a backlog of thousands holds the groups behind that
point until it drains below the cap (within it, the other groups go on), and
:func:`available_ordered` answers False, so a waiting receiver does not propose receives that can
hand out nothing. Without the cap, the waiting records of one hot group took the whole scan budget,
the receive reached nothing past them, and the receivers proposed empty receives without end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftmq.cluster.machines.delivery.state import SCAN_BUDGET, _deliverable, _Work
from raftmq.storage import keys, queues
from raftmq.storage.keys import STATE_INFLIGHT, STATE_RETRY, PendingRecord
from raftmq.storage.queues import OffsetOutOfRange, read_messages, scan_prefix
from raftmq.storage.records import Message
from raftmq.storage.store import Store

if TYPE_CHECKING:
    from raftmq.cluster.commands import ReceiveCommand

__all__ = ["PENDING_CAP", "available_ordered", "hand_out_ordered"]

PENDING_CAP = SCAN_BUDGET * 3 // 4  # a quarter of the budget is left for the walk past them
"""The most pending records a queue holds for ordered receives to look past blocked messages."""

HandOut = Callable[[int, int, int, int], None]  # queue, offset, attempt, first_ms


def hand_out_ordered(
    w: _Work, cmd: ReceiveCommand, open_queues: list[int], hand_out: HandOut, out: list[dict[str, Any]]
) -> None:
    """Hand out up to ``cmd["max"]`` messages of ``open_queues`` by the ordered rule (module
    docstring), through ``hand_out``; ``out`` is what was handed out so far (its length counts)."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    limit, max_age_ms = cmd["max"], cmd["max_age_ms"]
    budget = SCAN_BUDGET
    for queue in open_queues:
        if len(out) >= limit or budget <= 0:
            return
        prefix = w._prefix(topic_id, queue, group)
        blocked: set[str | None] = set()
        visible: list[tuple[int, PendingRecord, str | None]] = []
        pending = 0
        for key, _ in scan_prefix(w.store, prefix, limit=budget):
            budget -= 1
            pending += 1
            offset = keys.decode_u64(key[len(prefix) :])
            rec = w.pending_at(key)
            if rec is None:
                continue
            message = w.message(topic_id, queue, offset)
            if message is None or not _deliverable(message, group, now_ms, max_age_ms):
                if rec.state == STATE_RETRY:
                    w.finish(topic_id, queue, group, offset)
                continue  # in flight: its deadline's tick finishes it
            if rec.state == STATE_INFLIGHT or rec.time_ms > now_ms:
                blocked.add(message.key)
            else:
                visible.append((offset, rec, message.key))
        for offset, rec, group_key in visible:
            if group_key in blocked:
                continue
            if len(out) >= limit:
                return
            hand_out(queue, offset, rec.attempts + 1, rec.first_ms if rec.attempts else now_ms)
        _new_messages(w, cmd, queue, blocked, hand_out, out, budget, PENDING_CAP - pending)


def _new_messages(
    w: _Work,
    cmd: ReceiveCommand,
    queue: int,
    blocked: set[str | None],
    hand_out: HandOut,
    out: list[dict[str, Any]],
    budget: int,
    room: int,
) -> None:
    """From the cursor on: hand out a message whose key is free, give one whose key is blocked a
    waiting record while there is ``room`` for one; stop at ``max`` handed out, the budget, or a
    blocked message with no room left (the cursor stays at it)."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    limit, max_age_ms = cmd["max"], cmd["max_age_ms"]
    sub = w.sub(topic_id, queue, group)
    low, high = queues.queue_bounds(w.store, topic_id, queue)
    if sub.cursor is None:
        sub.cursor = low if sub.floor is None else sub.floor
    sub.cursor = max(sub.cursor, low)
    waiting = PendingRecord(STATE_RETRY, 0, now_ms, 0, 0, 0)
    while sub.cursor < high and len(out) < limit and budget > 0:
        found = read_messages(w.store, topic_id, queue, sub.cursor, min(limit - len(out), budget))
        if not found:
            return
        for message in found:
            if len(out) >= limit or budget <= 0:
                return
            deliverable = _deliverable(message, group, now_ms, max_age_ms)
            if deliverable and message.key in blocked and room <= 0:
                return  # as many pending records as a queue may hold: the cursor stays here
            budget -= 1
            sub.cursor = message.offset + 1
            if not deliverable:
                continue
            if message.key in blocked:
                w.set_pending(topic_id, queue, group, message.offset, waiting)
                room -= 1
            else:
                hand_out(queue, message.offset, 1, now_ms)


def available_ordered(
    store: Store, group: str, topic_id: int, queue_list: list[int], now_ms: int
) -> tuple[bool, int | None]:
    """``timers.available`` for ``receive_ordered``: whether it could hand out something now (a
    message above the cursor, or a due retry whose key has nothing in flight), and if not the
    earliest due time of a retry. A blocked key is freed by an ack (no wake time: the caller's
    wait also ends at its own deadline or at the next change)."""
    wake: list[int] = []
    for queue in queue_list:
        low, high = queues.queue_bounds(store, topic_id, queue)
        cursor = queues.sub_cursor(store, group, topic_id, queue)
        if cursor is None:
            cursor = queues.committed_offset(store, group, topic_id, queue) or 0
        prefix = keys.sub_key(keys.PENDING, topic_id, queue, group)
        records = [
            (keys.decode_u64(k[len(prefix) :]), PendingRecord.decode(v))
            for k, v in scan_prefix(store, prefix, limit=SCAN_BUDGET)
        ]
        cursor = max(cursor, low)
        if cursor < high and len(records) < PENDING_CAP:
            return True, None
        if not records:
            continue
        found = {o: m for o, _ in records if (m := _message_at(store, topic_id, queue, o)) is not None}
        # A key is held by a message in flight or by a retry not due yet (as the receive holds it).
        held = [(o, rec) for o, rec in records if rec.state == STATE_INFLIGHT or rec.time_ms > now_ms]
        blocked = {found[o].key for o, _ in held if o in found}
        # At the cap, the receive still hands out the message at the cursor if its key is free.
        at_cursor = _message_at(store, topic_id, queue, cursor) if cursor < high else None
        if at_cursor is not None and at_cursor.key not in blocked:
            return True, None
        wake += [rec.time_ms for _, rec in held if rec.state == STATE_RETRY]
        for o, rec in records:
            if (
                rec.state == STATE_RETRY
                and rec.time_ms <= now_ms
                and (o not in found or found[o].key not in blocked)
            ):
                return True, None  # (a message gone: the receive finishes it)
    return False, min(wake) if wake else None


def _message_at(store: Store, topic_id: int, queue: int, offset: int) -> Message | None:
    try:
        found = read_messages(store, topic_id, queue, offset, 1, first_chunk=1)
    except OffsetOutOfRange:
        return None
    return found[0] if found else None
