"""Bounds on the subscriptions that consume rights make (``cluster/machines/delivery/__init__.py``).

A receive or push stream under a new consumer group stores a subscription (``U``) in each queue
group of the topic, and receive/ack state under it (``S``, ``I``, ``Y``, ``O``). A token with consume
rights can invent group names at will, so this state is bounded twice:

- **Caps**: a new subscription is refused (``too_many_groups``, nothing written) when the topic
  already has ``max_topic_groups`` subscriptions in this queue group, or the creator's token
  already made ``max_token_groups`` here (:func:`check_group_limits`). A subscription an admin
  configured (``PUT``, ``overwrite``) is not refused.
- **Expiry**: ``expire_subscriptions {"now_ms", "idle_ms", "max"}`` drops up to ``max`` subscriptions
  that are not configured and were in use (``Subscription.used_ms``: refreshed by subscribe, and
  in the machine by receive, ack, nack, extend and lock up to the deadline or lease they hand out,
  ``_Work.touch``) until ``idle_ms`` or more before ``now_ms``, with the group's receive/ack state
  on every queue of the topic in this store: cursor, pending records (in flight, retrying or parked
  dead letters), retry index and lock. So no delivery or lease a consumer holds is removed. Their
  deadline-index entries (``E``) are left dangling and deleted when the tick meets them, as after
  ``drop_topic``.

  The committed offset (``O``) goes too, unless the offset API (``commit``, ``commit_fenced``:
  ``PUT /v1/groups/{group}/offsets``, an ordered consumer's fenced commits) wrote it
  (``Subscription.offsets_shared``, set by :func:`mark_offsets_shared` and by ``subscribe`` when
  it finds one): removing it would rewind an offset consumer of the same group name to the oldest
  message. A group received again resumes from a kept offset.

  With ``offset_retention_ms`` (the field level ``expire_subscriptions.offsets``) such a group's
  record is not dropped but left **dormant** (its receive/ack state gone, ``Subscription.dormant``),
  so it still counts against the caps; once unused for ``offset_retention_ms`` the record goes
  with the offsets. A use (subscribe, which an offset commit or read makes too, or a receive, ack,
  lock) wakes it. Without the field (entries before it, or while a voter lacks it) the rule is
  the one before: ``dormant`` is ignored and the offset API's offsets stay. Result:
  ``{"expired": n, "more": bool}``, with the field also ``"dormant": m``.
- **Members**: a consumer group member that stays connected while no message comes commits
  nothing, so no entry marks its group used. As Kafka keeps a group's offsets while it has
  members, the membership coordinator (the metadata leader) names the groups with a live member
  to each queue group of their topics every quarter of the shorter of ``offset_retention_ms`` and
  ``subscription_idle_ms`` (at most a minute, ``cluster/api/handlers/groups.py``):
  ``touch_subscriptions {"now_ms", "groups"}`` moves ``used_ms`` of each stored unconfigured
  subscription it names to ``now_ms`` (:func:`touch_subscriptions`). It creates nothing and does
  not wake a dormant record (a member reads by offset: it holds no receive/ack state). One entry
  per queue group and period, not one per fetch or heartbeat.

Pure like the rest of the state machine: time only from the command, the store the only I/O.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused
from raftmq.cluster.machines.delivery.state import USED_STEP_MS, Subscription, read_subscription
from raftmq.storage import keys
from raftmq.storage.queues import scan_prefix
from raftmq.storage.store import Store

if TYPE_CHECKING:
    from raftmq.cluster.commands import (
        ExpireSubscriptionsCommand,
        SubscribeCommand,
        TouchSubscriptionsCommand,
    )
    from raftmq.cluster.machines.apply import Apply

__all__ = [
    "check_group_limits",
    "expire_subscriptions",
    "expiry_due",
    "has_committed_offsets",
    "mark_offsets_shared",
    "next_expiry_ms",
    "touch_subscriptions",
]


def _subscriptions(store: Store, prefix: bytes = keys.SUBSCRIPTION) -> Any:
    """``(topic_id, group, Subscription)`` of the stored subscriptions under ``prefix``, in key order."""
    for key, value in scan_prefix(store, prefix):
        (topic_id,) = struct.unpack_from(">I", key, 1)
        yield topic_id, key[6 : 6 + key[5]].decode("utf-8"), Subscription.from_json(orjson.loads(value))


def check_group_limits(store: Store, cmd: SubscribeCommand) -> None:
    """Refuse (``too_many_groups``) a new subscription over the command's caps."""
    topic_cap, token_cap, creator = cmd["max_topic_groups"], cmd["max_token_groups"], cmd["creator"]
    if topic_cap is not None:
        prefix = keys.topic_range(keys.SUBSCRIPTION, cmd["topic_id"])[0]
        count = sum(1 for _ in scan_prefix(store, prefix, limit=topic_cap + 1))
        if count >= topic_cap:
            raise Refused(
                errors.TOO_MANY_GROUPS,
                f"topic {cmd['topic']!r} has {topic_cap} consumer groups (limits.max_groups_per_topic); "
                "an admin can configure a group or raise the limit, and idle unconfigured groups expire",
                limit="max_groups_per_topic",
            )
    if token_cap is not None and creator is not None:
        count = sum(1 for _, _, s in _subscriptions(store) if s.creator == creator and not s.configured)
        if count >= token_cap:
            raise Refused(
                errors.TOO_MANY_GROUPS,
                f"token {creator!r} made {token_cap} consumer groups (limits.max_groups_per_token); "
                "idle ones expire after limits.subscription_idle_ms",
                limit="max_groups_per_token",
            )


