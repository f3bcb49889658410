"""Idle producer states expire: the ``expire_producers`` command.

Every idempotent producer leaves a :class:`~raftmq.storage.keys.ProducerState` per queue it wrote
to (the ``P`` keys). Producers are often short-lived (the Python client makes a new ``producer_id``
per ``Producer``), so without expiry these states would grow without bound. A state not used (no
batch appended under it) for ``limits.producer_idle_ms`` is forgotten: the leader of a queue group
proposes, on its retention timer, when its own store shows something is due::

    {"op": "expire_producers", "now_ms": time, "idle_ms": duration >= 1, "max": 1..100000}

:func:`apply_expire_producers` is the pure part (the queue group machine dispatches to it): no
clock (``now_ms`` is the leader's stamp), no I/O but the store, at most ``max`` keys looked at per
step, so a group with a million producers never stalls its apply thread; what is left is done by
the next command (the result says ``more``).

1. The idle index (``W`` keys, ``storage/keys.py``): every state with ``last_used_ms = t`` has the
   key ``W t topic queue producer``, moved by each produce that uses the state. One ordered scan
   finds the states last used before ``now_ms - idle_ms``; each is deleted with its index key. An
   index key whose state is gone (its topic was dropped) or has another time is just deleted.
2. The sweep (once per group): until a group applies its first ``expire_producers``, producer
   states are written in the old encoding, without a time and index key, as releases before this
   one wrote them (so a rolling upgrade with ``producer_idle_ms = 0`` keeps every replica's bytes
   identical, and a rollback stays possible). That first command starts the sweep: a cursor (the
   ``G`` key) walks the ``P`` keys, at most ``max`` per command, and gives each state without a
   time the command's ``now_ms`` (and its index key), so it expires after ``idle_ms`` more unless
   its producer writes again. From then on every append records its time. ``G`` is empty when the
   sweep is done.

3. The cap: an ``expire_producers`` carrying ``max_states`` (``limits.max_producer_states``, the
   field level ``expire_producers.max_states``) stores it in the ``K`` key (0: none, the key
   deleted). While it is set, the group holds at most that many live states (``W`` keys, counted
   by the machine's cache): an append whose new states would pass it forgets the least recently
   used ones first, as many as it adds (:func:`forget_least_used`, the first keys of the idle
   index; never one the same entry uses); a lowered cap is reached by the expiry steps, ``max``
   keys each. Until a group applies such a command, appends apply exactly as before.

A forgotten producer is a new producer to the queue: a retry arriving later than the idle time
is stored again, and an old sequence is no longer refused as ``stale_sequence``. Only appends use a
state: a retry answered as a duplicate, or refused as stale, changes nothing (and so does not keep
the state alive).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from raftmq.cluster.commands.producers import ExpireProducersCommand
from raftmq.storage import keys, queues
from raftmq.storage.keys import PRODUCER_CAP, PRODUCER_IDLE, PRODUCER_SWEEP, ProducerState
from raftmq.storage.store import Batch, Store

__all__ = ["apply_expire_producers", "expiry_due", "forget_least_used", "stored_cap"]


class _Work(Protocol):
    """What the queue group machine's apply offers (``apply.Apply``)."""

    store: Store
    batch: Batch

    def producer_states(self) -> int: ...


# -- leader side ---------------------------------------------------------------------------------


def expiry_due(
    store: Store, now_ms: int, idle_ms: int, max_states: int | None = None, states: int | None = None
) -> bool:
    """Whether an ``expire_producers`` would find work in this replica's ``store`` (the leader asks
    before proposing, so an idle group adds no entries): idle states, the sweep, or with
    ``max_states`` (the cap to propose; None: the group's voters cannot apply it yet) a cap the
    group does not hold yet, or ``states`` (the live states counted here, if known) above it."""
    if max_states is not None and (stored_cap(store) != max_states or (states or 0) > max_states > 0):
        return True
    if _sweep_start(store) is not None:
        return True
    start, end = _due_range(now_ms - idle_ms)
    return next(iter(store.scan(start, end, limit=1)), None) is not None


def stored_cap(store: Store) -> int:
    """The group's cap on live producer states (0: none)."""
    data = store.get(PRODUCER_CAP)
    return 0 if data is None else keys.decode_u64(data)


# -- the pure apply ------------------------------------------------------------------------------


