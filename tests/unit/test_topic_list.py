"""The topic list shows dead-letter topics under their source: ``api.handlers.topics.topic_list`` (the API's
answer) and ``cli.topics._grouped`` (``raftmq topic list``)."""

from __future__ import annotations

import zlib
from typing import Any

from raftmq.cluster.api.handlers.topics import topic_list
from raftmq.cluster.cli.topics import _grouped
from raftmq.cluster.machines.metadata import Topic


def topic(name: str, groups: tuple[int, ...] = (1, 2), of: Topic | None = None, group: str = "") -> Topic:
    """A topic; with ``of``, the dead-letter topic of ``group`` on ``of`` (its record)."""
    record = None if of is None else (of.id, group)
    return Topic(zlib.crc32(name.encode()), name, len(groups), groups, None, None, None, 0, record)


def listed(*topics: Topic) -> list[tuple[str, Any]]:
    return [(t["name"], t.get("dead_letter_of")) for t in topic_list(list(topics))]


def test_dead_letter_topics_follow_their_source_marked_with_it() -> None:
    a, ab = topic("a"), topic("a.b")
    assert listed(
        topic("a-b"),
        a,
        topic("a.w.dlq", of=a, group="w"),
        topic("a.b.c.dlq", of=a, group="b.c"),
        ab,
        topic("z"),
    ) == [
        ("a", None),
        ("a.b.c.dlq", {"topic": "a", "group": "b.c"}),  # its record, whatever the name suggests
        ("a.w.dlq", {"topic": "a", "group": "w"}),
        ("a-b", None),
        ("a.b", None),
        ("z", None),
    ]


def test_a_topic_is_a_dead_letter_topic_only_by_its_record_never_by_its_name() -> None:
    x = topic("x")
    assert listed(x, topic("x.g.dlq"), topic("y.g.dlq"), topic(".dlq")) == [
        (".dlq", None),
        ("x", None),
        ("x.g.dlq", None),  # named like one, made by create_topic: no record
        ("y.g.dlq", None),
    ]


def test_the_cli_groups_an_answer_by_dead_letter_of_whatever_its_order() -> None:
    answer = [
        {"name": "a.w.dlq", "dead_letter_of": {"topic": "a", "group": "w"}},
        {"name": "b"},
        {"name": "a.w.dlq.v.dlq", "dead_letter_of": {"topic": "a.w.dlq", "group": "v"}},
        {"name": "a"},
        {"name": "gone.g.dlq", "dead_letter_of": {"topic": "gone", "group": "g"}},  # not visible
    ]
    assert [t["name"] for t in _grouped(answer)] == ["b", "a", "a.w.dlq", "a.w.dlq.v.dlq", "gone.g.dlq"]
