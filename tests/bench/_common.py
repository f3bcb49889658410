"""Helpers shared by the benchmark scripts: the run (options, a quiet machine, the JSON result),
a 3-node cluster, worker processes, tables, ports, CPU meters and py-spy profiles."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench-results"
PYTHON = sys.executable

if TYPE_CHECKING:  # imported where used: only the cluster benchmarks put the repository on sys.path
    from tests.integration.harness import Cluster

Spy = tuple[str, Path, "subprocess.Popen[bytes] | None"]  # (name, output file, py-spy process)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def fs_type(path: Path) -> str:
    """The filesystem type holding ``path`` (to warn when fsync is free, e.g. tmpfs)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def header(bench: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "bench": bench,
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "params": params,
    }


def write_result(bench: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{bench}-{data['commit']}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank; nan when there are none)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    return "\n".join([line, sep, *body])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return list(range(base, base + count))
    raise RuntimeError("no free port block")


# -- CPU accounting: how much of the machine the benchmark had ------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_busy_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts[:8]) - idle, sum(parts[:8])


def _proc_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (all threads)
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` used so far; 0 when it is gone."""
    return _proc_ticks(pid) / _TICK


ThreadCpu = dict[int, tuple[str, float, float]]  # thread id -> (name, user s, system s)


def thread_cpu(pid: int) -> ThreadCpu:
    """Each thread of process ``pid``: thread id -> (its name in /proc, user seconds, system seconds)."""
    out: ThreadCpu = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue  # the thread ended
        fields = raw.rsplit(")", 1)[1].split()
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        out[int(tid)] = (comm, int(fields[11]) / _TICK, int(fields[12]) / _TICK)
    return out


def thread_kinds(pid: int) -> dict[int, str]:
    """Python thread id -> what it is ("loop": the node's main thread, "tick": a Raft group's tick
    thread, "executor", or the Python thread's name), from ``py-spy dump``; {} without py-spy."""
    exe = py_spy()
    if exe is None:
        return {}
    try:
        dump = subprocess.run(
            [exe, "dump", "-p", str(pid)], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    kinds: dict[int, str] = {}
    for line in dump.splitlines():
        if not line.startswith("Thread "):
            continue
        tid_s, _, rest = line[len("Thread ") :].partition(" ")
        name = rest.split('"')[1] if rest.count('"') >= 2 else "?"
        kind = (
            "loop"
            if name == "MainThread"
            else "tick"
            if "_autoTickThread" in name
            else "executor"
            if "ThreadPoolExecutor" in name or "asyncio_" in name
            else name
        )
        try:
            kinds[int(tid_s, 0)] = kind
        except ValueError:
            continue
    return kinds


def thread_cpu_delta(
    before: ThreadCpu, after: ThreadCpu, kinds: dict[int, str]
) -> dict[str, dict[str, float]]:
    """CPU seconds per kind of thread between two :func:`thread_cpu` snapshots: {kind: {"user",
    "system"}}; a thread py-spy did not name goes by its /proc name (RocksDB's own threads are
    "rocksdb:...")."""
    out: dict[str, dict[str, float]] = {}
    for tid, (comm, user, system) in after.items():
        _, user0, system0 = before.get(tid, (comm, 0.0, 0.0))
        kind = kinds.get(tid) or ("rocksdb" if comm.startswith("rocksdb") else f"other:{comm}")
        slot = out.setdefault(kind, {"user": 0.0, "system": 0.0})
        slot["user"] += user - user0
        slot["system"] += system - system0
    return out


class CpuMeter:
    """CPU used (in cores) by the given processes and by everything else, between start and stop.

    "other" is the rest of the machine (other users' tests, the kernel); on a shared 2-core machine it
    says how much the benchmark had to itself."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0 = 0.0
        self._sys0 = (0, 0)
        self._p0: dict[str, int] = {}

    def start(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._sys0 = _system_busy_ticks()
        self._p0 = {k: _proc_ticks(p) for k, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        wall = max(1e-6, time.monotonic() - self._t0)
        busy1, _ = _system_busy_ticks()
        ours = {k: (_proc_ticks(p) - self._p0[k]) / _TICK / wall for k, p in self.pids.items()}
        system = (busy1 - self._sys0[0]) / _TICK / wall
        # (4 places: a process's CPU is read in clock ticks of 10 ms, 0.001 cores over 10 s; at 2 the
        # per-call figures of a lightly loaded node moved in steps of about 100 µs)
        out = {k: round(v, 4) for k, v in ours.items()}
        out["machine_busy"] = round(system, 2)
        out["other"] = round(max(0.0, system - sum(ours.values())), 2)
        return out


def wait_quiet(max_wait_s: float, threshold_cores: float = 0.5, window_s: float = 2.0) -> float:
    """Wait (up to ``max_wait_s``) until the machine's busy CPU over ``window_s`` is below
    ``threshold_cores``; returns the last busy figure. Other users' work skews the figures."""
    deadline = time.monotonic() + max_wait_s
    while True:
        meter = CpuMeter({}).start()
        time.sleep(window_s)
        busy = meter.stop()["machine_busy"]
        if busy < threshold_cores or time.monotonic() >= deadline:
            print(f"machine busy before start: {busy:.2f} cores", flush=True)
            return busy
        print(f"  waiting for a quieter machine (busy {busy:.2f} cores) ...", flush=True)


def loadavg() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


# -- profiling --------------------------------------------------------------------------------------


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    local = Path(PYTHON).parent / "py-spy"
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


def require_py_spy(ap: argparse.ArgumentParser) -> None:
    """Stop now, with argparse's usage error, when ``--profile`` is asked and py-spy is missing:
    the run would go on unprofiled, and print and record no profile."""
    if py_spy() is None:
        ap.error(
            f"--profile needs py-spy, found neither next to {PYTHON} nor on PATH; "
            f"install it ({PYTHON} -m pip install py-spy) or run without --profile"
        )


def start_py_spy(
    pid: int, seconds: float, out: Path, rate: int = 200, gil: bool = False
) -> subprocess.Popen[bytes] | None:
    """Record ``pid`` for ``seconds`` into ``out`` (collapsed stacks). ``gil``: sample only the thread
    holding the GIL (py-spy --gil). Without it a thread waiting for the GIL is sampled where it
    waits, which inflates long Python loops when two threads of a process compete (a node's
    asyncio and Raft threads)."""
    exe = py_spy()
    if exe is None:
        return None
    return subprocess.Popen(
        [
            exe,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            str(out),
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _frame_name(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py)'."""
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    path = loc.rsplit(":", 1)[0]
    short = "/".join(path.split("/")[-2:])
    return f"{name} ({short})"


# Leaf frames that mean "waiting", not working (py-spy reports threads blocked in C calls as active).
IDLE_LEAVES = (
    "PollPoller.poll (",
    "main (core_replica.py)",
    "main (bench/core_replica.py)",
    "Condition.wait (",
    "Event.wait (",
    "Semaphore.acquire (",
    "select (selectors.py)",
    "_run_once (asyncio",
    "_worker (concurrent",
    "_worker (futures/thread.py)",
)
# Leaf frames that are a blocking fsync (the GIL is released; the thread waits for the disk).
IO_LEAVES = ("RocksStore.sync (",)


def summarize_raw_profile(
    path: Path, top: int = 20, threads: dict[str, str] | None = None, seconds: float = 0, rate: int = 200
) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output.

    Samples whose leaf is a wait (``IDLE_LEAVES``) are counted as idle and left out of the shares;
    samples in a blocking fsync (``IO_LEAVES``) are counted apart (``fsync_wait_samples``).
    ``threads`` maps a frame substring to a thread label (first match wins, else "other");
    ``busy`` gives each label's busy samples as a share of ``seconds * rate`` (1.0 = one core)."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    total = idle = fsync_wait = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"samples": 0, "self": [], "inclusive": []}
    for line in lines:
        stack, _, count_s = line.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        raw = [f for f in stack.split(";") if f]
        if not raw:
            continue
        leaf_name = _frame_name(raw[-1])
        if any(leaf_name.startswith(w) or w in leaf_name for w in IDLE_LEAVES):
            idle += count
            continue
        if any(leaf_name.startswith(w) for w in IO_LEAVES):
            fsync_wait += count
            continue
        frames = [_frame_name(f) for f in raw]
        label = "other"
        for needle, name in (threads or {}).items():
            if needle in stack:
                label = name
                break
        busy[label] += count
        total += count
        self_c[frames[-1]] += count
        for f in set(frames):
            incl_c[f] += count

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in c.most_common(top)] if total else []

    possible = seconds * rate
    return {
        "samples": total,
        "idle_samples": idle,
        "fsync_wait_samples": fsync_wait,
        "fsync_wait_share_of_busy": round(fsync_wait / (total + fsync_wait), 3) if total else 0.0,
        "busy_cores": {k: round(v / possible, 2) for k, v in busy.items()} if possible else {},
        "self": share(self_c),
        "inclusive": share(incl_c),
    }


def collect_profiles(
    spies: list[Spy], threads: dict[str, str], seconds: float, wait_s: float
) -> dict[str, Any]:
    """The summary of each py-spy recording of ``seconds`` once it ended (waiting up to ``wait_s``
    for each); a spy that could not start (no py-spy) has none."""
    profiles = {}
    for name, out, spy in spies:
        if spy is not None:
            spy.wait(wait_s)
            profiles[name] = summarize_raw_profile(out, threads=threads, seconds=seconds)
    return profiles


# -- the run: options, a quiet machine, the JSON result --------------------------------------------


def add_run_arguments(ap: argparse.ArgumentParser, keep: str = "") -> None:
    """The options of every benchmark that runs a cluster: ``--data-dir``, ``--wait-quiet``,
    ``--tag``, and ``--keep`` (with help ``keep``) where the script can keep its data."""
    ap.add_argument("--data-dir", default="", help="where the data goes (default: the system's temp dir)")
    if keep:
        ap.add_argument("--keep", action="store_true", help=keep)
    add_quiet_argument(ap)
    ap.add_argument("--tag", default="", help="free text stored in the JSON (e.g. the experiment)")


def add_quiet_argument(ap: argparse.ArgumentParser) -> None:
    """``--wait-quiet``: how long :func:`quiet_header` waits for an idle machine."""
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        help="wait up to this many s for the machine to be idle (< 0.5 busy cores) first",
    )


def quiet_header(bench: str, params: dict[str, Any], wait_quiet_s: float) -> dict[str, Any]:
    """The result's header, made once the machine is quiet (up to ``wait_quiet_s``; 0: at once),
    with how busy it still was and its load average."""
    result = header(bench, params)
    result["busy_before_start"] = wait_quiet(wait_quiet_s) if wait_quiet_s > 0 else None
    result["loadavg_start"] = loadavg()
    return result


def data_folder(args: argparse.Namespace) -> tuple[Path, str]:
    """The folder the data goes under (``--data-dir``, else the system's temp dir) and its
    filesystem type; warns when that is memory, where fsync costs nothing."""
    base = Path(args.data_dir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    kind = fs_type(base.resolve())
    if kind in ("tmpfs", "ramfs"):
        print(f"WARNING: {base} is on {kind}: fsync costs nothing there; pass --data-dir on a disk")
    return base, kind


@contextlib.contextmanager
def recorded_run(
    bench: str,
    args: argparse.Namespace,
    *,
    notes: str,
    data_fs: str,
    report: Callable[[dict[str, Any]], None],
    internal: tuple[str, ...] = (),
) -> Iterator[dict[str, Any]]:
    """The result of one run, to fill in the block: it starts with the header (``args`` but the
    ``internal`` ones as params) once the machine is quiet (``--wait-quiet``); after the block,
    the elapsed time is added, ``report`` prints it and it is written to RESULTS as JSON. A block
    that raises writes nothing."""
    params = {k: v for k, v in vars(args).items() if k not in internal}
    params["data_fs"] = data_fs
    result = quiet_header(bench, params, args.wait_quiet)
    result["notes"] = notes
    RESULTS.mkdir(exist_ok=True)
    t0 = time.monotonic()
    yield result
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_end"] = loadavg()
    report(result)
    path = write_result(bench, result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}  ({result['elapsed_s']} s)")


# -- a 3-node cluster --------------------------------------------------------------------------------


@contextlib.contextmanager
def three_node_cluster(base: Path, prefix: str, extra_toml: str, keep: bool = False) -> Iterator[Cluster]:
    """A cluster of 3 nodes (3 queue groups, replication 3) in a new folder under ``base``, started
    and ready; at the end it is stopped and the folder removed (unless ``keep``)."""
    from tests.integration.harness import Cluster

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    cluster = Cluster(tmp, nodes=3, queue_groups=3, replication=3, extra_toml=extra_toml)
    try:
        cluster.start()
        cluster.wait_ready(timeout_s=60)
        yield cluster
    finally:
        cluster.stop()
        if keep:
            print(f"  cluster data and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def leaders_settled(cluster: Cluster, groups: int = 3) -> bool:
    """Every queue group is led by its preferred node (n{g+1}), as the node's balancer arranges."""
    return all(cluster.leader(str(g)) == f"n{(g % len(cluster.nodes)) + 1}" for g in range(groups))


def settle_leaders(cluster: Cluster, timeout_s: float = 20) -> None:
    """Wait until the leader balancer has put each queue group on its preferred node (a leadership
    transfer while measuring stalls a group for about a second); if it has not by ``timeout_s``,
    say so and go on."""
    from tests.integration.harness import wait_until

    try:
        wait_until(lambda: leaders_settled(cluster), timeout_s, 0.25, "leaders on preferred nodes")
    except AssertionError:
        print("  leaders did not settle on their preferred nodes; measuring anyway", flush=True)


def node_pids(cluster: Cluster) -> dict[str, int]:
    """The process id of each running node."""
    return {nid: n.proc.pid for nid, n in cluster.nodes.items() if n.proc is not None}


def profile_nodes(cluster: Cluster, name: str, seconds: float, gil: bool = False) -> list[Spy]:
    """py-spy every node for ``seconds``, into RESULTS/profile-<name>-<node>.raw.txt."""
    spies: list[Spy] = []
    for nid, pid in node_pids(cluster).items():
        out = RESULTS / f"profile-{name}-{nid}.raw.txt"
        spies.append((nid, out, start_py_spy(pid, seconds, out, gil=gil)))
    return spies


async def _fill(
    leaders: dict[int, str], topic: str, queues: int, requests_per_sender: int, value_bytes: int
) -> None:
    import aiohttp
    import orjson

    per_request = 1_000
    bodies = {
        q: orjson.dumps(
            {"messages": [{"value": f"{q:04d}" + "x" * (value_bytes - 4), "queue": q}] * per_request}
        )
        for q in range(queues)
    }
    async with aiohttp.ClientSession() as session:

        async def fill(q: int) -> None:
            for _ in range(requests_per_sender):
                for attempt in range(20):
                    async with session.post(
                        f"{leaders[q]}/v1/topics/{topic}/messages",
                        data=bodies[q],
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        await r.read()
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.1 * (attempt + 1))
                else:
                    raise RuntimeError(f"cannot produce to queue {q}")

        await asyncio.gather(*(fill(q) for q in range(queues)), *(fill(q) for q in range(queues)))


def fill_topic(
    cluster: Cluster, topic: str, queues: int, messages: int, value_bytes: int = 100
) -> tuple[int, float]:
    """Create ``topic`` with ``queues`` queues and produce ``messages`` messages of ``value_bytes``
    to it, spread evenly over the queues: raw HTTP, 1,000 per request, two senders per queue, each
    request to its queue's leader. ``messages`` is rounded down to whole requests of every sender.

    Returns:
        (messages produced, seconds it took)
    """
    r = cluster.post("/v1/topics", {"name": topic, "queues": queues})
    assert r.status_code == 201, r.text
    senders = 2 * queues
    total = messages // (1_000 * senders) * 1_000 * senders
    desc = cluster.get(f"/v1/topics/{topic}").json()
    leaders = {q["queue"]: cluster.nodes[q["leader"]].url for q in desc["queues"]}
    t0 = time.perf_counter()
    asyncio.run(_fill(leaders, topic, queues, total // 1_000 // senders, value_bytes))
    produce_s = time.perf_counter() - t0
    print(f"  produced {total:,} messages in {produce_s:.1f} s", flush=True)
    return total, produce_s


# -- worker processes: the script itself, run with --role ---------------------------------------------

WORKER_OPTIONS = ("role", "topic", "group", "spy_out")  # what a worker is started with (internal)
# py-spy's threads of a client process (first match wins)
CLIENT_THREADS = {"_run_once": "asyncio", "run_forever": "asyncio", "_worker": "executor"}


def add_worker_arguments(ap: argparse.ArgumentParser, worker: str, max_seconds: float) -> None:
    """The options of a benchmark whose workers are the script itself run with ``--role``: how
    long they run (``--max-seconds``, ``--idle-s``), how long a profile lasts (``--profile-s``),
    and the internal options ``WORKER_OPTIONS``."""
    ap.add_argument("--profile-s", type=float, default=5.0)
    ap.add_argument("--max-seconds", type=float, default=max_seconds)
    ap.add_argument(
        "--idle-s", type=float, default=1.5, help=f"a {worker} stops after this long without messages"
    )
    for name in WORKER_OPTIONS:
        ap.add_argument("--" + name.replace("_", "-"), default="", help=argparse.SUPPRESS)


def worker_command(script: str, role: str, **options: object) -> list[str]:
    """``script`` run as a worker in ``role``, with ``options`` (``max_batch=500``: ``--max-batch 500``)."""
    cmd = [PYTHON, script, "--role", role]
    for name, value in options.items():
        cmd += ["--" + name.replace("_", "-"), str(value)]
    return cmd


def read_lines(proc: subprocess.Popen[str], into: list[dict[str, Any]]) -> None:
    """Append each JSON line ``proc`` prints to ``into`` until it exits."""
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            into.append(json.loads(line))


class Workers:
    """Worker processes that print JSON lines: a sample ``{"t": ..., "n": messages}`` now and then
    and a summary ``{"done": true, ...}`` at the end. Their lines are collected as they come
    (``outputs``, one list per worker); :meth:`go` tells all of them to start at once."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.procs = [
            subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            for cmd in commands
        ]
        self.outputs: list[list[dict[str, Any]]] = [[] for _ in self.procs]
        self._readers = [
            threading.Thread(target=read_lines, args=(p, o))
            for p, o in zip(self.procs, self.outputs, strict=True)
        ]
        for t in self._readers:
            t.start()

    def go(self) -> float:
        """Send "go" to every worker; returns the time it was sent."""
        t_go = time.time()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return t_go

    def wait(self, timeout_s: float, name: str, log_prefix: str | None = None) -> None:
        """Wait for every worker to exit and for its last line. Raises if one failed (with the end of
        its stderr); else a worker's stderr, if any, goes to RESULTS/<log_prefix><i>.log (None: dropped)."""
        for p in self.procs:
            p.wait(timeout=timeout_s)
        for t in self._readers:
            t.join()
        for i, p in enumerate(self.procs):
            assert p.stderr is not None
            log = p.stderr.read()
            if p.returncode:
                raise RuntimeError(f"{name} {i} failed: {log[-3000:]}")
            if log_prefix is not None and log.strip():
                (RESULTS / f"{log_prefix}{i}.log").write_text(log)

    def summaries(self) -> list[dict[str, Any]]:
        return [next(x for x in o if x.get("done")) for o in self.outputs]

    def samples(self, since: float) -> list[list[dict[str, Any]]]:
        """Each worker's samples from ``since`` on."""
        return [[x for x in o if "t" in x and x["t"] >= since] for o in self.outputs]


def steady_rate(samples: list[list[dict[str, Any]]], start: float, end: float) -> float:
    """Messages per second of all workers together between ``start`` and ``end`` (nan when that
    window is under 0.3 s)."""

    def total_at(t: float) -> float:
        out = 0.0
        for s in samples:
            before = [x for x in s if x["t"] <= t]
            out += before[-1]["n"] if before else 0
        return out

    window = end - start
    return (total_at(end) - total_at(start)) / window if window > 0.3 else float("nan")


def worker_profile(path: Path, threads: dict[str, str], seconds: float) -> dict[str, Any]:
    """The summary of the profile a worker records of itself into ``path`` (it ends ``seconds``
    after the worker's "go"; waited for, up to 10 s more)."""
    deadline = time.monotonic() + seconds + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    return summarize_raw_profile(path, threads=threads, seconds=seconds)


def timeit(fn: Callable[[], Any], min_time: float = 0.4, min_runs: int = 5) -> float:
    """Median seconds per call of ``fn``: at least ``min_runs`` calls and ``min_time`` seconds,
    after one call not counted (a warm-up)."""
    fn()
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < min_runs or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]
