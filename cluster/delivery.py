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

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from raftmq.storage import keys, queues
from raftmq.storage.keys import (
    STATE_INFLIGHT,
    STATE_RETRY,
    LockState,
    PendingRecord,
    QueueMeta,
)
from raftmq.storage.queues import OffsetOutOfRange, read_delivery_fields, read_messages, scan_prefix
from raftmq.storage.records import Message, NewMessage, decode_batch, encode_batch
from raftmq.storage.store import Store

from . import errors
from .errors import ErrorCode, error_body

if TYPE_CHECKING:
    from .commands import (
        DeliverTickCommand,
        LockCommand,
        Receipt,
        ReceiptsCommand,
        ReceiveCommand,
        RedriveCommand,
        SubscribeCommand,
        UnlockCommand,
    )
    from .queue_group import _Apply

__all__ = [
    "DEFAULT_BACKOFF_MS",
    "DEFAULT_MAX_DELIVERIES",
    "DLQ_HEADER_PREFIX",
    "REDRIVE_GROUP_HEADER",
    "Refused",
    "Subscription",
    "ack_nack_extend",
    "available",
    "check_fence",
    "deliver_tick",
    "dlq_topic_name",
    "lock",
    "on_commit",
    "read_subscription",
    "receive",
    "redrive",
    "store_delayed",
    "subscribe",
    "unlock",
]

DEFAULT_MAX_DELIVERIES = 16
DEFAULT_BACKOFF_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
"""RocketMQ's retry levels from 10 s on: attempt ``n`` failed -> due ``DEFAULT_BACKOFF_MS[n - 1]``
later (the last level repeats)."""

DLQ_HEADER_PREFIX = "raftmq-dlq-"
"""Headers a dead letter gets (``raftmq-dlq-topic``, ``-queue``, ``-offset``, ...); redrive strips them."""
REDRIVE_GROUP_HEADER = "raftmq-redrive-group"
"""Set on a redriven message: only this consumer group receives it; others skip it as finished."""

WAKE_WITHIN_MS = 1000
"""An in-flight deadline closer than this to the command's ``now_ms`` wakes the leader's tick loop
(``Applied.scheduled``); a later one is seen when the loop next looks, which it does at least every
``delivery.tick_ms`` (200 ms), so it is still expired on time. Waking the loop for every receive
would make it look up the earliest deadline after every receive."""
READ_GAP = 16
"""Receipts of one queue whose offsets are at most this far apart are looked up with one scan of
the pending records between them rather than one read each (a delivery's offsets are mostly
consecutive); a scan reads at most this many records per receipt."""
SCAN_BUDGET = 4096
"""Most index entries and messages one ``receive`` looks at (dangling entries and skipped
messages count), so one command does bounded work; the next one continues."""
REDRIVE_MAX_PER_COMMAND = 10_000


