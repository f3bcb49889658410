"""A topic as the metadata group keeps it (:class:`Topic`), and the pure checks and making of one
that the metadata machine's ops share (``cluster/machines/metadata.py``): names, attributes, tags,
and :func:`new_topic`, which ``create_topic``, ``create_topics`` and ``ensure_dlq_topic`` all use.
No I/O, no clock."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_QUEUES",
    "MAX_TAGS",
    "MAX_TAG_KEY_CHARS",
    "MAX_TAG_VALUE_CHARS",
    "RETENTION_FIELDS",
    "TOPIC_NAME",
    "Topic",
    "error_result",
    "migrate_dead_letter_records",
    "new_topic",
    "opt_int",
    "permission_names",
    "validate_attributes",
    "validate_tags",
    "validate_topic_name",
]

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
MAX_QUEUES = 1024
MAX_ATTRIBUTES = 64  # per topic, after a merge
MAX_ATTRIBUTE_VALUE_BYTES = 8192  # UTF-8; an SQS RedrivePolicy or Policy fits
ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_TAGS = 50  # per topic, after a merge, and per command (AWS's limit for a queue's tags)
MAX_TAG_KEY_CHARS = 128  # Unicode code points, as AWS counts them
MAX_TAG_VALUE_CHARS = 256
RETENTION_FIELDS = ("retention_ms", "retention_bytes")  # what set_topic_retention may change


@dataclass(frozen=True)
class Topic:
    id: int
    name: str
    queues: int
    queue_groups: tuple[int, ...]  # queue q lives in queue group queue_groups[q]
    retention_ms: int | None
    retention_bytes: int | None
    max_message_bytes: int | None
    created_ms: int
    # A dead-letter topic's source: (source topic id, consumer group); None for other topics.
    dead_letter_of: tuple[int, str] | None = None
    attributes: dict[str, str] = field(default_factory=dict)  # never mutated: replaced by a new Topic
    tags: dict[str, str] = field(default_factory=dict)  # as attributes

    def to_json(self) -> dict[str, Any]:
        out = self._fields()
        if self.dead_letter_of is not None:
            topic_id, group = self.dead_letter_of
            out["dead_letter_of"] = {"topic_id": topic_id, "group": group}
        return out

    def _fields(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "queues": self.queues,
            "queue_groups": list(self.queue_groups),
            "retention_ms": self.retention_ms,
            "retention_bytes": self.retention_bytes,
            "max_message_bytes": self.max_message_bytes,
            "created_ms": self.created_ms,
        }
        if self.attributes:  # absent when empty: topics stored before attributes read the same
            d["attributes"] = dict(self.attributes)
        if self.tags:  # absent when empty, as attributes
            d["tags"] = dict(self.tags)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Topic:
        return cls(
            id=d["id"],
            name=d["name"],
            queues=d["queues"],
            queue_groups=tuple(d["queue_groups"]),
            retention_ms=d["retention_ms"],
            retention_bytes=d["retention_bytes"],
            max_message_bytes=d["max_message_bytes"],
            created_ms=d["created_ms"],
            dead_letter_of=_dead_letter_of(d.get("dead_letter_of")),
            attributes=dict(d.get("attributes") or {}),
            tags=dict(d.get("tags") or {}),
        )


def _dead_letter_of(raw: Any) -> tuple[int, str] | None:
    if not isinstance(raw, dict):
        return None
    return int(raw["topic_id"]), str(raw["group"])


def migrate_dead_letter_records(topics: dict[str, Topic]) -> dict[str, Topic]:
    """The topics that a release before the dead-letter record made with ``ensure_dlq_topic``, each
    given its record: a topic named ``<source>.<group>.dlq`` without one, whose source exists with
    the same queue groups and a smaller id (it existed when the dead-letter topic was made, so a
    topic created since cannot claim it). When dots allow several sources, the longest source name
    wins: a token could invent the group ``eu.billing`` on ``payments``, while ``payments.eu`` needs an
    admin to create. Pure: every replica computes the same records from the same topics."""
    out: dict[str, Topic] = {}
    for t in topics.values():
        if t.dead_letter_of is not None or not t.name.endswith(".dlq"):
            continue
        stem = t.name[: -len(".dlq")]
        for i in range(len(stem) - 1, 0, -1):
            source, group = topics.get(stem[:i]), stem[i + 1 :]
            if (
                stem[i] == "."
                and source is not None
                and group
                and source.id < t.id
                and source.queue_groups == t.queue_groups
            ):
                out[t.name] = replace(t, dead_letter_of=(source.id, group))
                break
    return out


def permission_names(
    name: str,
    topics: Mapping[str, Topic],
    *,
    creating: bool = False,
    by_id: Mapping[int, Topic] | None = None,
) -> list[str]:
    """The topic names a token's permission on topic ``name`` is checked against, given every topic
    by name (``docs/security.md``, "Permissions"). A dead-letter topic answers for its source, found
    by its record (never by its name, which ``payments.*`` matches in ``payments.billing.dlq``), and
    followed to a topic that records none: the dead-letter topic of a dead-letter topic
    (``payments.billing.dlq.g.dlq``) answers for ``payments`` too. A source that was deleted ends the
    walk: the last topic found goes by its own name. ``creating``: a topic to create must also be
    allowed on every existing topic it could be the dead-letter topic of (each as it answers); so
    must a name no topic has, so that a token without a right on ``payments`` gets the same answer
    for ``payments.billing.dlq`` whether that group has dead letters or not (before, 403 or 404
    told it). ``by_id``: ``topics`` by id, for a caller asking of many names (built here otherwise,
    a walk over every topic per name). Pure."""
    if not name.endswith(".dlq") or validate_topic_name(name):
        return [name]  # only ensure_dlq_topic records sources, and its names end in .dlq
    if creating or name not in topics:
        stem = name[: -len(".dlq")]
        sources = [stem[:i] for i in range(1, len(stem) - 1) if stem[i] == "." and stem[:i] in topics]
        return [name, *(n for source in sources for n in permission_names(source, topics, by_id=by_id))]
    topic = topics.get(name)
    if by_id is None:
        by_id = {t.id: t for t in topics.values()} if topic is not None and topic.dead_letter_of else {}
    seen: set[int] = set()
    while topic is not None and topic.dead_letter_of is not None and topic.id not in seen:
        seen.add(topic.id)
        source = by_id.get(topic.dead_letter_of[0])
        if source is None:
            break
        topic = source
    return [name if topic is None else topic.name]


def validate_attributes(attributes: Any, *, removals: bool) -> str | None:
    """An error message, or None when ``attributes`` is an object of attribute names (1-128 of
    ``A-Z a-z 0-9 . _ : -``) to strings of at most MAX_ATTRIBUTE_VALUE_BYTES UTF-8 bytes (or null,
    to remove one, when ``removals``), at most MAX_ATTRIBUTES of them."""
    if not isinstance(attributes, dict):
        return "attributes must be an object of names to strings"
    if len(attributes) > MAX_ATTRIBUTES:
        return f"at most {MAX_ATTRIBUTES} attributes"
    for name, value in attributes.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME.match(name):
            return "attribute names are 1-128 characters of A-Z a-z 0-9 . _ : -"
        if value is None and removals:
            continue
        if not isinstance(value, str):
            return f"attribute {name!r} must be a string" + (" or null" if removals else "")
        try:
            size = len(value.encode())
        except UnicodeEncodeError:  # a lone surrogate
            return f"attribute {name!r} is not valid UTF-8 text"
        if size > MAX_ATTRIBUTE_VALUE_BYTES:
            return f"attribute {name!r} is over {MAX_ATTRIBUTE_VALUE_BYTES} bytes"
    return None


def validate_tags(tags: Any, *, removals: bool) -> str | None:
    """An error message, or None when ``tags`` is an object of at most MAX_TAGS tag keys (strings
    of 1-MAX_TAG_KEY_CHARS characters) to values (strings of at most MAX_TAG_VALUE_CHARS, or null
    to remove one when ``removals``). Lengths only: which characters a tag may hold is the front
    end's rule (a Unicode category test here would depend on the replica's Python version)."""
    if not isinstance(tags, dict):
        return "tags must be an object of keys to strings"
    if len(tags) > MAX_TAGS:
        return f"at most {MAX_TAGS} tags"
    for key, value in tags.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_TAG_KEY_CHARS:
            return f"tag keys are 1-{MAX_TAG_KEY_CHARS} characters"
        if value is None and removals:
            continue
        if not isinstance(value, str) or len(value) > MAX_TAG_VALUE_CHARS:
            return f"tag values are strings of at most {MAX_TAG_VALUE_CHARS} characters ({key!r})"
    return None


def validate_topic_name(name: Any) -> str | None:
    """An error message, or None when ``name`` is a valid topic name."""
    if not isinstance(name, str) or not TOPIC_NAME.match(name):
        return "topic names are 1-200 characters of A-Z a-z 0-9 . _ -"
    if name in (".", ".."):
        return "topic name may not be '.' or '..'"
    return None


def opt_int(d: dict[str, Any], key: str, minimum: int) -> tuple[int | None, str | None]:
    """``d[key]``: None when absent or null, else an integer >= ``minimum`` or the problem."""
    v = d.get(key)
    if v is None:
        return None, None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        return None, f"{key} must be an integer >= {minimum}"
    return v, None


def error_result(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def new_topic(cmd: dict[str, Any], topics: dict[str, Topic], topic_id: int) -> Topic | dict[str, Any]:
    """The topic ``create_topic`` command ``cmd`` makes with id ``topic_id`` next to ``topics``,
    or the error body when it makes none (``bad_request``, ``topic_exists``). Pure."""
    name = cmd.get("name")
    problem = validate_topic_name(name)
    if problem:
        return error_result("bad_request", problem)
    assert isinstance(name, str)
    queues, group_count, now_ms = cmd.get("queues"), cmd.get("group_count"), cmd.get("now_ms")
    for key, v, lo, hi in (("queues", queues, 1, MAX_QUEUES), ("group_count", group_count, 1, 256)):
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            return error_result("bad_request", f"{key} must be an integer from {lo} to {hi}")
    if not isinstance(now_ms, int) or isinstance(now_ms, bool) or now_ms < 0:
        return error_result("bad_request", "now_ms must be a non-negative integer")
    opts: dict[str, int | None] = {}
    for key, minimum in (("retention_ms", 1), ("retention_bytes", 1), ("max_message_bytes", 1)):
        opts[key], problem = opt_int(cmd, key, minimum)
        if problem:
            return error_result("bad_request", problem)
    attributes = cmd.get("attributes") or {}
    problem = validate_attributes(attributes, removals=False)
    if problem:
        return error_result("bad_request", problem)
    tags = cmd.get("tags") or {}
    problem = validate_tags(tags, removals=False)
    if problem:
        return error_result("bad_request", problem)
    if name in topics:
        return error_result("topic_exists", f"topic {name!r} exists")
    assert isinstance(queues, int) and isinstance(group_count, int)
    return Topic(
        id=topic_id,
        name=name,
        queues=queues,
        # Start each topic at a different group so that small topics spread over the groups.
        queue_groups=tuple((topic_id + q) % group_count for q in range(queues)),
        retention_ms=opts["retention_ms"],
        retention_bytes=opts["retention_bytes"],
        max_message_bytes=opts["max_message_bytes"],
        created_ms=now_ms,
        attributes=dict(attributes),
        tags=dict(tags),
    )
