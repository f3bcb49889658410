"""Spark replay benchmark (docs/benchmarks.md, "Spark replay").

1. Sealed path: ``--rows`` (default 10,000,000) committed 100-byte messages in sealed segments,
   read in ``local[2]`` by the ``raftmq`` data source and, side by side over the same segments'
   Parquet files, by Spark's own Parquet reader. Both end in ``write.format("noop")``, which
   materializes every row and column. The segments are written directly with the broker's segment
   writer (``SegmentStore.write``, the code the sealing task runs) rather than produced through a
   broker, and the manifest is served by a small HTTP stub: the measured read path (plan from the
   manifest, memory-map each Arrow IPC file, verify its CRC32C, yield its record batches) is the
   one the data source takes against a real cluster.
2. Tail path: ``--tail-rows`` (default 2,000,000) 100-byte messages produced into a real 1-node
   cluster with sealing off, read through the Arrow fetch (65,536 rows a call).

    .venv/bin/python tests/bench/bench_spark.py [--rows N] [--tail-rows N] [--runs 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from raftmq.storage.columns import SCHEMA  # noqa: E402
from raftmq.storage.segments import SegmentStore, segment_name  # noqa: E402
from tests.bench._common import header, loadavg, table, write_result  # noqa: E402

TOPIC = "bench"
SEGMENT_ROWS = 262_144  # the default segments.max_messages
QUEUES = 4


def make_batch(queue: int, base: int, n: int, value_bytes: int, rng: np.random.Generator) -> pa.RecordBatch:
    values = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32)
    value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    topic_bytes = TOPIC.encode()
    topic = pa.Array.from_buffers(
        pa.string(),
        n,
        [
            None,
            pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(topic_bytes)),
            pa.py_buffer(topic_bytes * n),
        ],
    )
    ts = np.full(n, 1_700_000_000_000_000, dtype=np.int64) + np.arange(base, base + n, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(n, pa.binary()),
            value,
            topic,
            pa.array(np.full(n, queue, dtype=np.int32)),
            pa.array(np.arange(base, base + n, dtype=np.int64)),
            pa.array(ts, pa.timestamp("us", tz="UTC")),
            pa.array(np.ones(n, dtype=np.int32)),
            pa.nulls(n, SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )


def write_segments(root: Path, rows: int, value_bytes: int) -> dict[str, Any]:
    """Segments of SEGMENT_ROWS rows over QUEUES queues; returns the manifest the broker would serve."""
    store = SegmentStore(str(root))
    rng = np.random.default_rng(7)
    per_queue = rows // QUEUES
    queues = []
    for q in range(QUEUES):
        segs = []
        base = 0
        while base < per_queue:
            n = min(SEGMENT_ROWS, per_queue - base)
            batches = [
                make_batch(q, base + i, min(65_536, n - i), value_bytes, rng) for i in range(0, n, 65_536)
            ]
            arrow = segment_name(TOPIC, 1, q, base, base + n, "n1", "arrow")
            parquet = segment_name(TOPIC, 1, q, base, base + n, "n1", "parquet")
            w = store.write(batches, arrow, parquet)
            segs.append(
                {
                    "base": base,
                    "end": base + n,
                    "rows": n,
                    "bytes": w.bytes,
                    "crc32c": w.crc32c,
                    "parquet_crc32c": w.parquet_crc32c,
                    "node": "n1",
                    "first_timestamp_ms": w.first_ts_ms,
                    "last_timestamp_ms": w.last_ts_ms,
                    "arrow_path": store.location(arrow),
                    "parquet_path": store.location(parquet),
                    "url": f"http://127.0.0.1:1/v1/topics/{TOPIC}/segments/{q}/{base}",
                }
            )
            base += n
        queues.append(
            {
                "queue": q,
                "group_id": 0,
                "leader": "n1",
                "leader_url": None,
                "low_offset": 0,
                "high_offset": per_queue,
                "sealed_end": per_queue,
                "segments": segs,
            }
        )
    return {"topic": TOPIC, "topic_id": 1, "shared_store": False, "queues": queues}


def serve_manifest(manifest: dict[str, Any]) -> str:
    body = json.dumps(manifest).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == f"/v1/topics/{TOPIC}/segments":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def timed(action: Any, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        action()
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--tail-rows", type=int, default=2_000_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--skip-tail", action="store_true")
    args = p.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from tests.spark.conftest import spark_session

    result = header("spark", vars(args))
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    t0 = time.perf_counter()
    manifest = write_segments(tmp / "segments", args.rows, args.value_bytes)
    result["write_segments_s"] = round(time.perf_counter() - t0, 2)
    print(f"wrote {args.rows:,} rows in segments in {result['write_segments_s']} s", flush=True)
    broker = serve_manifest(manifest)
    spark = spark_session("bench-spark")
    paths = [s["parquet_path"] for q in manifest["queues"] for s in q["segments"]]

    def raftmq_read() -> None:
        df = spark.read.format("raftmq").option("brokers", broker).option("topic", TOPIC).load()
        df.write.format("noop").mode("overwrite").save()

    def parquet_read() -> None:
        spark.read.parquet(*paths).write.format("noop").mode("overwrite").save()

    n = spark.read.format("raftmq").option("brokers", broker).option("topic", TOPIC).load().count()
    assert n == args.rows // QUEUES * QUEUES, n
    raftmq_read()  # warm-up (Python workers, JIT)
    parquet_read()
    rows: list[list[Any]] = []
    sealed: dict[str, Any] = {}
    actions = (("raftmq (sealed segments)", raftmq_read), ("spark.read.parquet", parquet_read))
    times: dict[str, list[float]] = {name: [] for name, _ in actions}
    result["loadavg_start"] = loadavg()
    for _ in range(args.runs):  # interleaved, so that load from elsewhere hits both alike
        for name, action in actions:
            times[name] += timed(action, 1)
    for name, _ in actions:
        med = statistics.median(times[name])
        sealed[name] = {
            "runs_s": [round(t, 3) for t in times[name]],
            "median_s": round(med, 3),
            "rows_per_s": round(n / med),
        }
        rows.append([name, f"{n:,}", f"{med:.2f}", f"{n / med:,.0f}"])
        print(rows[-1], flush=True)
    ratio = sealed["raftmq (sealed segments)"]["median_s"] / sealed["spark.read.parquet"]["median_s"]
    result["sealed"] = sealed
    result["sealed_ratio"] = round(ratio, 3)
    if not args.skip_tail:
        result["tail"] = tail_bench(spark, args, rows)
    result["loadavg_end"] = loadavg()
    spark.stop()
    print(table(rows, ["path", "rows", "median s", "rows/s"]))
    print(f"raftmq / parquet time ratio: {ratio:.2f}")
    print("result:", write_result("spark", result))


def tail_bench(spark: Any, args: Any, rows: list[list[Any]]) -> dict[str, Any]:
    from tests.integration.harness import Cluster, wait_until

    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-tail-"))
    toml = "[segments]\nenabled = false\n[limits]\nmax_request_bytes = 8388608\n"
    with Cluster(tmp, nodes=1, extra_toml=toml) as c:
        c.start()
        c.wait_ready()
        c.create_topic(TOPIC, queues=QUEUES)
        value = "x" * args.value_bytes
        per_request = 10_000
        t0 = time.perf_counter()
        for i in range(0, args.tail_rows, per_request):
            msgs = [{"value": value, "queue": (i // per_request) % QUEUES} for _ in range(per_request)]
            r = c.produce(TOPIC, msgs)
            assert r.status_code == 200, r.text
        produce_s = time.perf_counter() - t0
        print(f"produced {args.tail_rows:,} in {produce_s:.1f} s", flush=True)
        wait_until(lambda: c.get(f"/v1/topics/{TOPIC}/segments").status_code == 200, 10)
        brokers = c.url("n1")

        def tail_read() -> None:
            df = spark.read.format("raftmq").option("brokers", brokers).option("topic", TOPIC).load()
            df.write.format("noop").mode("overwrite").save()

        tail_read()  # warm-up
        times = timed(tail_read, args.runs)
        med = statistics.median(times)
        rows.append(
            [
                "raftmq (tail, Arrow fetch)",
                f"{args.tail_rows:,}",
                f"{med:.2f}",
                f"{args.tail_rows / med:,.0f}",
            ]
        )
        print(rows[-1], flush=True)
        return {
            "produce_s": round(produce_s, 2),
            "runs_s": [round(t, 3) for t in times],
            "median_s": round(med, 3),
            "rows_per_s": round(args.tail_rows / med),
        }


if __name__ == "__main__":
    main()
