"""Receive/ack, retries, dead letters, delayed messages and queue locks in the queue-group state
machine (``QueueGroupMachine`` dispatches the ops here). The model is in ``docs/delivery.md``.

Everything here runs inside ``QueueGroupMachine.apply`` and keeps its invariants: pure (time only
from the command's ``now_ms``, the store the only I/O), never raising on input (a refusal is a
:class:`Refused`, turned into an error result with nothing written), every write into the one
batch of the apply, bounded work per command.

Per (topic, queue, consumer group) the state is (keys in ``storage/keys.py``):

- the **floor**: the committed offset (``O``, shared with offset consumers): every offset below it
  is finished;
- the **cursor** (``S``): the next offset never handed out;
- a **pending record** (``I``) for each handed-out, unfinished offset: in flight (with its
  visibility deadline and receipt token) or waiting for a retry (with its due time).

Invariant: an offset in ``[floor, cursor)`` is finished exactly when it has no pending record, and
``floor == min(lowest pending offset, cursor)`` after every apply. So "acked above the floor" is
the absence of a pending record, and moving the floor is one ordered lookup, never a scan.

The deadline index (``E``, by deadline over the whole queue group) lets ``deliver_tick`` find
expired deliveries in deadline order; the retry index (``Y``, per subscription queue, by due time)
lets ``receive`` hand out due retries oldest first. Index entries are maintained with every change
of a pending record; entries left behind by bulk changes (a rewinding commit, ``drop_topic``) are
recognised as dangling when met (their pending record is gone or says otherwise) and deleted then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused, error_body
from raftmq.cluster.machines.delivery.dead_letters import _dead_letter, redrive
from raftmq.cluster.machines.delivery.expiry import (
    check_group_limits,
    expire_subscriptions,
    has_committed_offsets,
    mark_offsets_shared,
    touch_subscriptions,
)
from raftmq.cluster.machines.delivery.locks import check_fence, lock, unlock
from raftmq.cluster.machines.delivery.ordered import available_ordered, hand_out_ordered, not_due
from raftmq.cluster.machines.delivery.state import (
    DEFAULT_BACKOFF_MS,
    DEFAULT_MAX_DELIVERIES,
    DLQ_HEADER_PREFIX,
    NEVER_DEAD_LETTERED,
    REDRIVE_GROUP_HEADER,
    SCAN_BUDGET,
    WAKE_WITHIN_MS,
    Subscription,
    _check_topic,
    _deliverable,
    _deliverable_fields,
    _Sub,
    _Work,
    dlq_topic_name,
    read_subscription,
)
from raftmq.cluster.machines.delivery.timers import available, deliver_tick, on_commit, store_delayed
from raftmq.storage import keys
from raftmq.storage.keys import STATE_INFLIGHT, STATE_RETRY, LockState, PendingRecord
from raftmq.storage.queues import read_delivery_fields
from raftmq.storage.records import decode_delivery_fields

if TYPE_CHECKING:
    from raftmq.cluster.commands import (
        AckReceiveCommand,
        Receipt,
        ReceiptsCommand,
        ReceiveCommand,
        SubscribeCommand,
        TakeAlong,
    )
    from raftmq.cluster.machines.apply import Apply
    from raftmq.storage.store import Store

__all__ = [
    "DEFAULT_BACKOFF_MS",
    "DEFAULT_MAX_DELIVERIES",
    "DLQ_HEADER_PREFIX",
    "NEVER_DEAD_LETTERED",
    "REDRIVE_GROUP_HEADER",
    "SCAN_BUDGET",
    "WAKE_WITHIN_MS",
    "Refused",
    "Subscription",
    "ack_nack_extend",
    "ack_receive",
    "available",
    "available_ordered",
    "check_fence",
    "deliver_tick",
    "dlq_topic_name",
    "expire_subscriptions",
    "lock",
    "mark_offsets_shared",
    "not_due",
    "on_commit",
    "read_subscription",
    "receive",
    "receive_ordered",
    "redrive",
    "refuse_new_group_over_caps",
    "release",
    "stale_receipt",
    "store_delayed",
    "subscribe",
    "take_along",
    "touch_subscriptions",
    "unlock",
]

# -- subscribe ----------------------------------------------------------------------------------


def refuse_new_group_over_caps(store: Store, cmd: SubscribeCommand) -> None:
    """At the leader, before proposing a ``subscribe``: refuse (``too_many_groups``) the one the
    apply would refuse over its caps (:func:`subscribe`), from the leader's state (a leader cut
    off from its group could miss a group expired since: a refusal the client may ask again). A
    refused request then costs no entry in every queue group of the topic (a client looping
    receives under new group names past its cap wrote one each before). The apply checks again:
    an entry in flight may have taken the last place."""
    configured = cmd["overwrite"] or cmd["configured"]
    if not configured and read_subscription(store, cmd["topic_id"], cmd["group"]) is None:
        check_group_limits(store, cmd)


def subscribe(work: Apply, cmd: SubscribeCommand) -> dict[str, Any]:
    """Store the subscription settings. Without ``overwrite``, an existing subscription keeps its
    ``max_deliveries`` and ``backoff_ms`` (a receive after a restart must not undo a PUT); with it
    (a ``PUT``, admin) or ``configured`` (an admin's receive) the subscription becomes configured.
    The dead-letter link: a ``checked`` one (read from the metadata group's record) replaces the
    stored one, even by none; an unchecked given one (an older leader) replaces it unchecked; none
    keeps the stored one. ``now_ms`` marks it used. A new unconfigured subscription is refused with
    ``too_many_groups`` when the topic or the creator's token already has ``max_topic_groups`` /
    ``max_token_groups`` of them in this queue group.
    Result: ``{"subscription": {...}, "changed": bool}``."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    _check_topic(work, topic_id)
    current = read_subscription(work.store, topic_id, group)
    configured = cmd["overwrite"] or cmd["configured"]
    if current is None and not configured:
        check_group_limits(work.store, cmd)
    given = Subscription(cmd["topic"], cmd["dlq_topic_id"], cmd["max_deliveries"], tuple(cmd["backoff_ms"]))
    new = given if current is None or cmd["overwrite"] else replace(current, topic=given.topic)
    if current is None and has_committed_offsets(work.store, topic_id, group):
        new = replace(new, offsets_shared=True)  # an offset consumer's, or left by an expired one
    if cmd["checked"]:
        new = replace(new, dlq_topic_id=given.dlq_topic_id, dlq_checked=True)
    elif given.dlq_topic_id is not None:
        new = replace(new, dlq_topic_id=given.dlq_topic_id, dlq_checked=False)
    elif current is not None:
        new = replace(new, dlq_topic_id=current.dlq_topic_id, dlq_checked=current.dlq_checked)
    if now_ms is not None:
        new = replace(
            new,
            configured=configured or (current is not None and current.configured),
            used_ms=max(now_ms, (current.used_ms or 0) if current is not None else 0),
            creator=current.creator if current is not None else cmd["creator"],
            dormant=False,  # used again
        )
    if new != current:
        work.batch.put(keys.subscription_key(topic_id, group), orjson.dumps(new.to_json()))
    return {"subscription": new.to_json(), "changed": new != current}


# -- receive ------------------------------------------------------------------------------------


def _open_queues(w: _Work, cmd: ReceiveCommand) -> list[int]:
    """The queues this receive may take from: with an epoch, all of them must be locked with it
    (else the whole receive is refused); without, queues locked by a live holder are left out."""
    topic_id, group, now_ms, epoch = cmd["topic_id"], cmd["group"], cmd["now_ms"], cmd["epoch"]
    out = []
    for queue in cmd["queues"]:
        lock_state = w.work.read_kept(keys.lock_key(topic_id, queue, group), LockState.decode)
        if epoch is not None:
            if lock_state is None or lock_state.epoch != epoch or not lock_state.live(now_ms):
                raise Refused(
                    errors.STALE_EPOCH,
                    f"queue {queue} is not locked with epoch {epoch} now",
                    queue=queue,
                    epoch=None if lock_state is None else lock_state.epoch,
                )
            out.append(queue)
        elif lock_state is None or not lock_state.live(now_ms):
            out.append(queue)
    return out


def _due_retries(
    w: _Work, cmd: ReceiveCommand, open_queues: list[int], limit: int
) -> list[tuple[int, int, int]]:
    """``(due_ms, queue, offset)`` of due retry-index entries, oldest due first (ties: queue order
    of the command, then offset). Dangling entries are included; the caller checks them."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    found: list[tuple[int, int, int, int]] = []
    for position, queue in enumerate(open_queues):
        prefix = keys.sub_key(keys.RETRY, topic_id, queue, group)
        for key, _ in w.work.retries(prefix, limit):
            due_ms, offset = keys.decode_u64(key[len(prefix) : -8]), keys.decode_u64(key[-8:])
            if due_ms > now_ms:
                break
            found.append((due_ms, position, queue, offset))
    found.sort()
    return [(due_ms, queue, offset) for due_ms, _, queue, offset in found[:limit]]


def receive_ordered(work: Apply, cmd: ReceiveCommand, index: int) -> dict[str, Any]:
    """:func:`receive` with a message's key as its message group (``delivery/ordered.py``): the
    messages of one key in offset order, none of a key while one of it is in flight (or waiting
    for its retry's due time); other keys go on. Same result."""
    return receive(work, cmd, index, ordered=True)


def receive(work: Apply, cmd: ReceiveCommand, index: int, *, ordered: bool = False) -> dict[str, Any]:
    """Hand out up to ``max`` messages: due retries first (oldest due first), then new offsets
    from each queue's cursor, in the command's queue order. Each becomes in flight until
    ``now_ms + visibility_ms`` with ``attempt`` + 1 and the receipt token ``index``. Expired
    messages (TTL, or older than ``max_age_ms``) and messages redriven for another group are
    finished on the way, never handed out.

    Result: ``{"token": index, "messages": [{"queue", "offset", "attempt", "deadline_ms",
    "first_ms"}]}``; ``first_ms`` is when the message was first handed out (its pending record's,
    kept through retries: ``now_ms`` for a first delivery).
    """
    _check_topic(work, cmd["topic_id"])
    w = _Work(work, cmd["now_ms"])
    out = _receive(w, cmd, index, ordered)
    w.finish_op()
    return {"token": index, "messages": out}


def _receive(w: _Work, cmd: ReceiveCommand, index: int, ordered: bool) -> list[dict[str, Any]]:
    """The hand-out of :func:`receive` into ``w`` (the caller finishes the op)."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    open_queues = _open_queues(w, cmd)
    limit, deadline_ms, max_age_ms = cmd["max"], now_ms + cmd["visibility_ms"], cmd["max_age_ms"]
    budget = SCAN_BUDGET
    out: list[dict[str, Any]] = []

    def hand_out(queue: int, offset: int, attempts: int, first_ms: int) -> None:
        rec = PendingRecord(STATE_INFLIGHT, attempts, deadline_ms, index, first_ms, now_ms)
        w.set_pending(topic_id, queue, group, offset, rec)
        out.append(
            {
                "queue": queue,
                "offset": offset,
                "attempt": attempts,
                "deadline_ms": deadline_ms,
                "first_ms": first_ms,
            }
        )

    if ordered:
        hand_out_ordered(w, cmd, open_queues, hand_out, out)
        if out:
            w.touch(topic_id, group, deadline_ms)
        return out
    for due_ms, queue, offset in _due_retries(w, cmd, open_queues, min(limit, budget)):
        budget -= 1
        rec = w.pending(topic_id, queue, group, offset)
        if rec is None or rec.state != STATE_RETRY or rec.time_ms != due_ms:
            w.batch.delete(keys.retry_key(topic_id, queue, group, due_ms, offset))  # dangling
            continue
        message = w.message(topic_id, queue, offset)
        if message is None or not _deliverable(message, group, now_ms, max_age_ms):
            w.finish(topic_id, queue, group, offset)
            continue
        hand_out(queue, offset, rec.attempts + 1, rec.first_ms)
    first = PendingRecord(STATE_INFLIGHT, 1, deadline_ms, index, now_ms, now_ms)  # a first delivery
    for queue in open_queues:
        if len(out) >= limit or budget <= 0:
            break
        sub = w.sub(topic_id, queue, group)
        meta = w.work.meta(topic_id, queue)  # the store's, through the machine's cache
        low, high = meta.low_offset, meta.high_offset
        if sub.cursor is None:  # first receive: start at the committed offset, else the oldest
            sub.cursor = low if sub.floor is None else sub.floor
        sub.cursor = max(sub.cursor, low)  # retention removed what was never handed out
        while sub.cursor < high and len(out) < limit and budget > 0:
            wanted = min(limit - len(out), budget)
            found = _delivery_fields(w, topic_id, queue, sub.cursor, wanted)
            if not found:
                break
            budget -= len(found)
            sub.cursor = found[-1][0] + 1
            fresh = [
                o
                for o, ts, exp, redrive_group in found
                if _deliverable_fields(ts, exp, redrive_group, group, now_ms, max_age_ms)
            ]
            w.put_fresh(topic_id, queue, group, fresh, first)  # above the cursor: no record yet
            out += [
                {"queue": queue, "offset": o, "attempt": 1, "deadline_ms": deadline_ms, "first_ms": now_ms}
                for o in fresh
            ]
    if out:  # in use while what it handed out is in flight
        w.touch(topic_id, group, deadline_ms)
    return out


def _delivery_fields(
    w: _Work, topic_id: int, queue: int, offset: int, wanted: int
) -> list[tuple[int, int, int | None, str | None]]:
    """``read_delivery_fields`` from ``offset``: from a batch this apply stored (an append's
    take-along, :func:`take_along`: the store shows it only after the apply's write), else the
    store's."""
    for base, end, value, append_ms in (w.work.appended or {}).get((topic_id, queue), ()):
        if base <= offset < end:
            fields = decode_delivery_fields(value, offset, wanted, REDRIVE_GROUP_HEADER)
            return [(o, append_ms, expires_at_ms, found) for o, expires_at_ms, found in fields]
    return read_delivery_fields(w.store, topic_id, queue, offset, wanted, REDRIVE_GROUP_HEADER)


def take_along(work: Apply, take: TakeAlong, now_ms: int, index: int) -> dict[str, Any]:
    """An ``append``'s take-along (the field level ``append.take``), after its batches in the same
    apply: a ``receive`` (no epoch) of up to ``max`` messages of ``queues`` at the append's
    ``now_ms`` with the receipt token ``index``, which sees the messages the append just stored. A
    node's SendMessage(Batch) of a standard SQS queue hands them to a ReceiveMessage waiting there
    (``cluster/node/read_ahead.py``), so the receive costs no entry of its own. As
    :func:`ack_receive`'s receive, nothing is taken for a subscription that dead-letters; nor for a
    dropped topic or a group with no subscription (the append stands either way: a take-along
    never refuses its entry).

    Result: ``{"token": index, "messages": [...]}`` as ``receive``'s.
    """
    topic_id, group = take["topic_id"], take["group"]
    if work.is_dropped(topic_id):
        return {"token": index, "messages": []}
    w = _Work(work, now_ms)
    sub = w.subscription(topic_id, group)  # (through the machine's cache)
    if sub is None or sub.max_deliveries < NEVER_DEAD_LETTERED:
        return {"token": index, "messages": []}
    receive_cmd: ReceiveCommand = {
        "v": 1,
        "op": "receive",
        "now_ms": now_ms,
        "group": group,
        "topic_id": topic_id,
        "queues": take["queues"],
        "max": take["max"],
        "visibility_ms": take["visibility_ms"],
        "epoch": None,
        "max_age_ms": take["max_age_ms"],
    }
    out = _receive(w, receive_cmd, index, False)
    w.finish_op()
    return {"token": index, "messages": out}


# -- ack, nack, extend --------------------------------------------------------------------------


def ack_nack_extend(work: Apply, cmd: ReceiptsCommand) -> dict[str, Any]:
    """Apply ``ack`` (finish), ``nack`` (retry after ``delay_ms`` or the backoff; after
    ``max_deliveries`` deliveries: dead letter) or ``extend`` (deadline = ``now_ms +
    visibility_ms``) to each receipt.

    A receipt is valid while its message is in flight from the delivery that issued it (same
    token); otherwise it gets a ``stale_receipt`` result and changes nothing. Receipts are applied
    one by one (a stale one does not stop the others); with an ``epoch`` the whole command is
    refused unless every named queue's lock has that epoch.

    Result: ``{"results": [r, ...]}`` in receipt order: ``{"ok": true}`` (extend adds
    ``deadline_ms``; nack adds ``"dead_lettered": true`` when the message moved to the dead-letter
    topic) or an error body.
    """
    topic_id, group, now_ms, op = cmd["topic_id"], cmd["group"], cmd["now_ms"], cmd["op"]
    _check_topic(work, topic_id)
    if cmd["epoch"] is not None:
        check_fence(work.store, group, topic_id, sorted({r.queue for r in cmd["receipts"]}), cmd["epoch"])
    w = _Work(work, now_ms)
    by_queue: dict[int, list[int]] = {}
    for r in cmd["receipts"]:
        by_queue.setdefault(r.queue, []).append(r.offset)
    for queue, offsets in by_queue.items():
        w.load_pending(topic_id, queue, group, offsets)
    # Settling is using: an extend keeps it in use until the new deadline (expiry must never
    # remove a delivery a consumer still holds), an ack or nack until now.
    w.touch(topic_id, group, now_ms + cmd["visibility_ms"] if op == "extend" else now_ms)
    if op == "ack":
        acked = _ack(w, topic_id, group, cmd["receipts"])
        w.finish_op()
        return {"results": acked}
    results: list[dict[str, Any]] = []
    for queue, offset, token in cmd["receipts"]:
        key = w._prefix(topic_id, queue, group) + keys.encode_u64(offset)
        rec = w.pending_at(key)
        if rec is None or rec.state != STATE_INFLIGHT or rec.token != token:
            results.append(stale_receipt(queue, offset))
            continue
        if op == "extend":
            deadline_ms = now_ms + cmd["visibility_ms"]
            w.set_pending(topic_id, queue, group, offset, replace(rec, time_ms=deadline_ms))
            results.append({"ok": True, "deadline_ms": deadline_ms})
        else:
            settings = w.settings(topic_id, group)
            if rec.attempts >= settings.max_deliveries:
                outcome = _dead_letter(w, topic_id, queue, group, offset, rec, "nacked")
                results.append({"ok": True, **({outcome: True} if outcome != "discarded" else {})})
            else:
                delay = cmd["delay_ms"]
                w.retry(
                    topic_id,
                    queue,
                    group,
                    offset,
                    rec,
                    now_ms + (settings.backoff(rec.attempts) if delay is None else delay),
                )
                results.append({"ok": True})
    w.finish_op()
    return {"results": results}


def ack_receive(work: Apply, cmd: AckReceiveCommand, index: int) -> dict[str, Any]:
    """The ``ack`` of the receipts, then a ``receive`` (no epoch) of up to ``max`` messages of
    ``queues`` with the receipt token ``index``, in one apply: the receive sees what the ack
    finished. A node's DeleteMessage(Batch) of a standard SQS queue takes its receiver's next
    messages along (``cluster/node/read_ahead.py``), so a receive-and-delete cycle waits for one
    commit instead of two. Nothing is taken for a subscription whose ``max_deliveries`` is below
    :data:`NEVER_DEAD_LETTERED` (one that dead-letters): the ack alone.

    Result: ``{"results": [...]}`` as ``ack``'s, with ``"token"`` and ``"messages"`` as
    ``receive``'s.
    """
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    _check_topic(work, topic_id)
    w = _Work(work, now_ms)
    by_queue: dict[int, list[int]] = {}
    for r in cmd["receipts"]:
        by_queue.setdefault(r.queue, []).append(r.offset)
    for queue, offsets in by_queue.items():
        w.load_pending(topic_id, queue, group, offsets)
    w.touch(topic_id, group, now_ms)
    acked = _ack(w, topic_id, group, cmd["receipts"])
    receive_cmd: ReceiveCommand = {
        "v": cmd["v"],
        "op": "receive",
        "now_ms": now_ms,
        "group": group,
        "topic_id": topic_id,
        "queues": cmd["queues"],
        "max": cmd["max"],
        "visibility_ms": cmd["visibility_ms"],
        "epoch": None,
        "max_age_ms": cmd["max_age_ms"],
    }
    # A subscription that dead-letters takes nothing ahead: a read-ahead no consumer got (its
    # node crashed) would count a delivery, and the count could dead-letter an undelivered message.
    dead_letters = w.settings(topic_id, group).max_deliveries < NEVER_DEAD_LETTERED
    out = [] if dead_letters else _receive(w, receive_cmd, index, False)
    w.finish_op()
    return {"results": acked, "token": index, "messages": out}


def release(work: Apply, cmd: ReceiptsCommand) -> dict[str, Any]:
    """Give back deliveries nobody received (a node's read-ahead that no ReceiveMessage took in
    time): each receipt still in flight from that delivery becomes visible again at once with its
    ``attempts`` one less, as if that delivery had not happened (a first delivery: a record with
    ``attempts`` 0, which the next receive hands out as attempt 1). Result: as ``ack``'s."""
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    _check_topic(work, topic_id)
    w = _Work(work, now_ms)
    results: list[dict[str, Any]] = []
    for queue, offset, token in cmd["receipts"]:
        rec = w.pending(topic_id, queue, group, offset)
        if rec is None or rec.state != STATE_INFLIGHT or rec.token != token:
            results.append(stale_receipt(queue, offset))
            continue
        w.retry(topic_id, queue, group, offset, replace(rec, attempts=max(0, rec.attempts - 1)), now_ms)
        results.append({"ok": True})
    w.touch(topic_id, group, now_ms)
    w.finish_op()
    return {"results": results}


def stale_receipt(queue: int, offset: int) -> dict[str, Any]:
    """The result of a receipt that names nothing in flight (the leader answers an all-stale
    settle with it too: ``cluster/node/delivery_actions.py``)."""
    return error_body(
        errors.STALE_RECEIPT,
        f"the receipt of queue {queue} offset {offset} is no longer valid (acked, redelivered or unknown)",
    )


def _ack(w: _Work, topic_id: int, group: str, receipts: list[Receipt]) -> list[dict[str, Any]]:
    """The ``ack`` of :func:`ack_nack_extend` (records loaded), with the work per receipt kept
    small: it runs for every message on every replica."""
    results: list[dict[str, Any]] = []
    per_queue: dict[int, tuple[bytes, _Sub]] = {}
    delete = w.batch.delete
    pending = w._pending
    for queue, offset, token in receipts:
        known = per_queue.get(queue)
        if known is None:
            known = per_queue[queue] = (w._prefix(topic_id, queue, group), w.sub(topic_id, queue, group))
        prefix, sub = known
        o = keys.encode_u64(offset)
        key = prefix + o
        rec = w.pending_at(key)
        if rec is None or rec.state != STATE_INFLIGHT or rec.token != token:
            results.append(stale_receipt(queue, offset))
            continue
        delete(w._deadline_prefix(rec.time_ms, topic_id, queue, group) + o)
        delete(key)
        pending[key] = None
        sub.gone.add(offset)
        results.append({"ok": True})
    for _, sub in per_queue.values():
        if sub.gone:
            sub.touched = True
            sub.new.difference_update(sub.gone)
    return results
