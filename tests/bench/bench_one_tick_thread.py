"""One Raft tick thread per node instead of one per group: a prototype measured, no product change
(issue 23, docs/benchmarks.md "One tick thread per node, prototyped in a benchmark").

One process holds three nodes, each with ``--groups`` replicas of ``RaftGroup`` (RocksDB journals,
fsync on, a trivial state machine): 12 pysyncobj objects by default. Two arms, one cluster each:

- ``per-group`` (today): every object ticks on its own thread, as pysyncobj starts it;
- ``one``: every node's objects are ticked by ONE thread: each object's poller is a thin view of
  the node's one ``select.poll`` (its sockets and its proposal pipe registered there), an object's
  tick is run when one of its descriptors fired or its own deadline (the sleep raftmq's deadline
  poll asks for) has come, and the thread then polls once for the whole node.

Entries of ``--size`` bytes are offered at fixed rates (``--rates``, entries/s over all groups,
spread round-robin, each to its group's leader) for ``--seconds`` each. Per rate and arm: on-CPU
time per entry of the tick threads (``/proc/self/task/<tid>/schedstat``) and of the whole process,
context switches per entry (voluntary + involuntary, ``/proc/self/task/<tid>/status``) of the tick
threads and the process, journal fsyncs per entry and their mean time, and submit-to-applied
(on the leader) p50/p99. Then a micro-measure of what sharing the fsyncs would need: ``--groups``
journals in separate RocksDBs (one ``flush_wal`` each, today) against one RocksDB holding them
all (one ``flush_wal`` for all).

What one process hides: the three nodes share one GIL here (a real node has its own), so a wake-up
may also wait for another node's thread; both arms pay that, the per-group arm with more threads.

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_one_tick_thread.py   # ~90 s

Prints a table and writes JSON to bench-results/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pysyncobj.syncobj as pso_syncobj
from _common import add_quiet_argument, free_ports, percentile, quiet_header, table, write_result
from pysyncobj.poller import PollPoller

from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

NODES = 3


class _Machine:
    """Applies nothing: the entry's Raft work alone."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.applied_index = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.applied_index = index
        return None

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


# -- the one-thread arm: a node's shared poll and its driver ---------------------------------------


class _GroupPoller:
    """What one pysyncobj object sees as its poller: subscriptions go to the node's shared poll,
    each callback marks the object due; ``poll`` only records how long the object may sleep."""

    def __init__(self, shared: PollPoller) -> None:
        self._shared = shared
        self.due = False  # one of its descriptors fired since its last tick
        self.wait_s = 0.0

    def subscribe(self, descr: Any, callback: Callable[[Any, int], None], event_mask: int) -> None:
        def marked(d: Any, event: int) -> None:
            self.due = True
            callback(d, event)

        self._shared.subscribe(descr, marked, event_mask)

    def unsubscribe(self, descr: Any) -> None:
        self._shared.unsubscribe(descr)

    def poll(self, timeout: float) -> None:  # raftmq's deadline poll wraps this one
        self.wait_s = timeout


class _NodeDriver:
    """One thread ticking every pysyncobj object of one node. Invariant: an object's tick runs on
    this thread only, after one of its descriptors fired or once its own deadline has come."""

    def __init__(self) -> None:
        self.shared = PollPoller()
        self.syncs: list[tuple[Any, _GroupPoller]] = []
        self.next_tick: list[float] = []
        self.tid = 0
        self.polls = 0  # its waits on the shared poll: one wake-up each when it slept
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="node-driver", daemon=True)
        self._thread.start()

    def adopt(self, sync: Any) -> None:
        with self._lock:
            self.syncs.append((sync, sync._poller))
            self.next_tick.append(0.0)

    def stop(self) -> None:
        self._stop = True
        self._thread.join()

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        while not self._stop:
            with self._lock:
                syncs = list(enumerate(self.syncs))
            for i, (sync, poller) in syncs:
                if poller.due or time.monotonic() >= self.next_tick[i]:
                    poller.due = False
                    sync._onTick(0)  # its last step records its sleep in poller.wait_s
                    self.next_tick[i] = time.monotonic() + poller.wait_s
            wait_s = min(self.next_tick, default=0.05) - time.monotonic()
            self.polls += 1
            self.shared.poll(min(max(wait_s, 0.0), 0.05))
        for sync, _ in self.syncs:
            sync._doDestroy()


class _TickCount:
    """pysyncobj ticks run in this process (every object, every thread): ``_onTick`` counted."""

    def __init__(self) -> None:
        self.ticks = 0
        self._on_tick = on_tick = pso_syncobj.SyncObj._onTick

        def counted(sync: Any, time_to_wait: float = 0.0) -> None:
            self.ticks += 1  # not atomic across threads: a rare lost count at most
            on_tick(sync, time_to_wait)

        pso_syncobj.SyncObj._onTick = counted

    def restore(self) -> None:
        pso_syncobj.SyncObj._onTick = self._on_tick