def has_committed_offsets(store: Store, topic_id: int, group: str) -> bool:
    """Whether ``group`` has a committed offset on a queue of ``topic_id`` in this store."""
    for meta_key, _ in scan_prefix(store, keys.topic_range(keys.META, topic_id)[0]):
        (queue,) = struct.unpack_from(">I", meta_key, 5)
        if store.get(keys.offset_key(topic_id, queue, group)) is not None:
            return True
    return False


def mark_offsets_shared(work: Apply, topic_id: int, group: str) -> None:
    """The offset API committed ``group``'s offsets on ``topic_id``: an unconfigured subscription
    of it keeps them when it expires (one write, the first time)."""
    current = read_subscription(work.store, topic_id, group)
    if current is not None and not current.configured and not current.offsets_shared:
        new = replace(current, offsets_shared=True)
        work.batch.put(keys.subscription_key(topic_id, group), orjson.dumps(new.to_json()))


def _idle(s: Subscription, now_ms: int, idle_ms: int) -> bool:
    return not s.configured and s.used_ms is not None and s.used_ms + idle_ms <= now_ms


_ALL, _RECEIVE = "all", "receive"


def _due(s: Subscription, now_ms: int, idle_ms: int, retention_ms: int | None) -> str | None:
    """What of ``s`` expires at ``now_ms``: ``"all"`` (the record with its state and offsets),
    ``"receive"`` (its receive/ack state: the record stays dormant for the offset API's offsets)
    or None. ``retention_ms`` None: the rule before offset retention (a command without
    ``offset_retention_ms``), which ignores ``dormant`` as the releases before it do."""
    if retention_ms is None:
        return _ALL if _idle(s, now_ms, idle_ms) else None
    if s.configured or s.used_ms is None:
        return None
    if not s.offsets_shared:
        return _ALL if s.used_ms + idle_ms <= now_ms else None
    if s.used_ms + retention_ms <= now_ms:
        return _ALL
    return _RECEIVE if not s.dormant and s.used_ms + idle_ms <= now_ms else None


def _due_at(s: Subscription, idle_ms: int, retention_ms: int | None) -> int | None:
    """When :func:`_due` first answers something for ``s`` (None: never, until it changes)."""
    if s.configured or s.used_ms is None:
        return None
    if retention_ms is None or not s.offsets_shared:
        return s.used_ms + idle_ms
    at = s.used_ms + retention_ms
    return at if s.dormant else min(at, s.used_ms + idle_ms)


