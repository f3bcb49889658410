"""The floor under issue 24's CPU per SQS call: what an HTTP server that does nothing costs per
boto3 call, against what a raftmq entry node costs for the same call, in one run.

Three servers, each driven in turn by ``bench_sqs_node.py``'s boto3 cycle (one client, one call at
a time: SendMessageBatch of 10, ReceiveMessage of 10, DeleteMessageBatch of them), the windows
alternating so that the machine's drift touches all three alike:

- ``aiohttp``: a bare aiohttp application in its own process (the standard asyncio loop, no access
  log, as a node): it reads the body, parses it as JSON and answers the action named by
  ``X-Amz-Target`` with fixed bytes a real SQS would send (MessageIds, receipt handles, the MD5s of
  the bodies the cycle sends). The floor of aiohttp and the loop per request.
- ``raftmq stack``: a one-node raftmq node (``raftmq serve``, 1 queue group, replication 1) whose
  SQS handler (``SqsHandler.handle``) is replaced by the same stub: the node's listener, runner,
  middlewares (idle connections, metrics, errors, request cap, body deadline, auth) and router,
  with no SQS work. Its own idle CPU (Raft ticks of an idle node) is measured apart.
- ``raftmq``: ``bench_sqs_node.py``'s cluster (3 nodes, 1 queue group, replication 3, fsync), the
  client on the group's leader: the entry node's CPU, and the two followers' apart.

Each server's CPU (user + system, /proc) over a window is divided by the calls it answered.
``--profile`` records py-spy (``--gil``) on the two floors during one more window each and prints
their top frames. The entry node's own profile: ``bench_sqs_node.py --profile``.

    .venv/bin/python tests/bench/bench_sqs_floor.py                  # ~2 min
    .venv/bin/python tests/bench/bench_sqs_floor.py --seconds 10 --rounds 3 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import (  # noqa: E402
    _TICK,
    PYTHON,
    RESULTS,
    _proc_ticks,
    add_run_arguments,
    data_folder,
    free_ports,
    node_pids,
    recorded_run,
    require_py_spy,
    start_py_spy,
    summarize_raw_profile,
    table,
)
from bench_sqs_node import ACTIONS, _client, cycles, window  # noqa: E402

Server = tuple[Any, str, dict[str, int], str]  # a boto3 client, its queue's URL, the pids, the measured one
TARGETS = ("aiohttp", "raftmq stack", "raftmq")
JSON_TYPE = "application/x-amz-json-1.0"
_TARGET = "AmazonSQS."


def fixed_answers(value_size: int) -> dict[str, bytes]:
    """The three actions' answers to the cycle's calls, as SQS's JSON wire sends them."""
    body = "x" * value_size
    md5 = hashlib.md5(body.encode()).hexdigest()
    ids = [f"{i:08d}-0000-4000-8000-000000000000" for i in range(10)]
    return {
        "SendMessageBatch": orjson.dumps(
            {
                "Successful": [
                    {"Id": str(i), "MessageId": m, "MD5OfMessageBody": md5} for i, m in enumerate(ids)
                ]
            }
        ),
        "ReceiveMessage": orjson.dumps(
            {
                "Messages": [
                    {"MessageId": m, "ReceiptHandle": f"handle-{m}", "MD5OfBody": md5, "Body": body}
                    for m in ids
                ]
            }
        ),
        "DeleteMessageBatch": orjson.dumps({"Successful": [{"Id": str(i)} for i in range(10)]}),
    }


def stub(answers: dict[str, bytes]) -> Any:
    """A handler that parses the request as an SQS JSON call and answers it with fixed bytes."""

    async def handle(request: web.Request) -> web.Response:
        target = request.headers.get("X-Amz-Target", "")
        orjson.loads(await request.read())
        return web.Response(
            body=answers[target[len(_TARGET) :]],
            content_type=JSON_TYPE,
            headers={"x-amzn-RequestId": "00000000-0000-4000-8000-000000000000"},
        )

    return handle


# -- the floor servers (run in their own processes) ----------------------------------------------


async def _serve_bare(port: int, answers: dict[str, bytes]) -> None:
    app = web.Application()
    app.router.add_post("/", stub(answers))
    app.router.add_post("/{account}/{queue}", stub(answers))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("listening", flush=True)
    await asyncio.Event().wait()


