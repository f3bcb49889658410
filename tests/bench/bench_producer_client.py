"""The Python ``Producer``'s own cost per message, without a cluster: what the client spends.

A stub node (``--role stub``, a separate process: its CPU is not the client's) answers the
client's requests as a node does, without storing anything: ``GET /v1/cluster``, ``GET
/v1/topics/{topic}`` (``--queues`` queues, all led by the stub) and ``POST
/v1/topics/{topic}/messages`` in both wires (frames of record batches: one result per frame, from
each batch's record count; JSON: one result per message). This process then sends
``--messages`` values of ``--value-size`` bytes with one sync ``Producer`` (default settings, one
application thread, as ``bench_vs_nats.py`` does), once per ``--wire``, and reports

- msgs/s from the first send to the end of ``flush``, and
- the client's CPU µs per message (this process's user + system time over the same span: the
  application thread, the producer's I/O thread, aiohttp).

Before the runs, the two batch writers alone (no producer, no I/O): µs per message to append
2,000 values and write the batch, ``raftmq.batch.BatchBuilder`` against the producer's
``ColumnBatch`` (``client/_batch_writer.py``).

``--closed-loop N`` then sends N messages one at a time (each waits for its delivery callback
before the next is sent, keyed over the queues: every message its own request, as at a low rate),
and reports the client's CPU µs and wall µs per request: the fixed cost of one produce request
in the client (issue 23), without the cluster's.

``--transport-floor N`` then times N one-frame produce requests in turn in one asyncio loop, twice:
through the client's ``Transport.request`` (aiohttp) and through a bare ``asyncio.Protocol`` that
writes the same request bytes on one kept-alive connection and reads the answer by its
``Content-Length`` (the same socket calls, none of the HTTP library's objects): the client's CPU µs
per request of each, best of three rounds. Their difference is what the HTTP library costs a
request (a figure for choosing, not a client to use: the protocol handles none of the transport's
failures).

``--profile S`` then records one more run of the first wire with py-spy (this process, the
thread holding the GIL: the application thread and the I/O thread take turns) and prints where
the client's time goes, in µs per message.

    .venv/bin/python tests/bench/bench_producer_client.py
    .venv/bin/python tests/bench/bench_producer_client.py --wire binary --messages 1000000 --profile 10
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    PYTHON,
    add_quiet_argument,
    cpu_seconds,
    free_ports,
    quiet_header,
    start_py_spy,
    summarize_raw_profile,
    table,
    write_result,
)

BENCH = "producer_client"
WARMUP = 20_000
POOL = 1024


# -- the stub node ---------------------------------------------------------------------------------


def stub(port: int, queues: int) -> None:
    """A node that answers produce requests at once and stores nothing."""
    import orjson
    from aiohttp import web

    from raftmq.batch import BATCH_MEDIA_TYPE, split_frames

    high = [0] * queues
    url = f"http://127.0.0.1:{port}"

    async def cluster(request: web.Request) -> web.Response:
        node = {"id": "n1", "http": url, "raft": ""}
        return web.json_response({"node_id": "n1", "nodes": [node], "groups": []})

    async def topic(request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        states = [
            {"queue": q, "group_id": 0, "leader": "n1", "replicas": ["n1"], "low_offset": 0, "high_offset": 0}
            for q in range(queues)
        ]
        return web.json_response(
            {"id": 1, "name": name, "queues": states, "queue_groups": [0] * queues, "created_ms": 0}
        )

    async def produce(request: web.Request) -> web.Response:
        body = await request.read()
        results: list[dict[str, Any]] = []
        if request.content_type == BATCH_MEDIA_TYPE:
            for frame in split_frames(body):
                q = frame.queue or 0
                count = int.from_bytes(frame.batch[48:52], "little")  # record_count (docs/format.md)
                results.append({"queue": q, "base_offset": high[q], "count": count})
                high[q] += count
        else:
            for m in orjson.loads(body)["messages"]:
                q = m["queue"]
                results.append({"queue": q, "offset": high[q]})
                high[q] += 1
        return web.Response(body=orjson.dumps({"results": results}), content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.add_routes(
        [
            web.get("/v1/cluster", cluster),
            web.get("/v1/topics/{topic}", topic),
            web.post("/v1/topics/{topic}/messages", produce),
        ]
    )
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- the client ------------------------------------------------------------------------------------


def writers(values: list[str], rounds: int = 50) -> dict[str, float]:
    """µs per message to append 2,000 of ``values`` and write the batch, with each writer (the
    best of ``rounds``)."""
    from raftmq.batch import BatchBuilder
    from raftmq.client._batch_writer import ColumnBatch

    batch = [values[i % len(values)] for i in range(2_000)]
    best = {"BatchBuilder": float("inf"), "ColumnBatch": float("inf")}
    for _ in range(rounds):
        t0 = time.perf_counter()
        b = BatchBuilder("p-bench", 1)
        for v in batch:
            b.append(v)
        b.finish()
        t1 = time.perf_counter()
        c = ColumnBatch("p-bench", 1)
        for v in batch:
            c.append(v, None, None)
        c.finish()
        t2 = time.perf_counter()
        best["BatchBuilder"] = min(best["BatchBuilder"], (t1 - t0) / len(batch) * 1e6)
        best["ColumnBatch"] = min(best["ColumnBatch"], (t2 - t1) / len(batch) * 1e6)
    return best


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def produce(url: str, wire: str, values: list[str], messages: int) -> tuple[float, float]:
    """(seconds from the first send to the end of flush, this process's CPU seconds meanwhile)."""
    from raftmq.client import Producer

    mask = POOL - 1
    with Producer(url, wire=wire) as producer:  # type: ignore[arg-type]
        for i in range(WARMUP):
            producer.send("bench", values[i & mask])
        producer.flush(60)
        send = producer.send
        cpu0, t0 = _cpu_s(), time.perf_counter()
        for i in range(messages):
            send("bench", values[i & mask])
        if not producer.flush(600):
            raise RuntimeError("flush did not finish in 600 s")
        return time.perf_counter() - t0, _cpu_s() - cpu0


def closed_loop(url: str, value: str, requests: int, queues: int) -> dict[str, float]:
    """One message at a time (the next sent from the delivery callback's wake-up), keyed over
    ``queues``: client CPU µs and wall µs per request, the best of three rounds."""
    import threading

    from raftmq.client import Producer

    answered = threading.Event()
    keys = [f"key-{q}" for q in range(queues)]
    best = {"client_us_per_request": float("inf"), "wall_us_per_request": float("inf")}
    with Producer(url) as producer:
        for i in range(500):  # warm-up: connections, metadata
            producer.send("bench", value, key=keys[i % queues]).result(10)
        for _ in range(3):
            cpu0, t0 = _cpu_s(), time.perf_counter()
            for i in range(requests):
                answered.clear()
                producer.send("bench", value, key=keys[i % queues], callback=lambda m, e: answered.set())
                if not answered.wait(10):
                    raise RuntimeError("no answer within 10 s")
            cpu, wall = _cpu_s() - cpu0, time.perf_counter() - t0
            best["client_us_per_request"] = min(best["client_us_per_request"], cpu / requests * 1e6)
            best["wall_us_per_request"] = min(best["wall_us_per_request"], wall / requests * 1e6)
    return {k: round(v, 1) for k, v in best.items()}


def transport_floor(url: str, requests: int) -> dict[str, float]:
    """Client CPU µs per one-frame produce request in turn: ``Transport.request`` against a bare
    protocol on one connection (best of three rounds each, after 300 not timed)."""
    import asyncio
    from urllib.parse import urlsplit

    import orjson

    from raftmq.batch import BATCH_MEDIA_TYPE, join_frames
    from raftmq.client._batch_writer import ColumnBatch
    from raftmq.client._transport import Transport

    writer = ColumnBatch("p-floor", 0)
    writer.append("x" * 100, "key-0", None)
    body = join_frames([(1, None, writer.finish())])
    path = "/v1/topics/bench/messages"

    class Bare(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""
            self.answer: asyncio.Future[bytes] | None = None

        def data_received(self, data: bytes) -> None:
            self.buf += data
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            at = head.lower().find(b"content-length:")
            if not sep or at < 0:
                return
            length = int(head[at + 15 : head.index(b"\r\n", at)])
            if len(rest) >= length and self.answer is not None:
                self.buf = rest[length:]
                self.answer.set_result(rest[:length])

    async def rounds(one: Any) -> float:
        for _ in range(300):
            await one()
        best = float("inf")
        for _ in range(3):
            cpu0 = _cpu_s()
            for _ in range(requests):
                await one()
            best = min(best, (_cpu_s() - cpu0) / requests * 1e6)
        return round(best, 1)

    async def run() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        transport = Transport(url)

        async def via_transport() -> None:
            await transport.request(
                "POST", path, body=body, content_type=BATCH_MEDIA_TYPE, node_url=url, idempotent=True
            )

        aiohttp_us = await rounds(via_transport)
        await transport.close()
        where = urlsplit(url)
        sock, bare = await loop.create_connection(Bare, where.hostname or "127.0.0.1", where.port or 80)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: {BATCH_MEDIA_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()

        async def via_protocol() -> None:
            bare.answer = loop.create_future()
            sock.write(head + body)
            orjson.loads(await bare.answer)

        bare_us = await rounds(via_protocol)
        sock.close()
        return {"transport_us_per_request": aiohttp_us, "bare_protocol_us_per_request": bare_us}

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value (ASCII)")
    ap.add_argument("--queues", type=int, default=8, help="queues of the stub's topic")
    ap.add_argument("--wire", action="append", choices=["binary", "json"], help="default: both")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per wire (the best is kept)")
    ap.add_argument("--closed-loop", type=int, default=0, help="then this many requests one at a time")
    ap.add_argument("--transport-floor", type=int, default=0, help="then this many requests: aiohttp or not")
    ap.add_argument("--profile", type=float, default=0.0, help="then py-spy a run for this many s")
    ap.add_argument("--tag", default="", help="free text stored in the JSON")
    ap.add_argument("--role", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    add_quiet_argument(ap)
    args = ap.parse_args()
    if args.role == "stub":
        stub(args.port, args.queues)
        return
    wires = args.wire or ["binary", "json"]
    import random
    import string

    rng = random.Random(14)
    alphabet = string.ascii_letters + string.digits
    values = ["".join(rng.choices(alphabet, k=args.value_size)) for _ in range(POOL)]
    (port,) = free_ports(1)
    node = subprocess.Popen(
        [PYTHON, __file__, "--role", "stub", "--port", str(port), "--queues", str(args.queues)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url)
        params = {k: v for k, v in vars(args).items() if k not in ("role", "port")}
        result = quiet_header(BENCH, params, args.wait_quiet)
        result["writers_us_per_msg"] = w = writers(values)
        print(
            f"append + write a batch of 2,000: BatchBuilder {w['BatchBuilder']:.2f} µs/msg, "
            f"ColumnBatch {w['ColumnBatch']:.2f} µs/msg"
        )
        rows, runs = [], {}
        for wire in wires:
            best: dict[str, Any] | None = None
            for _ in range(args.repeat):
                stub0 = cpu_seconds(node.pid)
                seconds, cpu = produce(url, wire, values, args.messages)
                run = {
                    "msgs_per_s": args.messages / seconds,
                    "client_us_per_msg": cpu / args.messages * 1e6,
                    "stub_us_per_msg": (cpu_seconds(node.pid) - stub0) / args.messages * 1e6,
                    "seconds": round(seconds, 3),
                }
                if best is None or run["client_us_per_msg"] < best["client_us_per_msg"]:
                    best = run
            assert best is not None
            runs[wire] = best
            rows.append([wire, best["msgs_per_s"], best["client_us_per_msg"], best["stub_us_per_msg"]])
        result["runs"] = runs
        print(f"\n{args.messages:,} messages of {args.value_size} B, one sync Producer, {args.queues} queues")
        print(table(rows, ["wire", "msgs/s", "client CPU µs/msg", "stub node CPU µs/msg"]))
        if args.closed_loop > 0:
            result["closed_loop"] = c = closed_loop(url, values[0], args.closed_loop, args.queues)
            print(
                f"\none message per request, {args.closed_loop:,} in turn (best of 3): client CPU "
                f"{c['client_us_per_request']:.0f} µs/request, round trip {c['wall_us_per_request']:.0f} µs"
            )
        if args.transport_floor > 0:
            result["transport_floor"] = f = transport_floor(url, args.transport_floor)
            print(
                f"\none-frame produce requests in turn, client CPU µs/request (best of 3): "
                f"Transport.request {f['transport_us_per_request']:.0f}, "
                f"a bare protocol {f['bare_protocol_us_per_request']:.0f}"
            )
        if args.profile > 0:
            result["profile"] = _profile(url, wires[0], values, args, runs[wires[0]]["client_us_per_msg"])
        path = write_result(BENCH, result)
        print(f"\nwrote {path}")
    finally:
        node.terminate()
        node.wait(10)


def _wait_up(url: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/v1/cluster", timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _profile(url: str, wire: str, values: list[str], args: argparse.Namespace, us_per_msg: float) -> Any:
    """py-spy over a run long enough for ``args.profile`` s; each function's self share of the
    busy samples as µs per message of the timed run."""
    out = Path(tempfile.mkdtemp()) / "client.raw"
    messages = max(args.messages, int(args.profile * 400_000))
    spy = start_py_spy(os.getpid(), args.profile, out, rate=200, gil=True)
    if spy is None:
        print("py-spy not found: no profile")
        return None
    time.sleep(1.0)
    produce(url, wire, values, messages)
    spy.wait(args.profile + 30)
    summary = summarize_raw_profile(out, top=15)
    print(f"\npy-spy ({wire}, {args.profile:.0f} s, the GIL holder); top self, as µs per message:")
    for name, pct in summary["self"]:
        print(f"  {pct / 100 * us_per_msg:6.2f} µs  {pct:5.1f}%  {name}")
    return summary


if __name__ == "__main__":
    main()