class Refused(Exception):
    """A valid command that cannot be applied; nothing is written but ``applied_index``."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


def dlq_topic_name(topic: str, group: str) -> str:
    """The dead-letter topic of consumer group ``group`` on ``topic``."""
    return f"{topic}.{group}.dlq"


@dataclass(frozen=True, slots=True)
class Subscription:
    """The settings of one consumer group on one topic, stored in each queue group of the topic.

    Attributes:
        topic: The topic's name (for the dead letters' headers).
        dlq_topic_id: The dead-letter topic, whose queue ``q`` lives in the same queue group as
            queue ``q`` of the topic; None until the metadata group created it.
        max_deliveries: After this many deliveries a message goes to the dead-letter topic.
        backoff_ms: Delay before retry ``n`` (``backoff_ms[n - 1]``, the last repeating).
    """

    topic: str
    dlq_topic_id: int | None
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS

    def backoff(self, attempts: int) -> int:
        return self.backoff_ms[min(max(attempts, 1), len(self.backoff_ms)) - 1]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "dlq_topic_id": self.dlq_topic_id,
            "max_deliveries": self.max_deliveries,
            "backoff_ms": list(self.backoff_ms),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Subscription:
        return cls(d["topic"], d["dlq_topic_id"], d["max_deliveries"], tuple(d["backoff_ms"]))


def read_subscription(store: Store, topic_id: int, group: str) -> Subscription | None:
    """The stored subscription of ``group`` on ``topic_id``, or None."""
    data = store.get(keys.subscription_key(topic_id, group))
    return None if data is None else Subscription.from_json(orjson.loads(data))


# -- the working state of one apply -------------------------------------------------------------


@dataclass
class _Sub:
    """Cursor and floor of one (topic, queue, group) during an apply."""

    cursor: int | None  # None: never received from
    floor: int | None  # the committed offset; None: none yet
    stored_cursor: int | None
    stored_floor: int | None
    gone: set[int] = field(default_factory=set)  # offsets whose record this apply deleted
    touched: bool = False
    new: set[int] = field(default_factory=set)  # offsets given a pending record in this apply


class _Work:
    """An overlay over the store for one delivery op: pending records, subscription cursors and
    floors, locks and appends made earlier in the same command are seen by later steps."""

    def __init__(self, work: _Apply, now_ms: int) -> None:
        self.work = work
        self.store = work.store
        self.batch = work.batch
        self.now_ms = now_ms
        self._pending: dict[bytes, PendingRecord | None] = {}
        self._decoded: dict[bytes, PendingRecord] = {}  # by stored value: a delivery's share one
        self._prefixes: dict[tuple[int, int, str], bytes] = {}
        self._deadline_prefixes: dict[tuple[int, int, int, str], bytes] = {}
        self._subs: dict[tuple[int, int, str], _Sub] = {}
        self._subscriptions: dict[tuple[int, str], Subscription | None] = {}
        self._appends: dict[tuple[int, int], list[NewMessage]] = {}

    # reads

    def _prefix(self, topic_id: int, queue: int, group: str) -> bytes:
        """The prefix of the pending records of one subscription queue (cached: it is per message)."""
        k = (topic_id, queue, group)
        prefix = self._prefixes.get(k)
        if prefix is None:
            prefix = self._prefixes[k] = keys.sub_key(keys.PENDING, topic_id, queue, group)
        return prefix

    def pending(self, topic_id: int, queue: int, group: str, offset: int) -> PendingRecord | None:
        return self.pending_at(self._prefix(topic_id, queue, group) + keys.encode_u64(offset))

    def pending_at(self, key: bytes) -> PendingRecord | None:
        """The pending record at ``key`` (a pending key), seeing this apply's changes."""
        try:
            return self._pending[key]
        except KeyError:
            data = self.store.get(key)
            rec = self._pending[key] = None if data is None else self._decode(data)
            return rec

    def _decode(self, data: bytes) -> PendingRecord:
        rec = self._decoded.get(data)
        if rec is None:
            rec = self._decoded[data] = PendingRecord.decode(data)
        return rec

    def load_pending(self, topic_id: int, queue: int, group: str, offsets: Iterable[int]) -> None:
        """Read the pending records of ``offsets`` into the overlay with few store calls: offsets at
        most ``READ_GAP`` apart are read with one scan (only a cost: the records read are the same)."""
        prefix = self._prefix(topic_id, queue, group)
        todo = sorted({o for o in offsets if prefix + keys.encode_u64(o) not in self._pending})
        i = 0
        while i < len(todo):
            j = i
            while j + 1 < len(todo) and todo[j + 1] - todo[j] <= READ_GAP:
                j += 1
            if i == j:
                self.pending(topic_id, queue, group, todo[i])
            else:
                wanted = {prefix + keys.encode_u64(o) for o in todo[i : j + 1]}
                end = prefix + keys.encode_u64(todo[j] + 1)  # a local: the scan's bound stays alive
                for key, data in self.store.scan(prefix + keys.encode_u64(todo[i]), end):
                    if key in wanted:
                        self._pending[key] = self._decode(data)
                for key in wanted:
                    self._pending.setdefault(key, None)
            i = j + 1

    def sub(self, topic_id: int, queue: int, group: str) -> _Sub:
        k = (topic_id, queue, group)
        if k not in self._subs:
            cursor = queues.sub_cursor(self.store, group, topic_id, queue)
            floor = queues.committed_offset(self.store, group, topic_id, queue)
            self._subs[k] = _Sub(cursor, floor, cursor, floor)
        return self._subs[k]

    def subscription(self, topic_id: int, group: str) -> Subscription | None:
        k = (topic_id, group)
        if k not in self._subscriptions:
            self._subscriptions[k] = read_subscription(self.store, topic_id, group)
        return self._subscriptions[k]

    def settings(self, topic_id: int, group: str) -> Subscription:
        """The subscription, or the built-in defaults (no dead-letter topic) if none is stored."""
        return self.subscription(topic_id, group) or Subscription("", None)

    def message(self, topic_id: int, queue: int, offset: int) -> Message | None:
        """The stored message, or None if retention removed it."""
        try:
            found = read_messages(self.store, topic_id, queue, offset, 1, first_chunk=1)
        except OffsetOutOfRange:
            return None
        return found[0] if found else None

    # writes

    def set_pending(
        self,
        topic_id: int,
        queue: int,
        group: str,
        offset: int,
        new: PendingRecord | None,
    ) -> None:
        """Replace the pending record of an offset (None: finished), keeping both indexes."""
        key = self._prefix(topic_id, queue, group) + keys.encode_u64(offset)
        old = self.pending(topic_id, queue, group, offset)
        if old is not None:
            self.batch.delete(_index_key(topic_id, queue, group, offset, old))
        if new is None:
            self.batch.delete(key)
        else:
            self.batch.put(key, new.encode())
            index_value = keys.encode_u64(new.token) if new.state == STATE_INFLIGHT else b""
            self.batch.put(_index_key(topic_id, queue, group, offset, new), index_value)
            if new.state == STATE_RETRY:
                self.work.changed[(topic_id, queue)] = None
            elif new.time_ms - self.now_ms < WAKE_WITHIN_MS:
                self.work.scheduled = True
        self._pending[key] = new
        sub = self.sub(topic_id, queue, group)
        sub.touched = True
        if new is None:
            if old is not None:
                sub.gone.add(offset)
            sub.new.discard(offset)
        else:
            sub.new.add(offset)

    def put_fresh(
        self, topic_id: int, queue: int, group: str, offsets: list[int], rec: PendingRecord
    ) -> None:
        """``set_pending(..., rec)`` for offsets at or above the cursor, which have no record yet
        (none is read): a first delivery, all its offsets sharing one record value. Per message
        this is two puts."""
        if not offsets:
            return
        put = self.batch.put
        prefix = self._prefix(topic_id, queue, group)
        index_prefix = self._deadline_prefix(rec.time_ms, topic_id, queue, group)
        value, token = rec.encode(), keys.encode_u64(rec.token)
        pending = self._pending
        for offset in offsets:
            o = keys.encode_u64(offset)
            key = prefix + o
            put(key, value)
            put(index_prefix + o, token)
            pending[key] = rec
        if rec.time_ms - self.now_ms < WAKE_WITHIN_MS:
            self.work.scheduled = True
        sub = self.sub(topic_id, queue, group)
        sub.touched = True
        sub.new.add(min(offsets))  # only the lowest matters for the floor

    def _deadline_prefix(self, deadline_ms: int, topic_id: int, queue: int, group: str) -> bytes:
        """The deadline-index key of an offset without the offset (its last 8 bytes)."""
        k = (deadline_ms, topic_id, queue, group)
        prefix = self._deadline_prefixes.get(k)
        if prefix is None:
            prefix = keys.deadline_key(deadline_ms, topic_id, queue, group, 0)[:-8]  # offset: last u64
            self._deadline_prefixes[k] = prefix
        return prefix

    def finish(self, topic_id: int, queue: int, group: str, offset: int) -> None:
        self.set_pending(topic_id, queue, group, offset, None)

    def retry(
        self, topic_id: int, queue: int, group: str, offset: int, rec: PendingRecord, due_ms: int
    ) -> None:
        self.set_pending(topic_id, queue, group, offset, replace(rec, state=STATE_RETRY, time_ms=due_ms))

    def append(self, topic_id: int, queue: int, message: NewMessage) -> None:
        """Append ``message`` to a queue when the op finishes (one record batch per queue)."""
        self._appends.setdefault((topic_id, queue), []).append(message)

    def finish_op(self) -> None:
        """Write the appends, the changed cursors and the floors they imply."""
        for (topic_id, queue), messages in self._appends.items():
            meta = self.work.meta(topic_id, queue)
            value = encode_batch(self.work.index, self.now_ms, meta.high_offset, messages)
            self.batch.put(keys.record_key(topic_id, queue, meta.high_offset), value)
            high = meta.high_offset + len(messages)
            self.work.set_meta(
                topic_id, queue, QueueMeta(meta.low_offset, high, meta.retained_bytes + len(value))
            )
            self.work.grown[(topic_id, queue)] = high
        for (topic_id, queue, group), sub in self._subs.items():
            if sub.cursor is None:
                continue
            if sub.cursor != sub.stored_cursor:
                self.batch.put(
                    keys.sub_key(keys.SUB_CURSOR, topic_id, queue, group), keys.encode_u64(sub.cursor)
                )
            if sub.touched or sub.cursor != sub.stored_cursor:
                sub.floor = self._lowest_pending(topic_id, queue, group, sub)
            if sub.floor != sub.stored_floor and sub.floor is not None:
                self.batch.put(keys.offset_key(topic_id, queue, group), keys.encode_u64(sub.floor))

    def _lowest_pending(self, topic_id: int, queue: int, group: str, sub: _Sub) -> int:
        """``min(lowest pending offset, cursor)``, seeing this apply's changes. Only records
        deleted in this apply can be skipped, so the lookup is bounded by the command's size.

        The scan starts at the stored floor: no pending record is below it (the invariant), and
        starting at the prefix would step over the deletion marks of every record acked since the
        store last compacted (RocksDB keeps them until then). It starts past the offsets from the
        floor on that this apply finished (typically: an ack of the oldest messages), which the
        store still holds until the apply's batch is written."""
        assert sub.cursor is not None
        lowest = sub.cursor
        prefix = self._prefix(topic_id, queue, group)
        start = sub.stored_floor or 0
        while start in sub.gone:
            start += 1
        skippable = sum(1 for o in sub.gone if o > start)
        start_key = prefix + keys.encode_u64(start)
        for key, _ in scan_prefix(self.store, prefix, start=start_key, limit=skippable + 1):
            if key in self._pending and self._pending[key] is None:
                continue
            lowest = min(lowest, keys.decode_u64(key[len(prefix) :]))
            break
        return min(lowest, *sub.new) if sub.new else lowest


