"""The table at the end of a run (the JSON holds every figure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.bench._common import table
from tests.bench.backlog.common import GB


def report(result: dict[str, Any]) -> None:
    rounds = result.get("rounds", [])
    if not rounds:
        return
    # Ratios to the empty round, and to the control round (--empty-again) when there is one.
    bases = [i for i, r in enumerate(rounds) if r["round"] in ("empty", "empty-again")]
    pairs = [(b, i) for b in bases for i in range(b + 1, len(rounds)) if i not in bases or b == 0]
    heads = ["figure", *(r["round"] for r in rounds)]
    heads += [f"{rounds[i]['round']} / {rounds[b]['round']}" for b, i in pairs]

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> list[Any]:
        vals = [get(r) for r in rounds]
        ratios = [
            round(vals[i] / vals[b], 2)
            if isinstance(vals[b], int | float) and vals[b] and vals[i] is not None
            else "-"
            for b, i in pairs
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
        row("snapshot installs, produce to catch-up", lambda r: r.get("snapshot_installs")),
    ]
    print(f"\nbench_backlog  commit {result['commit']}  backlog {result['params']['gigabytes']} GB")
    print(table(rows, heads))
    print("the open loop's slowest seconds:")
    worst_seconds(result)
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
        print(
            f"  at most {level0} level-0 files in a store while filling; {end / 1e6:,.0f} MB to compact; "
            f"{f.get('snapshot_installs')} snapshot installs"
        )
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


def worst_seconds(result: dict[str, Any], count: int = 3) -> None:
    """The open loop's slowest seconds of each round, beside what the nodes did in them."""
    for r in result.get("rounds", []):
        rows = [row for row in r["produce_open_loop"].get("per_second", []) if row["p99_ms"] is not None]
        for row in sorted(rows, key=lambda row: -row["p99_ms"])[:count]:
            print(
                f"  [{r['round']}] at {row['s']:5.1f} s: p99 {row['p99_ms']} ms, max {row['max_ms']} ms; "
                f"nodes wrote {row['written_mb']} MB, {row['slow_fsyncs']:.0f} of {row['fsyncs']:.0f} "
                f"journal fsyncs >= 50 ms ({row['fsync_s']:.2f} s in all); flushes {row['flushes']}, "
                f"compactions {row['compactions']}, level-0 {row['level0_files']}, journals dropped "
                f"{row['journal_mb_dropped']} MB, snapshots installed {row['snapshot_installs']:.0f}; "
                f"dirty {row['dirty_mb']} MB, "
                f"writeback {row['writeback_mb']} MB"
            )
