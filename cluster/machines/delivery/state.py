"""The working state of one delivery apply (``cluster/machines/delivery/__init__.py``): constants,
subscription settings, pending records through :class:`_Work`, and which messages are deliverable.

Pure as the rest of the delivery state machine: time only from the command's ``now_ms``, the
store the only I/O, every write into the apply's batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused
from raftmq.cluster.base.limits import DEFAULT_BACKOFF_MS as DEFAULT_BACKOFF_MS
from raftmq.storage import keys
from raftmq.storage.keys import STATE_INFLIGHT, STATE_RETRY, PendingRecord, QueueMeta
from raftmq.storage.queues import OffsetOutOfRange, read_messages, scan_prefix
from raftmq.storage.records import Message, NewMessage, encode_batch
from raftmq.storage.store import Store

if TYPE_CHECKING:
    from raftmq.cluster.machines.apply import Apply

DEFAULT_MAX_DELIVERIES = 16
NEVER_DEAD_LETTERED = 2**32 - 1  # the largest max_deliveries (u32): no count reaches it

DLQ_HEADER_PREFIX = "raftmq-dlq-"
"""Headers a dead letter gets (``raftmq-dlq-topic``, ``-queue``, ``-offset``, ...); redrive strips them."""
REDRIVE_GROUP_HEADER = "raftmq-redrive-group"
"""Set on a redriven message: only this consumer group receives it; others skip it as finished."""

WAKE_WITHIN_MS = 1000
"""An in-flight deadline closer than this to the command's ``now_ms`` wakes the leader's tick loop
(``Applied.scheduled``); a later one the loop learns from ``Applied.due_ms`` when it next wakes
(at least every 800 ms), so it is still expired on time. Waking the loop for every receive would
make it look up the earliest deadline after every receive."""
SCAN_BUDGET = 4096
"""Most index entries and messages one ``receive`` looks at (dangling entries and skipped
messages count), so one command does bounded work; the next one continues."""
REDRIVE_MAX_PER_COMMAND = 10_000
PARK_MS = 1000
USED_STEP_MS = 1000
"""An unconfigured subscription's ``used_ms`` is written again only when it moves by this much:
at most one write a second per group, however many receipts come (``_Work.touch``)."""
"""How long a dead letter without a dead-letter topic waits before it is looked at again: time
for the leader to have the topic created (``delivery.dead_letters._dead_letter``)."""


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
        dlq_checked: ``dlq_topic_id`` was read from the dead-letter topic's record of its source
            (this topic id and group) in the metadata group. Only then do dead letters go there:
            a link stored by a release that matched the name ``<topic>.<group>.dlq`` alone is
            checked again first (the message is parked and the leader asks the metadata group).
        configured: An admin set this subscription (``PUT``): it may create its dead-letter topic
            and never expires. A subscription that receives made is not configured.
        used_ms: Until when it is in use, on the group's time: the latest receive (subscribe),
            ack, nack or lock, or the latest visibility deadline or lease it handed out, whichever
            is later (None: stored by an older release, never expires); an unconfigured one
            unused for ``limits.subscription_idle_ms`` after that expires.
        creator: The token whose receive made it (None: an admin's, or without tokens), counted
            against ``limits.max_groups_per_token``.
        offsets_shared: The offset API (``commit``, ``commit_fenced``) wrote the group's
            committed offset on this topic: its expiry leaves that offset alone until
            ``limits.offset_retention_ms`` unused (``delivery/expiry.py``).
        dormant: Its receive/ack state expired (``subscription_idle_ms``) and the record stays
            only for the offset API's offsets, until they expire too; a use wakes it.
    """

    topic: str
    dlq_topic_id: int | None
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS
    dlq_checked: bool = False
    configured: bool = True
    used_ms: int | None = None
    creator: str | None = None
    offsets_shared: bool = False
    dormant: bool = False

    def backoff(self, attempts: int) -> int:
        return self.backoff_ms[min(max(attempts, 1), len(self.backoff_ms)) - 1]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "dlq_topic_id": self.dlq_topic_id,
            "max_deliveries": self.max_deliveries,
            "backoff_ms": list(self.backoff_ms),
        }
        # Written only when they differ from what a record of an older release means.
        if self.dlq_checked:
            out["dlq_checked"] = True
        if not self.configured:
            out["configured"] = False
        if self.used_ms is not None:
            out["used_ms"] = self.used_ms
        if self.creator is not None:
            out["creator"] = self.creator
        if self.offsets_shared:
            out["offsets_shared"] = True
        if self.dormant:
            out["dormant"] = True
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Subscription:
        # A record of an older release has none of the last four: its link is unchecked, and it
        # counts as configured (it may have been set by a PUT, which that release did not mark).
        return cls(
            d["topic"],
            d["dlq_topic_id"],
            d["max_deliveries"],
            tuple(d["backoff_ms"]),
            dlq_checked=d.get("dlq_checked", False),
            configured=d.get("configured", True),
            used_ms=d.get("used_ms"),
            creator=d.get("creator"),
            offsets_shared=d.get("offsets_shared", False),
            dormant=d.get("dormant", False),
        )


def read_subscription(store: Store, topic_id: int, group: str) -> Subscription | None:
    """The stored subscription of ``group`` on ``topic_id``, or None."""
    data = store.get(keys.subscription_key(topic_id, group))
    return None if data is None else decode_subscription(data)