def _serve_stack(config: str, node: str, answers: dict[str, bytes]) -> None:
    """``raftmq serve`` with the SQS handler replaced by :func:`stub` (the rest of the node as is)."""
    from raftmq.cluster.api.sqs import routes
    from raftmq.cluster.cli.main import main

    handle = stub(answers)

    async def stub_handle(self: Any, request: web.Request) -> web.Response:
        return await handle(request)

    routes.SqsHandler.handle = stub_handle  # type: ignore[method-assign]
    main(["serve", "--config", config, "--node", node])


def start_bare(value_size: int) -> tuple[subprocess.Popen[bytes], str]:
    (port,) = free_ports(1)
    cmd = [PYTHON, __file__, "--serve", "aiohttp", "--port", str(port), "--value-size", str(value_size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"listening":
        stop_proc(proc)
        raise RuntimeError("the floor did not start")
    return proc, f"http://127.0.0.1:{port}"


def stop_proc(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def start_stack(base: Path, value_size: int) -> Any:
    """A one-node cluster whose node runs :func:`_serve_stack`; the harness's ``Cluster`` (its
    ``stop`` kills the node). A node that does not get ready is stopped here: the caller has
    nothing to stop yet."""
    from tests.integration.harness import Cluster

    cluster = Cluster(
        Path(tempfile.mkdtemp(prefix="sqs-floor-", dir=base)), nodes=1, queue_groups=1, replication=1
    )
    n = cluster.nodes["n1"]
    n.log_path = cluster.dir / "n1.log"
    cmd = [PYTHON, __file__, "--serve", "raftmq stack", "--config", str(cluster.config_path), "--node", "n1"]
    with open(n.log_path, "ab") as log:
        n.proc = subprocess.Popen(
            [*cmd, "--value-size", str(value_size)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        cluster.wait_ready(timeout_s=60)
    except BaseException:
        cluster.stop()
        shutil.rmtree(cluster.dir, ignore_errors=True)
        raise
    return cluster


def measured(server: Server, body: str, seconds: float) -> dict[str, Any]:
    """One window of ``bench_sqs_node.window`` on ``server``, with this process's CPU per call (the
    boto3 client's: issue 24 compares the nodes' CPU per call with it)."""
    sqs, url, pids, who = server
    t0 = time.process_time()
    w = window(sqs, url, body, pids, who, seconds)
    w["client_cpu_us_per_call"] = round(1e6 * (time.process_time() - t0) / w["calls"], 1)
    return w


def idle_us_per_s(pid: int, seconds: float = 5.0) -> float:
    """The CPU (µs a second) ``pid`` spends with no request, from /proc's clock ticks as they are
    (``CpuMeter`` rounds to 0.01 cores, 10,000 µs a second): one tick over the window is
    ``1e6 / SC_CLK_TCK / seconds`` (2,000 µs a second at 100 ticks a second over 5 s)."""
    t0, ticks0 = time.monotonic(), _proc_ticks(pid)
    time.sleep(seconds)
    return round(1e6 * (_proc_ticks(pid) - ticks0) / _TICK / (time.monotonic() - t0), 1)


# -- the run -----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="one measured window")
    ap.add_argument(
        "--rounds", type=int, default=3, help="windows per target, alternating (the median is printed)"
    )
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--profile", action="store_true", help="py-spy --gil on the two floors, one window each")
    ap.add_argument("--profile-rate", type=int, default=1000, help="py-spy's samples a second")
    ap.add_argument("--serve", choices=TARGETS[:2], help=argparse.SUPPRESS)  # a floor server's process
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--node", help=argparse.SUPPRESS)
    add_run_arguments(ap)
    args = ap.parse_args()
    if args.serve == "aiohttp":
        asyncio.run(_serve_bare(args.port, fixed_answers(args.value_size)))
        return
    if args.serve == "raftmq stack":
        _serve_stack(args.config, args.node, fixed_answers(args.value_size))
        return
    if args.profile:
        require_py_spy(ap)
    run(args)


def run(args: argparse.Namespace) -> None:
    from tests.integration.harness import Cluster, wait_until

    base, fs = data_folder(args)
    notes = "1 boto3 client, one call at a time: send 10, receive 10, delete them; 3 servers alternating"
    ignored = ("serve", "port", "config", "node")
    with (
        recorded_run("sqs_floor", args, notes=notes, data_fs=fs, report=report, internal=ignored) as result,
        contextlib.ExitStack() as started,  # what started is stopped, in reverse, whatever fails
    ):
        bare, bare_url = start_bare(args.value_size)
        started.callback(stop_proc, bare)
        stack = start_stack(base, args.value_size)
        started.callback(shutil.rmtree, stack.dir, ignore_errors=True)
        started.callback(stack.stop)
        folder = Path(tempfile.mkdtemp(prefix="sqs-node-", dir=base))
        started.callback(shutil.rmtree, folder, ignore_errors=True)
        cluster = Cluster(folder, nodes=3, queue_groups=1, replication=3, extra_toml='durability = "fsync"')
        started.callback(cluster.stop)
        cluster.start()
        cluster.wait_ready(timeout_s=60)
        wait_until(lambda: cluster.leader("0") == "n1", 30, 0.25, "n1 leads group 0 (its balancer)")
        entry = cluster.leader("0")
        assert entry is not None, "no leader of queue group 0"
        body = "x" * args.value_size
        raft_sqs = _client(cluster.url(entry))
        stack_pid = node_pids(stack)["n1"]
        stack_url = stack.url("n1")
        raft_url = raft_sqs.create_queue(QueueName="bench")["QueueUrl"]
        servers: dict[str, Server] = {
            "aiohttp": (_client(bare_url), f"{bare_url}/0/bench", {"s": bare.pid}, "s"),
            "raftmq stack": (_client(stack_url), f"{stack_url}/0/bench", {"s": stack_pid}, "s"),
            "raftmq": (raft_sqs, raft_url, node_pids(cluster), entry),
        }
        result["idle_us_per_s"] = {
            "aiohttp": idle_us_per_s(bare.pid),
            "raftmq stack": idle_us_per_s(stack_pid),
        }
        result.update(measure_all(servers, body, args))


def measure_all(servers: dict[str, Server], body: str, args: argparse.Namespace) -> dict[str, Any]:
    """The warm-up, then ``--rounds`` windows of each server in turn, their medians, and the
    floors' profiles (``--profile``)."""
    result: dict[str, Any] = {}
    for sqs, url, _, _ in servers.values():
        cycles(sqs, url, body, args.warmup_s)
    windows: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
    for _ in range(args.rounds):
        for t, server in servers.items():
            windows[t].append(measured(server, body, args.seconds))
    result["windows"] = windows
    result["median_us_per_call"] = {
        t: statistics.median(w["node_cpu_us_per_call"] for w in ws) for t, ws in windows.items()
    }
    result["client_median_us_per_call"] = statistics.median(
        w["client_cpu_us_per_call"] for ws in windows.values() for w in ws
    )
    result["followers_median_us_per_call"] = statistics.median(
        w["followers_cpu_us_per_call"] for w in windows["raftmq"]
    )
    if args.profile:
        result["profiles"] = {t: profile(servers[t], body, args) for t in TARGETS[:2]}
    return result


def profile(server: Server, body: str, args: argparse.Namespace) -> dict[str, Any]:
    """py-spy --gil on a floor during one window: its top frames by self time."""
    pids, who = server[2], server[3]
    out = RESULTS / f"profile-sqs_floor-{pids[who]}.raw.txt"
    spy = start_py_spy(pids[who], args.seconds, out, rate=args.profile_rate, gil=True)
    w = measured(server, body, args.seconds)
    if spy is not None:
        spy.wait(30)
    return {"window": w, "top": summarize_raw_profile(out, top=15)}


def report(result: dict[str, Any]) -> None:
    print(f"\nbench_sqs_floor  commit {result['commit']}  {result['params']['tag']}")
    names = [
        "target",
        "calls",
        "server µs/call",
        "followers µs/call",
        "client µs/call",
        "server cores",
        "other cores",
    ]
    names += ["send p50 ms", "receive p50 ms", "delete p50 ms"]
    rows = []
    for t, ws in result["windows"].items():
        for w in ws:
            p50 = [w["p50_ms"].get(a, "") for a in ACTIONS]
            keys = ("calls", "node_cpu_us_per_call", "followers_cpu_us_per_call", "client_cpu_us_per_call")
            keys += ("node_cores", "other_cores")
            rows.append([t, *(w[k] for k in keys), *p50])
    print(table(rows, names))
    for t, us in result["median_us_per_call"].items():
        print(f"median {t}: {us} µs of CPU per SQS call")
    print(f"median boto3 client (all windows): {result['client_median_us_per_call']} µs per call")
    print(f"median raftmq followers (2 nodes): {result['followers_median_us_per_call']} µs per call")
    print(f"idle CPU, µs a second: {result['idle_us_per_s']}")
    for t, p in (result.get("profiles") or {}).items():
        print(f"\n{t} profile (--gil), {p['window']['node_cpu_us_per_call']} µs/call in its window:")
        for name, share in p["top"]["self"]:
            print(f"  {share:5.1f} %  {name}")


if __name__ == "__main__":
    main()
