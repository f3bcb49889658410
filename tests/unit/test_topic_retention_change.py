"""Changing a topic's retention after its creation: ``set_topic_retention`` in the metadata
machine (each bound given is set or removed, one left out is kept, a bad one refuses the whole
command), ``PATCH /v1/topics/{topic}``'s parsing, and the rolling-upgrade gate."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from raftmq.cluster.api.validation import parse_topic_patch
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.cli.main import main
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES
from raftmq.storage.memory import MemoryStore


class Meta:
    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore()
        self.machine = MetadataMachine(self.store)
        self.index = self.machine.applied_index

    def apply(self, **cmd: Any) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, orjson.dumps({"v": 1, **cmd}))


def _create(meta: Meta, **extra: Any) -> dict[str, Any]:
    return meta.apply(op="create_topic", name="q", queues=2, group_count=3, now_ms=5, **extra)


def test_retention_turned_on_later_is_stored_and_a_reload_sees_it() -> None:
    meta = Meta()
    _create(meta)
    got = meta.apply(op="set_topic_retention", name="q", retention_bytes=1 << 20)
    assert (got["topic"]["retention_bytes"], got["topic"]["retention_ms"]) == (1 << 20, None)
    again = Meta(meta.store).machine.topic("q")
    assert again is not None and (again.retention_bytes, again.retention_ms) == (1 << 20, None)


def test_a_bound_left_out_is_kept_and_null_removes_one() -> None:
    meta = Meta()
    _create(meta, retention_ms=60_000, retention_bytes=4096)
    got = meta.apply(op="set_topic_retention", name="q", retention_ms=None)
    assert (got["topic"]["retention_ms"], got["topic"]["retention_bytes"]) == (None, 4096)
    topic = meta.machine.topic("q")
    assert topic is not None and topic.retention_ms is None and topic.retention_bytes == 4096


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"retention_ms": 0},
        {"retention_bytes": -1},
        {"retention_ms": "60"},
        {"retention_ms": 5, "retention_bytes": True},
    ],
)
def test_a_bad_or_empty_change_refuses_the_whole_command(fields: dict[str, Any]) -> None:
    meta = Meta()
    _create(meta, retention_ms=60_000)
    got = meta.apply(op="set_topic_retention", name="q", **fields)
    assert got["error"]["code"] == "bad_request", got
    topic = meta.machine.topic("q")
    assert topic is not None and (topic.retention_ms, topic.retention_bytes) == (60_000, None)


def test_an_unknown_topic_is_topic_not_found() -> None:
    got = Meta().apply(op="set_topic_retention", name="nope", retention_ms=5)
    assert got["error"]["code"] == "topic_not_found"


def test_patch_parses_retention_or_attributes_never_both() -> None:
    assert parse_topic_patch({"retention_ms": 5, "retention_bytes": None}) == {
        "op": "set_topic_retention",
        "retention_ms": 5,
        "retention_bytes": None,
    }
    assert parse_topic_patch({"attributes": {"a": "1"}}) == {
        "op": "set_topic_attributes",
        "attributes": {"a": "1"},
    }
    for body in (
        {"retention_ms": 5, "attributes": {"a": "1"}},
        {"retention_ms": 0},
        {"retention_bytes": 1.5},
        {"retention_ms": False},
        {"retain": 5},
        {},
        [],
    ):
        with pytest.raises(ApiError) as refused:
            parse_topic_patch(body)
        assert refused.value.error.code == "bad_request", body


def test_set_topic_retention_is_gated_for_a_rolling_upgrade() -> None:
    # A voter of a release before would refuse the op: proposed once every voter advertises it.
    assert "meta.set_topic_retention" in CAPABILITIES
    assert "meta.set_topic_retention" not in BEFORE_CAPABILITIES


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--retention-ms", "soon"], "neither a positive integer nor 'off'"),
        (["--retention-bytes", "0"], "neither a positive integer nor 'off'"),
        (["--retention-bytes", "\u00b2"], "neither a positive integer nor 'off'"),  # a digit to isdigit only
    ],
)
def test_the_cli_refuses_a_bound_it_cannot_send_before_any_request(args: list[str], complaint: str) -> None:
    # An unreachable --url: a refusal that sent a request would fail differently (exit 1).
    command = ["topic", "retention", "t", *args, "--url", "http://127.0.0.1:9"]
    done = CliRunner().invoke(main, command, prog_name="raftmq")
    assert done.exit_code == 2 and complaint in done.output, done.output
