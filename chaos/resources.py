"""Each node's resources over a run: the soak's evidence that nothing grows without bound.

:class:`ResourceSampler` reads, every ``interval_s`` (5 s), per node:

- ``rss_bytes``: the node process's resident set (``VmRSS`` of ``/proc/<pid>/status``; the pid is
  the container's main process as the host sees it, read again each time: a restart changes it);
- ``open_files``: the entries of ``/proc/<pid>/fd`` (files, sockets, pipes);
- ``disk_bytes``: the apparent size of every file under the node's data directory (its volume, or
  with the power-loss file system the directory under it, so that sampling does not go through
  FUSE).

A node that is down (killed, powered off) has ``None`` for the first two. The samples go to
``results.json`` (``run.resources``), a plot (``resources.png``) and a verdict per node and metric
(:func:`resource_summary`): **bounded** when the peak of the run's last quarter is at most the
peak of its second quarter times 1.25 plus a slack (32 MiB of RSS, 32 files, 32 MiB of disk: a
checkpoint, a compaction's new files, a burst of connections); otherwise **growing**. A run
shorter than 5 minutes is mostly start-up (caches, connections): it is not judged (``None``). Reading
``/proc`` of another process needs root (the harness runs as root for docker and FUSE anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["METRICS", "ResourceSampler", "plot_resources", "resource_summary"]

log = logging.getLogger("raftmq.chaos.resources")

MiB = 1 << 20
# metric -> (unit divisor for plots, its label, the slack a bounded metric may grow by)
METRICS: dict[str, tuple[float, str, float]] = {
    "rss_bytes": (MiB, "RSS (MiB)", 32 * MiB),
    "open_files": (1, "open files", 32),
    "disk_bytes": (MiB, "data directory (MiB)", 32 * MiB),
}
GROWTH = 1.25
MIN_SPAN_S = 300.0  # a shorter run is mostly start-up: its samples are kept, not judged


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _open_files(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


class ResourceSampler:
    """Samples ``nodes`` every ``interval_s``. ``pid_of(node)``: the node's host pid, or None when
    it is down; ``data_dir_of(node)``: the directory to size; ``now_s()``: the run's clock."""

    def __init__(
        self,
        nodes: Sequence[str],
        pid_of: Callable[[str], int | None],
        data_dir_of: Callable[[str], Path],
        now_s: Callable[[], float],
        interval_s: float = 5.0,
    ) -> None:
        self.nodes = list(nodes)
        self.pid_of = pid_of
        self.data_dir_of = data_dir_of
        self.now_s = now_s
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []

    def sample(self) -> None:
        t = round(self.now_s(), 2)
        for node in self.nodes:
            try:
                pid = self.pid_of(node)
            except Exception as e:  # a docker call during a fault: the sample says down
                log.debug("pid of %s: %s", node, e)
                pid = None
            self.samples.append({
                "t": t,
                "node": node,
                "rss_bytes": _rss_bytes(pid) if pid else None,
                "open_files": _open_files(pid) if pid else None,
                "disk_bytes": _tree_bytes(self.data_dir_of(node)),
            })  # fmt: skip

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)


def resource_summary(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per node and metric: first, peak and last value and ``bounded`` (see the module docstring);
    ``bounded`` overall iff every one is."""
    if not samples:
        return {"bounded": None, "nodes": {}}
    end = max(s["t"] for s in samples)
    judged = end - min(s["t"] for s in samples) >= MIN_SPAN_S
    nodes: dict[str, dict[str, Any]] = {}
    for node in sorted({s["node"] for s in samples}):
        mine = [s for s in samples if s["node"] == node]
        nodes[node] = {}
        for metric, (_, _, slack) in METRICS.items():
            points = [(s["t"], s[metric]) for s in mine if s[metric] is not None]
            if not points:
                continue
            second = [v for t, v in points if end / 4 <= t < end / 2] or [points[0][1]]
            last = [v for t, v in points if t >= 3 * end / 4] or [points[-1][1]]
            nodes[node][metric] = {
                "first": points[0][1],
                "peak": max(v for _, v in points),
                "last": points[-1][1],
                "peak_second_quarter": max(second),
                "peak_last_quarter": max(last),
                "bounded": max(last) <= max(second) * GROWTH + slack if judged else None,
            }
    bounded = all(m["bounded"] for per in nodes.values() for m in per.values()) if judged else None
    return {
        "bounded": bounded,
        "rule": f"last quarter's peak <= second quarter's * {GROWTH} + slack",
        "nodes": nodes,
    }


def plot_resources(
    samples: Sequence[dict[str, Any]], windows: Sequence[tuple[str, float, float]], path: Path, title: str
) -> None:
    """One panel per metric, one line per node, fault windows (``(fault, start_s, stop_s)``) shaded."""
    if not samples:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(METRICS), 1, figsize=(10, 7), dpi=80, sharex=True)
    for ax, (metric, (unit, label, _)) in zip(axes, METRICS.items(), strict=True):
        for _, start, stop in windows:
            ax.axvspan(start, stop, color="#999999", alpha=0.12, lw=0)
        for node in sorted({s["node"] for s in samples}):
            xs = [s["t"] for s in samples if s["node"] == node]
            ys = [
                s[metric] / unit if s[metric] is not None else float("nan")
                for s in samples
                if s["node"] == node
            ]
            ax.plot(xs, ys, lw=1, label=node)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_title(f"{title}: node resources (faults shaded)")
    axes[0].legend(loc="upper left", fontsize=8, ncol=5)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
