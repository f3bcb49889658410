"""What the nodes spend: CPU by thread (RocksDB's own threads apart), disk I/O, the bytes they
hold, and RocksDB's background work (their ``raftmq_rocksdb_*`` metrics)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import requests

from tests.bench._common import cpu_seconds, node_pids
from tests.integration.harness import Cluster


def disk_bytes(path: Path) -> int:
    """Bytes allocated under ``path`` (``du``: blocks, not lengths)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # RocksDB removed it meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def node_disks(cluster: Cluster) -> dict[str, int]:
    return {nid: disk_bytes(cluster.data_dir / nid) for nid in cluster.nodes}


def segment_disks(cluster: Cluster) -> dict[str, int]:
    """Bytes of sealed segment files on each node (what its sealer wrote)."""
    return {nid: disk_bytes(cluster.data_dir / nid / "segments") for nid in cluster.nodes}


# -- what the nodes spend: CPU by thread, disk I/O, RocksDB's background work -----------------------

_TICK = os.sysconf("SC_CLK_TCK")
ROCKSDB_THREADS = "rocksdb:"  # RocksDB names its flush and compaction threads rocksdb:high / rocksdb:low


def process_usage(pid: int) -> dict[str, Any]:
    """What process ``pid`` spent so far: CPU seconds (``cpu_s``: all its threads, those that ended
    included, from ``/proc/<pid>/stat``), each of RocksDB's background threads' CPU seconds
    (``rocksdb``: thread id -> seconds), and the bytes it read from and wrote to the disk
    (``/proc/<pid>/io``).

    Why the process's own total, not a sum over its threads: a thread that ended (a checkpoint's
    download, an executor's) leaves that sum, and a phase it ended in showed a node's CPU as
    negative (-4.02 s in a backlog run's catch-up). RocksDB's threads are compared thread by thread
    (:func:`rocksdb_cpu_delta`): one started meanwhile counts from 0, and none is subtracted."""
    rocksdb: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                if not comm.startswith(ROCKSDB_THREADS):
                    continue
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            rocksdb[int(tid)] = (int(fields[11]) + int(fields[12])) / _TICK
    io = {"read_bytes": 0, "write_bytes": 0}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/io") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in io:
                io[name] = int(value)
    return {"cpu_s": cpu_seconds(pid), "rocksdb": rocksdb, **io}


def rocksdb_cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds RocksDB's threads spent between two :func:`process_usage` readings."""
    return sum(seconds - before.get(tid, 0.0) for tid, seconds in after.items())


class Usage:
    """What each node process spent between :meth:`start` and :meth:`stop`: CPU seconds (all
    threads, and RocksDB's background threads apart), MB read and written on the disk; a node
    restarted meanwhile (another pid) is left out."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pids: dict[str, int] = {}
        self._t0 = 0.0
        self._before: dict[str, dict[str, Any]] = {}

    def start(self) -> Usage:
        self._pids = node_pids(self.cluster)
        self._before = {nid: process_usage(pid) for nid, pid in self._pids.items()}
        self._t0 = time.monotonic()
        return self

    def stop(self) -> dict[str, Any]:
        seconds = time.monotonic() - self._t0
        now = node_pids(self.cluster)
        nodes: dict[str, Any] = {}
        for nid, pid in self._pids.items():
            if now.get(nid) != pid:
                continue
            after, before = process_usage(pid), self._before[nid]
            nodes[nid] = {
                "cpu_s": round(after["cpu_s"] - before["cpu_s"], 2),
                "rocksdb_cpu_s": round(rocksdb_cpu_delta(before["rocksdb"], after["rocksdb"]), 2),
                "read_mb": round((after["read_bytes"] - before["read_bytes"]) / 1e6, 1),
                "written_mb": round((after["write_bytes"] - before["write_bytes"]) / 1e6, 1),
            }
        total = {k: round(sum(n[k] for n in nodes.values()), 2) for k in ("cpu_s", "rocksdb_cpu_s")}
        total |= {k: round(sum(n[k] for n in nodes.values()), 1) for k in ("read_mb", "written_mb")}
        return {"seconds": round(seconds, 2), "nodes": nodes, "total": total}


STORAGE_METRICS = {
    "raftmq_rocksdb_pending_compaction_bytes": "pending_compaction_bytes",
    "raftmq_rocksdb_running_compactions": "running_compactions",
    "raftmq_rocksdb_running_flushes": "running_flushes",
    "raftmq_rocksdb_level0_files": "level0_files",
    "raftmq_rocksdb_delayed_write_rate_bytes": "delayed_write_rate",
    "raftmq_rocksdb_writes_stopped": "writes_stopped",
}


def storage_work(cluster: Cluster) -> dict[str, dict[str, int]]:
    """Each running node's RocksDB background work, summed over its stores (its metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, int]] = {}
    for nid in node_pids(cluster):
        try:
            text = cluster.get("/metrics", nid, timeout=10).text
        except requests.RequestException:
            continue
        sums = dict.fromkeys([*STORAGE_METRICS.values(), "level0_files_max"], 0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in STORAGE_METRICS:
                    sums[STORAGE_METRICS[sample.name]] += int(sample.value)
                    if sample.name == "raftmq_rocksdb_pending_compaction_bytes":  # state / raft apart
                        key = f"pending_compaction_bytes_{sample.labels.get('store', '')}"
                        sums[key] = sums.get(key, 0) + int(sample.value)
                    if sample.name == "raftmq_rocksdb_level0_files":
                        sums["level0_files_max"] = max(sums["level0_files_max"], int(sample.value))
        out[nid] = sums
    return out


def work_idle(work: dict[str, dict[str, int]]) -> bool:
    return bool(work) and all(
        not (w["pending_compaction_bytes"] or w["running_compactions"] or w["running_flushes"])
        for w in work.values()
    )