def _index_key(topic_id: int, queue: int, group: str, offset: int, rec: PendingRecord) -> bytes:
    if rec.state == STATE_INFLIGHT:
        return keys.deadline_key(rec.time_ms, topic_id, queue, group, offset)
    return keys.retry_key(topic_id, queue, group, rec.time_ms, offset)


def _deliverable(message: Message, group: str, now_ms: int, max_age_ms: int | None) -> bool:
    """Expired messages and messages redriven for another group are finished without delivery."""
    if message.expired(now_ms, max_age_ms):
        return False
    target = (message.headers or {}).get(REDRIVE_GROUP_HEADER)
    return target is None or target == group


_REDRIVE_GROUP_JSON = orjson.dumps(REDRIVE_GROUP_HEADER)


def _deliverable_fields(
    timestamp_ms: int,
    expires_at_ms: int | None,
    headers: bytes,
    group: str,
    now_ms: int,
    max_age_ms: int | None,
) -> bool:
    """:func:`_deliverable` from ``storage.queues.read_delivery_fields``' fields (headers as
    stored: orjson never escapes the header's name, so a message without it is told apart
    without decoding its headers)."""
    if expires_at_ms is not None and expires_at_ms <= now_ms:
        return False
    if max_age_ms is not None and timestamp_ms + max_age_ms <= now_ms:
        return False
    if headers and _REDRIVE_GROUP_JSON in headers:
        target = orjson.loads(headers).get(REDRIVE_GROUP_HEADER)
        return target is None or target == group
    return True


