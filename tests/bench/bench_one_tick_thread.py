"""One Raft tick thread per node instead of one per group: a prototype measured, no product change
(issue 23, docs/benchmarks.md "One tick thread per node, prototyped in a benchmark").

Three nodes, each a process of its own (this script with ``--worker-node``), each with its
replica of ``--groups`` ``RaftGroup`` s (RocksDB journals, fsync on, a trivial state machine):
4 pysyncobj objects per node by default. Two arms, one cluster each:

- ``per-group`` (today): every object ticks on its own thread, as pysyncobj starts it;
- ``one``: every node's objects are ticked by ONE thread: each object's poller is a thin view of
  the node's one ``select.poll`` (its sockets and its proposal pipe registered there), an object's
  tick is run when one of its descriptors fired or its own deadline (the sleep raftmq's deadline
  poll asks for) has come, and the thread then polls once for the whole node.

Entries of ``--size`` bytes are offered at fixed rates (``--rates``, entries/s over all groups,
spread round-robin, each to its group's leader) for ``--seconds`` each. Per rate and arm: on-CPU
time per entry of the tick threads (``/proc/self/task/<tid>/schedstat``, and their time runnable
but waiting for a core) and of the node processes, context switches per entry (voluntary +
involuntary, ``/proc/self/task/<tid>/status``) of the tick threads and the processes, pysyncobj
ticks and waits on a poll per entry, journal fsyncs per entry and their mean time, and
submit-to-applied (on the leader) p50/p99. Then a micro-measure of what sharing the fsyncs would
need: ``--groups`` journals in separate RocksDBs (one ``flush_wal`` each, today) against one
RocksDB holding them all (one ``flush_wal`` for all).

``--one-process`` puts the three nodes in this process instead: they share one GIL there (a
real node has its own), so a wake-up may also wait for another node's thread.

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_one_tick_thread.py   # ~80 s

Prints a table and writes JSON to bench-results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
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
from bench_raft_ticks import NullMachine
from pysyncobj.poller import PollPoller

from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

NODES = 3
LONG_ROUND_S = 0.004


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
        self.ticked: set[int] = set()  # the objects ticked once: due at once when one fires
        self.tid = 0
        self.polls = 0  # its waits on the shared poll: one wake-up each when it slept
        # Rounds of ticks that took over LONG_ROUND_S (every object of the node waited for them):
        # how many, their seconds and the journals' fsync seconds in them.
        self.long_rounds = 0
        self.long_round_s = 0.0
        self.long_round_fsync_s = 0.0
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="node-driver", daemon=True)
        self._thread.start()

    def adopt(self, sync: Any) -> None:
        with self._lock:
            self.syncs.append((sync, sync._poller))
            # pysyncobj's own tick thread waits 0.1 s before its first tick: RaftGroup installs
            # its seams on the object meanwhile
            self.next_tick.append(time.monotonic() + 0.1)

    def stop(self) -> None:
        self._stop = True
        self._thread.join()

    def _fsync_s(self) -> float:
        return sum(sync.raftmq_journal.sync_seconds for sync, _ in self.syncs)

    @staticmethod
    def _tick(sync: Any) -> None:
        try:
            sync._onTick(0)
        except Exception:  # as pysyncobj's tick thread: log it and go on
            logging.getLogger(__name__).exception("tick_failed")

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        while not self._stop:
            with self._lock:
                syncs = list(enumerate(self.syncs))
            started, fsync_s = time.perf_counter(), self._fsync_s()
            for i, (sync, poller) in syncs:
                if time.monotonic() >= self.next_tick[i] or (poller.due and i in self.ticked):
                    self.ticked.add(i)
                    poller.due = False
                    self._tick(sync)  # its last step records its sleep in poller.wait_s
                    self.next_tick[i] = time.monotonic() + poller.wait_s
            took_s = time.perf_counter() - started
            if took_s > LONG_ROUND_S:
                self.long_rounds += 1
                self.long_round_s += took_s
                self.long_round_fsync_s += self._fsync_s() - fsync_s
            wait_s = min(self.next_tick, default=0.05) - time.monotonic()
            self.polls += 1
            try:
                self.shared.poll(min(max(wait_s, 0.0), 0.05))
            except Exception:  # a callback's failure, as pysyncobj's tick thread: log it, go on
                logging.getLogger(__name__).exception("poll_failed")
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
def _tick_arm(arm: str, driver: _NodeDriver | None, tids: list[int]) -> Iterator[None]:
    """pysyncobj patched in this process for ``arm`` while one node's objects are built: each on
    its own thread (its id into ``tids``), or handed to ``driver`` with a view of its shared poll."""
    run, create = pso_syncobj.SyncObj._autoTickThread, pso_syncobj.createPoller

    def own_thread(sync: Any) -> None:
        tids.append(threading.get_native_id())
        run(sync)

    def hand_to_driver(sync: Any) -> None:  # pysyncobj's start of its tick thread, then the driver
        try:
            sync._SyncObj__transport.tryGetReady()
        finally:
            sync._SyncObj__initialised.set()
        assert driver is not None
        driver.adopt(sync)

    if driver is not None:
        pso_syncobj.SyncObj._autoTickThread = hand_to_driver
        pso_syncobj.createPoller = lambda _kind: _GroupPoller(driver.shared)
    else:
        pso_syncobj.SyncObj._autoTickThread = own_thread
    try:
        yield
    finally:
        pso_syncobj.SyncObj._autoTickThread, pso_syncobj.createPoller = run, create


# -- a node: its replica of every group ------------------------------------------------------------


class _Node:
    """Node ``n``'s replica of each group (``addrs[g][n]`` its address), ticked as ``arm`` says."""

    def __init__(self, base: Path, arm: str, addrs: list[list[str]], n: int) -> None:
        self.tids: list[int] = []
        self.driver = _NodeDriver() if arm == "one" else None
        self.stores: list[RocksStore] = []
        self.replicas: list[RaftGroup] = []
        settings = RaftSettings(password="b" * 16, prompt_commit_notice=False)  # as a queue group's
        with _tick_arm(arm, self.driver, self.tids):
            for g, group_addrs in enumerate(addrs):
                self.stores.append(RocksStore.open(str(base / f"n{n}" / f"g{g}")))
                self.replicas.append(
                    RaftGroup(
                        name=f"g{g}",
                        node_id=f"n{n + 1}",
                        self_addr=group_addrs[n],
                        peer_addrs=[a for a in group_addrs if a != group_addrs[n]],
                        journal_store=self.stores[-1],
                        machine=NullMachine(),
                        snapshot_file=str(base / f"n{n}" / f"g{g}.snapshot"),
                        settings=settings,
                    )
                )
        if self.driver is not None:
            time.sleep(0.1)
            self.tids[:] = [self.driver.tid]

    def _long_rounds(self) -> dict[str, float]:
        if self.driver is None:
            return {}
        d = self.driver
        return {
            "long_rounds": d.long_rounds,
            "long_round_s": d.long_round_s,
            "long_round_fsync_s": d.long_round_fsync_s,
        }

    def roles(self) -> list[list[Any]]:
        """Per group: whether this replica leads, and the leader it knows."""
        return [[r.is_leader(), r.leader()] for r in self.replicas]

    def counters(self, ticks: int) -> dict[str, float]:
        """Cumulative: tick threads' CPU and switches, the process's, ticks, polls, fsyncs."""
        journals = [r._journal for r in self.replicas]
        return {
            "tick_cpu_us": _cpu_ns(self.tids) / 1e3,
            "tick_runqueue_us": _cpu_ns(self.tids, field=1) / 1e3,
            "tick_switches": _switches(self.tids),
            "ticks": ticks,
            "polls": self.driver.polls if self.driver is not None else ticks,
            "fsyncs": sum(j.syncs for j in journals),
            "fsync_s": sum(j.sync_seconds for j in journals),
            **self._long_rounds(),
        }

    def offer(self, rate: float, seconds: float, size: int) -> list[float]:
        """Offer this node's share of ``rate`` (entries/s over all groups) to the groups it leads."""
        leaders = [r for r in self.replicas if r.is_leader()]
        share = rate * len(leaders) / len(self.replicas)
        return _offer(leaders, share, seconds, os.urandom(size)) if leaders else []

    def close(self) -> None:
        if self.driver is not None:
            self.driver.stop()
        for r in self.replicas:
            r.destroy()
        for store in self.stores:
            store.close()


