"""Helpers shared by the benchmark scripts: result files, tables, ports, py-spy profiles."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench-results"
PYTHON = sys.executable


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
        import time

        self._t0 = time.monotonic()
        self._sys0 = _system_busy_ticks()
        self._p0 = {k: _proc_ticks(p) for k, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        import time

        wall = max(1e-6, time.monotonic() - self._t0)
        busy1, _ = _system_busy_ticks()
        ours = {k: (_proc_ticks(p) - self._p0[k]) / _TICK / wall for k, p in self.pids.items()}
        system = (busy1 - self._sys0[0]) / _TICK / wall
        out = {k: round(v, 2) for k, v in ours.items()}
        out["machine_busy"] = round(system, 2)
        out["other"] = round(max(0.0, system - sum(ours.values())), 2)
        return out


def wait_quiet(max_wait_s: float, threshold_cores: float = 0.5, window_s: float = 2.0) -> float:
    """Wait (up to ``max_wait_s``) until the machine's busy CPU over ``window_s`` is below
    ``threshold_cores``; returns the last busy figure. Other users' work skews the figures."""
    import time

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
