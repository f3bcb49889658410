"""``create_topics`` in the metadata machine: many topics in one entry, each spec made as
``create_topic`` makes it, one result per spec; a failing spec fails alone, an entry applied again
(a restart's replay) creates nothing twice, and a replica that applies it has what one applying the
single creates has."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from raftmq.cluster.api.validation import ApiError, parse_create_topic, parse_create_topics
from raftmq.cluster.base.limits import MAX_TOPICS_PER_ENTRY
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES, capability_of
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Store


def command(**cmd: Any) -> bytes:
    return orjson.dumps({"v": 1, **cmd})


def bulk(*specs: Any) -> bytes:
    return command(op="create_topics", now_ms=5, group_count=3, topics=list(specs))


def state(store: Store) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in store.scan(b"") if k != b"A"]  # all but the applied index


def test_one_entry_creates_every_topic_as_the_single_creates_would() -> None:
    specs = [
        {"name": "a", "queues": 2},
        {"name": "b", "queues": 5, "retention_ms": 60_000, "max_message_bytes": 1000},
        {"name": "c", "queues": 1, "attributes": {"k": "v"}},
    ]
    bulk_machine = MetadataMachine(MemoryStore())
    got = bulk_machine.apply(1, bulk(*specs))
    assert [r["topic"]["name"] for r in got["results"]] == ["a", "b", "c"]
    one_by_one = MetadataMachine(MemoryStore())
    for i, spec in enumerate(specs, 1):
        assert "topic" in one_by_one.apply(i, command(op="create_topic", now_ms=5, group_count=3, **spec))
    assert state(bulk_machine.store) == state(one_by_one.store)
    assert bulk_machine.topics() == one_by_one.topics()
    assert MetadataMachine(bulk_machine.store).topics() == bulk_machine.topics()  # durable


def test_a_failing_spec_fails_alone_and_the_others_are_created() -> None:
    meta = MetadataMachine(MemoryStore())
    meta.apply(1, command(op="create_topic", name="taken", queues=1, now_ms=1, group_count=3))
    got = meta.apply(
        2,
        bulk(
            {"name": "new-1", "queues": 1},
            {"name": "taken", "queues": 1},
            {"name": "bad name", "queues": 1},
            {"name": "new-2", "queues": 9999},
            "not an object",
            {"name": "new-1", "queues": 1},  # twice in one entry: the second exists by then
            {"name": "new-3", "queues": 1},
        ),
    )
    codes = [r["error"]["code"] if "error" in r else r["topic"]["name"] for r in got["results"]]
    assert codes == [
        "new-1",
        "topic_exists",
        "bad_request",
        "bad_request",
        "bad_request",
        "topic_exists",
        "new-3",
    ]
    assert [t.name for t in meta.topics()] == ["new-1", "new-3", "taken"]
    ids = [t.id for t in meta.topics()]
    assert len(set(ids)) == 3 and meta.topic("new-3").id == meta.topic("new-1").id + 1  # type: ignore[union-attr]


def test_the_same_entry_applied_again_creates_nothing_twice() -> None:
    meta = MetadataMachine(MemoryStore())
    entry = bulk({"name": "a", "queues": 2}, {"name": "b", "queues": 2})
    meta.apply(1, entry)
    before = state(meta.store)
    assert meta.apply(1, entry) == {"skipped": True}  # a replay at its index after a restart
    assert MetadataMachine(meta.store).apply(1, entry) == {"skipped": True}
    assert state(meta.store) == before
    # Proposed again (a client's retry is a new entry): every name exists, nothing is written.
    again = meta.apply(2, entry)
    assert [r["error"]["code"] for r in again["results"]] == ["topic_exists", "topic_exists"]
    assert state(meta.store) == before


def test_a_malformed_entry_is_refused_whole_and_changes_nothing() -> None:
    meta = MetadataMachine(MemoryStore())
    before = state(meta.store)
    too_many = [{"name": f"t{i}", "queues": 1} for i in range(MAX_TOPICS_PER_ENTRY + 1)]
    for i, topics in enumerate(([], None, "a", {"name": "a"}, too_many), 1):
        got = meta.apply(i, command(op="create_topics", now_ms=5, group_count=3, topics=topics))
        assert got["error"]["code"] == "bad_request", topics
    for i, shared in enumerate(({"now_ms": -1, "group_count": 3}, {"now_ms": 5, "group_count": 0}), 10):
        got = meta.apply(i, command(op="create_topics", topics=[{"name": "a", "queues": 1}], **shared))
        assert got["results"][0]["error"]["code"] == "bad_request", shared
    assert meta.topics() == [] and state(meta.store) == before


def test_create_topics_is_gated_for_a_rolling_upgrade() -> None:
    # A previous release does not know the op: a leader proposes it only once every voter does.
    assert capability_of("meta", bulk({"name": "a", "queues": 1})) == "meta.create_topics"
    assert "meta.create_topics" in CAPABILITIES and "meta.create_topics" not in BEFORE_CAPABILITIES


def test_the_request_is_checked_spec_by_spec_as_a_single_create_is() -> None:
    limits = Limits(max_topics_per_request=3)
    specs = parse_create_topics({"topics": [{"name": "a"}, {"name": "b", "queues": 2}]}, limits)
    assert specs == [
        parse_create_topic({"name": "a"}, limits),
        parse_create_topic({"name": "b", "queues": 2}, limits),
    ]
    with pytest.raises(ApiError) as over:
        parse_create_topics({"topics": [{"name": f"t{i}"} for i in range(4)]}, limits)
    assert (over.value.code, over.value.details) == ("request_too_large", {"limit": 3})
    for body, index in (
        ({"topics": [{"name": "a"}, {"name": "a"}]}, 1),
        ({"topics": [{"name": "a"}, {"name": "b", "queues": 2000}]}, 1),
        ({"topics": [{"name": ".."}]}, 0),
    ):
        with pytest.raises(ApiError) as e:
            parse_create_topics(body, limits)
        assert (e.value.code, e.value.details) == ("bad_request", {"index": index}), body
        assert e.value.message.startswith(f"topics[{index}]: ")
    for body in ({"topics": []}, {"topics": {}}, {"topics": [{"name": "a"}], "queues": 2}, []):
        with pytest.raises(ApiError) as e:
            parse_create_topics(body, limits)
        assert e.value.code == "bad_request" and "index" not in e.value.details, body
