"""Issue 24's numbers: boto3 through the Amazon SQS API, raftmq against moto's server, in one run.

One after another, never at the same time, all on 127.0.0.1:

- ``moto``    moto's server (``moto[server]`` MOTO_VERSION from PyPI, one process, in memory, no
              fsync): the emulator anchor.
- ``raftmq``  3 ``raftmq serve`` nodes (3 queue groups, replication 3, ``durability = "fsync"``, as
              ``raftmq dev``): a send is answered once fsynced on a majority.

The same harness against each: one standard queue, two sending threads doing SendMessageBatch of
10 x ``--value-size`` bytes as fast as they are answered, and two receiving threads doing
ReceiveMessage (10, a long poll of ``--wait-s``) and DeleteMessageBatch of what they got; each
thread has its own boto3 client (default settings: retries on, kept connections) on its own node
(raftmq: sender w on node w + 1, receiver w on node 3 - w). After ``--warmup-s`` the counts and
CPU are taken over ``--seconds``: messages a second acknowledged (sent), received and deleted, the
end-to-end rate being the deletes'; the servers' CPU (the nodes' or moto's, from /proc) per SQS
call against the client process's own CPU per call (getrusage: the four boto3 threads).

raftmq also reports what its calls cost in replicated writes: the Raft entries committed in the
queue groups (from each group's commit index in ``/metrics``) and the actions passed between nodes
(``/internal/groups/{group}/{action}`` requests) during the window, a second; and after it, on the
receivers' nodes with the senders stopped, the entries and hops of single calls: a ReceiveMessage
of 10, the DeleteMessageBatch of them, the ReceiveMessage after that delete, and an empty long poll
of ``--wait-s`` on an empty queue.

``--profile`` records every node and the client with py-spy during raftmq's window and prints
where each spends its time.

    .venv/bin/python tests/bench/bench_sqs.py                      # moto, then raftmq, 20 s each
    .venv/bin/python tests/bench/bench_sqs.py --profile --targets raftmq
    .venv/bin/python tests/bench/bench_sqs.py --setup-only         # install moto[server], then exit
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    PYTHON,
    RESULTS,
    add_run_arguments,
    collect_profiles,
    cpu_seconds,
    data_folder,
    free_ports,
    node_pids,
    profile_nodes,
    recorded_run,
    require_py_spy,
    settle_leaders,
    start_py_spy,
    table,
    three_node_cluster,
)

MOTO_VERSION = "5.2.5"
TARGETS = ("moto", "raftmq")
THREADS = {"_autoTickThread": "tick", "_run_once": "asyncio", "run_forever": "asyncio"}
CLIENT_THREADS = {"sender": "senders", "receiver": "receivers"}


class SetupError(Exception):
    """moto could not be installed; the message says what to do."""


def _moto_version() -> str:
    out = subprocess.run([PYTHON, "-c", "import moto, flask; print(moto.__version__)"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else ""


def ensure_moto() -> str:
    """moto's server MOTO_VERSION in this venv (pip installs it when missing); its executable."""
    exe = Path(PYTHON).parent / "moto_server"
    if _moto_version() != MOTO_VERSION or not exe.exists():
        print(f"installing moto[server]=={MOTO_VERSION} into {Path(PYTHON).parent.parent} ...", flush=True)
        pip = subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", f"moto[server]=={MOTO_VERSION}"],
                             capture_output=True, text=True)  # fmt: skip
        if pip.returncode != 0 or _moto_version() != MOTO_VERSION:
            tail = "\n".join((pip.stdout + pip.stderr).strip().splitlines()[-15:])
            raise SetupError(
                f"pip could not install moto[server]=={MOTO_VERSION}:\n{tail}\n"
                f"Install it by hand: {PYTHON} -m pip install 'moto[server]=={MOTO_VERSION}'"
            )
    return str(exe)


# -- the harness: the same for every target -------------------------------------------------------


@dataclass
class Counts:
    sent: int = 0
    received: int = 0
    deleted: int = 0
    calls: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **n: int) -> None:
        with self.lock:
            for k, v in n.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: getattr(self, k) for k in ("sent", "received", "deleted", "calls", "errors")}