@contextmanager
def _tick_arm(arm: str, drivers: dict[str, _NodeDriver], tids: list[int]) -> Iterator[list[str]]:
    """pysyncobj patched in this process for ``arm``; yields the list whose last item names the node
    whose objects are being built (the one-thread arm gives each its node's shared poll)."""
    building: list[str] = []
    run, create = pso_syncobj.SyncObj._autoTickThread, pso_syncobj.createPoller

    def own_thread(sync: Any) -> None:
        tids.append(threading.get_native_id())
        run(sync)

    def hand_to_driver(sync: Any) -> None:  # pysyncobj's start of its tick thread, then the driver
        try:
            sync._SyncObj__transport.tryGetReady()
        finally:
            sync._SyncObj__initialised.set()
        drivers[str(sync.selfNode.id)].adopt(sync)

    if arm == "one":
        pso_syncobj.SyncObj._autoTickThread = hand_to_driver
        pso_syncobj.createPoller = lambda _kind: _GroupPoller(drivers[building[-1]].shared)
    else:
        pso_syncobj.SyncObj._autoTickThread = own_thread
    try:
        yield building
    finally:
        pso_syncobj.SyncObj._autoTickThread, pso_syncobj.createPoller = run, create


# -- the cluster -----------------------------------------------------------------------------------


class _Cluster:
    """``groups`` Raft groups over three nodes in this process, ticked as ``arm`` says."""

    def __init__(self, base: Path, arm: str, groups: int) -> None:
        self.tids: list[int] = []
        addrs = [[f"127.0.0.1:{p}" for p in free_ports(NODES)] for _ in range(groups)]
        nodes = [[a[n] for a in addrs] for n in range(NODES)]
        self.drivers: dict[str, _NodeDriver] = {}  # a replica's address -> its node's driver
        for node in nodes if arm == "one" else []:
            driver = _NodeDriver()
            self.drivers.update((a, driver) for a in node)
        self.stores: list[RocksStore] = []
        self.groups: list[list[RaftGroup]] = []
        settings = RaftSettings(password="b" * 16, prompt_commit_notice=False)  # as a queue group's
        with _tick_arm(arm, self.drivers, self.tids) as building:
            for g, group_addrs in enumerate(addrs):
                replicas = []
                for n, addr in enumerate(group_addrs):
                    building.append(addr)
                    self.stores.append(RocksStore.open(str(base / f"n{n}" / f"g{g}")))
                    replicas.append(
                        RaftGroup(
                            name=f"g{g}",
                            node_id=f"n{n + 1}",
                            self_addr=addr,
                            peer_addrs=[a for a in group_addrs if a != addr],
                            journal_store=self.stores[-1],
                            machine=_Machine(),
                            snapshot_file=str(base / f"n{n}" / f"g{g}.snapshot"),
                            settings=settings,
                        )
                    )
                self.groups.append(replicas)
        if arm == "one":
            self.tids[:] = []
            time.sleep(0.1)
            self.tids.extend({d.tid for d in self.drivers.values()})

    def leaders(self) -> list[RaftGroup]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [next((r for r in rs if r.is_leader()), None) for rs in self.groups]
            settled = [
                ld
                for ld, rs in zip(found, self.groups, strict=True)
                if ld is not None and all(r.leader() == ld.self_addr for r in rs)
            ]
            if len(settled) == len(self.groups):
                return settled
            time.sleep(0.01)
        raise RuntimeError("no leader in some group")

    def polls(self, ticks: int) -> int:
        """Waits on a poll so far: one per tick when each object has its thread."""
        return sum(d.polls for d in set(self.drivers.values())) if self.drivers else ticks

    def syncs(self) -> tuple[int, float]:
        journals = [r._journal for rs in self.groups for r in rs]
        return sum(j.syncs for j in journals), sum(j.sync_seconds for j in journals)

    def close(self) -> None:
        for driver in set(self.drivers.values()):
            driver.stop()
        for rs in self.groups:
            for r in rs:
                r.destroy()
        for store in self.stores:
            store.close()


# -- measuring -------------------------------------------------------------------------------------


def _cpu_ns(tids: list[int]) -> int:
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def _switches(tids: list[int]) -> int:
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/status") as f:
            total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return total


def _all_tids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _offer(leaders: list[RaftGroup], rate: float, seconds: float, command: bytes) -> list[float]:
    """Submit at ``rate`` entries/s round-robin over the groups' leaders; each entry's
    submit-to-applied seconds (on the leader), in the order answered."""
    took: list[float] = []
    answered = threading.Semaphore(0)
    count = int(rate * seconds)
    start = time.perf_counter()
    for i in range(count):
        due = start + i / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        submitted = time.perf_counter()

        def done(_outcome: Any, submitted: float = submitted) -> None:
            took.append(time.perf_counter() - submitted)
            answered.release()

        leaders[i % len(leaders)].submit(command, done)
    for _ in range(count):
        if not answered.acquire(timeout=10):
            raise RuntimeError("an entry was not answered in 10 s")
    return took


