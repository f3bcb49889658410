"""The metadata state machine: topics, their settings and the queue → queue group map.

Replicated by the metadata group (a Raft group over the first five nodes). Pure like every state
machine here: no clock (``now_ms`` arrives in the command), no I/O but the Store, never raises.

Keys: ``b"A"`` applied index (u64), ``b"N"`` next topic id (u32), ``b"T" + name`` → topic (orjson).
Topic ids are never reused, so data a deleted topic left in a queue group can never be mistaken for
a new topic's.

Ops: ``noop``, ``create_topic``, ``delete_topic``, ``ensure_dlq_topic``, then the placement ops of
``cluster/machines/placement.py`` (``init_placement`` ... ``end_change``), then
``record_dead_letters``, ``set_topic_attributes``, ``set_topic_tags``, ``create_topics`` and
``set_topic_retention`` (ONLY ADD TO THE END: ``OPS`` below, which the rolling-upgrade gate reads).
Placement keys: ``b"P"`` placement, ``b"X"`` the change in progress, ``b"Y"`` the last finished
changes, ``b"Z"`` next change id (u64).
``ensure_dlq_topic {"source", "group", "now_ms", "by_record"?}`` returns the dead-letter topic of a consumer
group, creating it as ``<source>.<group>.dlq`` with the source's queue count and the SAME
``queue_groups`` (queue q of both topics in one queue group, so moving a message to its dead
letter queue is one apply).

Invariant: a dead-letter topic records its source, ``dead_letter_of = (source topic id, group)``,
and that record is the only link between them: :meth:`MetadataMachine.dead_letter_topic` finds a
group's dead-letter topic by it, never by name. Group names may hold dots, so one name
``<a>.<b>.<c>.dlq`` can spell the dead-letter topic of (``a``, ``b.c``) and of (``a.b``, ``c``); an
existing topic is used only when its record names exactly this (source id, group), else
``ensure_dlq_topic`` answers ``dead_letter_topic_conflict``. Topic ids are never reused, so a
record whose source was deleted matches no later topic of the same name.

Topics written before the record existed are given one by :func:`migrate_dead_letter_records`
when the entry ``record_dead_letters`` is applied (the marker ``b"M"`` says it ran): a pure function
of the topics, so every replica records the same sources at the same entry. The metadata leader
proposes it once every voter advertises the op (``cluster/replication/upgrade.py``): a replica of
the release before would refuse it, and a migration each replica ran at its own first entry after
its upgrade would read different topics on different replicas.

``set_topic_attributes {"name", "attributes", "expect"?}`` merges string attributes into a topic's (a
null value removes one); ``create_topic`` may carry ``attributes`` too. With ``expect`` (names to the
values they must have now, null: absent) the merge is a compare-and-set: when any differs nothing is
written and the result is ``{"topic": <as it is>, "changed": false}``, so a front end that keeps a
record in an attribute (the SQS API's message move tasks) reads, changes and writes it back without
losing a change made meanwhile elsewhere. Attributes are the topic's own
settings that front ends keep (the SQS API stores a queue's attributes there, ``cluster/api/sqs/``);
the machine checks only their shape (:func:`validate_attributes`) and never reads them.

``set_topic_tags {"name", "tags"}`` and ``create_topic``'s ``tags`` do the same with the topic's
tags (the SQS API's queue tags), a map apart from its attributes: no tag key can name an attribute.

``create_topics {"now_ms", "group_count", "topics": [spec, ...]}`` creates many topics in one entry,
each spec exactly as ``create_topic`` would (the same function, :func:`_new_topic`), one result per
spec; ``raftmq topic create`` with many names writes it (``POST /v1/topics`` with ``topics``).

``set_topic_retention {"name", "retention_ms"?, "retention_bytes"?}`` changes an existing topic's
retention bounds: each field given is set (an integer >= 1) or removed (null), a field left out is
kept; at least one must be given, and a bad one refuses the whole command. The queue groups'
leaders read the bounds from their metadata replica at their next retention look
(``raft.retention_check_ms``), so turning retention on frees a backlog without a restart.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from raftmq.cluster.base.errors import Refused
from raftmq.cluster.base.limits import MAX_TOPICS_PER_ENTRY
from raftmq.cluster.machines import placement as pl
from raftmq.cluster.machines.placement import Change, Placement
from raftmq.cluster.machines.topics import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_QUEUES,
    MAX_TAG_KEY_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
    RETENTION_FIELDS,
    TOPIC_NAME,
    Topic,
    error_result,
    migrate_dead_letter_records,
    new_topic,
    opt_int,
    validate_attributes,
    validate_tags,
    validate_topic_name,
)
from raftmq.storage.store import Batch, Store

__all__ = [
    "FIELD_LEVELS",
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_QUEUES",
    "MAX_TAGS",
    "MAX_TAG_KEY_CHARS",
    "MAX_TAG_VALUE_CHARS",
    "OPS",
    "TOPIC_NAME",
    "MetadataMachine",
    "Topic",
    "applied_index",
    "migrate_dead_letter_records",
    "validate_attributes",
    "validate_tags",
    "validate_topic_name",
]

log = structlog.get_logger(__name__)

# ONLY ADD TO THE END: op names are part of the metadata group's log.
OPS: tuple[str, ...] = (
    "noop",
    "create_topic",
    "delete_topic",
    "ensure_dlq_topic",
    *pl.OPS,
    "record_dead_letters",
    "set_topic_attributes",
    "set_topic_tags",
    "create_topics",
    "set_topic_retention",
)
# Meanings added to an op after it shipped (as cluster/commands FIELD_LEVELS; ONLY ADD TO THE END).
FIELD_LEVELS: tuple[str, ...] = (
    # ensure_dlq_topic finds and records a dead-letter topic by its source record, not its name
    "ensure_dlq_topic.records",
    # create_topic may carry the topic's attributes (an older replica refused the field)
    "create_topic.attributes",
    # create_topic may carry the topic's tags (an older replica would create the topic without them)
    "create_topic.tags",
    # set_topic_attributes may carry expect, a compare-and-set (an older replica would ignore it)
    "set_topic_attributes.expect",
)

_APPLIED = b"A"
_NEXT_ID = b"N"
_TOPIC = b"T"
_PLACEMENT = b"P"
_CHANGE = b"X"
_HISTORY = b"Y"
_NEXT_CHANGE = b"Z"
_MIGRATED = b"M"  # present once the topics carry their dead-letter records (from this version on)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


# The ops that merge into a topic's map: (its field, its check, its cap per topic).
_MAPS: dict[str, tuple[str, Callable[..., str | None], int]] = {
    "set_topic_attributes": ("attributes", validate_attributes, MAX_ATTRIBUTES),
    "set_topic_tags": ("tags", validate_tags, MAX_TAGS),
}


def applied_index(store: Store) -> int:
    """The raft index of the last command applied to a metadata store (0 if none)."""
    applied = store.get(_APPLIED)
    return 0 if applied is None else int(_U64.unpack(applied)[0])


def _putnew_topic(batch: Batch, topic: Topic) -> None:
    """Write a topic made with the next id, and move the next id past it."""
    batch.put(_TOPIC + topic.name.encode(), orjson.dumps(topic.to_json()))
    batch.put(_NEXT_ID, _U32.pack(topic.id + 1))


class MetadataMachine:
    """Topics in memory, persisted through the Store on every apply."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._topics: dict[str, Topic] = {}
        self._dead_letters: dict[tuple[int, str], Topic] = {}  # by dead_letter_of, from _topics
        self._migrated = False
        self._applied = 0
        self._next_id = 1
        self._placement: Placement | None = None
        self._change: Change | None = None
        self._history: list[dict[str, Any]] = []
        self._next_change = 1
        self._staged: tuple[Placement | None, Change | None, list[dict[str, Any]], int] | None = None
        # Called on the tick thread after an entry changed the placement or the change in progress.
        self.on_placement_changed: Callable[[], None] | None = None
        self.reload()

    @property
    def store(self) -> Store:
        return self._store

    @property
    def applied_index(self) -> int:
        return self._applied

    def reload(self) -> None:
        self._applied = applied_index(self._store)
        next_id = self._store.get(_NEXT_ID)
        self._next_id = 1 if next_id is None else _U32.unpack(next_id)[0]
        self._set_topics(
            {k[1:].decode(): Topic.from_json(orjson.loads(v)) for k, v in self._store.scan(_TOPIC, b"U")}
        )
        self._migrated = self._store.get(_MIGRATED) is not None
        raw = self._store.get(_PLACEMENT)
        self._placement = None if raw is None else Placement.from_json(orjson.loads(raw))
        raw = self._store.get(_CHANGE)
        self._change = None if raw is None else Change.from_json(orjson.loads(raw))
        raw = self._store.get(_HISTORY)
        self._history = [] if raw is None else list(orjson.loads(raw))
        raw = self._store.get(_NEXT_CHANGE)
        self._next_change = 1 if raw is None else _U64.unpack(raw)[0]

    def _set_topics(self, topics: dict[str, Topic]) -> None:
        # Readers see the two dicts replaced, never mutated in place.
        self._dead_letters = {t.dead_letter_of: t for t in topics.values() if t.dead_letter_of is not None}
        self._topics = topics

    def restore(self, checkpoint_dir: str) -> None:
        self._store.restore_from(checkpoint_dir)  # type: ignore[attr-defined]
        self.reload()

    # Reads (any thread): the dict is replaced, never mutated in place.
    def topic(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def topics(self) -> list[Topic]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def placement(self) -> Placement | None:
        """The cluster's placement (None until the metadata group initialised it)."""
        return self._placement

    def change(self) -> Change | None:
        """The cluster change in progress, if any."""
        return self._change

    def change_history(self) -> list[dict[str, Any]]:
        """The last finished changes, oldest first."""
        return list(self._history)

    def dead_letter_topic(self, source_id: int, group: str) -> Topic | None:
        """The dead-letter topic recorded for consumer group ``group`` of topic ``source_id``."""
        return self._dead_letters.get((source_id, group))

    def topic_by_id(self, topic_id: int) -> Topic | None:
        for t in self._topics.values():
            if t.id == topic_id:
                return t
        return None

    def apply(self, index: int, command: bytes) -> dict[str, Any]:
        # Invariant: applied_index only grows; an entry at or below it was applied before a
        # restart and is skipped.
        if index <= self._applied:
            return {"skipped": True}
        self._staged = None
        try:
            result, batch, topics, next_id = self._execute(command)
        except Exception as e:  # a bug must not become a poison pill; nothing was written
            log.exception("metadata_apply_failed", index=index)
            result, batch, topics, next_id = (
                error_result("internal", f"{type(e).__name__}"),
                Batch(),
                None,
                None,
            )
            self._staged = None
        batch.put(_APPLIED, _U64.pack(index))
        self._store.write(batch)
        self._applied = index
        if topics is not None:
            self._set_topics(topics)
        if not self._migrated and result.get("recorded") is not None:
            self._migrated = True
        if next_id is not None:
            self._next_id = next_id
        if self._staged is not None:
            self._placement, self._change, self._history, self._next_change = self._staged
            self._staged = None
            if self.on_placement_changed is not None:
                self.on_placement_changed()
        return result

    @property
    def needs_dead_letter_records(self) -> bool:
        """Whether ``record_dead_letters`` has not been applied yet and would record something (the
        leader proposes it): a new cluster, or one whose dead-letter topics all have their record,
        needs no such entry before it makes dead-letter topics. Read by leaders only."""
        return not self._migrated and bool(migrate_dead_letter_records(self._topics))

    def _record_dead_letters(self, batch: Batch) -> tuple[dict[str, Any], dict[str, Topic] | None]:
        """Give the dead-letter topics of an older release their record, once (the marker)."""
        if self._migrated:
            return {"recorded": 0}, None
        migrated = migrate_dead_letter_records(self._topics)
        for name, t in migrated.items():
            batch.put(_TOPIC + name.encode(), orjson.dumps(t.to_json()))
            log.info("dead_letter_topic_recorded", topic=name, source_id=t.dead_letter_of)
        batch.put(_MIGRATED, b"1")
        return {"recorded": len(migrated)}, {**self._topics, **migrated}

    def _execute(self, command: bytes) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        batch = Batch()
        try:
            cmd = orjson.loads(command)
        except orjson.JSONDecodeError:
            return error_result("bad_request", "command is not JSON"), batch, None, None
        if not isinstance(cmd, dict) or cmd.get("v") != 1:
            return error_result("bad_request", "command must be an object with v=1"), batch, None, None
        op = cmd.get("op")
        if op == "noop":
            return {"ok": True}, batch, None, None
        if op == "create_topic":
            return self._create_topic(cmd, batch)
        if op == "create_topics":
            return self._create_topics(cmd, batch)
        if op == "ensure_dlq_topic":
            return self._ensure_dlq_topic(cmd, batch)
        if op == "record_dead_letters":
            result, topics = self._record_dead_letters(batch)
            return result, batch, topics, None
        if op in pl.OPS:
            return self._placement_op(cmd, batch), batch, None, None
        if op in _MAPS:
            return self._set_map(cmd, batch)
        if op == "set_topic_retention":
            return self._set_retention(cmd, batch)
        if op == "delete_topic":
            name = cmd.get("name")
            if not isinstance(name, str) or name not in self._topics:
                return error_result("topic_not_found", f"no topic {name!r}"), batch, None, None
            topics = dict(self._topics)
            deleted = topics.pop(name)
            batch.delete(_TOPIC + name.encode())
            return {"deleted": deleted.to_json()}, batch, topics, None
        return error_result("bad_request", f"unknown op {op!r}"), batch, None, None

    def _placement_op(self, cmd: dict[str, Any], batch: Batch) -> dict[str, Any]:
        try:
            result, placement, change, ended = pl.apply_op(
                self._placement, self._change, self._next_change, cmd
            )
        except Refused as e:
            return e.body()
        history, next_change = self._history, self._next_change
        if placement is not None and placement is not self._placement:
            batch.put(_PLACEMENT, orjson.dumps(placement.to_json()))
        if change is not self._change:
            if change is None:
                batch.delete(_CHANGE)
            else:
                batch.put(_CHANGE, orjson.dumps(change.to_json()))
            if change is not None and change.id == next_change:
                next_change += 1
                batch.put(_NEXT_CHANGE, _U64.pack(next_change))
        if ended is not None:
            history = [*history, ended][-pl.MAX_HISTORY :]
            batch.put(_HISTORY, orjson.dumps(history))
        self._staged = (placement, change, history, next_change)
        return result

    def _create_topic(
        self, cmd: dict[str, Any], batch: Batch
    ) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        made = new_topic(cmd, self._topics, self._next_id)
        if not isinstance(made, Topic):
            return made, batch, None, None
        _putnew_topic(batch, made)
        return {"topic": made.to_json()}, batch, {**self._topics, made.name: made}, made.id + 1

    def _create_topics(
        self, cmd: dict[str, Any], batch: Batch
    ) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        """``create_topics {"now_ms", "group_count", "topics": [spec, ...]}``: each spec (the fields
        of ``create_topic`` but ``now_ms`` and ``group_count``, which the entry gives all of them)
        created as ``create_topic`` creates it, in order, in this one entry; a spec that fails
        (``topic_exists``, also for a name given earlier in the entry; ``bad_request``) fails
        alone. Answers ``{"results": [{"topic"} or {"error"}, ...]}`` in the specs' order."""
        specs = cmd.get("topics")
        if not isinstance(specs, list) or not 1 <= len(specs) <= MAX_TOPICS_PER_ENTRY:
            message = f"topics must be a list of 1 to {MAX_TOPICS_PER_ENTRY} topic specs"
            return error_result("bad_request", message), batch, None, None
        shared = {"now_ms": cmd.get("now_ms"), "group_count": cmd.get("group_count")}
        topics, next_id = dict(self._topics), self._next_id
        results: list[dict[str, Any]] = []
        for spec in specs:
            if not isinstance(spec, dict):
                results.append(error_result("bad_request", "a topic spec must be an object"))
                continue
            made = new_topic({**spec, **shared}, topics, next_id)
            if not isinstance(made, Topic):
                results.append(made)
                continue
            _putnew_topic(batch, made)
            topics[made.name] = made
            next_id = made.id + 1
            results.append({"topic": made.to_json()})
        if next_id == self._next_id:  # nothing created
            return {"results": results}, batch, None, None
        return {"results": results}, batch, topics, next_id

    def _set_map(
        self, cmd: dict[str, Any], batch: Batch
    ) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        """``set_topic_attributes`` / ``set_topic_tags``: merge the changes into the topic's map
        (a null removes), refused whole when bad or over the map's cap after the merge."""
        field, validate, cap = _MAPS[cmd["op"]]
        name, changes = cmd.get("name"), cmd.get(field)
        topic = self._topics.get(name) if isinstance(name, str) else None
        if topic is None:
            return error_result("topic_not_found", f"no topic {name!r}"), batch, None, None
        problem = validate(changes, removals=True)
        expect = cmd.get("expect") if field == "attributes" else None  # set_topic_attributes only
        if problem is None and expect is not None:
            problem = validate(expect, removals=True)
            problem = problem and f"expect: {problem}"
        if problem:
            return error_result("bad_request", problem), batch, None, None
        assert isinstance(changes, dict)
        current = getattr(topic, field)
        if expect is not None and any(current.get(k) != v for k, v in expect.items()):
            return {"topic": topic.to_json(), "changed": False}, batch, None, None
        merged = {k: v for k, v in sorted({**current, **changes}.items()) if v is not None}
        if len(merged) > cap:
            return error_result("bad_request", f"at most {cap} {field} per topic"), batch, None, None
        maps = {"attributes": topic.attributes, "tags": topic.tags, field: merged}
        updated = dataclasses.replace(topic, attributes=maps["attributes"], tags=maps["tags"])
        batch.put(_TOPIC + topic.name.encode(), orjson.dumps(updated.to_json()))
        topics = dict(self._topics)
        topics[topic.name] = updated
        return {"topic": updated.to_json(), "changed": True}, batch, topics, None

    def _set_retention(
        self, cmd: dict[str, Any], batch: Batch
    ) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        """``set_topic_retention``: set (an integer >= 1) or remove (null) each bound given;
        refused whole when one is bad or none is given."""
        name = cmd.get("name")
        topic = self._topics.get(name) if isinstance(name, str) else None
        if topic is None:
            return error_result("topic_not_found", f"no topic {name!r}"), batch, None, None
        given = [key for key in RETENTION_FIELDS if key in cmd]
        if not given:
            message = f"set_topic_retention needs one of {', '.join(RETENTION_FIELDS)}"
            return error_result("bad_request", message), batch, None, None
        bounds = {"retention_ms": topic.retention_ms, "retention_bytes": topic.retention_bytes}
        for key in given:
            bounds[key], problem = opt_int(cmd, key, 1)
            if problem:
                return error_result("bad_request", problem), batch, None, None
        updated = dataclasses.replace(
            topic, retention_ms=bounds["retention_ms"], retention_bytes=bounds["retention_bytes"]
        )
        batch.put(_TOPIC + topic.name.encode(), orjson.dumps(updated.to_json()))
        return {"topic": updated.to_json()}, batch, {**self._topics, topic.name: updated}, None

    def _ensure_dlq_topic(
        self, cmd: dict[str, Any], batch: Batch
    ) -> tuple[dict[str, Any], Batch, dict[str, Topic] | None, int | None]:
        source_name, group, now_ms = cmd.get("source"), cmd.get("group"), cmd.get("now_ms")
        if not isinstance(source_name, str) or not isinstance(group, str):
            return error_result("bad_request", "source and group must be strings"), batch, None, None
        if not isinstance(now_ms, int) or isinstance(now_ms, bool) or now_ms < 0:
            return error_result("bad_request", "now_ms must be a non-negative integer"), batch, None, None
        source = self._topics.get(source_name)
        if source is None:
            return error_result("topic_not_found", f"no topic {source_name!r}"), batch, None, None
        # Without by_record, an older leader wrote the entry: applied as its release applied it
        # (found by name, made without a record), as that release's replicas do; the topic gets
        # its record from record_dead_letters later, on every replica alike.
        by_record = cmd.get("by_record") is True
        recorded = self._dead_letters.get((source.id, group))
        if recorded is not None and by_record:
            return {"topic": recorded.to_json(), "created": False}, batch, None, None
        name = f"{source_name}.{group}.dlq"
        problem = validate_topic_name(name)
        if problem:
            return error_result("bad_request", f"dead-letter topic {name!r}: {problem}"), batch, None, None
        existing = self._topics.get(name)
        if existing is not None and not by_record:
            if existing.queue_groups != source.queue_groups:
                message = f"topic {name!r} exists with another placement; it cannot hold dead letters"
                return error_result("topic_exists", message), batch, None, None
            return {"topic": existing.to_json(), "created": False}, batch, None, None
        if existing is not None:  # not this group's (its record names another source, or none)
            message = (
                f"topic {name!r} exists and is not the dead-letter topic of group {group!r} on "
                f"{source_name!r}; delete it or use another group name"
            )
            return error_result("dead_letter_topic_conflict", message), batch, None, None
        topic_id = self._next_id
        topic = Topic(
            id=topic_id,
            name=name,
            queues=source.queues,
            queue_groups=source.queue_groups,
            retention_ms=None,
            retention_bytes=None,
            max_message_bytes=None,
            created_ms=now_ms,
            dead_letter_of=(source.id, group) if by_record else None,
        )
        _putnew_topic(batch, topic)
        topics = dict(self._topics)
        topics[name] = topic
        return {"topic": topic.to_json(), "created": True}, batch, topics, topic_id + 1