def apply_expire_producers(work: _Work, cmd: ExpireProducersCommand) -> dict[str, Any]:
    """Forget the states last used before ``now_ms - idle_ms``, then continue the sweep, looking
    at most at ``max`` keys in all (see the module docstring).

    Result: ``{"expired": n, "more": bool}``: ``n`` states were deleted; ``more`` when the step
    ended at its ``max`` (the leader proposes again at once).
    """
    budget = cmd["max"]
    expired = 0
    start, end = _due_range(cmd["now_ms"] - cmd["idle_ms"])
    due = list(work.store.scan(start, end, limit=budget))
    over = _set_cap(work, cmd["max_states"]) - len(due) if "max_states" in cmd else 0
    for index_key, _ in due:
        last_used_ms, topic_id, queue, producer_id = keys.decode_producer_idle_key(index_key)
        work.batch.delete(index_key)
        state_key = keys.producer_key(topic_id, queue, producer_id)
        data = work.store.get(state_key)
        if data is not None and ProducerState.decode(data).last_used_ms == last_used_ms:
            work.batch.delete(state_key)
            expired += 1
    budget -= len(due)
    if over > 0 and budget > 0:
        after = due[-1][0] + b"\x00" if due else PRODUCER_IDLE
        forgotten = forget_least_used(work.store, work.batch, min(over, budget), after, set())
        expired, over, budget = expired + forgotten, over - forgotten, budget - forgotten
    more = budget == 0 or over > 0
    if budget > 0:
        more = _sweep(work, cmd["now_ms"], budget) or over > 0
    return {"expired": expired, "more": more}


def _set_cap(work: _Work, max_states: int) -> int:
    """Store the group's cap (0: none); how many live states are above it."""
    if stored_cap(work.store) != max_states:
        if max_states:
            work.batch.put(PRODUCER_CAP, keys.encode_u64(max_states))
        else:
            work.batch.delete(PRODUCER_CAP)
    return work.producer_states() - max_states if max_states else 0


def forget_least_used(store: Store, batch: Batch, count: int, start: bytes, skip: set[bytes]) -> int:
    """Delete the first ``count`` idle-index keys from ``start`` on, but those in ``skip`` (an
    apply's own), each with its state (unless dangling); returns how many were deleted."""
    forgotten = 0
    if count <= 0:
        return 0
    for index_key, _ in store.scan(start, _IDLE_END):
        if index_key in skip:
            continue
        last_used_ms, topic_id, queue, producer_id = keys.decode_producer_idle_key(index_key)
        batch.delete(index_key)
        state_key = keys.producer_key(topic_id, queue, producer_id)
        data = store.get(state_key)
        if data is not None and ProducerState.decode(data).last_used_ms == last_used_ms:
            batch.delete(state_key)
        forgotten += 1
        if forgotten == count:
            break
    return forgotten


_IDLE_END = bytes([PRODUCER_IDLE[0] + 1])


def _due_range(cutoff_ms: int) -> tuple[bytes, bytes]:
    """The index keys of states last used before ``cutoff_ms`` (none when it is <= 0)."""
    start = PRODUCER_IDLE
    return start, keys.producer_idle_key(max(cutoff_ms, 0), 0, 0, "")


def _sweep_start(store: Store) -> bytes | None:
    """Where the sweep continues; None when it is done."""
    cursor = store.get(PRODUCER_SWEEP)
    if cursor is None:
        return keys.PRODUCER  # not started
    return cursor or None


def _sweep(work: _Work, now_ms: int, budget: int) -> bool:
    """One step of the sweep over at most ``budget`` ``P`` keys; returns whether more is left."""
    start = _sweep_start(work.store)
    if start is None:
        return False
    chunk = list(queues.scan_prefix(work.store, keys.PRODUCER, start=start, limit=budget))
    for state_key, value in chunk:
        state = ProducerState.decode(value)
        if state.last_used_ms is None:
            topic_id, queue, producer_id = keys.decode_producer_key(state_key)
            work.batch.put(state_key, replace(state, last_used_ms=now_ms).encode())
            work.batch.put(keys.producer_idle_key(now_ms, topic_id, queue, producer_id), b"")
    if len(chunk) < budget:
        work.batch.put(PRODUCER_SWEEP, b"")
        return False
    work.batch.put(PRODUCER_SWEEP, chunk[-1][0] + b"\x00")
    return True