def _check_topic(work: _Apply, topic_id: int) -> None:
    if work.is_dropped(topic_id):
        raise Refused(errors.TOPIC_NOT_FOUND, f"topic {topic_id} was dropped")


# -- subscribe ----------------------------------------------------------------------------------


def subscribe(work: _Apply, cmd: SubscribeCommand) -> dict[str, Any]:
    """Store the subscription settings. Without ``overwrite``, an existing subscription keeps its
    ``max_deliveries`` and ``backoff_ms`` (a receive after a restart must not undo a PUT); a null
    ``dlq_topic_id`` keeps the stored one. Result: ``{"subscription": {...}, "changed": bool}``."""
    topic_id, group = cmd["topic_id"], cmd["group"]
    _check_topic(work, topic_id)
    current = read_subscription(work.store, topic_id, group)
    given = Subscription(cmd["topic"], cmd["dlq_topic_id"], cmd["max_deliveries"], tuple(cmd["backoff_ms"]))
    new = given if current is None or cmd["overwrite"] else replace(current, topic=given.topic)
    if given.dlq_topic_id is None and current is not None:
        new = replace(new, dlq_topic_id=current.dlq_topic_id)
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
        lock_state = queues.lock_state(w.store, group, topic_id, queue)
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
        for key, _ in scan_prefix(w.store, prefix, limit=limit):
            due_ms, offset = keys.decode_u64(key[len(prefix) : -8]), keys.decode_u64(key[-8:])
            if due_ms > now_ms:
                break
            found.append((due_ms, position, queue, offset))
    found.sort()
    return [(due_ms, queue, offset) for due_ms, _, queue, offset in found[:limit]]


