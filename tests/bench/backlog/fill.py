"""The backlog's making and unmaking: the fill, the wait for its after-work (settle), and
retention turned on until the disk is back (reclaim)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import requests

from tests.bench._common import node_pids
from tests.bench.backlog.common import GB, JOURNAL_ALLOWANCE, POOL, commit_goals, groups_of, stored
from tests.bench.backlog.timeline import snapshot_installs
from tests.bench.backlog.usage import Usage, node_disks, segment_disks, storage_work, work_idle
from tests.integration.harness import Cluster

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

    installs_before = snapshot_installs(cluster)
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
        "snapshot_installs": snapshot_installs(cluster) - installs_before,
    }


# -- the after-work ----------------------------------------------------------------------------------


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
