"""Topic tags in the metadata machine (the SQS API's queue tags): set at creation, merged by
``set_topic_tags`` (null removes), kept apart from the attributes (no tag key can name one), at most
50, checked for length, durable across a reload, and refused whole when bad."""

from __future__ import annotations

from typing import Any

import orjson
from metadata_log import Meta, create_topic

from raftmq.cluster.machines.metadata import MAX_TAGS, MetadataMachine
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES, gated_fields_of


def test_tags_given_at_creation_are_stored_apart_from_the_attributes() -> None:
    meta = Meta()
    got = create_topic(meta, attributes={"sqs.VisibilityTimeout": "30"}, tags={"sqs.VisibilityTimeout": "0"})
    assert got["topic"]["attributes"] == {"sqs.VisibilityTimeout": "30"}
    assert got["topic"]["tags"] == {"sqs.VisibilityTimeout": "0"}
    topic = meta.machine.topic("q")
    assert topic is not None and topic.attributes == {"sqs.VisibilityTimeout": "30"}
    assert topic.tags == {"sqs.VisibilityTimeout": "0"}


def test_a_topic_without_tags_serialises_as_before() -> None:
    assert "tags" not in create_topic(Meta())["topic"]


def test_set_merges_overwrites_and_null_removes_and_a_reload_sees_it() -> None:
    meta = Meta()
    create_topic(meta, tags={"team": "a", "Team": "b", "../x": "y"})
    got = meta.apply(
        op="set_topic_tags", name="q", tags={"team": "c", "Team": None, "gone": None, "é /=+-@": ""}
    )
    assert got["topic"]["tags"] == {"team": "c", "../x": "y", "é /=+-@": ""}
    reloaded = MetadataMachine(meta.machine.store)
    topic = reloaded.topic("q")
    assert topic is not None and topic.tags == {"team": "c", "../x": "y", "é /=+-@": ""}
    assert topic.attributes == {}


def test_bad_tags_are_refused_and_change_nothing() -> None:
    meta = Meta()
    create_topic(meta, tags={"a": "1"})
    for bad in ({"": "x"}, {"k" * 129: "x"}, {"a": "v" * 257}, {"a": 5}, [], {"a": ["x"]}):
        got = meta.apply(op="set_topic_tags", name="q", tags=bad)
        assert got["error"]["code"] == "bad_request", bad
    got = meta.apply(op="set_topic_tags", name="q", tags={f"k{i}": "v" for i in range(MAX_TAGS)})
    assert got["error"]["code"] == "bad_request"  # 50 new + "a" = 51 after the merge
    assert create_topic(meta, name="r", tags={"a": None})["error"]["code"] == "bad_request"
    assert create_topic(meta, name="r", tags={f"k{i}": "" for i in range(MAX_TAGS + 1)})["error"]["code"] == (
        "bad_request"
    )
    topic = meta.machine.topic("q")
    assert topic is not None and topic.tags == {"a": "1"}
    assert meta.machine.topic("r") is None
    # The longest key and value, and exactly 50 tags, are kept.
    full = {"k" * 128: "v" * 256, **{f"k{i}": "" for i in range(MAX_TAGS - 2)}}
    assert meta.apply(op="set_topic_tags", name="q", tags=full)["topic"]["tags"] == {"a": "1", **full}


def test_tagging_a_missing_topic_is_topic_not_found() -> None:
    got = Meta().apply(op="set_topic_tags", name="nope", tags={"a": "1"})
    assert got["error"]["code"] == "topic_not_found"


def test_tags_are_gated_for_a_rolling_upgrade() -> None:
    # A voter of a release before tags would refuse the op, or create the topic without them.
    for capability in ("meta.set_topic_tags", "meta.create_topic.tags"):
        assert capability in CAPABILITIES and capability not in BEFORE_CAPABILITIES, capability


def test_a_create_topic_with_tags_waits_for_every_voter_to_keep_them_and_one_without_does_not() -> None:
    def create(**fields: Any) -> bytes:
        return orjson.dumps({"v": 1, "op": "create_topic", "name": "q", **fields})

    assert gated_fields_of("meta.create_topic", create()) == []
    assert gated_fields_of("meta.create_topic", create(tags={"a": "b"})) == ["meta.create_topic.tags"]
    assert gated_fields_of("meta.create_topic", create(attributes={"x": "1"}, tags={"a": ""})) == [
        "meta.create_topic.attributes",
        "meta.create_topic.tags",
    ]
    assert gated_fields_of("meta.set_topic_tags", orjson.dumps({"v": 1, "op": "set_topic_tags"})) == []