def receive(work: _Apply, cmd: ReceiveCommand, index: int) -> dict[str, Any]:
    """Hand out up to ``max`` messages: due retries first (oldest due first), then new offsets
    from each queue's cursor, in the command's queue order. Each becomes in flight until
    ``now_ms + visibility_ms`` with ``attempt`` + 1 and the receipt token ``index``. Expired
    messages (TTL, or older than ``max_age_ms``) and messages redriven for another group are
    finished on the way, never handed out.

    Result: ``{"token": index, "messages": [{"queue", "offset", "attempt", "deadline_ms"}]}``.
    """
    topic_id, group, now_ms = cmd["topic_id"], cmd["group"], cmd["now_ms"]
    _check_topic(work, topic_id)
    w = _Work(work, now_ms)
    open_queues = _open_queues(w, cmd)
    limit, deadline_ms, max_age_ms = cmd["max"], now_ms + cmd["visibility_ms"], cmd["max_age_ms"]
    budget = SCAN_BUDGET
    out: list[dict[str, Any]] = []

    def hand_out(queue: int, offset: int, attempts: int, first_ms: int) -> None:
        rec = PendingRecord(STATE_INFLIGHT, attempts, deadline_ms, index, first_ms, now_ms)
        w.set_pending(topic_id, queue, group, offset, rec)
        out.append({"queue": queue, "offset": offset, "attempt": attempts, "deadline_ms": deadline_ms})

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
        low, high = queues.queue_bounds(w.store, topic_id, queue)
        if sub.cursor is None:  # first receive: start at the committed offset, else the oldest
            sub.cursor = low if sub.floor is None else sub.floor
        sub.cursor = max(sub.cursor, low)  # retention removed what was never handed out
        while sub.cursor < high and len(out) < limit and budget > 0:
            found = read_delivery_fields(w.store, topic_id, queue, sub.cursor, min(limit - len(out), budget))
            if not found:
                break
            budget -= len(found)
            sub.cursor = found[-1][0] + 1
            fresh = [
                o
                for o, ts, exp, headers in found
                if _deliverable_fields(ts, exp, headers, group, now_ms, max_age_ms)
            ]
            w.put_fresh(topic_id, queue, group, fresh, first)  # above the cursor: no record yet
            out += [{"queue": queue, "offset": o, "attempt": 1, "deadline_ms": deadline_ms} for o in fresh]
    w.finish_op()
    return {"token": index, "messages": out}


