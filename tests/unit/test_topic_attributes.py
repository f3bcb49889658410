"""Topic attributes in the metadata machine: set at creation, merged by ``set_topic_attributes`` (null
removes), checked for shape, durable across a reload, and refused whole when bad."""

from __future__ import annotations

from metadata_log import Meta, create_topic

from raftmq.cluster.machines.metadata import MAX_ATTRIBUTES, MetadataMachine
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES


def test_attributes_given_at_creation_are_stored_and_shown() -> None:
    meta = Meta()
    got = create_topic(meta, attributes={"sqs.VisibilityTimeout": "30"})
    assert got["topic"]["attributes"] == {"sqs.VisibilityTimeout": "30"}
    topic = meta.machine.topic("q")
    assert topic is not None and topic.attributes == {"sqs.VisibilityTimeout": "30"}


def test_a_topic_without_attributes_serialises_as_before() -> None:
    meta = Meta()
    assert "attributes" not in create_topic(meta)["topic"]


def test_set_merges_and_null_removes_and_a_reload_sees_it() -> None:
    meta = Meta()
    create_topic(meta, attributes={"a": "1", "b": "2"})
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"b": None, "c": "3"})
    assert got["topic"]["attributes"] == {"a": "1", "c": "3"}
    reloaded = MetadataMachine(meta.machine.store)
    topic = reloaded.topic("q")
    assert topic is not None and topic.attributes == {"a": "1", "c": "3"}


def test_bad_attributes_are_refused_and_change_nothing() -> None:
    meta = Meta()
    create_topic(meta, attributes={"a": "1"})
    for bad in ({"a b": "x"}, {"a": 5}, {"a": "x" * 9000}, [], {"": "x"}):
        got = meta.apply(op="set_topic_attributes", name="q", attributes=bad)
        assert got["error"]["code"] == "bad_request", bad
    too_many = {f"k{i}": "v" for i in range(MAX_ATTRIBUTES)}  # 64 new + "a" = 65 after the merge
    got = meta.apply(op="set_topic_attributes", name="q", attributes=too_many)
    assert got["error"]["code"] == "bad_request"
    assert create_topic(meta, name="r", attributes={"a": None})["error"]["code"] == "bad_request"
    topic = meta.machine.topic("q")
    assert topic is not None and topic.attributes == {"a": "1"}
    assert meta.machine.topic("r") is None


def test_setting_attributes_of_a_missing_topic_is_topic_not_found() -> None:
    got = Meta().apply(op="set_topic_attributes", name="nope", attributes={"a": "1"})
    assert got["error"]["code"] == "topic_not_found"


def test_expect_makes_the_merge_a_compare_and_set_that_changes_nothing_when_a_value_moved() -> None:
    meta = Meta()
    create_topic(meta, attributes={"tasks": "v1"})
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"tasks": "v2"}, expect={"tasks": "v1"})
    assert got["changed"] is True and got["topic"]["attributes"] == {"tasks": "v2"}
    # A writer that read v1 before that change loses: nothing is written, the answer shows v2.
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"tasks": "v3"}, expect={"tasks": "v1"})
    assert got["changed"] is False and got["topic"]["attributes"] == {"tasks": "v2"}
    # null expects the attribute to be absent.
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"x": "1"}, expect={"x": None})
    assert got["changed"] is True
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"x": "2"}, expect={"x": None})
    assert got["changed"] is False
    topic = MetadataMachine(meta.machine.store).topic("q")
    assert topic is not None and topic.attributes == {"tasks": "v2", "x": "1"}
    got = meta.apply(op="set_topic_attributes", name="q", attributes={"x": "3"}, expect={"x y": "1"})
    assert got["error"]["code"] == "bad_request"


def test_the_compare_and_set_is_a_field_level_the_rolling_upgrade_gate_knows() -> None:
    assert "meta.set_topic_attributes.expect" in CAPABILITIES
    assert "meta.set_topic_attributes.expect" not in BEFORE_CAPABILITIES
