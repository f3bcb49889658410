"""Backlog benchmark: what a large retained backlog costs a 3-node cluster (issue 25; figures in
docs/benchmarks.md).

One cluster (tests/integration/harness.Cluster through ``three_node_cluster``: 3 ``raftmq serve``
nodes, 3 queue groups, replication 3, ``durability = "fsync"``, as ``raftmq dev``), measured twice
in the same run: first empty, then after ``--gigabytes`` of ``--value-size`` messages (random
alphanumeric, cycled from 1,024) were produced to a topic of ``--queues`` queues with retention
off. Each round measures:

- **produce**: ``--probe-messages`` sent by one sync ``Producer`` (default settings) as fast as it
  goes, to a new topic: msgs/s from the first send to the end of ``flush``; then ``--rate`` msgs/s
  offered for ``--probe-seconds`` (open loop, latency from each scheduled send to its
  acknowledgement): p50 / p99.
- **catch-up**: a consumer reading from offset 0 (JSON fetches of ``--fetch-max``, one thread per
  ``--readers``): the empty round reads the produce topic, the backlog round the oldest
  ``--catchup-messages`` of the backlog (same count, and the produce topic has ``--queues``
  queues too, so both rounds read as many queues with as many fetches).
- **restart**: ``--restart-node`` killed (SIGKILL) and started again: seconds to ``/readyz`` 200
  (every group has a leader it knows) and to caught up (each of its groups applied up to the
  commit index its leader had at the kill).
- **wiped replica**: ``--wipe-node`` killed, its data folder deleted, started again while the open
  loop offers ``--rate`` msgs/s: seconds until each of its groups has applied the commit index its
  leader had at the wipe (a snapshot checkpoint install for a group whose journal was compacted),
  and the producers' p50 / p99 meanwhile, against the same offered load without a wipe.

Between the fill and the backlog round, **the after-work**: the fill is acknowledged once its
entries are in every replica's RocksDB write-ahead log and memtables; RocksDB then flushes and
compacts them in its own threads, and the leaders seal what is due into segments. The run waits
until every node reports no compaction running or pending and no flush running (its
``raftmq_rocksdb_*`` metrics) and no segment file was written for ``--settle-quiet-s``, and
records how long that took and what the nodes spent on it (CPU seconds, RocksDB's threads apart,
and the bytes written: ``/proc/<pid>``), so the backlog round measures the backlog, like for like
with the empty round (which starts with nothing pending), and the fill's after-work is a figure
of its own. ``--at-once`` also measures a round right after the fill, beside that work (as the
run at 27000a7 did). Every timed phase records the nodes' CPU and disk I/O the same way;
``--profile-s`` records py-spy of every node from each round's produce on.

Then **retention**: the backlog topic gets ``retention_bytes`` (``PATCH /v1/topics/{topic}``) such
that ``--retain-fraction`` of it stays; the disk of every node is sampled until it is back within
the retained size plus what the empty cluster held after its round, plus as much again for each
later round's probe topic (retention on the backlog does not reclaim those), and the journals'
``64 MiB x groups``, at most ``--reclaim-timeout`` s: the seconds it took (or the size it stopped at).

Progress lines while filling; a table at the end; JSON to bench-results/. The data is deleted at
the end (``--keep`` keeps it).

    .venv/bin/python tests/bench/bench_backlog.py --gigabytes 1      # about 3 minutes here
    .venv/bin/python tests/bench/bench_backlog.py --gigabytes 20     # issue 25's size (~90 GB of disk)

Disk: each node holds every queue group (replication 3 on 3 nodes): at 1 GB the 3 nodes held
3.4 GB after the fill and 4.4 GB at the end of the backlog round (state, journals, the sealed
segments' Arrow and Parquet copies, a wiped replica's checkpoint copies); keep 5 x
``--gigabytes`` free. Run it under the heavy lock on a
shared machine (``flock /tmp/raftmq-heavy.lock ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import string
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.bench._common import (  # noqa: E402
    collect_profiles,
    data_folder,
    node_pids,
    percentile,
    profile_nodes,
    recorded_run,
    settle_leaders,
    table,
    three_node_cluster,
)
from tests.integration.harness import Cluster, wait_until  # noqa: E402

POOL = 1024
GB = 1_000_000_000
JOURNAL_ALLOWANCE = 64 << 20  # per group and node: raft.compaction_max_bytes (docs/operations.md)


def value_pool(size: int) -> list[str]:
    """POOL random alphanumeric values of ``size`` bytes (neither zlib nor RocksDB shrinks them much)."""
    rng = random.Random(25)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=size)) for _ in range(POOL)]


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


def process_usage(pid: int) -> dict[str, float]:
    """CPU seconds of process ``pid`` so far, split into RocksDB's background threads and the rest
    (its Python threads), and the bytes it read from and wrote to the disk (``/proc/<pid>/io``)."""
    rocksdb = other = 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            seconds = (int(fields[11]) + int(fields[12])) / _TICK
            if comm.startswith(ROCKSDB_THREADS):
                rocksdb += seconds
            else:
                other += seconds
    io = {"read_bytes": 0, "write_bytes": 0}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/io") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in io:
                io[name] = int(value)
    return {"cpu_s": rocksdb + other, "rocksdb_cpu_s": rocksdb, **io}


class Usage:
    """What each node process spent between :meth:`start` and :meth:`stop`: CPU seconds (all
    threads, and RocksDB's background threads apart), MB read and written on the disk; a node
    restarted meanwhile (another pid) is left out."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pids: dict[str, int] = {}
        self._t0 = 0.0
        self._before: dict[str, dict[str, float]] = {}

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
                "rocksdb_cpu_s": round(after["rocksdb_cpu_s"] - before["rocksdb_cpu_s"], 2),
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


def replicas_behind(cluster: Cluster, goals: dict[str, int]) -> int:
    """Entries the replicas still have to apply to reach ``goals`` (each group's commit index at
    its leader when the fill ended), summed over every node and group."""
    behind = 0
    for nid in node_pids(cluster):
        try:
            groups = cluster.status(nid)["groups"]
        except requests.RequestException:
            continue
        for g, goal in goals.items():
            if g in groups:
                behind += max(0, goal - int(groups[g]["applied_index"]))
    return behind


def settle(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """Wait until the work the fill left behind is done on every node: every replica applied what
    its leader had committed when the fill ended (a fill at full speed leaves followers behind),
    RocksDB has no compaction running or pending and no flush running (``--settle-quiet-s`` in a
    row), and no node's sealer wrote a segment file meanwhile. Returns how long that took (the
    replicas' catching up apart) and what the nodes spent on it."""
    usage = Usage(cluster).start()
    t0 = time.monotonic()
    goals = commit_goals(cluster, groups_of(cluster, "n1"), exclude="")
    behind_at_start = replicas_behind(cluster, goals)
    caught_up_s: float | None = 0.0 if behind_at_start == 0 else None
    first = storage_work(cluster)
    segments = segment_disks(cluster)
    samples: list[tuple[float, int, int]] = []  # (s, pending compaction bytes, running compactions)
    idle_since: float | None = None
    settled_s: float | None = None
    while time.monotonic() - t0 < args.settle_timeout:
        work = storage_work(cluster)
        now = time.monotonic() - t0
        pending = sum(w["pending_compaction_bytes"] for w in work.values())
        running = sum(w["running_compactions"] for w in work.values())
        samples.append((round(now, 1), pending, running))
        grown = segment_disks(cluster)
        behind = replicas_behind(cluster, goals) if caught_up_s is None else 0
        if behind == 0 and caught_up_s is None:
            caught_up_s = round(now, 1)
        quiet = work_idle(work) and grown == segments and behind == 0
        segments = grown
        if not quiet:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= args.settle_quiet_s:
            settled_s = round(idle_since, 1)
            break
        if len(samples) % 10 == 1:
            print(
                f"  settling: {now:5.0f} s, {pending / 1e6:,.0f} MB of compaction pending, "
                f"{running} compactions running, replicas {behind:,} entries behind",
                flush=True,
            )
        time.sleep(1.0)
    return {
        "settled_s": settled_s,
        "replicas_behind_at_start": behind_at_start,
        "replicas_caught_up_s": caught_up_s,
        "work_at_start": first,
        "usage": usage.stop(),
        "segments_bytes": segment_disks(cluster),
        "samples": samples,
    }


def stored(cluster: Cluster, topic: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """(messages held, messages ever written): the sums of the queues' low and high offsets, as
    each queue group's leader has them once it serves reads (docs/api.md, "What the bounds and lag
    say"). A group without such a leader gives null bounds (never smaller ones): asked again."""

    def bounds() -> list[dict[str, Any]] | None:
        queues: list[dict[str, Any]] = cluster.get(f"/v1/topics/{topic}").json()["queues"]
        return None if any(q["high_offset"] is None for q in queues) else queues

    queues = wait_until(bounds, timeout_s, 0.5, f"every queue's bounds of {topic}")
    low = sum(int(q["low_offset"]) for q in queues)
    high = sum(int(q["high_offset"]) for q in queues)
    return high - low, high


def create_topic(cluster: Cluster, name: str, queues: int) -> None:
    r = cluster.post("/v1/topics", {"name": name, "queues": queues})
    if r.status_code != 201:
        raise RuntimeError(f"cannot create {name}: {r.status_code} {r.text}")


# -- produce ---------------------------------------------------------------------------------------


def produce_max(urls: list[str], topic: str, values: list[str], messages: int) -> dict[str, Any]:
    """``messages`` as fast as one sync Producer sends them; msgs/s to the end of flush."""
    from raftmq.client import Producer

    with Producer(urls) as producer:
        for i in range(1000):  # warm-up: metadata, connections
            producer.send(topic, values[i % POOL])
        if not producer.flush(60):
            raise RuntimeError("the warm-up did not flush in 60 s")
        t0 = time.perf_counter()
        for i in range(messages):
            producer.send(topic, values[i % POOL])
        if not producer.flush(600):
            raise RuntimeError("flush did not finish in 600 s")
        seconds = time.perf_counter() - t0
    return {"messages": messages, "seconds": round(seconds, 2), "msgs_per_s": round(messages / seconds)}


class OpenLoop:
    """One sync Producer offering ``rate`` msgs/s to ``topic`` in a thread from :meth:`start` until
    :meth:`stop`; latency from each message's scheduled send to its acknowledgement (a send that
    ran late counts its lateness). Messages scheduled before ``warmup_s`` are not timed."""

    def __init__(self, urls: list[str], topic: str, values: list[str], rate: float, warmup_s: float = 1.0):
        self.urls, self.topic, self.values, self.rate, self.warmup_s = urls, topic, values, rate, warmup_s
        self.latencies_ms: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0
        self.error: BaseException | None = None

    def start(self) -> OpenLoop:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(300)
        if self.error is not None:
            raise RuntimeError(f"open loop failed: {self.error!r}")
        lat = self.latencies_ms
        return {
            "offered_per_s": self.rate,
            "timed": len(lat),
            "failures": len(self.failures),
            "p50_ms": round(percentile(lat, 50), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else float("nan"),
        }

    def _run(self) -> None:
        from raftmq.client import Producer

        try:
            with Producer(self.urls) as producer:
                start = time.perf_counter() + 0.2
                i = 0
                while not self._stop.is_set():
                    scheduled = start + i / self.rate
                    wait = scheduled - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    producer.send(
                        self.topic,
                        self.values[i % POOL],
                        callback=self._callback(scheduled, scheduled - start >= self.warmup_s),
                    )
                    i += 1
                self.sent = i
                if not producer.flush(120):
                    raise RuntimeError("the open loop's messages were not acknowledged in 120 s")
        except BaseException as e:  # reported by stop()
            self.error = e

    def _callback(self, scheduled: float, timed: bool) -> Callable[[Any, Any], None]:
        def callback(_metadata: Any, error: Any) -> None:
            now = time.perf_counter()
            with self._lock:
                if error is not None:
                    self.failures.append(str(error))
                elif timed:
                    self.latencies_ms.append((now - scheduled) * 1000)

        return callback


def open_loop_for(urls: list[str], topic: str, values: list[str], args: argparse.Namespace) -> dict[str, Any]:
    loop = OpenLoop(urls, topic, values, args.rate).start()
    time.sleep(args.probe_seconds + loop.warmup_s)
    return loop.stop()


# -- consume ---------------------------------------------------------------------------------------


def catch_up(cluster: Cluster, topic: str, limit: int, args: argparse.Namespace) -> dict[str, Any]:
    """Read ``topic`` from offset 0 of every queue (JSON fetches of ``args.fetch_max`` from the
    queues' leaders, ``args.readers`` threads) until ``limit`` messages, split evenly over the
    queues, were read; msgs/s and MB/s."""
    desc = cluster.get(f"/v1/topics/{topic}").json()
    queues = [(q["queue"], cluster.nodes[q["leader"]].url) for q in desc["queues"]]
    per_queue = -(-limit // len(queues))
    counts = [0] * len(queues)
    bytes_read = [0] * len(queues)
    failures: list[str] = []

    def read(indexes: list[int]) -> None:
        with requests.Session() as session:
            for i in indexes:
                q, url = queues[i]
                offset = 0
                while counts[i] < per_queue:
                    r = session.get(
                        f"{url}/v1/topics/{topic}/queues/{q}/messages",
                        params={"offset": offset, "max": min(args.fetch_max, per_queue - counts[i])},
                        timeout=60,
                    )
                    if r.status_code != 200:
                        failures.append(f"queue {q}: {r.status_code} {r.text[:200]}")
                        return
                    body = orjson.loads(r.content)
                    if not body["messages"]:
                        break  # the queue holds fewer than its share
                    counts[i] += len(body["messages"])
                    bytes_read[i] += len(r.content)
                    offset = body["next_offset"]

    threads = [
        threading.Thread(target=read, args=(list(range(k, len(queues), args.readers)),))
        for k in range(args.readers)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"catch-up failed: {failures[:3]}")
    n = sum(counts)
    return {
        "messages": n,
        "seconds": round(seconds, 2),
        "msgs_per_s": round(n / seconds),
        "mb_per_s": round(sum(bytes_read) / seconds / 1e6, 1),
    }


# -- restart and wipe ------------------------------------------------------------------------------


def commit_goals(cluster: Cluster, groups: list[str], exclude: str) -> dict[str, int]:
    """Each group's commit index at its leader now (a leader other than ``exclude``)."""
    goals = {}
    for g in groups:
        leader = cluster.wait_leader(g, exclude=exclude)
        goals[g] = int(cluster.status(leader)["groups"][g]["commit_index"])
    return goals


def caught_up(cluster: Cluster, nid: str, goals: dict[str, int]) -> bool:
    groups = cluster.status(nid)["groups"]
    return all(g in groups and int(groups[g]["applied_index"]) >= goal for g, goal in goals.items())


def groups_of(cluster: Cluster, nid: str) -> list[str]:
    return sorted(cluster.status(nid)["groups"])


def restart(cluster: Cluster, nid: str, timeout_s: float) -> dict[str, Any]:
    """Kill ``nid`` (SIGKILL), start it again: seconds to ready and to caught up."""
    groups = groups_of(cluster, nid)
    cluster.kill(nid)
    goals = commit_goals(cluster, groups, exclude=nid)
    t0 = time.monotonic()
    cluster.start(nid)
    wait_until(lambda: cluster._answers_ready(nid), timeout_s, 0.05, f"{nid} ready")
    ready_s = time.monotonic() - t0
    wait_until(lambda: caught_up(cluster, nid, goals), timeout_s, 0.1, f"{nid} caught up")
    return {"node": nid, "ready_s": round(ready_s, 2), "caught_up_s": round(time.monotonic() - t0, 2)}


def wipe_and_catch_up(
    cluster: Cluster, nid: str, urls: list[str], topic: str, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Wipe ``nid`` and start it again while the open loop offers ``args.rate``: seconds until its
    groups applied what their leaders had committed at the wipe, and the producers' latency."""
    groups = groups_of(cluster, nid)
    live = [u for n, u in zip(cluster.nodes, urls, strict=True) if n != nid]
    cluster.kill(nid)
    cluster.wipe(nid)
    loop = OpenLoop(live, topic, values, args.rate, warmup_s=0.0).start()
    time.sleep(1.0)  # the producers' figures cover the start and the whole catch-up
    goals = commit_goals(cluster, groups, exclude=nid)
    t0 = time.monotonic()
    cluster.start(nid)
    try:
        wait_until(lambda: caught_up(cluster, nid, goals), args.wipe_timeout, 0.2, f"wiped {nid} caught up")
        seconds: float | None = round(time.monotonic() - t0, 2)
    except AssertionError as e:
        print(f"  {e}", flush=True)
        seconds = None
    latency = loop.stop()
    return {"node": nid, "caught_up_s": seconds, "producers": latency}


# -- fill and retention ----------------------------------------------------------------------------


def fill(
    cluster: Cluster, urls: list[str], topic: str, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """``args.gigabytes`` of values into ``topic`` by one sync Producer; a progress line every
    ``args.progress_s``."""
    from raftmq.client import Producer

    messages = int(args.gigabytes * GB // args.value_size)
    failures: list[str] = []

    def on_done(_metadata: Any, error: Any) -> None:
        if error is not None:
            failures.append(str(error))

    samples: list[tuple[float, dict[str, dict[str, int]]]] = []  # (s, each node's RocksDB work)
    t0 = last = time.perf_counter()
    with Producer(urls) as producer:
        for i in range(messages):
            producer.send(topic, values[i % POOL], callback=on_done)
            if i % 10_000 == 0 and time.perf_counter() - last >= args.progress_s:
                last = time.perf_counter()
                done_gb = i * args.value_size / GB
                disk = sum(node_disks(cluster).values()) / GB
                work = storage_work(cluster)
                samples.append((round(last - t0, 1), work))
                level0 = max((w["level0_files_max"] for w in work.values()), default=0)
                pending = sum(w["pending_compaction_bytes"] for w in work.values()) / 1e6
                print(
                    f"  filling: {done_gb:6.2f} of {args.gigabytes} GB sent, {i / (last - t0):,.0f} msgs/s, "
                    f"{disk:.1f} GB on the 3 nodes' disks; RocksDB: {pending:,.0f} MB of compaction "
                    f"pending, at most {level0} level-0 files in a store",
                    flush=True,
                )
        if not producer.flush(600):
            raise RuntimeError("the fill did not flush in 600 s")
    seconds = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{len(failures)} messages failed, e.g. {failures[:3]}")
    held, _ = stored(cluster, topic)
    if held != messages:
        raise RuntimeError(f"the backlog holds {held} of {messages} messages")
    return {
        "messages": messages,
        "seconds": round(seconds, 1),
        "msgs_per_s": round(messages / seconds),
        "work_samples": samples,
        "work_at_end": storage_work(cluster),
    }


def reclaim(
    cluster: Cluster, topic: str, queues: int, floor: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Turn retention on (``retention_bytes`` per queue, ``args.retain_fraction`` of the backlog)
    and sample every node's disk until each is within its target, at most ``args.reclaim_timeout``."""
    held_before, _ = stored(cluster, topic)
    backlog_bytes = held_before * args.value_size
    per_queue = max(1, int(backlog_bytes * args.retain_fraction / queues))
    retained = per_queue * queues
    groups = len(groups_of(cluster, "n1"))
    targets = {nid: floor[nid] + int(retained * 1.1) + JOURNAL_ALLOWANCE * groups for nid in cluster.nodes}
    before = node_disks(cluster)
    t0 = time.monotonic()
    r = cluster.session.patch(
        cluster.url() + f"/v1/topics/{topic}", json={"retention_bytes": per_queue}, timeout=60
    )
    if r.status_code != 200:
        raise RuntimeError(f"cannot turn retention on: {r.status_code} {r.text}")
    samples: list[tuple[float, int, int]] = []  # (s, messages held, bytes on the 3 disks)
    removed_s = reached_s = None
    while time.monotonic() - t0 < args.reclaim_timeout:
        disks = node_disks(cluster)
        held, _ = stored(cluster, topic)
        now = time.monotonic() - t0
        samples.append((round(now, 1), held, sum(disks.values())))
        if removed_s is None and held * args.value_size <= retained * 1.1:
            removed_s = round(now, 1)
        if all(disks[n] <= targets[n] for n in disks):
            reached_s = round(now, 1)
            break
        if len(samples) % 6 == 1:
            print(
                f"  reclaiming: {now:5.0f} s, {held:,} messages held, "
                f"{sum(disks.values()) / GB:.2f} GB on the 3 nodes (target {sum(targets.values()) / GB:.2f})",
                flush=True,
            )
        time.sleep(args.reclaim_sample_s)
    after = node_disks(cluster)
    return {
        "retention_bytes_per_queue": per_queue,
        "retained_bytes": retained,
        "disk_before": before,
        "disk_after": after,
        "targets": targets,
        "messages_removed_s": removed_s,
        "disk_at_target_s": reached_s,
        "samples": samples,
    }


# -- one round and the run -------------------------------------------------------------------------


def measure_round(
    cluster: Cluster, name: str, catchup_topic: str | None, values: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """produce (max and open loop), catch-up, restart and wipe, as ``name`` ("empty"/"backlog")."""
    urls = [n.url for n in cluster.nodes.values()]
    probe = f"probe-{name}"
    # As many queues as the backlog: the empty round's catch-up then reads as many queues, with as
    # many fetches each, as the backlog round's (the run at 27000a7 read 8 against 64).
    create_topic(cluster, probe, args.queues)
    out: dict[str, Any] = {"round": name, "work_at_start": storage_work(cluster)}
    out["segments_bytes_at_start"] = segment_disks(cluster)
    spies = profile_nodes(cluster, f"backlog-{name}", args.profile_s) if args.profile_s else []
    print(f"[{name}] produce at full speed ...", flush=True)
    usage = Usage(cluster).start()
    out["produce_max"] = produce_max(urls, probe, values, args.probe_messages)
    out["produce_max"]["usage"] = usage.stop()
    print(f"[{name}] produce at {args.rate:,.0f} msgs/s offered ...", flush=True)
    usage = Usage(cluster).start()
    out["produce_open_loop"] = open_loop_for(urls, probe, values, args)
    out["produce_open_loop"]["usage"] = usage.stop()
    print(f"[{name}] catch-up from offset 0 ...", flush=True)
    usage = Usage(cluster).start()
    out["catch_up"] = catch_up(cluster, catchup_topic or probe, args.catchup_messages, args)
    out["catch_up"]["usage"] = usage.stop()
    if spies:
        out["profiles"] = collect_profiles(spies, PROFILE_THREADS, args.profile_s, wait_s=args.profile_s + 30)
    print(f"[{name}] restart of {args.restart_node} ...", flush=True)
    out["restart"] = restart(cluster, args.restart_node, args.restart_timeout)
    settle_leaders(cluster)
    print(
        f"[{name}] wiped {args.wipe_node} catching up, producers at {args.rate:,.0f} msgs/s ...", flush=True
    )
    out["wipe"] = wipe_and_catch_up(cluster, args.wipe_node, urls, probe, values, args)
    settle_leaders(cluster)
    out["disk"] = node_disks(cluster)
    print(f"[{name}] {summary_line(out)}", flush=True)
    return out


# py-spy's threads of a node (first match wins)
PROFILE_THREADS = {
    "raftmq-checkpoint": "checkpoint",
    "_run_once": "asyncio",
    "run_forever": "asyncio",
    "_worker": "executor",
    "_autoTickThread": "raft",
}


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"produce {r['produce_max']['msgs_per_s']:,} msgs/s, p99 {r['produce_open_loop']['p99_ms']} ms; "
        f"catch-up {r['catch_up']['msgs_per_s']:,} msgs/s; restart ready {r['restart']['ready_s']} s "
        f"(caught up {r['restart']['caught_up_s']} s); wiped replica {r['wipe']['caught_up_s']} s "
        f"(p99 {r['wipe']['producers']['p99_ms']} ms)"
    )


def report(result: dict[str, Any]) -> None:
    rounds = result.get("rounds", [])
    if not rounds:
        return
    heads = ["figure", *(r["round"] for r in rounds), *(f"{r['round']} / empty" for r in rounds[1:])]

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> list[Any]:
        vals = [get(r) for r in rounds]
        base = vals[0]
        ratios = [
            round(v / base, 2) if isinstance(base, int | float) and base and v is not None else "-"
            for v in vals[1:]
        ]
        return [label, *vals, *ratios]

    def cpu(phase: str) -> Callable[[dict[str, Any]], Any]:
        return lambda r: r[phase]["usage"]["total"]["cpu_s"]

    rows = [
        row("produce msgs/s (full speed)", lambda r: r["produce_max"]["msgs_per_s"]),
        row("  nodes' CPU s", cpu("produce_max")),
        row("  of it RocksDB's threads", lambda r: r["produce_max"]["usage"]["total"]["rocksdb_cpu_s"]),
        row("  nodes' disk writes, MB", lambda r: r["produce_max"]["usage"]["total"]["written_mb"]),
        row(
            f"produce p50 ms at {result['params']['rate']:,.0f}/s", lambda r: r["produce_open_loop"]["p50_ms"]
        ),
        row(
            f"produce p99 ms at {result['params']['rate']:,.0f}/s", lambda r: r["produce_open_loop"]["p99_ms"]
        ),
        row("  nodes' CPU s", cpu("produce_open_loop")),
        row("  of it RocksDB's threads", lambda r: r["produce_open_loop"]["usage"]["total"]["rocksdb_cpu_s"]),
        row("catch-up from 0, msgs/s", lambda r: r["catch_up"]["msgs_per_s"]),
        row("  nodes' CPU s", cpu("catch_up")),
        row("  of it RocksDB's threads", lambda r: r["catch_up"]["usage"]["total"]["rocksdb_cpu_s"]),
        row("restart to ready, s", lambda r: r["restart"]["ready_s"]),
        row("restart to caught up, s", lambda r: r["restart"]["caught_up_s"]),
        row("wiped replica caught up, s", lambda r: r["wipe"]["caught_up_s"]),
        row("producers' p99 ms meanwhile", lambda r: r["wipe"]["producers"]["p99_ms"]),
        row("disk on the 3 nodes, GB", lambda r: round(sum(r["disk"].values()) / GB, 2)),
    ]
    print(f"\nbench_backlog  commit {result['commit']}  backlog {result['params']['gigabytes']} GB")
    print(table(rows, heads))
    if "fill" in result:
        f = result["fill"]
        t = f["usage"]["total"]
        print(
            f"fill: {f['messages']:,} messages in {f['seconds']} s ({f['msgs_per_s']:,} msgs/s); the nodes "
            f"spent {t['cpu_s']} CPU s ({t['rocksdb_cpu_s']} in RocksDB's threads), wrote "
            f"{t['written_mb']:,.0f} MB"
        )
        level0 = max([w["level0_files_max"] for _, ws in f["work_samples"] for w in ws.values()] or [0])
        end = sum(w["pending_compaction_bytes"] for w in f["work_at_end"].values())
        print(f"  at most {level0} level-0 files in a store while filling; {end / 1e6:,.0f} MB to compact")
    if "settle" in result:
        st, total = result["settle"], result["settle"]["usage"]["total"]
        pending = sum(w["pending_compaction_bytes"] for w in st["work_at_start"].values())
        print(
            f"after-work (settle): idle after {st['settled_s']} s; {pending / 1e6:,.0f} MB of compaction "
            f"pending at its start; the nodes spent {total['cpu_s']} CPU s meanwhile "
            f"({total['rocksdb_cpu_s']} in RocksDB's threads), wrote {total['written_mb']:,.0f} MB, read "
            f"{total['read_mb']:,.0f} MB; segments {sum(st['segments_bytes'].values()) / 1e6:,.0f} MB; "
            f"replicas {st['replicas_behind_at_start']:,} entries behind at its start, caught up after "
            f"{st['replicas_caught_up_s']} s"
        )
    if "reclaim" in result:
        rc = result["reclaim"]
        print(
            f"retention on ({rc['retained_bytes'] / GB:.2f} GB kept): messages removed after "
            f"{rc['messages_removed_s']} s, disk at target after {rc['disk_at_target_s']} s "
            f"({sum(rc['disk_before'].values()) / GB:.2f} -> {sum(rc['disk_after'].values()) / GB:.2f} GB "
            f"on the 3 nodes, target {sum(rc['targets'].values()) / GB:.2f})"
        )


def cluster_toml(args: argparse.Namespace) -> str:
    """The cluster file's settings: ``fsync``, and ``segments.max_bytes`` when given (a smaller
    segment makes a small backlog seal as much of itself as a large one does with the default)."""
    toml = 'durability = "fsync"\n'
    if args.segment_max_bytes:
        toml += f"\n[segments]\nmax_bytes = {args.segment_max_bytes}\n"
    return toml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gigabytes", type=float, default=20.0, help="backlog size (values, 10^9 bytes)")
    ap.add_argument("--queues", type=int, default=64, help="queues of the backlog topic")
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--probe-messages", type=int, default=100_000, help="messages of the full-speed produce")
    ap.add_argument("--rate", type=float, default=1000.0, help="msgs/s the open loop offers")
    ap.add_argument("--probe-seconds", type=float, default=10.0, help="timed seconds of the open loop")
    ap.add_argument("--catchup-messages", type=int, default=100_000, help="messages the catch-up reads")
    ap.add_argument("--fetch-max", type=int, default=2000, help="messages per fetch in the catch-up")
    ap.add_argument("--readers", type=int, default=4, help="catch-up threads")
    ap.add_argument("--restart-node", default="n2")
    ap.add_argument("--wipe-node", default="n3")
    ap.add_argument("--restart-timeout", type=float, default=300.0)
    ap.add_argument("--wipe-timeout", type=float, default=900.0)
    ap.add_argument("--retain-fraction", type=float, default=0.1, help="of the backlog, once retention is on")
    ap.add_argument("--reclaim-timeout", type=float, default=600.0)
    ap.add_argument("--reclaim-sample-s", type=float, default=5.0)
    ap.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument(
        "--at-once",
        action="store_true",
        help="also measure a round right after the fill, before its after-work ended (as at 27000a7)",
    )
    ap.add_argument("--settle-timeout", type=float, default=900.0, help="the longest wait for the after-work")
    ap.add_argument("--settle-quiet-s", type=float, default=5.0, help="idle this long in a row: settled")
    ap.add_argument(
        "--segment-max-bytes",
        type=int,
        default=0,
        help="segments.max_bytes of the cluster (0: its default, 64 MiB: 1 GB over 64 queues seals nothing)",
    )
    ap.add_argument(
        "--profile-s", type=float, default=0.0, help="py-spy every node this long from each round's produce"
    )
    ap.add_argument("--data-dir", default="", help="where the data goes (default: the system's temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's folder")
    ap.add_argument("--wait-quiet", type=float, default=30.0, help="wait up to this long for an idle machine")
    ap.add_argument("--tag", default="", help="a label stored with the result")
    args = ap.parse_args()
    base, fs = data_folder(args)
    values = value_pool(args.value_size)
    notes = (
        "one cluster, empty then with the backlog; produce by one sync Producer; catch-up by raw JSON "
        "fetches; restart by SIGKILL; wipe with the open loop running; retention_bytes turned on last"
    )
    with (
        recorded_run(
            "backlog",
            args,
            notes=notes,
            data_fs=fs,
            report=report,
            internal=("keep", "data_dir", "wait_quiet"),
        ) as result,
        three_node_cluster(base, "backlog-", cluster_toml(args), keep=args.keep) as cluster,
    ):
        settle_leaders(cluster)
        result["pids"] = node_pids(cluster)
        start = node_disks(cluster)
        result["rounds"] = [measure_round(cluster, "empty", None, values, args)]
        floor = node_disks(cluster)
        # What one round's probe topic left on each disk: every later round leaves as much, and
        # retention on the backlog topic does not reclaim it, so the targets count it too.
        probe_bytes = {nid: max(0, floor[nid] - start[nid]) for nid in floor}
        create_topic(cluster, "backlog", args.queues)
        urls = [n.url for n in cluster.nodes.values()]
        print(
            f"[fill] {args.gigabytes} GB of {args.value_size} B values over {args.queues} queues ...",
            flush=True,
        )
        usage = Usage(cluster).start()
        result["fill"] = fill(cluster, urls, "backlog", values, args)
        result["fill"]["usage"] = usage.stop()
        result["disk_filled"] = node_disks(cluster)
        if args.at_once:
            # The round as the run at 27000a7 measured it: at once, beside the fill's after-work.
            result["rounds"].append(measure_round(cluster, "at-once", "backlog", values, args))
        print("[settle] waiting for the nodes' background work to end ...", flush=True)
        result["settle"] = settle(cluster, args)
        result["rounds"].append(measure_round(cluster, "backlog", "backlog", values, args))
        print("[retention] on ...", flush=True)
        later = len(result["rounds"]) - 1
        floor = {nid: floor[nid] + later * probe_bytes[nid] for nid in floor}
        result["reclaim"] = reclaim(cluster, "backlog", args.queues, floor, args)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stopped run removes its data
    main()
