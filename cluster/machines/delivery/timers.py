"""Time in the delivery state machine (``cluster/machines/delivery/__init__.py``): the leader's tick (delayed
messages released, expired deliveries retried or dead-lettered), delayed messages stored,
committed offsets kept consistent, and the leader's ``available`` read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftmq.cluster.machines.delivery.dead_letters import _dead_letter, expiry_reason
from raftmq.cluster.machines.delivery.state import _Work
from raftmq.storage import keys, queues
from raftmq.storage.keys import STATE_INFLIGHT
from raftmq.storage.queues import scan_prefix
from raftmq.storage.records import NewMessage, decode_batch, encode_batch
from raftmq.storage.store import Store

if TYPE_CHECKING:
    from raftmq.cluster.commands import DeliverTickCommand
    from raftmq.cluster.machines.apply import Apply

# -- the leader's tick --------------------------------------------------------------------------


def deliver_tick(work: Apply, cmd: DeliverTickCommand) -> dict[str, Any]:
    """Release delayed messages due at ``now_ms`` (due order; appended to their queues now, so
    they get their offsets now), then expire in-flight deliveries whose deadline passed: a retry,
    available at once (after the group's backoff only when the command says ``expiry_backoff``, as
    every entry written before that field existed does; the backoff is for nacks), or a dead
    letter after ``max_deliveries``. At most ``max`` of each; ``more`` says the leader should tick
    again at once.

    Result: ``{"released", "expired", "dead_lettered", "more"}``.
    """
    now_ms, limit = cmd["now_ms"], cmd["max"]
    w = _Work(work, now_ms)
    released, more = 0, False
    for key, value in scan_prefix(work.store, keys.DELAYED, limit=limit + 1):
        due_ms, topic_id, queue = keys.decode_delayed_key(key)
        if due_ms > now_ms:
            break
        if released == limit:
            more = True
            break
        released += 1
        work.batch.delete(key)
        if not work.is_dropped(topic_id):
            m = decode_batch(value).messages[0]
            w.append(topic_id, queue, NewMessage(m.value, m.binary, m.key, m.headers, m.expires_at_ms))
    seen = expired = dead_lettered = 0
    for key, value in scan_prefix(work.store, keys.DEADLINE, limit=limit + 1):
        deadline_ms, topic_id, queue, group, offset = keys.decode_deadline_key(key)
        if deadline_ms > now_ms:
            break
        if seen == limit:
            more = True
            break
        seen += 1
        rec = w.pending(topic_id, queue, group, offset)
        if (
            rec is None
            or rec.state != STATE_INFLIGHT
            or rec.token != keys.decode_u64(value)
            or rec.time_ms != deadline_ms
        ):
            work.batch.delete(key)  # dangling
            continue
        expired += 1
        settings = w.settings(topic_id, group)
        if rec.attempts >= settings.max_deliveries:
            dead_lettered += (
                _dead_letter(w, topic_id, queue, group, offset, rec, expiry_reason(rec)) == "dead_lettered"
            )
        else:
            wait_ms = settings.backoff(rec.attempts) if cmd["expiry_backoff"] else 0
            w.retry(topic_id, queue, group, offset, rec, now_ms + wait_ms)
    w.finish_op()
    return {"released": released, "expired": expired, "dead_lettered": dead_lettered, "more": more}


def store_delayed(
    work: Apply, now_ms: int, topic_id: int, queue: int, position: int, due_ms: int, message: NewMessage
) -> None:
    """Keep a delayed message in the due-time index until ``deliver_tick`` releases it."""
    key = keys.delayed_key(due_ms, topic_id, queue, work.index, position)
    work.batch.put(key, encode_batch(work.index, now_ms, 0, [message]))
    work.scheduled = True
    work.add_due(due_ms)


# -- offsets committed by offset consumers ------------------------------------------------------


def on_commit(work: Apply, group: str, topic_id: int, queue: int, offset: int) -> int:
    """Keep receive/ack state consistent with a committed offset; returns the offset to store
    (called before the commit is written). Only when ``group`` has received from the queue (a
    cursor exists); otherwise ``offset`` is stored as given:

    - forward (``offset >= floor``): pending records below it are finished and the cursor moves up
      to it if it was below. The stored floor is then ``min(lowest pending offset, cursor)``, which
      may be above ``offset`` (offsets acked above it were finished already);
    - backward (a rewind): every pending record is dropped and the cursor moves back, so
      everything from ``offset`` on is delivered again, as new (attempts start at 1).

    Index entries of the dropped records are left dangling and removed when met.
    """
    cursor = queues.sub_cursor(work.store, group, topic_id, queue)
    if cursor is None:
        return offset
    floor = queues.committed_offset(work.store, group, topic_id, queue)
    prefix = keys.sub_key(keys.PENDING, topic_id, queue, group)
    cursor_key = keys.sub_key(keys.SUB_CURSOR, topic_id, queue, group)
    if floor is not None and offset < floor:
        work.batch.delete_range(prefix, keys.prefix_end(prefix))
        work.batch.put(cursor_key, keys.encode_u64(offset))
        work.changed[(topic_id, queue)] = None
        return offset
    start = keys.pending_key(topic_id, queue, group, offset)
    work.batch.delete_range(prefix, start)
    if offset > cursor:
        work.batch.put(cursor_key, keys.encode_u64(offset))
        return offset
    for key, _ in scan_prefix(work.store, prefix, start=start, limit=1):
        return min(cursor, keys.decode_u64(key[len(prefix) :]))
    return cursor


# -- reads for the leader (not part of apply) ---------------------------------------------------


def available(
    store: Store, group: str, topic_id: int, queue_list: list[int], now_ms: int, epoch: int | None = None
) -> tuple[bool, int | None]:
    """Whether a ``receive`` could hand out something now, and if not, the earliest time that may
    change by itself (a retry becoming due, a lock lease running out). Cheap: a few point reads
    and index lookups per queue. May say yes when every candidate turns out to be expired; the
    receive then finishes those and moves on, so asking again converges."""
    wake: list[int] = []
    for queue in queue_list:
        lock_state = queues.lock_state(store, group, topic_id, queue)
        if epoch is None and lock_state is not None and lock_state.live(now_ms):
            wake.append(lock_state.lease_until_ms)
            continue
        low, high = queues.queue_bounds(store, topic_id, queue)
        cursor = queues.sub_cursor(store, group, topic_id, queue)
        if cursor is None:
            cursor = queues.committed_offset(store, group, topic_id, queue) or 0
        if max(cursor, low) < high:
            return True, None
        prefix = keys.sub_key(keys.RETRY, topic_id, queue, group)
        for key, _ in scan_prefix(store, prefix, limit=1):
            due_ms = keys.decode_u64(key[len(prefix) : -8])
            if due_ms <= now_ms:
                return True, None
            wake.append(due_ms)
    return False, min(wake) if wake else None
