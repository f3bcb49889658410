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

A delay (the command's ``delay_ms``, an SQS FIFO queue's DelaySeconds): a message is **due** at its
timestamp plus the delay, and is handed out first no earlier. The cursor stops at the first message
not due (it was appended at once, with its offset and so its SequenceNumber, but stays invisible);
the messages behind it were appended after it, so they are not due either (timestamps are the
group's time, which never goes back), and no group's later message passes an earlier one. A
waiting record whose message is not due (the delay was raised since: it applies to the messages
already in the queue, as AWS's FIFO delay does) holds its group until it is due. Redeliveries are
not delayed again.

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

__all__ = ["PENDING_CAP", "OrderedLooks", "available_ordered", "hand_out_ordered", "not_due"]

PENDING_CAP = SCAN_BUDGET * 3 // 4  # a quarter of the budget is left for the walk past them
"""The most pending records a queue holds for ordered receives to look past blocked messages."""

HandOut = Callable[[int, int, int, int], None]  # queue, offset, attempt, first_ms


def hand_out_ordered(
    w: _Work, cmd: ReceiveCommand, open_queues: list[int], hand_out: HandOut, out: list[dict[str, Any]]
) -> None:
    """Hand out up to ``cmd["max"]`` messages of ``open_queues`` by the ordered rule (module
    docstring), through ``hand_out``; ``out`` is what was handed out so far (its length counts)."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    limit, max_age_ms, delay_ms = cmd["max"], cmd["max_age_ms"], cmd.get("delay_ms") or 0
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
            if (
                rec.state == STATE_INFLIGHT
                or rec.time_ms > now_ms
                or not _due(rec, message, delay_ms, now_ms)
            ):
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
    not_after_ms = now_ms - (cmd.get("delay_ms") or 0)  # the newest timestamp that is due
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
            if deliverable and message.timestamp_ms > not_after_ms:
                return  # not due (the queue's delay), nor is anything behind it: the cursor stays
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


Seen = tuple[str | None, int]
"""A message's key (its message group) and timestamp, as a look needs them: they never change."""

MAX_LOOK_ENTRIES = 256
"""The most answers, and the most queues' :data:`Seen` maps, an :class:`OrderedLooks` keeps."""


class OrderedLooks:
    """What a queue group's leader keeps between the looks of its waiting ordered receivers
    (:func:`available_ordered`, every 0.2 s while they wait; not replicated, a leader's cache):

    - the answer of a look as of the group's applied index: taken again while nothing was applied
      since and its wake time was not reached, so such a look reads nothing (only an applied entry
      changes what is pending, and time only makes a retry or a delayed message due, at the wake);
    - per queue, the key and timestamp of the messages of its pending records at the last look
      (they never change), so a look after a change scans the pending records but reads none of
      their messages again: a held group's backlog of thousands costs one scan, not a message read
      each.

    Bounded: at most :data:`MAX_LOOK_ENTRIES` answers and queues (then it starts afresh); per
    queue, the records of the last look (at most ``SCAN_BUDGET``). A new store (a restored
    checkpoint) starts it afresh. Used on the event loop only."""

    def __init__(self) -> None:
        self._store: Store | None = None
        self._answers: dict[tuple[str, int, tuple[int, ...], int], tuple[int, bool, int | None]] = {}
        self._seen: dict[tuple[int, int], dict[int, Seen]] = {}

    def available(
        self,
        store: Store,
        applied_index: int,
        group: str,
        topic_id: int,
        queue_list: list[int],
        now_ms: int,
        delay_ms: int = 0,
    ) -> tuple[bool, int | None]:
        """:func:`available_ordered`, from what was kept when it still holds. ``applied_index``
        must be read before the store (an entry applied meanwhile then only makes the next look
        read again)."""
        if store is not self._store:
            self._store = store
            self._answers.clear()
            self._seen.clear()
        key = (group, topic_id, tuple(queue_list), delay_ms)
        kept = self._answers.get(key)
        if kept is not None and kept[0] == applied_index and (kept[1] or kept[2] is None or now_ms < kept[2]):
            return kept[1], kept[2]
        if len(self._seen) > MAX_LOOK_ENTRIES:
            self._seen.clear()
        ok, wake = available_ordered(store, group, topic_id, queue_list, now_ms, delay_ms, self._seen)
        if len(self._answers) >= MAX_LOOK_ENTRIES:
            self._answers.clear()
        self._answers[key] = (applied_index, ok, wake)
        return ok, wake


def available_ordered(
    store: Store,
    group: str,
    topic_id: int,
    queue_list: list[int],
    now_ms: int,
    delay_ms: int = 0,
    seen: dict[tuple[int, int], dict[int, Seen]] | None = None,
) -> tuple[bool, int | None]:
    """``timers.available`` for ``receive_ordered`` (with the command's ``delay_ms``): whether it
    could hand out something now (a due message at the cursor, or a due retry whose key has
    nothing in flight), and if not the earliest time one of them is due. A blocked key is freed by
    an ack (no wake time: the caller's wait also ends at its own deadline or at the next change).
    ``seen``: the :data:`Seen` of pending records' messages per (topic, queue), read where missing
    and left holding those of this look's records (:class:`OrderedLooks`)."""
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
        # With a delay, the message at the cursor must be due too (nothing behind it is before it).
        at_cursor = _message_at(store, topic_id, queue, cursor) if cursor < high and delay_ms else None
        if at_cursor is not None and at_cursor.timestamp_ms + delay_ms > now_ms:
            wake.append(at_cursor.timestamp_ms + delay_ms)
            high = cursor  # nothing new is due here
        if cursor < high and len(records) < PENDING_CAP:
            return True, None
        if not records:
            continue
        found = _seen_of(store, topic_id, queue, low, records, seen)
        # A key is held by a message in flight, by a retry not due yet, or by a waiting message not
        # due (as the receive holds it).
        held = [
            (o, rec)
            for o, rec in records
            if rec.state == STATE_INFLIGHT
            or rec.time_ms > now_ms
            or (o in found and _due_ms(rec, found[o][1], delay_ms) > now_ms)
        ]
        blocked = {found[o][0] for o, _ in held if o in found}
        # At the cap, the receive still hands out the message at the cursor if its key is free.
        if cursor < high and at_cursor is None:
            at_cursor = _message_at(store, topic_id, queue, cursor)
        if cursor < high and at_cursor is not None and at_cursor.key not in blocked:
            return True, None
        wake += [
            max(rec.time_ms, _due_ms(rec, found[o][1] if o in found else None, delay_ms))
            for o, rec in held
            if rec.state == STATE_RETRY
        ]
        for o, rec in records:
            if (
                rec.state == STATE_RETRY
                and rec.time_ms <= now_ms
                and (
                    o not in found
                    or (found[o][0] not in blocked and _due_ms(rec, found[o][1], delay_ms) <= now_ms)
                )
            ):
                return True, None  # (a message gone: the receive finishes it)
    return False, min(wake) if wake else None


def _seen_of(
    store: Store,
    topic_id: int,
    queue: int,
    low: int,
    records: list[tuple[int, PendingRecord]],
    seen: dict[tuple[int, int], dict[int, Seen]] | None,
) -> dict[int, Seen]:
    """The :data:`Seen` of the records' messages that are still stored (an offset below ``low``
    is gone: retention removes from the low end), from ``seen`` where it has them; ``seen`` then
    holds these."""
    kept = {} if seen is None else seen.get((topic_id, queue), {})
    found: dict[int, Seen] = {}
    for o, _ in records:
        if o < low:
            continue
        known = kept.get(o)
        if known is None:
            message = _message_at(store, topic_id, queue, o)
            if message is None:
                continue
            known = (message.key, message.timestamp_ms)
        found[o] = known
    if seen is not None:
        seen[(topic_id, queue)] = found
    return found


def not_due(store: Store, group: str, topic_id: int, queue: int, now_ms: int, delay_ms: int) -> int:
    """How many messages of a queue ``receive_ordered`` with ``delay_ms`` has not reached because
    they are not due (an SQS FIFO queue's ApproximateNumberOfMessagesDelayed): those from the first
    one above the cursor whose timestamp plus ``delay_ms`` is after ``now_ms`` to the end. The
    timestamps grow with the offsets (the group's time), so a binary search finds it: about 2 log2
    n message reads, whatever the backlog. A leader-side read, as :func:`available_ordered`."""
    low, high = queues.queue_bounds(store, topic_id, queue)
    cursor = queues.sub_cursor(store, group, topic_id, queue)
    if cursor is None:
        cursor = queues.committed_offset(store, group, topic_id, queue) or 0
    first, end = max(cursor, low), high  # the answer is in [first, end]
    if not delay_ms:
        return 0
    while first < end:
        middle = (first + end) // 2
        message = _message_at(store, topic_id, queue, middle)
        if message is not None and message.timestamp_ms + delay_ms > now_ms:
            end = middle
        else:
            first = middle + 1
    return high - first


def _due_ms(rec: PendingRecord, timestamp_ms: int | None, delay_ms: int) -> int:
    """When a pending record's message (stamped ``timestamp_ms``) may be handed out by the delay:
    a waiting message (never handed out) at its timestamp plus ``delay_ms``; a redelivery at once
    (0)."""
    if rec.attempts or timestamp_ms is None or not delay_ms:
        return 0
    return timestamp_ms + delay_ms


def _due(rec: PendingRecord, message: Message, delay_ms: int, now_ms: int) -> bool:
    return _due_ms(rec, message.timestamp_ms, delay_ms) <= now_ms


def _message_at(store: Store, topic_id: int, queue: int, offset: int) -> Message | None:
    try:
        found = read_messages(store, topic_id, queue, offset, 1, first_chunk=1)
    except OffsetOutOfRange:
        return None
    return found[0] if found else None