def _client(endpoint: str) -> Any:
    import boto3

    return boto3.session.Session().client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="bench", aws_secret_access_key="bench",
    )  # fmt: skip


def sender(endpoint: str, url: str, body: str, counts: Counts, stop: threading.Event) -> None:
    sqs = _client(endpoint)
    entries = [{"Id": str(i), "MessageBody": body} for i in range(10)]
    while not stop.is_set():
        try:
            answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        except Exception:
            counts.add(calls=1, errors=1)
            time.sleep(0.1)
            continue
        counts.add(calls=1, sent=len(answer.get("Successful", [])), errors=len(answer.get("Failed", [])))


def receiver(endpoint: str, url: str, wait_s: int, counts: Counts, stop: threading.Event) -> None:
    sqs = _client(endpoint)
    while not stop.is_set():
        try:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s)
            messages = got.get("Messages", [])
            counts.add(calls=1, received=len(messages))
            if messages:
                entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                           for i, m in enumerate(messages)]  # fmt: skip
                done = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
                deleted, failed = len(done.get("Successful", [])), len(done.get("Failed", []))
                counts.add(calls=1, deleted=deleted, errors=failed)
        except Exception:
            counts.add(calls=1, errors=1)
            time.sleep(0.1)


ACTION_ROUTE = "/internal/groups/{group}/{action}"  # an action passed on to a group's leader