def decode_subscription(data: bytes) -> Subscription:
    """A stored subscription's bytes decoded."""
    return Subscription.from_json(orjson.loads(data))


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

    def __init__(self, work: Apply, now_ms: int) -> None:
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
        """Read the pending records of ``offsets`` into the overlay with one store call (a
        multi-get: for the few receipts of a settle it costs less than a scan, which builds and
        seeks an iterator; the records read are the same)."""
        prefix = self._prefix(topic_id, queue, group)
        pending = self._pending
        todo = [key for key in {prefix + keys.encode_u64(o) for o in offsets} if key not in pending]
        if not todo:
            return
        decode = self._decode
        for key, data in zip(todo, self.store.get_many(todo), strict=True):
            pending[key] = None if data is None else decode(data)

    def sub(self, topic_id: int, queue: int, group: str) -> _Sub:
        k = (topic_id, queue, group)
        if k not in self._subs:  # through the machine's cache: every receive and settle reads them
            cursor = self.work.read_kept(
                keys.sub_key(keys.SUB_CURSOR, topic_id, queue, group), keys.decode_u64
            )
            floor = self.work.read_kept(keys.offset_key(topic_id, queue, group), keys.decode_u64)
            self._subs[k] = _Sub(cursor, floor, cursor, floor)
        return self._subs[k]

    def subscription(self, topic_id: int, group: str) -> Subscription | None:
        k = (topic_id, group)
        if k not in self._subscriptions:  # through the machine's cache: an op reads it every time
            key = keys.subscription_key(topic_id, group)
            self._subscriptions[k] = self.work.read_kept(key, decode_subscription)
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

    def touch(self, topic_id: int, group: str, until_ms: int) -> None:
        """Mark an unconfigured subscription in use until ``until_ms`` (a deadline or lease it
        handed out, or the command's time), so that its expiry never removes state a consumer
        still holds. Written only when ``used_ms`` moves by :data:`USED_STEP_MS` or more."""
        current = self.subscription(topic_id, group)
        if current is None or current.configured or current.used_ms is None:
            return
        if until_ms < current.used_ms + USED_STEP_MS and not current.dormant:
            return
        new = replace(current, used_ms=max(until_ms, current.used_ms), dormant=False)
        self._subscriptions[(topic_id, group)] = new
        self.batch.put(keys.subscription_key(topic_id, group), orjson.dumps(new.to_json()))

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
            else:
                self.work.add_due(new.time_ms)
                if new.time_ms - self.now_ms < WAKE_WITHIN_MS:
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
        self.work.add_due(rec.time_ms)
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
            put, decode = self.work.put_kept, keys.decode_u64
            if sub.cursor != sub.stored_cursor:
                put(
                    keys.sub_key(keys.SUB_CURSOR, topic_id, queue, group), keys.encode_u64(sub.cursor), decode
                )
            if sub.touched or sub.cursor != sub.stored_cursor:
                sub.floor = self._lowest_pending(topic_id, queue, group, sub)
            if sub.floor != sub.stored_floor and sub.floor is not None:
                put(keys.offset_key(topic_id, queue, group), keys.encode_u64(sub.floor), decode)

    def _lowest_pending(self, topic_id: int, queue: int, group: str, sub: _Sub) -> int:
        """``min(lowest pending offset, cursor)``, seeing this apply's changes. Only records
        deleted in this apply can be skipped, so the lookup is bounded by the command's size.

        The scan starts at the stored floor: no pending record is below it (the invariant), and
        starting at the prefix would step over the deletion marks of every record acked since the
        store last compacted (RocksDB keeps them until then). It starts past the offsets from the
        floor on that this apply finished (typically: an ack of the oldest messages), which the
        store still holds until the apply's batch is written.

        The scan finds no offset below where it starts, so when the cursor or an offset put in
        this apply is at or below that start, the answer is known without it: the common case of
        a receive from the floor on, and of an ack of everything from the floor to the cursor."""
        assert sub.cursor is not None
        lowest = min(sub.cursor, *sub.new) if sub.new else sub.cursor
        start = sub.stored_floor or 0
        while start in sub.gone:
            start += 1
        if lowest <= start:
            return lowest
        prefix = self._prefix(topic_id, queue, group)
        skippable = sum(1 for o in sub.gone if o > start)
        start_key = prefix + keys.encode_u64(start)
        for key, _ in scan_prefix(self.store, prefix, start=start_key, limit=skippable + 1):
            if key in self._pending and self._pending[key] is None:
                continue
            return min(lowest, keys.decode_u64(key[len(prefix) :]))
        return lowest


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


def _deliverable_fields(
    timestamp_ms: int,
    expires_at_ms: int | None,
    redrive_group: str | None,
    group: str,
    now_ms: int,
    max_age_ms: int | None,
) -> bool:
    """:func:`_deliverable` from ``storage.queues.read_delivery_fields``' fields (``redrive_group``:
    the message's :data:`REDRIVE_GROUP_HEADER`, None without one)."""
    if expires_at_ms is not None and expires_at_ms <= now_ms:
        return False
    if max_age_ms is not None and timestamp_ms + max_age_ms <= now_ms:
        return False
    return redrive_group is None or redrive_group == group


def _check_topic(work: Apply, topic_id: int) -> None:
    if work.is_dropped(topic_id):
        raise Refused(errors.TOPIC_NOT_FOUND, f"topic {topic_id} was dropped")
