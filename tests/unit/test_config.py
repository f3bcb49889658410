"""The cluster file: validation lists every problem, env overrides, placement of queue groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.config.cluster_file import ConfigError, load_config, parse_config

SECRET = "0123456789abcdef0123"


def nodes(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8000 + i}",
            "raft": f"127.0.0.1:{7000 + 100 * i}",
            "data_dir": "/d",
        }
        for i in range(1, n + 1)
    ]


def test_defaults_one_queue_group_per_node_and_replication_three() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(5)})
    assert (c.queue_groups, c.replication, c.durability) == (5, 3, "fsync")
    assert c.limits.max_message_bytes == 1024 * 1024 and c.limits.max_request_bytes == 4 * 1024 * 1024
    assert [n.id for n in c.metadata_voters] == ["n1", "n2", "n3", "n4", "n5"]


def test_a_single_node_cluster_replicates_once() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(1)})
    assert (c.queue_groups, c.replication) == (1, 1)


def test_every_problem_is_listed_at_once() -> None:
    raw = {
        "cluster": {"secret": "short", "durability": "maybe", "replication": 4, "colour": "blue"},
        "limits": {"max_message_bytes": -1, "nope": 1},
        "raft": {"election_min_ms": 3000, "election_max_ms": 2000},
        "nodes": [
            {"id": "n1", "http": "127.0.0.1:8001", "raft": "127.0.0.1:7001", "data_dir": "/d"},
            {"id": "n1", "http": "127.0.0.1:99999", "raft": "nohost", "data_dir": ""},
            {"id": "bad id!", "http": "x", "raft": "y", "data_dir": "/d"},
            {"id": "n4", "http": "127.0.0.1:8004", "raft": "127.0.0.1:\u00b2", "data_dir": "/d"},
        ],
        "extra": {},
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    text = "\n".join(e.value.problems)
    for expected in (
        "cluster.secret",
        "durability",
        "replication (4) exceeds",
        "unknown key cluster.colour",
        "limits.max_message_bytes",
        "unknown key limits.nope",
        "election_min_ms must be below",
        "duplicate id 'n1'",
        "http must be host:port",
        "raft must be host:port",
        "data_dir",
        "nodes[2].id",
        "node n4: raft must be host:port",
        "unknown section [extra]",
    ):
        assert expected in text, f"{expected!r} not reported in:\n{text}"


def test_environment_overrides_single_settings() -> None:
    env = {
        "RAFTMQ_SECRET": SECRET,
        "RAFTMQ_CLUSTER_DURABILITY": "os",
        "RAFTMQ_LIMITS_MAX_MESSAGE_BYTES": "2048",
        "RAFTMQ_FAULTS_CRASH_AFTER_SNAPSHOT": "true",
    }
    c = parse_config({"nodes": nodes(3)}, env=env)
    assert c.secret == SECRET and c.durability == "os"
    assert c.limits.max_message_bytes == 2048 and c.faults.crash_after_snapshot


def test_a_bad_environment_value_is_a_listed_problem() -> None:
    with pytest.raises(ConfigError, match="RAFTMQ_LIMITS_MAX_MESSAGE_BYTES must be an integer"):
        parse_config(
            {"cluster": {"secret": SECRET}, "nodes": nodes(3)}, env={"RAFTMQ_LIMITS_MAX_MESSAGE_BYTES": "x"}
        )


def test_queue_groups_sit_on_distinct_nodes_with_spread_preferred_leaders() -> None:
    c = parse_config({"cluster": {"secret": SECRET, "queue_groups": 5}, "nodes": nodes(5)})
    for g in range(5):
        ids = [n.id for n in c.group_replicas(g)]
        assert len(set(ids)) == 3
    assert sorted(c.group_replicas(g)[0].id for g in range(5)) == ["n1", "n2", "n3", "n4", "n5"]
    assert sum(len(c.groups_on(n.id)) for n in c.nodes) == 15


def test_load_config_reports_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.toml"), env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\nsecret=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(bad), env={})


def test_retention_bounds_default_on_may_be_off_and_are_range_checked() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert (c.raft.retention_max_jump_ms, c.raft.retention_max_batches) == (300_000, 1000)
    off = {"retention_max_jump_ms": 0, "retention_max_batches": 0}  # a rolling upgrade
    c = parse_config({"cluster": {"secret": SECRET}, "raft": off, "nodes": nodes(3)})
    assert (c.raft.retention_max_jump_ms, c.raft.retention_max_batches) == (0, 0)
    bad = {"retention_max_jump_ms": 2**41, "retention_max_batches": -1}
    with pytest.raises(ConfigError) as e:
        parse_config({"cluster": {"secret": SECRET}, "raft": bad, "nodes": nodes(3)})
    text = "\n".join(e.value.problems)
    assert "raft.retention_max_jump_ms" in text and "raft.retention_max_batches" in text


def test_group_member_caps_default_below_each_other_and_must_be_positive() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert (c.limits.max_members_per_token, c.limits.max_members_per_topic) == (256, 1024)
    env = {"RAFTMQ_LIMITS_MAX_MEMBERS_PER_TOKEN": "5"}
    assert (
        parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)}, env=env).limits.max_members_per_token
        == 5
    )
    for key in ("max_members_per_token", "max_members_per_topic"):
        with pytest.raises(
            ConfigError, match="max_members_per_token and max_members_per_topic must be at least 1"
        ):
            parse_config({"cluster": {"secret": SECRET}, "limits": {key: 0}, "nodes": nodes(3)})


def test_a_request_limit_beyond_what_a_raft_frame_can_carry_is_refused() -> None:
    """A follower hangs up on a Raft frame over 256 MiB, and a leader sends a follower behind it
    entries of up to three requests in one frame: above 32 MiB per request a node does not start."""
    ok = parse_config(
        {"cluster": {"secret": SECRET}, "nodes": nodes(3), "limits": {"max_request_bytes": 32 << 20}}
    )
    assert ok.limits.max_request_bytes == 32 << 20
    for bad in (32 * 1024 * 1024 + 1, 200 * 1024 * 1024, 0):
        with pytest.raises(ConfigError) as e:
            parse_config(
                {"cluster": {"secret": SECRET}, "nodes": nodes(3), "limits": {"max_request_bytes": bad}}
            )
        assert any("limits.max_request_bytes" in p and "33554432" in p for p in e.value.problems), (
            e.value.problems
        )


def test_unauthenticated_raft_connection_limits_have_defaults_and_bounds() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert (
        c.limits.raft_auth_timeout_ms,
        c.limits.raft_max_unauthenticated,
        c.limits.raft_max_unauthenticated_per_source,
    ) == (5000, 512, 64)
    limits = {
        "raft_auth_timeout_ms": 0,
        "raft_max_unauthenticated": 0,
        "raft_max_unauthenticated_per_source": 0,
    }
    with pytest.raises(ConfigError) as e:
        parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3), "limits": limits})
    text = "\n".join(e.value.problems)
    assert "limits.raft_auth_timeout_ms" in text and "limits.raft_max_unauthenticated" in text


def test_http_idle_timeout_and_idle_connections_have_defaults_and_bounds() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert (c.limits.http_idle_timeout_ms, c.limits.http_max_idle_connections) == (75_000, 1024)
    for key, wrong in [
        ("http_idle_timeout_ms", 999),
        ("http_idle_timeout_ms", 3_600_001),
        ("http_max_idle_connections", 0),
    ]:
        with pytest.raises(ConfigError) as e:
            parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3), "limits": {key: wrong}})
        assert any(f"limits.{key}" in p for p in e.value.problems), e.value.problems


def test_offset_retention_defaults_to_a_week_may_be_off_and_is_not_below_the_idle_time() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert c.limits.offset_retention_ms == 7 * 24 * 3600 * 1000
    off = parse_config(
        {"cluster": {"secret": SECRET}, "limits": {"offset_retention_ms": 0}, "nodes": nodes(3)}
    )
    assert off.limits.offset_retention_ms == 0  # kept forever
    env = {"RAFTMQ_LIMITS_OFFSET_RETENTION_MS": "172800000"}
    assert (
        parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)}, env=env).limits.offset_retention_ms
        == 172_800_000
    )
    for bad in (3600 * 1000, 2**41):  # below subscription_idle_ms (24 h), beyond any duration
        with pytest.raises(ConfigError, match=r"limits\.offset_retention_ms must be 0"):
            parse_config(
                {"cluster": {"secret": SECRET}, "limits": {"offset_retention_ms": bad}, "nodes": nodes(3)}
            )


def test_the_checkpoint_download_timeout_defaults_to_30_s_and_is_range_checked() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert c.raft.checkpoint_io_timeout_ms == 30_000
    for bad in (0, 99, 3_600_001):
        with pytest.raises(ConfigError, match=r"raft\.checkpoint_io_timeout_ms must be from 100"):
            parse_config(
                {"cluster": {"secret": SECRET}, "raft": {"checkpoint_io_timeout_ms": bad}, "nodes": nodes(3)}
            )


def test_the_apply_cache_size_defaults_to_4096_may_be_off_and_is_range_checked() -> None:
    c = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(3)})
    assert c.limits.apply_cache_entries == 4096
    c = parse_config({"cluster": {"secret": SECRET}, "limits": {"apply_cache_entries": 0}, "nodes": nodes(3)})
    assert c.limits.apply_cache_entries == 0
    with pytest.raises(ConfigError, match=r"limits\.apply_cache_entries must be from 0"):
        parse_config(
            {"cluster": {"secret": SECRET}, "limits": {"apply_cache_entries": 1_000_001}, "nodes": nodes(3)}
        )


def test_the_sqs_move_task_lease_is_30_s_unless_set_from_10_s_to_an_hour() -> None:
    base: dict[str, Any] = {"cluster": {"secret": SECRET}, "nodes": nodes(1)}
    assert parse_config(base).sqs.move_task_lease_ms == 30_000
    assert parse_config({**base, "sqs": {"move_task_lease_ms": 10_000}}).sqs.move_task_lease_ms == 10_000
    for bad in (9_999, 3_600_001):
        with pytest.raises(ConfigError, match=r"sqs\.move_task_lease_ms must be from 10000"):
            parse_config({**base, "sqs": {"move_task_lease_ms": bad}})