def _writes(endpoints: list[str]) -> tuple[dict[str, int], int]:
    """The queue groups' commit indexes (each group's highest any node reports) and the actions
    passed between nodes so far (every node's ``ACTION_ROUTE`` requests)."""
    from prometheus_client.parser import text_string_to_metric_families

    commits: dict[str, int] = {}
    hops = 0
    for endpoint in endpoints:
        with urllib.request.urlopen(endpoint + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                group = sample.labels.get("group_id", "meta")
                if sample.name == "raftmq_raft_commit_index" and group != "meta":
                    commits[group] = max(commits.get(group, 0), int(sample.value))
                elif (
                    sample.name == "raftmq_http_requests_total" and sample.labels.get("route") == ACTION_ROUTE
                ):
                    hops += int(sample.value)
    return commits, hops


def _cost(endpoints: list[str], call: Any) -> dict[str, Any]:
    """The entries (by queue group) and hops between nodes of ``call()``."""
    commits0, hops0 = _writes(endpoints)
    out = call()
    commits1, hops1 = _writes(endpoints)
    grown = {
        g: commits1[g] - commits0.get(g, 0) for g in sorted(commits1) if commits1[g] != commits0.get(g, 0)
    }
    return {"entries": sum(grown.values()), "by_group": grown, "hops": hops1 - hops0, "out": out}


def count_calls(endpoints: list[str], url: str, wait_s: int) -> list[dict[str, Any]]:
    """Entries and hops of single calls on each receiving node (the senders stopped; the queue
    holds the backlog): ReceiveMessage 10, its DeleteMessageBatch, the ReceiveMessage after that
    delete, and an empty long poll of ``wait_s`` on an empty queue."""
    empty_url = _client(endpoints[0]).create_queue(QueueName="bench-empty")["QueueUrl"]
    last = len(endpoints) - 1
    rows: list[dict[str, Any]] = []
    for w in range(2):
        rows += _count_node(endpoints, (last - w) % len(endpoints), url, empty_url, wait_s)
    for row in rows:
        row.pop("out", None)
    return rows


def _count_node(endpoints: list[str], i: int, url: str, empty_url: str, wait_s: int) -> list[dict[str, Any]]:
    sqs = _client(endpoints[i])
    sqs.receive_message(QueueUrl=empty_url, WaitTimeSeconds=0)  # subscribed now

    def receive() -> list[dict[str, Any]]:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        return list(got.get("Messages", []))

    def delete(messages: list[dict[str, Any]]) -> Any:
        entries = [{"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(messages)]
        return sqs.delete_message_batch(QueueUrl=url, Entries=entries) if entries else None

    node = f"node {i + 1}"
    rows = []
    for call in ("ReceiveMessage", "ReceiveMessage after a delete"):
        got = _cost(endpoints, receive)
        rows.append({"node": node, "call": call, "messages": len(got["out"]), **got})
        rows.append(
            {"node": node, "call": "DeleteMessageBatch", **_cost(endpoints, lambda m=got["out"]: delete(m))}
        )
    empty = _cost(endpoints, lambda: sqs.receive_message(QueueUrl=empty_url, WaitTimeSeconds=wait_s))
    rows.append({"node": node, "call": f"empty long poll {wait_s} s", **empty})
    return rows


def _client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(
    name: str, endpoints: list[str], server_pids: dict[str, int], args: argparse.Namespace,
    profile: bool = False, cluster: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """The harness against one target: its endpoints (senders on the first two, receivers on the
    last two, round the list) and the processes whose CPU is the server's."""
    setup = _client(endpoints[0])
    url = setup.create_queue(QueueName=f"bench-{name}", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    counts, stop = Counts(), threading.Event()
    body = "x" * args.value_size
    last = len(endpoints) - 1
    threads = [
        threading.Thread(target=sender, name=f"sender-{w}",
                         args=(endpoints[w % len(endpoints)], url, body, counts, stop))
        for w in range(2)
    ] + [
        threading.Thread(target=receiver, name=f"receiver-{w}",
                         args=(endpoints[(last - w) % len(endpoints)], url, args.wait_s, counts, stop))
        for w in range(2)
    ]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(args.warmup_s)
    spies = []
    if profile and cluster is not None:
        spies = profile_nodes(cluster, "sqs", args.seconds)
        client_out = RESULTS / "profile-sqs-client.raw.txt"
        spies.append(("client", client_out, start_py_spy(os.getpid(), args.seconds, client_out)))
    writes0 = _writes(endpoints) if cluster is not None else None
    c0, t0 = counts.snapshot(), time.monotonic()
    server0 = {k: cpu_seconds(p) for k, p in server_pids.items()}
    client0 = _client_cpu_s()
    time.sleep(args.seconds)
    c1, wall = counts.snapshot(), time.monotonic() - t0
    server_s = sum(cpu_seconds(p) - server0[k] for k, p in server_pids.items())
    client_s = _client_cpu_s() - client0
    writes1 = _writes(endpoints) if cluster is not None else None
    stop.set()
    for t in threads:
        t.join(timeout=args.wait_s + 30)
    n = {k: c1[k] - c0[k] for k in c1}
    calls = max(1, n["calls"])
    result: dict[str, Any] = {
        "target": name,
        "seconds": round(wall, 1),
        "sent_per_s": round(n["sent"] / wall),
        "received_per_s": round(n["received"] / wall),
        "deleted_per_s": round(n["deleted"] / wall),
        "calls_per_s": round(n["calls"] / wall),
        "errors": n["errors"],
        "server_cores": round(server_s / wall, 2),
        "client_cores": round(client_s / wall, 2),
        "server_cpu_ms_per_call": round(1000 * server_s / calls, 2),
        "client_cpu_ms_per_call": round(1000 * client_s / calls, 2),
        "server_cpu_by_process_s": {k: round(cpu_seconds(p) - server0[k], 1) for k, p in server_pids.items()},
    }
    if writes0 is not None and writes1 is not None:
        entries = sum(writes1[0].values()) - sum(writes0[0].values())
        result["raft_entries_per_s"] = round(entries / wall)
        result["hops_per_s"] = round((writes1[1] - writes0[1]) / wall)
        result["entries_per_10_deleted"] = round(10 * entries / max(1, n["deleted"]), 2)
        try:
            result["single_calls"] = count_calls(endpoints, url, args.wait_s)
        except Exception as e:  # the window's figures are kept whatever happens here
            print(f"  single-call counts failed: {e!r}", flush=True)
            result["single_calls"] = []
    if spies:
        threads_of = {**THREADS, **CLIENT_THREADS}
        result["profiles"] = collect_profiles(spies, threads_of, args.seconds, args.seconds + 30)
    return result


# -- the targets ------------------------------------------------------------------------------------


@contextmanager
def moto_server() -> Iterator[tuple[str, int]]:
    exe = ensure_moto()
    (port,) = free_ports(1)
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start; see {log.name}") from None
                time.sleep(0.2)
        yield endpoint, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        Path(log.name).unlink(missing_ok=True)


def run_moto(args: argparse.Namespace) -> dict[str, Any]:
    with moto_server() as (endpoint, pid):
        return measure("moto", [endpoint], {"moto": pid}, args)


def run_raftmq(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    with three_node_cluster(base, "sqs-bench-", 'durability = "fsync"') as cluster:
        settle_leaders(cluster)
        endpoints = [cluster.url(nid) for nid in sorted(cluster.nodes)]
        return measure("raftmq", endpoints, node_pids(cluster), args, profile=args.profile, cluster=cluster)


def report(result: dict[str, Any]) -> None:
    rows = [
        [r["target"], r["sent_per_s"], r["received_per_s"], r["deleted_per_s"], r["calls_per_s"],
         r["server_cpu_ms_per_call"], r["client_cpu_ms_per_call"], r["server_cores"], r["client_cores"],
         r["errors"]]
        for r in result["runs"]
    ]  # fmt: skip
    print()
    print(table(rows, ["target", "sent/s", "received/s", "deleted/s", "calls/s", "server ms/call",
                       "client ms/call", "server cores", "client cores", "errors"]))  # fmt: skip
    for r in result["runs"]:
        if "raft_entries_per_s" in r:
            print(f"\n{r['target']}: {r['raft_entries_per_s']} Raft entries/s, {r['hops_per_s']} hops/s, "
                  f"{r['entries_per_10_deleted']} entries per 10 messages deleted")  # fmt: skip
            for c in r["single_calls"]:
                print(f"  {c['node']}: {c['call']}: {c['entries']} entries {c['by_group']}, {c['hops']} hops"
                      + (f", {c['messages']} messages" if "messages" in c else ""))  # fmt: skip
        for who, p in (r.get("profiles") or {}).items():
            print(f"\n{who}: busy cores {p['busy_cores']}, top self: "
                  + ", ".join(f"{f} {s}%" for f, s in p["self"][:8]))  # fmt: skip


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The options and the targets; a usage error (exit 2) for an unknown target, or for
    ``--profile`` without py-spy or without raftmq among the targets (it profiles raftmq's run)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma list of: moto, raftmq")
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window per target")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--value-size", type=int, default=100, help="bytes per message body")
    ap.add_argument("--wait-s", type=int, default=2, help="ReceiveMessage's WaitTimeSeconds")
    ap.add_argument("--profile", action="store_true", help="py-spy the nodes and the client (raftmq)")
    ap.add_argument("--setup-only", action="store_true", help="install moto[server] and exit")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}")
    if args.profile and not args.setup_only:
        if "raftmq" not in targets:
            ap.error("--profile profiles raftmq's run: add raftmq to --targets")
        require_py_spy(ap)
    return args, targets


def main() -> None:
    args, targets = parse_args()
    if args.setup_only:
        ensure_moto()
        return
    if "moto" in targets:
        ensure_moto()  # before the quiet wait: pip is not part of the measure
    base, fs = data_folder(args)
    notes = "boto3: 2 senders (SendMessageBatch 10), 2 receivers (ReceiveMessage 10 + DeleteMessageBatch)"
    internal = ("setup_only",)
    with recorded_run("sqs", args, notes=notes, data_fs=fs, report=report, internal=internal) as result:
        result["moto_version"] = MOTO_VERSION if "moto" in targets else None
        runs = []
        for target in targets:
            print(f"== {target}", flush=True)
            runs.append(run_moto(args) if target == "moto" else run_raftmq(args, base))
        result["runs"] = runs


if __name__ == "__main__":
    main()