def run_arm(arm: str, args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-one-tick-{arm}-", dir=base))
    counter = _TickCount()
    cluster = _Cluster(folder, arm, args.groups)
    try:
        leaders = cluster.leaders()
        command = os.urandom(args.size)
        _offer(leaders, 500, 1.0, command)  # warm-up
        rows = []
        for rate in args.rates:
            tids, every = list(cluster.tids), _all_tids()
            cpu0, sw0, all_sw0 = _cpu_ns(tids), _switches(tids), _switches(every)
            proc0, (syncs0, sync_s0) = time.process_time(), cluster.syncs()
            ticks0, polls0 = counter.ticks, cluster.polls(counter.ticks)
            took = _offer(leaders, rate, args.seconds, command)
            time.sleep(0.2)  # the followers' last acknowledgements
            n = len(took)
            syncs1, sync_s1 = cluster.syncs()
            rows.append(
                {
                    "arm": arm,
                    "rate": rate,
                    "entries": n,
                    "tick_threads": len(tids),
                    "leaders_per_node": sorted(
                        sum(1 for ld in leaders if ld.node_id == f"n{k + 1}") for k in range(NODES)
                    ),
                    "tick_cpu_us_per_entry": (_cpu_ns(tids) - cpu0) / 1e3 / n,
                    "process_cpu_us_per_entry": (time.process_time() - proc0) * 1e6 / n,
                    "tick_switches_per_entry": (_switches(tids) - sw0) / n,
                    "process_switches_per_entry": (_switches(every) - all_sw0) / n,
                    "ticks_per_entry": (counter.ticks - ticks0) / n,
                    "polls_per_entry": (cluster.polls(counter.ticks) - polls0) / n,
                    "fsyncs_per_entry": (syncs1 - syncs0) / n,
                    "fsync_ms_mean": (sync_s1 - sync_s0) * 1e3 / max(syncs1 - syncs0, 1),
                    "p50_ms": percentile(took, 50) * 1e3,
                    "p99_ms": percentile(took, 99) * 1e3,
                }
            )
        return rows
    finally:
        cluster.close()
        counter.restore()
        shutil.rmtree(folder, ignore_errors=True)


def fsync_share(base: Path, groups: int, rounds: int, size: int) -> dict[str, float]:
    """Microseconds to make one entry of each of ``groups`` journals durable: separate RocksDBs
    (a write and a ``flush_wal`` each, today) against one RocksDB for all (writes, one flush_wal)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-one-tick-fsync-", dir=base))
    value = os.urandom(size)
    separate = [RocksStore.open(str(folder / f"s{g}")) for g in range(groups)]
    shared = RocksStore.open(str(folder / "shared"))
    try:
        timed = {}
        for name, stores in (("separate", separate), ("shared", [shared] * groups)):
            started = time.perf_counter()
            for r in range(rounds):
                for g, store in enumerate(stores):
                    batch = Batch()
                    batch.put(b"g%d-%012d" % (g, r), value)
                    store.write(batch)
                for store in set(stores):
                    store.sync()
            timed[f"{name}_us_per_round"] = (time.perf_counter() - started) * 1e6 / rounds
        return timed
    finally:
        for store in [*separate, shared]:
            store.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=4, help="Raft groups (a node's meta + 3 queue groups)")
    ap.add_argument("--rates", type=float, nargs="+", default=[300, 1000, 3000], help="entries/s offered")
    ap.add_argument("--seconds", type=float, default=4, help="seconds per rate")
    ap.add_argument("--size", type=int, default=300, help="bytes per entry")
    ap.add_argument("--repeat", type=int, default=2, help="passes of both arms, alternated")
    ap.add_argument("--data-dir", default="", help="where the journals go (a disk; default: temp dir)")
    add_quiet_argument(ap)
    args = ap.parse_args()
    result = quiet_header("one_tick_thread", vars(args), args.wait_quiet)
    base = Path(args.data_dir or tempfile.gettempdir())
    passes = [run_arm(arm, args, base) for _ in range(args.repeat) for arm in ("per-group", "one")]
    result["passes"] = passes
    result["fsync_share"] = fsync_share(base, args.groups, 300, args.size)
    keys = (
        "tick_cpu_us_per_entry",
        "process_cpu_us_per_entry",
        "tick_switches_per_entry",
        "process_switches_per_entry",
        "ticks_per_entry",
        "polls_per_entry",
        "fsyncs_per_entry",
        "fsync_ms_mean",
        "p50_ms",
        "p99_ms",
    )
    measured = [r for arm_rows in passes for r in arm_rows]
    rows = [[r["arm"], r["rate"], r["tick_threads"], *(f"{r[k]:.2f}" for k in keys)] for r in measured]
    heads = ["arm", "entries/s", "threads", "tick CPU us", "proc CPU us", "tick cs", "proc cs", "ticks"]
    print(table(rows, [*heads, "polls", "fsyncs", "fsync ms", "p50 ms", "p99 ms"]))
    print("per entry; fsync sharing, us per round of one entry per group:", result["fsync_share"])
    print(f"wrote {write_result('one_tick_thread', result)}")


if __name__ == "__main__":
    main()