# -- ack, nack, extend --------------------------------------------------------------------------


def check_fence(work: _Apply, group: str, topic_id: int, queue_list: Iterable[int], epoch: int) -> None:
    """Refuse (``stale_epoch``) unless every queue's lock for ``group`` has ``epoch``. The lease
    need not be live: while nobody else took the lock, its holder's epoch is still the newest."""
    for queue in queue_list:
        lock_state = queues.lock_state(work.store, group, topic_id, queue)
        if lock_state is None or lock_state.epoch != epoch:
            raise Refused(
                errors.STALE_EPOCH,
                f"epoch {epoch} is not the lock epoch of queue {queue}",
                queue=queue,
                epoch=None if lock_state is None else lock_state.epoch,
            )


def ack_nack_extend(work: _Apply, cmd: ReceiptsCommand) -> dict[str, Any]:
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
        check_fence(work, group, topic_id, sorted({r.queue for r in cmd["receipts"]}), cmd["epoch"])
    w = _Work(work, now_ms)
    by_queue: dict[int, list[int]] = {}
    for r in cmd["receipts"]:
        by_queue.setdefault(r.queue, []).append(r.offset)
    for queue, offsets in by_queue.items():
        w.load_pending(topic_id, queue, group, offsets)
    if op == "ack":
        return {"results": _ack(w, topic_id, group, cmd["receipts"])}
    results: list[dict[str, Any]] = []
    for queue, offset, token in cmd["receipts"]:
        key = w._prefix(topic_id, queue, group) + keys.encode_u64(offset)
        rec = w.pending_at(key)
        if rec is None or rec.state != STATE_INFLIGHT or rec.token != token:
            results.append(_stale(queue, offset))
            continue
        if op == "extend":
            deadline_ms = now_ms + cmd["visibility_ms"]
            w.set_pending(topic_id, queue, group, offset, replace(rec, time_ms=deadline_ms))
            results.append({"ok": True, "deadline_ms": deadline_ms})
        else:
            settings = w.settings(topic_id, group)
            if rec.attempts >= settings.max_deliveries:
                outcome = _dead_letter(w, topic_id, queue, group, offset, rec, "nacked")
                results.append(
                    {"ok": True, **({"dead_lettered": True} if outcome == "dead_lettered" else {})}
                )
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


def _stale(queue: int, offset: int) -> dict[str, Any]:
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
            results.append(_stale(queue, offset))
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
    w.finish_op()
    return results


def _dead_letter(
    w: _Work, topic_id: int, queue: int, group: str, offset: int, rec: PendingRecord, reason: str
) -> str:
    """Move a message that used up its deliveries to the dead-letter topic (same queue number,
    same queue group: one apply). Returns ``dead_lettered``; ``discarded`` when the message
    expired or retention removed it; ``parked`` when there is no dead-letter topic (none created
    yet, or it was deleted): then it waits for the last backoff level and is delivered again."""
    settings = w.settings(topic_id, group)
    message = w.message(topic_id, queue, offset)
    if message is None or message.expired(w.now_ms):
        w.finish(topic_id, queue, group, offset)
        return "discarded"
    dlq = settings.dlq_topic_id
    if dlq is None or w.work.is_dropped(dlq):
        w.retry(topic_id, queue, group, offset, rec, w.now_ms + settings.backoff_ms[-1])
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