def expiry_due(store: Store, now_ms: int, idle_ms: int, retention_ms: int | None = None) -> bool:
    """Whether an ``expire_subscriptions`` would drop something in this replica's ``store``."""
    return any(_due(s, now_ms, idle_ms, retention_ms) for _, _, s in _subscriptions(store))


def next_expiry_ms(store: Store, idle_ms: int, retention_ms: int | None = None) -> int | None:
    """The earliest time at which an ``expire_subscriptions`` with ``idle_ms`` and
    ``retention_ms`` drops something of this replica's ``store`` (None: nothing can be). It holds
    until the store applies another entry: the leader asks once, not at every tick, and proposes
    ``expire_subscriptions`` only from then."""
    times = [t for _, _, s in _subscriptions(store) if (t := _due_at(s, idle_ms, retention_ms)) is not None]
    return min(times, default=None)


def expire_subscriptions(work: Apply, cmd: ExpireSubscriptionsCommand) -> dict[str, Any]:
    """Drop idle unconfigured subscriptions with their state (module docstring).

    Result: ``{"expired": n, "more": bool}``, and with ``offset_retention_ms`` ``"dormant": m``,
    the records whose receive/ack state went while they stay for the offset API's offsets."""
    now_ms, idle_ms, budget = cmd["now_ms"], cmd["idle_ms"], cmd["max"]
    retention_ms = cmd["offset_retention_ms"]
    store, batch = work.store, work.batch
    expired, dormant, more = 0, 0, False
    for topic_id, group, s in _subscriptions(store):
        due = _due(s, now_ms, idle_ms, retention_ms)
        if due is None:
            continue
        if expired + dormant >= budget:
            more = True
            break
        # Without offset retention the offset API's offsets stay (the rule before it); with it
        # they go once the whole record is due.
        keep_offsets = due == _RECEIVE or (retention_ms is None and s.offsets_shared)
        for meta_key, _ in scan_prefix(store, keys.topic_range(keys.META, topic_id)[0]):
            (queue,) = struct.unpack_from(">I", meta_key, 5)
            for prefix in (keys.PENDING, keys.RETRY):
                start = keys.sub_key(prefix, topic_id, queue, group)
                batch.delete_range(start, keys.prefix_end(start))
            batch.delete(keys.sub_key(keys.SUB_CURSOR, topic_id, queue, group))
            batch.delete(keys.lock_key(topic_id, queue, group))
            if not keep_offsets:
                batch.delete(keys.offset_key(topic_id, queue, group))
        if due == _RECEIVE:
            batch.put(
                keys.subscription_key(topic_id, group), orjson.dumps(replace(s, dormant=True).to_json())
            )
            dormant += 1
        else:
            batch.delete(keys.subscription_key(topic_id, group))
            expired += 1
    result: dict[str, Any] = {"expired": expired, "more": more}
    if retention_ms is not None:
        result["dormant"] = dormant
    return result


def touch_subscriptions(work: Apply, cmd: TouchSubscriptionsCommand) -> dict[str, Any]:
    """Mark the stored unconfigured subscriptions the command names used at its ``now_ms`` (groups
    with a live member: module docstring). A subscription that is configured, not stored, or used
    less than ``USED_STEP_MS`` before is left as it is. Result: ``{"touched": n}``."""
    now_ms, touched = cmd["now_ms"], 0
    for topic_id, group in cmd["groups"]:
        current = read_subscription(work.store, topic_id, group)
        if current is None or current.configured or current.used_ms is None:
            continue
        if now_ms < current.used_ms + USED_STEP_MS:
            continue
        new = replace(current, used_ms=now_ms)
        work.batch.put(keys.subscription_key(topic_id, group), orjson.dumps(new.to_json()))
        touched += 1
    return {"touched": touched}
