"""What one Raft entry costs the tick threads, in one process: three ``RaftGroup`` s on 127.0.0.1
with RocksDB journals (fsync on) and a trivial state machine, one entry of ``--size`` bytes at a
time (the next proposed once the last is answered), as at 1,000 msgs/s keyed, where each produce
request is about one entry.

Two passes per run: one timed (on-CPU time of the three tick threads from
``/proc/self/task/<tid>/schedstat``, and each entry's submit-to-answer time), then one under
cProfile on each tick thread (``time.thread_time``): Python function calls and ticks per entry for
the leader and a follower, the figures a change to pysyncobj's per-entry work moves without the
noise of a shared machine. Run it with another tree's venv to compare:

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_raft_ticks.py            # ~20 s
    cd ../main && flock /tmp/raftmq-heavy.lock .venv/bin/python ../wt/tests/bench/bench_raft_ticks.py

Prints a table and writes JSON to bench-results/.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pysyncobj.syncobj as pso_syncobj
from _common import add_quiet_argument, free_ports, percentile, quiet_header, table, write_result

from raftmq.cluster.replication import raft
from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore


class NullMachine:
    """Applies nothing: the entry's Raft work alone."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.applied_index = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.applied_index = index
        return None

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


class _TickThreads:
    """Each group's tick thread, seen from inside: its native id, and its profile when asked."""

    def __init__(self, profile: bool) -> None:
        self.ids: dict[str, int] = {}  # the replica's Raft address -> native thread id
        self.profiles: dict[str, cProfile.Profile] = {}
        run = pso_syncobj.SyncObj._autoTickThread

        def tick_thread(sync: Any) -> None:
            key = str(sync.selfNode.id)  # sync is a weak proxy of the SyncObj
            self.ids[key] = threading.get_native_id()
            if not profile:
                run(sync)
                return
            prof = self.profiles[key] = cProfile.Profile(time.thread_time)
            prof.enable()
            try:
                run(sync)
            finally:
                prof.disable()

        pso_syncobj.SyncObj._autoTickThread = tick_thread
        self._run = run

    def restore(self) -> None:
        pso_syncobj.SyncObj._autoTickThread = self._run

    def cpu_us(self) -> float:
        total = 0
        for tid in self.ids.values():
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e3


def _start(base: Path) -> tuple[list[RaftGroup], list[RocksStore]]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    settings = RaftSettings(password="b" * 16, prompt_commit_notice=False)  # as a queue group's
    groups, stores = [], []
    for i, addr in enumerate(addrs):
        stores.append(RocksStore.open(str(base / f"journal{i}")))
        groups.append(
            RaftGroup(
                name="g",
                node_id=f"n{i + 1}",
                self_addr=addr,
                peer_addrs=[a for a in addrs if a != addr],
                journal_store=stores[-1],
                machine=NullMachine(),
                snapshot_file=str(base / f"n{i + 1}" / "g.snapshot"),
                settings=settings,
            )
        )
    return groups, stores


def _leader(groups: list[RaftGroup]) -> RaftGroup:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        leader = next((g for g in groups if g.is_leader()), None)
        if leader is not None and all(g.leader() == leader.self_addr for g in groups):
            return leader
        time.sleep(0.01)
    raise RuntimeError("no leader")


def _submit(leader: RaftGroup, command: bytes, count: int) -> list[float]:
    done = threading.Event()
    took: list[float] = []
    for _ in range(count):
        done.clear()
        started = time.perf_counter()
        leader.submit(command, lambda _outcome: done.set())
        if not done.wait(10):
            raise RuntimeError("an entry was not answered in 10 s")
        took.append(time.perf_counter() - started)
    return took


def run_pass(entries: int, size: int, profile: bool) -> dict[str, Any]:
    threads = _TickThreads(profile)
    base = Path(tempfile.mkdtemp(prefix="bench-raft-ticks-"))
    groups: list[RaftGroup] = []
    stores: list[RocksStore] = []
    try:
        groups, stores = _start(base)
        leader = _leader(groups)
        command = os.urandom(size)
        _submit(leader, command, 200)  # warm-up
        time.sleep(0.3)
        counts_before = {addr: _counts(prof) for addr, prof in threads.profiles.items()}
        cpu_before = threads.cpu_us()
        took = _submit(leader, command, entries)
        time.sleep(0.2)  # the followers' last acknowledgements
        result: dict[str, Any] = {
            "tick_cpu_us_per_entry": (threads.cpu_us() - cpu_before) / entries,
            "p50_ms": percentile(took, 50) * 1e3,
            "p99_ms": percentile(took, 99) * 1e3,
        }
        for group in groups:
            role = "leader" if group is leader else "follower"
            if profile and role not in result:
                after, before = _counts(threads.profiles[group.self_addr]), counts_before[group.self_addr]
                calls, ticks, node = (a - b for a, b in zip(after, before, strict=True))
                result[role] = {
                    "calls_per_entry": calls / entries,
                    "ticks_per_entry": ticks / entries,
                    "calls_per_tick": calls / max(ticks, 1),
                    "node_method_calls_per_entry": node / entries,
                }
        return result
    finally:
        for group in groups:
            group.destroy()
        for store in stores:
            store.close()
        threads.restore()
        shutil.rmtree(base, ignore_errors=True)


def _counts(prof: cProfile.Profile) -> tuple[int, int, int]:
    """Python calls, pysyncobj ticks and calls of pysyncobj's ``Node`` methods (its hash, equality
    and ``id``) so far on a running profile (``getstats`` reads from any thread; ``create_stats``
    would disable the profile of the calling thread)."""
    calls = ticks = node = 0
    for entry in prof.getstats():
        calls += entry.callcount
        name, path = getattr(entry.code, "co_name", ""), getattr(entry.code, "co_filename", "")
        ticks += entry.callcount if name == "_onTick" and path.endswith("syncobj.py") else 0
        node += entry.callcount if path.endswith("pysyncobj/node.py") else 0
    return calls, ticks, node


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=2000, help="entries per pass")
    ap.add_argument("--size", type=int, default=300, help="bytes per entry")
    ap.add_argument("--repeat", type=int, default=2, help="timed passes")
    ap.add_argument("--tag", default="", help="a name for the tree measured, in the JSON")
    add_quiet_argument(ap)
    args = ap.parse_args()
    result = quiet_header("raft_ticks", vars(args), args.wait_quiet)
    result["code_measured"] = str(Path(raft.__file__).resolve().parents[2])  # the tree of its venv
    timed = [run_pass(args.entries, args.size, profile=False) for _ in range(args.repeat)]
    profiled = run_pass(min(args.entries, 1000), args.size, profile=True)
    result.update(timed=timed, profiled=profiled)
    rows = [
        ["timed", f"{t['tick_cpu_us_per_entry']:.0f}", f"{t['p50_ms']:.2f} / {t['p99_ms']:.2f}"]
        for t in timed
    ]
    figures = ("calls_per_entry", "ticks_per_entry", "calls_per_tick", "node_method_calls_per_entry")
    for role in ("leader", "follower"):
        rows.append([role, "", "", *(f"{profiled[role][k]:.2f}" for k in figures)])
    heads = [
        "pass",
        "tick CPU us/entry",
        "p50 / p99 ms",
        "calls/entry",
        "ticks/entry",
        "calls/tick",
        "Node calls/entry",
    ]
    print(table(rows, heads))
    print(f"wrote {write_result('raft_ticks', result)}")


if __name__ == "__main__":
    main()
