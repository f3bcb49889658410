"""The working state of one queue-group apply (:class:`Apply`): the batch being built and an overlay
of what the command changed so far. The queue-group machine (``queue_group.py``) creates one per
entry; the op families (``delivery/``, ``producers.py``, ``segments.py``) read and write through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from raftmq.cluster.machines.cache import StateCache
from raftmq.cluster.machines.producers import forget_least_used
from raftmq.storage import keys
from raftmq.storage.keys import GROUP_MAX_STEP_MS, GROUP_TIME, GroupTime, ProducerState, QueueMeta
from raftmq.storage.store import Batch, Store

__all__ = ["Apply", "advance", "group_now", "group_time"]

_T = TypeVar("_T")


def group_time(store: Store) -> GroupTime:
    """The group's applied time (all zero before the first stamped command)."""
    data = store.get(GROUP_TIME)
    return GroupTime() if data is None else GroupTime.decode(data)


CATCH_UP_DIVISOR = 10
"""A group's time that runs behind its stamps (after a spell without a leader longer than the
bound) moves ``1 + 1/CATCH_UP_DIVISOR`` times as fast as the stamps until it has caught up."""


def advance(
    before: GroupTime, stamped_ms: int, max_step_ms: int | None = None
) -> tuple[GroupTime, int | None]:
    """The group's time after a command stamped ``stamped_ms``, and the jump (ms) that was
    clamped, or None. The bound is :data:`GROUP_MAX_STEP_MS`, or ``max_step_ms`` (a ``retain``'s
    ``max_jump_ms``, for that command).

    The time moves by the stamps' progress since the previous stamp, at most ``max_step_ms`` per
    command, never beyond the stamp itself nor beyond the previous stamp plus ``max_step_ms``, and
    never backwards. A leader whose clock is D ahead moves it by the bound once, then at the
    true rate; when leadership goes back to a true clock it waits (the stamps are lower) and follows
    again. So nothing the group times (a TTL, an age limit, a visibility deadline, a retry, a
    lease) ends more than the bound early, whatever the jump. A group that applied no stamped
    command for longer than the bound (no leader: a leader ticks well within it,
    ``TickLoops.retention_once``) runs late by the excess (late, never early), and catches up at
    :data:`CATCH_UP_DIVISOR`'s rate: each command within the bound may move it a tenth of its
    step more while it is behind the stamp (a clamped command moves it by the bound exactly). An
    hour without a leader is made up in about nine hours; the price is that a leader clock that
    jumped ahead pulls the group's time ahead of the true time by at most the bound plus a tenth
    of the time it leads. The very first stamp has nothing to compare with and is taken as it is."""
    bound = GROUP_MAX_STEP_MS if max_step_ms is None else max_step_ms
    if not before.stamp_ms and not before.now_ms:
        return GroupTime(stamped_ms, stamped_ms), None
    progress = stamped_ms - before.stamp_ms
    step = min(max(progress, 0), bound)
    behind = stamped_ms - before.now_ms - step  # what the stamp is still ahead after the step
    # Only a command within the bound catches up: a clamped one moves by the bound exactly.
    catch_up = min(max(behind, 0), step // CATCH_UP_DIVISOR) if progress <= bound else 0
    now = max(
        before.now_ms,
        min(before.now_ms + step + catch_up, stamped_ms, before.stamp_ms + bound + catch_up),
    )
    return GroupTime(now, stamped_ms), (progress if progress > bound else None)


def group_now(store: Store, wall_ms: int) -> int:
    """The group's time a command stamped ``wall_ms`` now would apply at: what a leader compares
    the group's deadlines and due times with (they are on the group's time, not its clock)."""
    return advance(group_time(store), wall_ms)[0].now_ms


class Apply:
    """The working state of one apply: the batch being built and an overlay of the queue metas and
    producer states it changed, so that later batches of the same command see earlier ones.

    What the overlay has not seen is read through ``cache`` (the machine's, kept between entries:
    ``cache.py``), which reads the store when it does not hold the key; ``encoded`` tells the cache
    which of the batch's puts are the encodings of which values.

    Invariant: a stored producer state with ``last_used_ms = t`` has exactly one idle-index key, at
    ``t`` (``storage/keys.py``); :meth:`finish` moves it when a state's time changes."""

    def __init__(self, store: Store, index: int, cache: StateCache | None = None) -> None:
        self.store = store
        self.index = index
        self.batch = Batch()
        self.encoded: dict[bytes, tuple[bytes, object]] = {}  # key -> (bytes put, value), by finish
        self._cache = StateCache(0) if cache is None else cache
        self.grown: dict[tuple[int, int], int] = {}
        self.changed: dict[tuple[int, int], None] = {}  # an ordered set
        self.scheduled = False
        self.due_ms: int | None = None  # Applied.due_ms
        self.parked: dict[tuple[int, str, str], None] = {}  # an ordered set (Applied.parked)
        self.clock_jump_ms: int | None = None  # Applied.clock_jump_ms
        self.freed: list[tuple[bytes, bytes]] = []  # Applied.freed
        # The batches this apply stored, per (topic, queue): (base offset, end offset, value,
        # append time), kept only for an append with a take-along (the store does not show them
        # before the apply's write; the take-along's receive reads them here).
        self.appended: dict[tuple[int, int], list[tuple[int, int, bytes, int]]] | None = None
        self._metas: dict[tuple[int, int], QueueMeta] = {}
        self._changed_metas: dict[tuple[int, int], QueueMeta] = {}
        self._producers: dict[tuple[int, int, str], ProducerState] = {}
        self._changed_producers: dict[tuple[int, int, str], ProducerState] = {}
        self._stored_last_used: dict[tuple[int, int, str], int | None] = {}  # as loaded
        self._dropped: dict[int, bool] = {}
        self._producers_timed: bool | None = None
        self._time: GroupTime | None = None
        self._time_changed = False

    def time(self) -> GroupTime:
        """The group's applied time, as changed so far in this apply."""
        if self._time is None:
            self._time = self._cache.read(self.store, GROUP_TIME, GroupTime.decode) or GroupTime()
        return self._time

    def set_time(self, time: GroupTime) -> None:
        self._time, self._time_changed = time, True

    def producers_timed(self) -> bool:
        """Whether producer states record their last use: from the group's first
        ``expire_producers`` on (it writes the sweep key), so that a group never sent one writes
        exactly what releases before producer expiry wrote (a rolling upgrade, a rollback)."""
        if self._producers_timed is None:
            self._producers_timed = self._cache.read(self.store, keys.PRODUCER_SWEEP, bytes) is not None
        return self._producers_timed

    def producer_states(self) -> int:
        """The live producer states (``W`` keys) the store holds before this apply."""
        return self._cache.producer_states(self.store)

    def is_dropped(self, topic_id: int) -> bool:
        if topic_id not in self._dropped:
            tombstone = self._cache.read(self.store, keys.dropped_key(topic_id), bytes)
            self._dropped[topic_id] = tombstone is not None
        return self._dropped[topic_id]

    def add_due(self, due_ms: int) -> None:
        """A delayed message or an in-flight deadline due at ``due_ms`` was put (``Applied.due_ms``)."""
        if self.due_ms is None or due_ms < self.due_ms:
            self.due_ms = due_ms

    def read_kept(self, key: bytes, decode: Callable[[bytes], _T]) -> _T | None:
        """The stored value at ``key``, of a kind the machine's cache keeps (``cache.py``), decoded
        by ``decode`` (the same for a key every time), as of before this apply."""
        return self._cache.read(self.store, key, decode)

    def retries(self, prefix: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        """The first ``limit`` pairs of a subscription queue's retry index (``prefix``) as of
        before this apply, read lazily, through the machine's cache (which knows the empty ones)."""
        return self._cache.retries(self.store, prefix, limit)

    def meta(self, topic_id: int, queue: int) -> QueueMeta:
        key = (topic_id, queue)
        if key not in self._metas:
            stored = self._cache.read(self.store, keys.meta_key(topic_id, queue), QueueMeta.decode)
            self._metas[key] = stored or QueueMeta()
        return self._metas[key]

    def set_meta(self, topic_id: int, queue: int, meta: QueueMeta) -> None:
        self._metas[(topic_id, queue)] = self._changed_metas[(topic_id, queue)] = meta

    def producer(self, topic_id: int, queue: int, producer_id: str) -> ProducerState:
        key = (topic_id, queue, producer_id)
        if key not in self._producers:
            stored = self._cache.read(self.store, keys.producer_key(*key), ProducerState.decode)
            state = ProducerState() if stored is None else stored
            self._producers[key] = state
            self._stored_last_used[key] = None if stored is None else state.last_used_ms
        return self._producers[key]

    def set_producer(self, topic_id: int, queue: int, producer_id: str, state: ProducerState) -> None:
        """Store ``state``; it must have been read with :meth:`producer` in this apply."""
        key = (topic_id, queue, producer_id)
        self._producers[key] = self._changed_producers[key] = state

    def finish(self) -> Batch:
        """The batch with the changed metas and producer states (and their idle-index keys) added,
        in first-change order."""
        # Each value is kept for the cache as a read of its bytes gives it back, not as it was
        # written: the two differ where a decoding normalises (a group time stamped 0 reads back
        # stamped at its time), and a replica that reads the store must see the same.
        if self._time_changed and self._time is not None:
            self.put_kept(GROUP_TIME, self._time.encode(), GroupTime.decode)
        for (topic_id, queue), meta in self._changed_metas.items():
            self.put_kept(keys.meta_key(topic_id, queue), meta.encode(), QueueMeta.decode)
        new_states, used = 0, set()
        for key, state in self._changed_producers.items():
            self.put_kept(keys.producer_key(*key), state.encode(), ProducerState.decode)
            stored, now = self._stored_last_used[key], state.last_used_ms
            if stored is not None:  # its idle key, moved or not (the same time), is this entry's
                used.add(keys.producer_idle_key(stored, *key))
            if now is not None and now != stored:
                if stored is None:
                    new_states += 1
                else:
                    self.batch.delete(keys.producer_idle_key(stored, *key))
                self.batch.put(keys.producer_idle_key(now, *key), b"")
        if new_states:
            self._cap_producers(new_states, used)
        return self.batch

    def _cap_producers(self, new_states: int, used: set[bytes]) -> None:
        """Forget as many least recently used states as ``new_states`` pass the group's cap by
        (at most that many: a lowered cap is reached by expiry steps), never one this apply wrote
        (``used``: their idle keys as stored, also when the entry kept the same time; the new
        states' keys are not in the store yet) (``producers.py``, the cap)."""
        cap = self._cache.read(self.store, keys.PRODUCER_CAP, keys.decode_u64)
        if cap:
            over = self.producer_states() + new_states - cap
            forget_least_used(self.store, self.batch, min(over, new_states), keys.PRODUCER_IDLE, used)

    def put_kept(self, key: bytes, data: bytes, decode: Callable[[bytes], object]) -> None:
        """Put ``data`` at ``key``, of a kind the machine's cache keeps, and have the cache keep it
        as a read of ``data`` decodes it (not read again by the next entry)."""
        self.batch.put(key, data)
        self.encoded[key] = (data, decode(data))
