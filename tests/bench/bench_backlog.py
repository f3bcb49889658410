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
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.bench._common import data_folder, node_pids, recorded_run, settle_leaders, three_node_cluster  # noqa: E402
from tests.bench.backlog.common import create_topic, value_pool  # noqa: E402
from tests.bench.backlog.fill import fill, reclaim, settle  # noqa: E402
from tests.bench.backlog.phases import measure_round  # noqa: E402
from tests.bench.backlog.report import report  # noqa: E402
from tests.bench.backlog.usage import Usage, node_disks  # noqa: E402


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
    ap.add_argument(
        "--empty-again",
        action="store_true",
        help="measure the empty round twice (the second after the first's restart and wipe): a control",
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
        if args.empty_again:
            # The same round again, still empty: what a second round costs without a backlog.
            result["rounds"].append(measure_round(cluster, "empty-again", None, values, args))
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
