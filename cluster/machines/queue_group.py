"""The queue-group state machine: applies committed commands to one queue group's store.

Invariants (every replica relies on them; tests/unit/test_queue_group.py and test_determinism.py
check them):

- PURE. ``apply`` reads no clock, no randomness and does no I/O except through the ``Store``; time
  enters only as the leader-stamped ``now_ms`` of a command. The same command log gives the same
  store bytes and the same results on every replica.
- The group's time (``GroupTime.now_ms``, key ``T``) never goes backwards, and every op of a
  command applies at it, not at the raw stamp: a command stamped below it (a new leader whose clock
  is behind) is applied at it, and a stamp ahead of the group's previous stamp by more than the
  bound (``GROUP_MAX_STEP_MS``; a ``retain``'s ``max_jump_ms`` for itself) moves it by the bound only
  (:func:`~raftmq.cluster.machines.apply.advance`). So a leader clock that jumps ahead cannot
  expire, age out, time out or retry anything early: receive, the delivery tick, TTLs, locks and
  retention all judge by this one time. A clamped jump is
  reported in :class:`Applied` (``clock_jump_ms``) for the node to log and count.
- NEVER RAISES on input. A malformed or invalid command returns an error result
  (``{"error": {...}}``, codes from ``cluster/base/errors.py``); an unexpected exception in the logic is
  caught and returned as an ``internal`` error. Either way nothing is written except the new
  ``applied_index``, so the entry is not re-applied on replay and ``applied_index`` stays equal to
  the Raft index of the last applied entry.
- The only exception that escapes is ``StoreError`` (including ``CorruptRecord`` found while
  reading): this replica's storage is broken, and answering differently from healthy replicas
  would fork the group. The Raft adapter stops the process on it.
- ``applied_index`` only grows. An entry whose index is ``<= applied_index`` was applied before
  (journal replay after a restart) and is skipped with ``{"skipped": true}``, changing nothing.
  A skipped ``drop_topic`` or ``retain`` still reports the key ranges it removed (``Applied.freed``,
  as they are now): the node's compaction of them may not have run before it stopped.
- ONE ``store.write`` per applied entry, with ``sync=False`` (durability comes from the Raft
  journal, which is replayed from ``applied_index`` after a crash), and that batch always contains
  the new ``applied_index``.
- All-or-nothing: a command is applied whole or not at all, except that produce answers
  ``topic_not_found`` per batch (the leader coalesces several requests into one entry, and one
  request names one topic, so a request is still never half-applied), and ack/nack/extend answer
  ``stale_receipt`` per receipt (a stale receipt changes nothing; the others apply).
- The cache (``cache.py``) of the keys every apply reads (the group's time, queue metas, producer
  states, tombstones) holds what the store holds: written through from each written batch, and
  forgotten on a restore and on a failed write. With or without it, the same bytes and results.
- Bounded work: every command touches a bounded number of keys (its own size, or the ``max`` of
  a ``deliver_tick``/``receive``/``expire_producers``, or the ``max_batches`` of a ``retain``);
  what is left is continued by the next command.

Receive/ack, delayed messages and locks live in ``cluster/machines/delivery/__init__.py``; the expiry of idle
producer states in ``cluster/machines/producers.py``; deduplicated appends (``dedup_produce``, with
their bounded 5-minute window) in ``cluster/machines/dedup.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused as _Rejected
from raftmq.cluster.base.errors import error_body
from raftmq.cluster.commands import (
    BadCommand,
    Command,
    CommitFencedCommand,
    CommitOffsetsCommand,
    DropTopicCommand,
    RetainCommand,
)
from raftmq.cluster.machines import dedup, delivery, producers, segments
from raftmq.cluster.machines.append import apply_append
from raftmq.cluster.machines.apply import Apply, advance, group_time
from raftmq.cluster.machines.cache import DEFAULT_CACHE_ENTRIES, StateCache
from raftmq.cluster.machines.freed import freed_before, topic_ranges
from raftmq.storage import keys, queues
from raftmq.storage.keys import APPLIED, GroupTime, QueueMeta
from raftmq.storage.records import decode_header
from raftmq.storage.store import Batch, Store, StoreError

__all__ = ["Applied", "QueueGroupMachine", "QueueHigh", "advance", "group_time", "retention_due"]

_log = structlog.get_logger(__name__)


class QueueHigh(NamedTuple):
    """A queue whose ``high_offset`` grew in an apply."""

    topic_id: int
    queue: int
    high_offset: int


@dataclass(frozen=True, slots=True)
class Applied:
    """What one apply changed, for the ``on_applied`` hook (e.g. to wake long-polls).

    Attributes:
        index: The raft index just applied.
        grown: The queues that received messages, with their new ``high_offset``.
        changed: ``(topic_id, queue)`` whose receive/ack state changed so that a waiting receiver
            may find something (a retry scheduled, a cursor rewound, a lock released).
        scheduled: A delayed message or an in-flight deadline was added: the leader's tick may
            have to run earlier than it planned.
        due_ms: The earliest due time of the delayed messages and in-flight deadlines added
            (None: none), however far ahead: the leader's tick knows its schedule without a look
            at the store (``cluster/node/ticks.py``).
        parked: ``(topic_id, topic, consumer group)`` of dead letters parked because their
            subscription has no dead-letter topic (its leader creates it: ``docs/delivery.md``).
        clock_jump_ms: The entry's stamp was this far ahead of the group's previous stamp, beyond
            the bound: the group's time moved by the bound only (None: no clamp).
        freed: Key ranges ``[start, end)`` whose messages the entry removed (retention, a dropped
            topic): the node compacts them so that the disk is freed (``Store.compact_range``).
    """

    index: int
    grown: tuple[QueueHigh, ...]
    changed: tuple[tuple[int, int], ...] = ()
    scheduled: bool = False
    parked: tuple[tuple[int, str, str], ...] = ()
    clock_jump_ms: int | None = None
    freed: tuple[tuple[bytes, bytes], ...] = ()
    due_ms: int | None = None

    def news(self) -> bool:
        """Whether the node has something to do about this apply: wake, seal, schedule, park or
        compact (an apply that only moved the applied index has nothing)."""
        return bool(self.grown or self.changed or self.scheduled or self.parked or self.freed)

    def only_grown(self) -> bool:
        """Whether queues grew and nothing else in :meth:`news` happened."""
        return bool(self.grown) and not (self.changed or self.scheduled or self.parked or self.freed)


class QueueGroupMachine:
    """The deterministic state machine of one queue group.

    Args:
        store: The group's store; ``applied_index`` is loaded from it.
        group_id: The queue group's id (for logs).
        max_entry_messages: A produce command with more messages in total is rejected with
            ``request_too_large``.
        cache_entries: The most store keys the machine keeps decoded between entries
            (``cache.py``; 0: none, every apply reads the store).

    Attributes:
        on_applied: Optional hook called after every applied (written) entry with an
            :class:`Applied`; set by the node. It runs on the apply thread, so it must be quick;
            its exceptions are logged and swallowed.
        refuses: TEST FAULT (``faults.previous_release_node``): an entry for which it answers
            True is refused (``bad_request``, nothing written), as a replica of an older release
            refuses an op or field it does not know. None in production.
    """

    def __init__(
        self,
        store: Store,
        group_id: int,
        *,
        max_entry_messages: int = 100_000,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
    ) -> None:
        if max_entry_messages < 1:
            raise ValueError("max_entry_messages must be at least 1")
        self._store = store
        # Invariant: holds what the store holds (cache.py); forgotten when the store is replaced.
        self._cache = StateCache(cache_entries)
        self._group_id = group_id
        self._max_entry_messages = max_entry_messages
        self._applied_index = queues.applied_index(store)
        self.on_applied: Callable[[Applied], None] | None = None
        self.refuses: Callable[[bytes], bool] | None = None

    @property
    def applied_index(self) -> int:
        """The raft index of the last applied entry (0 before the first)."""
        return self._applied_index

    @property
    def counted_producer_states(self) -> int | None:
        """The live producer states of the group, if the apply counted them (a hint for the
        leader's expiry: read off the apply thread)."""
        return self._cache.counted_producer_states

    @property
    def store(self) -> Store:
        """The group's store (readers outside the apply thread use ``storage/queues.py`` on it)."""
        return self._store

    def restore(self, checkpoint_dir: str) -> None:
        """Replace the whole state with a checkpoint taken on a peer (a Raft snapshot install).

        Must run on the apply thread, between applies. ``applied_index`` is reloaded from the
        restored store, so entries the checkpoint already covers are skipped afterwards.

        Raises:
            StoreError: the store cannot restore (it has no ``restore_from``, as ``RocksStore``
                has) or the restore failed.
        """
        restore_from = getattr(self._store, "restore_from", None)
        if restore_from is None:
            raise StoreError(f"{type(self._store).__name__} cannot restore a checkpoint")
        try:
            restore_from(checkpoint_dir)
        finally:
            self._cache.clear()  # the old contents, the new ones, or a closed store: none is cached
        self._applied_index = queues.applied_index(self._store)

    def apply(self, index: int, command: bytes) -> dict[str, Any]:
        """Apply the committed entry ``index`` carrying ``command``.

        Args:
            index: The entry's raft index (> 0).
            command: The entry's bytes (see ``cluster/commands/__init__.py``).

        Returns:
            The result: ``{"skipped": true}`` for an already applied index, an error body for an
            invalid command, otherwise the op's result (see the op methods).

        Raises:
            StoreError: the store failed; this replica must stop.
        """
        # Invariant: applied_index only grows; an entry at or below it is skipped.
        if index <= self._applied_index:
            if self.on_applied is not None:
                freed = freed_before(self._store, command)
                if freed:
                    self._notify(Applied(index, (), freed=freed))
            return {"skipped": True}
        work = Apply(self._store, index, self._cache)
        try:
            if self.refuses is not None and self.refuses(command):
                raise BadCommand(errors.BAD_REQUEST, "unknown op or field (an older release)")
            before = work.time()
            advanced: dict[int, tuple[GroupTime, int | None]] = {}  # stamp -> advance(before, stamp)

            def time_at(stamp: int) -> int:
                advanced[stamp] = advance(before, stamp)
                return advanced[stamp][0].now_ms

            cmd, stamped = commands.decode_stamped(command, time_at)
            if stamped is not None:
                bound = cmd["max_jump_ms"] if cmd["op"] == "retain" else None
                known = advanced.get(stamped) if bound is None else None  # not computed twice
                after, work.clock_jump_ms = known or advance(before, stamped, bound)
                work.set_time(after)
            if cmd["op"] == "retain":
                if stamped is not None:  # its own bound may differ from the stored one
                    cmd["now_ms"] = work.time().now_ms
                result = self._retain(work, cmd, before, stamped)
            else:
                result = self._dispatch(work, cmd)
            batch = work.finish()
        except StoreError:
            self._cache.clear()
            raise
        except Exception as e:
            # Whatever went wrong, the partly built batch is dropped: nothing but applied_index
            # is written, so the command is all-or-nothing.
            result, batch = self._error_result(index, e), Batch()
            work.grown.clear()
            work.changed.clear()
            work.scheduled = False
            work.due_ms = None
            work.parked.clear()
            work.clock_jump_ms = None
            work.freed.clear()
        batch.put(APPLIED, keys.encode_u64(index))
        try:
            self._store.write(batch, sync=False)
        except StoreError:
            self._cache.clear()  # keeps nothing the store may not hold
            raise
        self._cache.written(batch, work.encoded)
        self._applied_index = index
        grown = tuple(QueueHigh(t, q, h) for (t, q), h in work.grown.items())
        self._notify(
            Applied(
                index,
                grown,
                tuple(work.changed),
                work.scheduled,
                tuple(work.parked),
                work.clock_jump_ms,
                tuple(work.freed),
                work.due_ms,
            )
        )
        return result

    def _error_result(self, index: int, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, BadCommand | _Rejected):
            return exc.body()
        _log.exception("apply_failed", group_id=self._group_id, index=index)
        return error_body(errors.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _notify(self, applied: Applied) -> None:
        hook = self.on_applied
        if hook is None:
            return
        try:
            hook(applied)
        except Exception:
            _log.exception("on_applied_failed", group_id=self._group_id, index=applied.index)

    def _dispatch(self, work: Apply, cmd: Command) -> dict[str, Any]:
        if cmd["op"] == "append" and "take" in cmd:  # the field level append.take
            work.appended = {}
            result = apply_append(work, cmd, self._max_entry_messages)
            return {**result, **delivery.take_along(work, cmd["take"], cmd["now_ms"], work.index)}
        if cmd["op"] == "append" or cmd["op"] == "produce":
            return apply_append(work, cmd, self._max_entry_messages)
        if cmd["op"] == "commit_offsets":
            return self._commit_offsets(work, cmd)
        if cmd["op"] == "drop_topic":
            return self._drop_topic(work, cmd)
        if cmd["op"] == "noop":
            return {"ok": True}
        if cmd["op"] == "dedup_produce":
            return dedup.apply_dedup_produce(work, cmd, self._max_entry_messages)
        return self._dispatch_delivery(work, cmd)

    def _dispatch_delivery(self, work: Apply, cmd: Command) -> dict[str, Any]:
        op = cmd["op"]
        if cmd["op"] == "subscribe":
            return delivery.subscribe(work, cmd)
        if cmd["op"] == "receive":
            return delivery.receive(work, cmd, work.index)
        if cmd["op"] == "receive_ordered":
            return delivery.receive_ordered(work, cmd, work.index)
        if cmd["op"] == "ack" or cmd["op"] == "nack" or cmd["op"] == "extend":
            return delivery.ack_nack_extend(work, cmd)
        if cmd["op"] == "ack_receive":
            return delivery.ack_receive(work, cmd, work.index)
        if cmd["op"] == "release":
            return delivery.release(work, cmd)
        if cmd["op"] == "deliver_tick":
            return delivery.deliver_tick(work, cmd)
        if cmd["op"] == "lock":
            return delivery.lock(work, cmd)
        if cmd["op"] == "unlock":
            return delivery.unlock(work, cmd)
        if cmd["op"] == "commit_fenced":
            fenced = sorted(cmd["offsets"])
            delivery.check_fence(work.store, cmd["group"], cmd["topic_id"], fenced, cmd["epoch"])
            return self._commit_offsets(work, cmd)
        if cmd["op"] == "redrive":
            return delivery.redrive(work, cmd)
        if cmd["op"] == "seal_segment":
            return segments.apply_seal_segment(work, cmd)
        if cmd["op"] == "expire_producers":
            return producers.apply_expire_producers(work, cmd)
        if cmd["op"] == "expire_subscriptions":
            return delivery.expire_subscriptions(work, cmd)
        if cmd["op"] == "touch_subscriptions":
            return delivery.touch_subscriptions(work, cmd)
        raise AssertionError(f"op {op} has no handler")  # commands.decode knows no other op

    def _commit_offsets(self, work: Apply, cmd: CommitOffsetsCommand | CommitFencedCommand) -> dict[str, Any]:
        """Store the consumer group's offsets. Each must be in ``[0, high_offset]`` of its queue
        (below ``low_offset`` is allowed: a lagging consumer). Receive/ack state of the group is
        kept consistent (``delivery.on_commit``: pending records below the offset are finished; a
        commit below the floor rewinds).

        With ``advance`` (a consumer's commit) a queue's offset is applied only if it is above the
        stored one; otherwise the stored offset is kept and nothing of that queue changes: a copy of
        an older commit that arrives late (held up at a paused node, or a retry racing the
        original) cannot move a newer one back. Without it (an explicit set, and every entry
        written before the field) the offset is stored as given, so a rewind moves it back.

        Result: ``{"ok": true, "offsets": {"<queue>": {"offset": stored, "applied": bool}}}``,
        ``applied`` false for a kept (stale) offset."""
        topic_id = cmd["topic_id"]
        if work.is_dropped(topic_id):
            raise _Rejected(errors.TOPIC_NOT_FOUND, f"topic {topic_id} was dropped")
        for queue, offset in cmd["offsets"].items():
            meta = work.meta(topic_id, queue)
            if offset > meta.high_offset:
                raise _Rejected(
                    errors.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is above high_offset {meta.high_offset} of queue {queue}",
                    queue=queue,
                    offset=offset,
                    low_offset=meta.low_offset,
                    high_offset=meta.high_offset,
                )
        answer: dict[str, dict[str, Any]] = {}
        for queue, offset in cmd["offsets"].items():
            current = queues.committed_offset(work.store, cmd["group"], topic_id, queue)
            if cmd["advance"] and current is not None and offset <= current:
                answer[str(queue)] = {"offset": current, "applied": False}
                continue
            stored = delivery.on_commit(work, cmd["group"], topic_id, queue, offset)
            work.batch.put(keys.offset_key(topic_id, queue, cmd["group"]), keys.encode_u64(stored))
            answer[str(queue)] = {"offset": stored, "applied": True}
        delivery.mark_offsets_shared(work, topic_id, cmd["group"])
        return {"ok": True, "offsets": answer}

    def _retain(
        self, work: Apply, cmd: RetainCommand, before: GroupTime, stamped: int | None
    ) -> dict[str, Any]:
        """Remove whole record batches from the low end of each queue while the batch was appended
        before ``clock - max_age_ms`` or the queue holds more than ``max_bytes``; ``clock`` is the
        group's time (:func:`~raftmq.cluster.machines.apply.advance`, bounded by ``max_jump_ms``;
        for a command without ``max_jump_ms``, written before the bound, its stamp as it is). At
        most ``max_batches`` batches in all; the next ``retain`` goes on. A queue may be emptied
        (``low_offset == high_offset``). Only batch headers are decoded.

        Result: ``{"removed": [{"topic_id", "queue", "low_offset"}]}`` for the queues whose
        ``low_offset`` moved, plus ``"more": bool`` with ``max_batches`` (the bound stopped
        removal before a batch that was due), plus
        ``"clock_jump_ms": n, "retention_clock_ms": t`` when the stamp jumped ``n`` ms ahead of the
        group's previous stamp and retention used ``t`` instead."""
        if cmd["max_jump_ms"] is None and stamped is not None:
            clock_ms = max(stamped, before.now_ms)
        else:
            clock_ms = cmd["now_ms"]
        jump_ms = work.clock_jump_ms if cmd["max_jump_ms"] is not None else None
        budget = cmd["max_batches"]
        removed: list[dict[str, Any]] = []
        more = False
        for entry in cmd["queues"]:
            topic_id, queue = entry["topic_id"], entry["queue"]
            max_age_ms, max_bytes = entry["max_age_ms"], entry["max_bytes"]
            meta = work.meta(topic_id, queue)
            if meta.low_offset == meta.high_offset or (max_age_ms is None and max_bytes is None):
                continue
            cutoff_ms = None if max_age_ms is None else clock_ms - max_age_ms
            point = _retention_point(work.store, topic_id, queue, meta, cutoff_ms, max_bytes, budget)
            if budget is not None:
                budget -= point.batches
            more = more or point.more
            if point.low == meta.low_offset:
                continue
            start, _ = keys.queue_range(keys.RECORD, topic_id, queue)
            end = keys.record_key(topic_id, queue, point.low)
            work.batch.delete_range(start, end)
            work.freed.append((start, end))
            work.set_meta(topic_id, queue, QueueMeta(point.low, meta.high_offset, point.retained))
            removed.append({"topic_id": topic_id, "queue": queue, "low_offset": point.low})
        result: dict[str, Any] = {"removed": removed}
        if budget is not None:
            result["more"] = more
        if jump_ms is not None:
            result.update(clock_jump_ms=jump_ms, retention_clock_ms=clock_ms)
        return result

    def _drop_topic(self, work: Apply, cmd: DropTopicCommand) -> dict[str, Any]:
        """Delete every key of the topic and leave a tombstone, so a produce or commit that raced
        the drop is refused (``topic_not_found``) instead of resurrecting the topic. Topic ids are
        never reused. Result: ``{"ok": true}``."""
        topic_id = cmd["topic_id"]
        for start, end in topic_ranges(topic_id):
            work.batch.delete_range(start, end)
            work.freed.append((start, end))
        work.batch.put(keys.dropped_key(topic_id), b"")
        return {"ok": True}


def retention_due(
    store: Store, entries: list[dict[str, Any]], now_ms: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Which ``retain`` entries (``{"topic_id", "queue", "max_age_ms", "max_bytes"}``) would remove
    something at the group's time ``now_ms`` in this replica's ``store``, and the earliest time one
    of the others falls due by age (None: none will unless it grows). The leader asks before it
    proposes, so that a retain lists only the queues with work, and none is proposed when none has
    any: an empty queue, or one within its bounds, costs a key read, not an entry. Same rule as
    the apply (``_retention_point``): a batch appended before ``now_ms - max_age_ms``, or more
    than ``max_bytes`` retained."""
    due: list[dict[str, Any]] = []
    next_ms: int | None = None
    for entry in entries:
        topic_id, queue = entry["topic_id"], entry["queue"]
        max_age_ms, max_bytes = entry["max_age_ms"], entry["max_bytes"]
        meta = queues.queue_meta(store, topic_id, queue)
        if meta is None or meta.low_offset == meta.high_offset:
            continue
        if max_bytes is not None and meta.retained_bytes > max_bytes:
            due.append(entry)
            continue
        if max_age_ms is None:
            continue
        start, end = keys.queue_range(keys.RECORD, topic_id, queue)
        first = next(iter(store.scan(start, end, limit=1)), None)
        if first is None:
            continue
        expires_ms = decode_header(first[1]).append_time_ms + max_age_ms + 1  # due once older
        if expires_ms <= now_ms:
            due.append(entry)
        elif next_ms is None or expires_ms < next_ms:
            next_ms = expires_ms
    return due, next_ms


class _RetentionPoint(NamedTuple):
    low: int  # the new low_offset
    retained: int  # the new retained_bytes
    batches: int  # batches removed
    more: bool  # the budget stopped removal before a batch that was due


def _retention_point(
    store: Store,
    topic_id: int,
    queue: int,
    meta: QueueMeta,
    cutoff_ms: int | None,
    max_bytes: int | None,
    budget: int | None,
) -> _RetentionPoint:
    """Where the low end moves when due batches are removed, at most ``budget`` of them. Reads the
    batches in key order one at a time (never more than ``budget + 1``), decoding only headers."""
    low, retained, batches = meta.low_offset, meta.retained_bytes, 0
    start, end = keys.queue_range(keys.RECORD, topic_id, queue)
    limit = None if budget is None else budget + 1
    for _, value in store.scan(start, end, limit=limit):
        header = decode_header(value)
        expired = cutoff_ms is not None and header.append_time_ms < cutoff_ms
        oversize = max_bytes is not None and retained > max_bytes
        if not (expired or oversize):
            break
        if batches == budget:
            return _RetentionPoint(low, retained, batches, True)
        low, retained, batches = header.end_offset, retained - len(value), batches + 1
    return _RetentionPoint(low, retained, batches, False)