def _process_counters() -> dict[str, float]:
    return {"process_cpu_us": time.process_time() * 1e6, "process_switches": _switches(_all_tids())}


# -- the cluster: three nodes in this process, or each in its own ----------------------------------


class _InProcess:
    """Three nodes in this process (one GIL for all)."""

    def __init__(self, base: Path, arm: str, addrs: list[list[str]]) -> None:
        self.counter = _TickCount()
        self.nodes = [_Node(base, arm, addrs, n) for n in range(NODES)]

    def roles(self) -> list[list[list[Any]]]:
        return [node.roles() for node in self.nodes]

    def counters(self) -> list[dict[str, float]]:
        # every node's ticks are counted together here: they go to the first
        per_node = [node.counters(self.counter.ticks if n == 0 else 0) for n, node in enumerate(self.nodes)]
        if self.nodes[0].driver is None:
            for c in per_node[1:]:
                c["polls"] = 0
        per_node[0].update(_process_counters())
        return per_node

    def offer(self, rate: float, seconds: float, size: int) -> list[float]:
        took: list[list[float]] = [[] for _ in self.nodes]

        def one(n: int) -> None:
            took[n] = self.nodes[n].offer(rate, seconds, size)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(NODES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [x for node_took in took for x in node_took]

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.counter.restore()


class _Processes:
    """Each node in a process of its own (this script with ``--worker-node``), spoken to by lines
    of JSON on its stdin and stdout."""

    def __init__(self, base: Path, arm: str, addrs: list[list[str]]) -> None:
        script, spec = str(Path(__file__).resolve()), json.dumps(addrs)
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    script,
                    "--worker-node",
                    str(n),
                    "--arm",
                    arm,
                    "--addrs",
                    spec,
                    "--data-dir",
                    str(base),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
            for n in range(NODES)
        ]
        for proc in self.procs:
            self._read(proc)  # ready

    def _read(self, proc: subprocess.Popen[str]) -> Any:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("a node process ended")
        return json.loads(line)

    def _ask_all(self, request: dict[str, Any]) -> list[Any]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request) + "\n")
        return [self._read(proc) for proc in self.procs]

    def roles(self) -> list[list[list[Any]]]:
        return self._ask_all({"op": "roles"})

    def counters(self) -> list[dict[str, float]]:
        return self._ask_all({"op": "counters"})

    def offer(self, rate: float, seconds: float, size: int) -> list[float]:
        answers = self._ask_all({"op": "offer", "rate": rate, "seconds": seconds, "size": size})
        return [x for took in answers for x in took]

    def close(self) -> None:
        self._ask_all({"op": "quit"})
        for proc in self.procs:
            proc.wait(30)


