"""The nodes' consumer lag history (cluster/node/lag_history.py): rings bounded in time, in samples per
series and in series, since group names are chosen by clients."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftmq.cluster.config.cluster_file import ConfigError, parse_config
from raftmq.cluster.node.lag_history import LagHistory, Lags, sample_forever


def test_a_series_keeps_the_last_minutes_oldest_first() -> None:
    h = LagHistory(interval_ms=10_000, history_ms=60_000)
    for i in range(20):  # 200 s of samples every 10 s
        h.record(1, [("billing", i)], now_ms=1_000_000 + i * 10_000)
    samples = h.of_topic(1)["billing"]
    now = 1_000_000 + 19 * 10_000
    assert samples == [(now - k * 10_000, 19 - k) for k in range(6, -1, -1)]  # 60 s back, at most 7
    assert h.of_topic(2) == {}


def test_client_chosen_group_names_do_not_grow_memory_without_bound() -> None:
    h = LagHistory(interval_ms=10_000, history_ms=60_000, max_series=100)
    for i in range(5000):
        h.record(1, [(f"group-{i}", i)], now_ms=1_000_000)
        h.record(1, [("steady", 1)], now_ms=1_000_000)  # updated every round: never dropped
    assert len(h) == 100
    groups = h.of_topic(1)
    assert "steady" in groups and "group-4999" in groups and "group-0" not in groups
    # Samples are bounded per series too, whatever the number of records.
    for _ in range(1000):
        h.record(1, [("steady", 1)], now_ms=1_000_000)
    assert len(h.of_topic(1)["steady"]) == h.samples_per_series == 7


def test_series_no_longer_seen_expire() -> None:
    h = LagHistory(interval_ms=10_000, history_ms=60_000)
    h.record(1, [("gone", 5), ("kept", 1)], now_ms=0)
    h.record(1, [("kept", 2)], now_ms=50_000)
    h.record(1, [("kept", 3)], now_ms=70_000)
    assert h.of_topic(1) == {"kept": [(50_000, 2), (70_000, 3)]}
    assert len(h) == 1


def test_the_sampler_records_each_topic_it_is_given_and_survives_a_failing_round() -> None:
    h = LagHistory(interval_ms=1)
    rounds = 0

    async def sample() -> Lags:
        nonlocal rounds
        rounds += 1
        if rounds < 3:
            raise AttributeError("no metadata yet")  # the loop goes on
        return {1: [("billing", 7), ("audit", 2)], 2: [("billing", rounds)]}

    async def run() -> None:
        task = asyncio.create_task(sample_forever(h, sample, lambda: 1000 + rounds))
        while rounds < 5:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 10))
    assert [lag for _, lag in h.of_topic(1)["billing"]][:2] == [7, 7]
    assert h.of_topic(1)["audit"][0] == (1003, 2)
    assert h.of_topic(2)["billing"][0] == (1003, 3)
    assert h.of_topic(3) == {}


def test_lag_sample_ms_is_checked() -> None:
    node = {"id": "n1", "http": "127.0.0.1:8001", "raft": "127.0.0.1:7001", "data_dir": "/d"}
    raw: dict[str, Any] = {"cluster": {"secret": "0123456789abcdef"}, "nodes": [node]}
    assert parse_config(raw).limits.lag_sample_ms == 10_000
    assert parse_config({**raw, "limits": {"lag_sample_ms": 500}}).limits.lag_sample_ms == 500
    with pytest.raises(ConfigError, match="lag_sample_ms"):
        parse_config({**raw, "limits": {"lag_sample_ms": 0}})