# -- the leader's tick --------------------------------------------------------------------------


def deliver_tick(work: _Apply, cmd: DeliverTickCommand) -> dict[str, Any]:
    """Release delayed messages due at ``now_ms`` (due order; appended to their queues now, so
    they get their offsets now), then expire in-flight deliveries whose deadline passed: a retry
    after the backoff, or a dead letter after ``max_deliveries``. At most ``max`` of each; ``more``
    says the leader should tick again at once.

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
                _dead_letter(w, topic_id, queue, group, offset, rec, "expired") == "dead_lettered"
            )
        else:
            w.retry(topic_id, queue, group, offset, rec, now_ms + settings.backoff(rec.attempts))
    w.finish_op()
    return {"released": released, "expired": expired, "dead_lettered": dead_lettered, "more": more}


def store_delayed(
    work: _Apply, now_ms: int, topic_id: int, queue: int, position: int, due_ms: int, message: NewMessage
) -> None:
    """Keep a delayed message in the due-time index until ``deliver_tick`` releases it."""
    key = keys.delayed_key(due_ms, topic_id, queue, work.index, position)
    work.batch.put(key, encode_batch(work.index, now_ms, 0, [message]))
    work.scheduled = True


# -- offsets committed by offset consumers ------------------------------------------------------


def on_commit(work: _Apply, group: str, topic_id: int, queue: int, offset: int) -> int:
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


# -- locks (ordered consumption) ----------------------------------------------------------------


def lock(work: _Apply, cmd: LockCommand) -> dict[str, Any]:
    """Acquire or renew the exclusive lock of a queue for ``consumer``.

    Refused with ``lock_held`` while another consumer's lease is live. The holder renewing keeps
    its epoch (also after its lease ran out, as long as nobody else took the lock: its commits
    stayed the newest); a new holder, or the same one after releasing, gets ``epoch + 1``.

    Result: ``{"consumer", "epoch", "lease_until_ms", "committed_offset"}`` (the offset to resume
    from, or None).
    """
    topic_id, queue, group, consumer, now_ms = (
        cmd["topic_id"],
        cmd["queue"],
        cmd["group"],
        cmd["consumer"],
        cmd["now_ms"],
    )
    _check_topic(work, topic_id)
    current = queues.lock_state(work.store, group, topic_id, queue)
    if current is not None and current.live(now_ms) and current.holder != consumer:
        raise Refused(
            errors.LOCK_HELD,
            f"queue {queue} is locked by another consumer",
            holder=current.holder,
            lease_until_ms=current.lease_until_ms,
        )
    renew = current is not None and current.holder == consumer and current.lease_until_ms != 0
    epoch = current.epoch if renew and current is not None else (0 if current is None else current.epoch) + 1
    new = LockState(epoch, now_ms + cmd["lease_ms"], consumer)
    work.batch.put(keys.lock_key(topic_id, queue, group), new.encode())
    return {
        "consumer": consumer,
        "epoch": epoch,
        "lease_until_ms": new.lease_until_ms,
        "committed_offset": queues.committed_offset(work.store, group, topic_id, queue),
    }


def unlock(work: _Apply, cmd: UnlockCommand) -> dict[str, Any]:
    """Release the lock if ``consumer`` holds it with ``epoch`` (the epoch is kept, so the next
    holder gets a higher one). Result: ``{"released": bool}``."""
    topic_id, queue, group = cmd["topic_id"], cmd["queue"], cmd["group"]
    current = queues.lock_state(work.store, group, topic_id, queue)
    if current is None or current.holder != cmd["consumer"] or current.epoch != cmd["epoch"]:
        return {"released": False}
    if current.lease_until_ms != 0:
        work.batch.put(keys.lock_key(topic_id, queue, group), replace(current, lease_until_ms=0).encode())
        work.changed[(topic_id, queue)] = None
    return {"released": True}


# -- dead letters back --------------------------------------------------------------------------


def redrive(work: _Apply, cmd: RedriveCommand) -> dict[str, Any]:
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