def _worker(args: argparse.Namespace) -> None:
    """One node in this process: answers ``roles``, ``counters``, ``offer`` and ``quit``."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # logging and stray prints must not reach the channel
    counter = _TickCount()
    node = _Node(Path(args.data_dir), args.arm, json.loads(args.addrs), args.worker_node)
    channel.write('"ready"\n')
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "roles":
            answer: Any = node.roles()
        elif op == "counters":
            answer = {**node.counters(counter.ticks), **_process_counters()}
        elif op == "offer":
            answer = node.offer(request["rate"], request["seconds"], request["size"])
        else:
            break
        channel.write(json.dumps(answer) + "\n")
    node.close()
    channel.write('"bye"\n')


# -- measuring -------------------------------------------------------------------------------------


def _cpu_ns(tids: list[int], field: int = 0) -> int:
    """Nanoseconds the threads ``tids`` ran (``field`` 0) or waited on a run queue, runnable (1)."""
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[field])
    return total


def _switches(tids: list[int]) -> int:
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def _all_tids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _offer(leaders: list[RaftGroup], rate: float, seconds: float, command: bytes) -> list[float]:
    """Submit at ``rate`` entries/s round-robin over ``leaders``; each entry's submit-to-applied
    seconds (on the leader), in the order answered."""
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


def _settle(cluster: _InProcess | _Processes, groups: int) -> list[int]:
    """Waits until every group has one leader that all its replicas know; leaders per node."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        roles = cluster.roles()  # [node][group] -> [leads, leader known]
        leading = [sum(1 for g in range(groups) if roles[n][g][0]) for n in range(NODES)]
        agreed = all(len({roles[n][g][1] for n in range(NODES)} - {None}) == 1 for g in range(groups))
        if sum(leading) == groups and agreed:
            return leading
        time.sleep(0.05)
    raise RuntimeError("no leader in some group")


