"""The topic list shows dead-letter topics under their source: ``api.handlers.topics.topic_list`` (the API's
answer) and ``cli.topics._grouped`` (``raftmq topic list``)."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.handlers.topics import topic_list
from raftmq.cluster.cli.topics import _grouped
from raftmq.cluster.machines.metadata import Topic


def topic(name: str, groups: tuple[int, ...] = (1, 2)) -> Topic:
    return Topic(len(name), name, len(groups), groups, None, None, None, 0)


def listed(*topics: Topic) -> list[tuple[str, Any]]:
    return [(t["name"], t.get("dead_letter_of")) for t in topic_list(list(topics))]


def test_dead_letter_topics_follow_their_source_marked_with_it() -> None:
    assert listed(
        topic("a-b"), topic("a"), topic("a.w.dlq"), topic("a.b.c.dlq"), topic("a.b"), topic("z")
    ) == [
        ("a", None),
        ("a.w.dlq", {"topic": "a", "group": "w"}),
        ("a-b", None),
        ("a.b", None),
        ("a.b.c.dlq", {"topic": "a.b", "group": "c"}),  # the longest source that fits
        ("z", None),
    ]


def test_a_topic_named_like_a_dead_letter_topic_is_one_only_with_its_sources_placement() -> None:
    assert listed(topic("x"), topic("x.g.dlq", (3, 4)), topic("y.g.dlq"), topic(".dlq")) == [
        (".dlq", None),
        ("x", None),
        ("x.g.dlq", None),  # another placement: not made by ensure_dlq_topic
        ("y.g.dlq", None),  # no topic y
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
