"""The soak's resource sampler: it reads a real process's RSS, open files and a directory's size,
and its verdict tells a flat or bounded metric from one that keeps growing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raftmq.chaos.resources import ResourceSampler, plot_resources, resource_summary

MiB = 1 << 20


def series(values: list[float], metric: str = "rss_bytes") -> list[dict[str, Any]]:
    return [
        {"t": 10.0 * i, "node": "n1", "rss_bytes": 100 * MiB, "open_files": 40, "disk_bytes": 10 * MiB,
         metric: v}
        for i, v in enumerate(values)
    ]  # fmt: skip


def test_the_sampler_reads_this_process_and_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    sampler = ResourceSampler(
        ["n1", "n2"], {"n1": os.getpid(), "n2": None}.get, lambda n: tmp_path, lambda: 1.5
    )
    with open(tmp_path / "a", "rb"):
        sampler.sample()
    n1, n2 = sampler.samples
    assert n1["t"] == 1.5 and n1["node"] == "n1"
    assert n1["rss_bytes"] > MiB
    assert n1["open_files"] >= 4  # stdin, stdout, stderr and the file held open
    assert n1["disk_bytes"] == 1024
    assert n2["rss_bytes"] is None and n2["open_files"] is None  # down


def test_flat_and_sawtooth_metrics_are_bounded() -> None:
    flat = resource_summary(series([100 * MiB] * 40))
    assert flat["bounded"] is True
    saw = [float((i % 10) * 20 * MiB) for i in range(40)]  # grows, then retention removes it
    assert resource_summary(series(saw, "disk_bytes"))["bounded"] is True


def test_a_metric_that_keeps_growing_is_caught() -> None:
    growing = [100 * MiB + i * 8 * MiB for i in range(40)]
    result = resource_summary(series(growing))
    assert result["bounded"] is False
    assert result["nodes"]["n1"]["rss_bytes"]["bounded"] is False
    assert result["nodes"]["n1"]["open_files"]["bounded"] is True
    leaking_files = resource_summary(series([40 + 5 * i for i in range(40)], "open_files"))
    assert leaking_files["nodes"]["n1"]["open_files"]["bounded"] is False


def test_the_plot_is_written(tmp_path: Path) -> None:
    plot_resources(series([100 * MiB] * 10), [("pause", 2.0, 4.0)], tmp_path / "r.png", "t")
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_a_run_under_five_minutes_is_not_judged() -> None:
    short = [{**s, "t": s["t"] / 10} for s in series([100 * MiB + i * 8 * MiB for i in range(40)])]
    result = resource_summary(short)
    assert result["bounded"] is None
    assert result["nodes"]["n1"]["rss_bytes"]["bounded"] is None
    assert result["nodes"]["n1"]["rss_bytes"]["peak"] == 100 * MiB + 39 * 8 * MiB