def _delta(after: list[dict[str, float]], before: list[dict[str, float]], key: str) -> float:
    return sum(a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before, strict=True))


def run_arm(arm: str, args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-one-tick-{arm}-", dir=base))
    ports = free_ports(NODES * args.groups)  # one call: ports of separate calls may repeat
    addrs = [[f"127.0.0.1:{p}" for p in ports[g * NODES : (g + 1) * NODES]] for g in range(args.groups)]
    cluster = (_InProcess if args.one_process else _Processes)(folder, arm, addrs)
    try:
        leading = _settle(cluster, args.groups)
        cluster.offer(500, 1.0, args.size)  # warm-up
        rows = []
        for rate in args.rates:
            before = cluster.counters()
            took = cluster.offer(rate, args.seconds, args.size)
            time.sleep(0.2)  # the followers' last acknowledgements
            after, n = cluster.counters(), len(took)
            fsyncs = _delta(after, before, "fsyncs")
            rows.append(
                {
                    "arm": arm,
                    "rate": rate,
                    "entries": n,
                    "tick_threads": NODES * (1 if arm == "one" else args.groups),
                    "leaders_per_node": leading,
                    "tick_cpu_us_per_entry": _delta(after, before, "tick_cpu_us") / n,
                    "tick_runqueue_us_per_entry": _delta(after, before, "tick_runqueue_us") / n,
                    "process_cpu_us_per_entry": _delta(after, before, "process_cpu_us") / n,
                    "tick_switches_per_entry": _delta(after, before, "tick_switches") / n,
                    "process_switches_per_entry": _delta(after, before, "process_switches") / n,
                    "ticks_per_entry": _delta(after, before, "ticks") / n,
                    "polls_per_entry": _delta(after, before, "polls") / n,
                    "fsyncs_per_entry": fsyncs / n,
                    "long_rounds": _delta(after, before, "long_rounds"),
                    "long_round_ms": _delta(after, before, "long_round_s") * 1e3,
                    "long_round_fsync_ms": _delta(after, before, "long_round_fsync_s") * 1e3,
                    "fsync_ms_mean": _delta(after, before, "fsync_s") * 1e3 / max(fsyncs, 1),
                    "p50_ms": percentile(took, 50) * 1e3,
                    "p99_ms": percentile(took, 99) * 1e3,
                }
            )
        return rows
    finally:
        cluster.close()
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
    ap.add_argument("--one-process", action="store_true", help="the three nodes in this process (one GIL)")
    ap.add_argument("--worker-node", type=int, help=argparse.SUPPRESS)  # a node process's own
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--addrs", help=argparse.SUPPRESS)
    add_quiet_argument(ap)
    args = ap.parse_args()
    if args.worker_node is not None:
        _worker(args)
        return
    result = quiet_header("one_tick_thread", vars(args), args.wait_quiet)
    base = Path(args.data_dir or tempfile.gettempdir())
    passes = [run_arm(arm, args, base) for _ in range(args.repeat) for arm in ("per-group", "one")]
    result["passes"] = passes
    result["fsync_share"] = fsync_share(base, args.groups, 300, args.size)
    keys = (
        "tick_cpu_us_per_entry",
        "tick_runqueue_us_per_entry",
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
    heads = [
        "arm",
        "entries/s",
        "threads",
        "tick CPU us",
        "tick runq us",
        "proc CPU us",
        "tick cs",
        "proc cs",
    ]
    print(table(rows, [*heads, "ticks", "polls", "fsyncs", "fsync ms", "p50 ms", "p99 ms"]))
    for r in measured:
        if r["arm"] == "one":
            print(
                f"one, {r['rate']:.0f}/s: {r['long_rounds']:.0f} rounds over {LONG_ROUND_S * 1e3:.0f} ms,"
                f" {r['long_round_ms']:.1f} ms, of it fsync {r['long_round_fsync_ms']:.1f} ms"
            )
    print("per entry; fsync sharing, us per round of one entry per group:", result["fsync_share"])
    print(f"wrote {write_result('one_tick_thread', result)}")


if __name__ == "__main__":
    main()
