"""What the nodes and the machine did, second by second, while the open loop measured latency: the
slow sends set against RocksDB's flushes and compactions, the journals' fsyncs and compactions,
the bytes each node wrote and the kernel's dirty pages, so that a p99 can be traced to what it
paid for.

One sample a second (``/metrics`` of every node, ``/proc/<pid>/io``, ``/proc/meminfo``); the
open loop's sends are bucketed by the second they were scheduled in.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.bench._common import node_pids, percentile
from tests.bench.backlog.usage import process_usage
from tests.integration.harness import Cluster

# Journal fsyncs at or above this many seconds are counted apart (the histogram's bucket bounds)
SLOW_FSYNC_S = 0.05
_WORK = {
    "raftmq_rocksdb_running_flushes": "flushes",
    "raftmq_rocksdb_running_compactions": "compactions",
    "raftmq_rocksdb_level0_files": "level0_files",
    "raftmq_rocksdb_pending_compaction_bytes": "pending_compaction_bytes",
    "raftmq_rocksdb_delayed_write_rate_bytes": "delayed_write_rate",
    "raftmq_rocksdb_writes_stopped": "writes_stopped",
}


def meminfo_mb() -> dict[str, float]:
    """The kernel's dirty pages and pages under writeback, MB (what an fsync may wait behind)."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Dirty", "Writeback"):
                out[name.lower() + "_mb"] = round(int(rest.split()[0]) / 1024, 1)
    return out


def node_sample(cluster: Cluster, nid: str) -> dict[str, float]:
    """One node's RocksDB work (summed over its stores), its journals' bytes and fsyncs so far."""
    from prometheus_client.parser import text_string_to_metric_families

    text = cluster.get("/metrics", nid, timeout=5).text
    names = [*_WORK.values(), "journal_bytes", "fsyncs", "fsync_s", "slow_fsyncs", "snapshot_installs"]
    out: dict[str, float] = dict.fromkeys(names, 0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _WORK:
                out[_WORK[s.name]] += s.value
            elif s.name == "raftmq_raft_snapshot_installs_total":
                out["snapshot_installs"] += s.value
            elif s.name == "raftmq_journal_bytes":
                out["journal_bytes"] += s.value
            elif s.name == "raftmq_journal_fsync_seconds_count":
                out["fsyncs"] += s.value
            elif s.name == "raftmq_journal_fsync_seconds_sum":
                out["fsync_s"] += s.value
            elif s.name == "raftmq_journal_fsync_seconds_bucket" and s.labels.get("le") == "+Inf":
                out["slow_fsyncs"] += s.value
            elif s.name == "raftmq_journal_fsync_seconds_bucket" and _le(s.labels) == SLOW_FSYNC_S:
                out["slow_fsyncs"] -= s.value
    return out


def _le(labels: dict[str, str]) -> float | None:
    try:
        return float(labels.get("le", ""))
    except ValueError:
        return None


def snapshot_installs(cluster: Cluster) -> int:
    """Snapshot installs so far, summed over the running nodes' replicas."""
    total = 0.0
    for nid in node_pids(cluster):
        with contextlib.suppress(requests.RequestException):
            total += node_sample(cluster, nid)["snapshot_installs"]
    return int(total)


def folder_sizes_mb(root: Path) -> dict[str, float]:
    """MB held under each folder of ``root`` (three levels down): which files a write burst grew."""
    sizes: dict[str, float] = {}
    for folder, _dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).parts[:3]
        key = "/".join(rel) or "."
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                sizes[key] = sizes.get(key, 0.0) + os.lstat(os.path.join(folder, name)).st_blocks * 512 / 1e6
    return {k: round(v, 1) for k, v in sizes.items()}


class Timeline:
    """Samples the cluster once a second in a thread from :meth:`start` to :meth:`stop`."""

    def __init__(self, cluster: Cluster, interval_s: float = 1.0) -> None:
        self.cluster, self.interval_s = cluster, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = 0.0

    def start(self) -> Timeline:
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(30)
        return self.samples

    def _run(self) -> None:
        pids = node_pids(self.cluster)
        while not self._stop.is_set():
            now = round(time.perf_counter() - self.t0, 2)
            sample: dict[str, Any] = {"s": now, **meminfo_mb(), "nodes": {}}
            for nid, pid in pids.items():
                try:
                    node = node_sample(self.cluster, nid)
                except requests.RequestException:
                    continue
                node["written_mb"] = round(process_usage(pid)["write_bytes"] / 1e6, 1)
                node["folders_mb"] = folder_sizes_mb(self.cluster.data_dir / nid)
                sample["nodes"][nid] = node
            self.samples.append(sample)
            self._stop.wait(self.interval_s)


def per_second(
    sends: list[tuple[float, float]], samples: list[dict[str, Any]], t0: float
) -> list[dict[str, Any]]:
    """Each second of the open loop: its sends' p99 and max (ms; ``sends`` are (scheduled
    ``perf_counter``, ms), ``t0`` the timeline's start) beside what the nodes did in it (differences
    of the samples around it)."""
    at_ms = [(at - t0, ms) for at, ms in sends]
    rows = []
    for a, b in itertools.pairwise(samples):
        lat = [ms for at, ms in at_ms if a["s"] <= at < b["s"]]
        nodes = [(a["nodes"][n], b["nodes"][n]) for n in b["nodes"] if n in a["nodes"]]
        row: dict[str, Any] = {
            "s": a["s"],
            "sends": len(lat),
            "p99_ms": round(percentile(lat, 99), 1) if lat else None,
            "max_ms": round(max(lat), 1) if lat else None,
            "dirty_mb": b.get("dirty_mb"),
            "writeback_mb": b.get("writeback_mb"),
        }
        for key in ("written_mb", "fsyncs", "fsync_s", "slow_fsyncs", "snapshot_installs"):
            row[key] = round(sum(after[key] - before[key] for before, after in nodes), 3)
        for key in ("flushes", "compactions", "level0_files", "writes_stopped", "delayed_write_rate"):
            row[key] = max((after[key] for _, after in nodes), default=0)
        dropped = sum(max(0.0, before["journal_bytes"] - after["journal_bytes"]) for before, after in nodes)
        row["journal_mb_dropped"] = round(dropped / 1e6, 1)
        rows.append(row)
    return rows
