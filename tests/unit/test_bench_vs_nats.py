"""The pure helpers of tests/bench/bench_vs_nats.py: the NATS servers' configuration and the
figures it reports (best, median, the ratios raftmq / NATS)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import loaded_bench


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from loaded_bench("bench_vs_nats")


def run(rate: float) -> dict[str, float]:
    return {
        "msgs_per_s": rate,
        "cpu_us_per_msg": 1e6 / rate,
        "server_us_per_msg": 0.8e6 / rate,
        "client_us_per_msg": 0.2e6 / rate,
        "other_cores": 0.1,
    }


def test_each_server_routes_to_all_three_and_only_always_sets_sync_interval(
    bench: ModuleType, tmp_path: Path
) -> None:
    ports = list(range(30000, 30009))  # (client, route, monitor) per server
    always = bench._nats_config(1, ports, tmp_path, sync_always=True)
    default = bench._nats_config(1, ports, tmp_path, sync_always=False)
    assert 'listen: "127.0.0.1:30003"' in always  # server 2's client port
    assert 'http: "127.0.0.1:30005"' in always
    for route in (30001, 30004, 30007):
        assert f"nats-route://127.0.0.1:{route}" in always
    assert "sync_interval: always" in always
    assert "sync_interval" not in default
    assert f'store_dir: "{tmp_path}/s2"' in default


def test_summary_gives_best_and_median_and_the_ratios_pair_them(bench: ModuleType) -> None:
    summaries = {
        "nats-always": bench.summary([run(100_000), run(80_000), run(120_000)]),
        "nats-default": bench.summary([run(200_000)]),
        "raftmq": bench.summary([run(20_000), run(30_000), run(10_000)]),
    }
    assert summaries["nats-always"]["best_msgs_per_s"] == 120_000
    assert summaries["nats-always"]["median_msgs_per_s"] == 100_000
    assert summaries["raftmq"]["median_cpu_us_per_msg"] == 50.0
    assert bench.ratios(summaries) == {
        "raftmq / nats-always (best)": 0.25,
        "raftmq / nats-always (median)": 0.2,
        "raftmq / nats-default (best)": 0.15,
        "raftmq / nats-default (median)": 0.1,
    }


def test_a_system_left_out_has_null_figures_and_no_ratio(bench: ModuleType) -> None:
    summaries = {
        "nats-always": bench.summary([run(100_000)]),
        "nats-default": bench.summary([]),
        "raftmq": bench.summary([run(50_000)]),
    }
    assert json.loads(json.dumps(summaries["nats-default"])) == dict.fromkeys(bench.SUMMARY_KEYS)
    assert bench.ratios(summaries) == {
        "raftmq / nats-always (best)": 0.5,
        "raftmq / nats-always (median)": 0.5,
    }


def test_values_are_pool_many_of_the_asked_size(bench: ModuleType) -> None:
    random_values = bench.value_pool(100, "random")
    assert len(random_values) == bench.POOL
    assert {len(v.encode()) for v in random_values} == {100}
    assert len(set(random_values)) == bench.POOL
    assert set(bench.value_pool(7, "x")) == {"xxxxxxx"}
