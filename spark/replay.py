"""Replay jobs over a topic's committed history (``docs/spark.md``)::

    python -m raftmq.spark.replay copy      --brokers URL[,URL] --topic T --out DIR [range]
    python -m raftmq.spark.replay count     --brokers ... --topic T --window "1 minute" [--out DIR] [range]
    python -m raftmq.spark.replay republish --brokers ... --topic T --to OTHER [--keep-queue] [range]

    range: [--starting-offsets earliest|JSON] [--ending-offsets latest|JSON] [--starting-timestamp MS]

The same jobs run under ``spark-submit`` as ``spark/jobs/{copy_to_parquet,count_by_key,republish}.py``
(they take the same arguments after the job name is dropped). ``--master`` defaults to ``local[*]``
when run with plain python.

- ``copy`` writes the range to Parquet (Kafka's columns; ``--partition-by partition`` optional).
- ``count`` counts messages per key per time window (tumbling, on the append timestamp) and prints
  the result or writes it to Parquet.
- ``republish`` produces the range to another topic through the broker API, keeping keys, headers
  and (with ``--keep-queue``) queue numbers. Each chunk carries a producer id derived from the
  source range and a sequence, so a retried Spark task is stored once by the target's idempotence.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import Brokers

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq-replay", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="job", required=True)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("--brokers", required=True, help="comma-separated node URLs")
        s.add_argument("--topic", required=True)
        s.add_argument("--starting-offsets", default="earliest")
        s.add_argument("--ending-offsets", default="latest")
        s.add_argument("--starting-timestamp", type=int, default=None, help="ms since the epoch")
        s.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"])
        s.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
        s.add_argument(
            "--ca-file", default=None, help="CA of the nodes' certificates (https); else $RAFTMQ_CA_FILE"
        )  # the API token comes from $RAFTMQ_TOKEN only: never on a command line

    c = sub.add_parser("copy", help="copy a topic range to Parquet")
    common(c)
    c.add_argument("--out", required=True)
    c.add_argument("--partition-by", default=None, help="e.g. partition")
    c.add_argument("--include-headers", action="store_true")
    n = sub.add_parser("count", help="count messages per key per time window")
    common(n)
    n.add_argument("--window", default="1 minute")
    n.add_argument("--out", default=None)
    r = sub.add_parser("republish", help="produce a topic range to another topic")
    common(r)
    r.add_argument("--to", required=True, help="target topic (must exist)")
    r.add_argument("--keep-queue", action="store_true", help="same queue number in the target")
    r.add_argument("--chunk", type=int, default=1000, help="messages per produce request")
    return p


def _session(master: str | None) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("raftmq-replay")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # plain python, not spark-submit
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    from .source import register

    register(spark)
    return spark


def _read(spark: Any, args: argparse.Namespace, include_headers: bool = False) -> Any:
    r = (
        spark.read.format("raftmq")
        .option("brokers", args.brokers)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("endingOffsets", args.ending_offsets)
        .option("failOnDataLoss", args.fail_on_data_loss)
        .option("includeHeaders", str(include_headers).lower())
    )
    if args.ca_file:
        r = r.option("caFile", args.ca_file)
    if args.starting_timestamp is not None:
        r = r.option("startingTimestamp", str(args.starting_timestamp))
    return r.load()


def copy(spark: Any, args: argparse.Namespace) -> int:
    df = _read(spark, args, args.include_headers)
    w = df.write.mode("overwrite")
    if args.partition_by:
        w = w.partitionBy(args.partition_by)
    w.parquet(args.out)
    n = spark.read.parquet(args.out).count()
    print(json.dumps({"job": "copy", "rows": n, "out": args.out}))
    return 0


def count(spark: Any, args: argparse.Namespace) -> int:
    from pyspark.sql import functions as f

    df = _read(spark, args)
    counts = (
        df.groupBy(f.col("key"), f.window("timestamp", args.window).alias("window"))
        .count()
        .select(
            f.col("key").cast("string").alias("key"),
            f.col("window.start").alias("window_start"),
            f.col("window.end").alias("window_end"),
            "count",
        )
        .orderBy("window_start", "key")
    )
    if args.out:
        counts.write.mode("overwrite").parquet(args.out)
        print(json.dumps({"job": "count", "out": args.out}))
    else:
        for row in counts.collect():
            print(json.dumps({k: str(v) if k.startswith("window") else v for k, v in row.asDict().items()}))
    return 0


def _produce_partition(
    rows: Iterator[Any], brokers: Brokers, target: str, keep_queue: bool, chunk: int, source: str
) -> Iterator[int]:
    """Produce one Spark partition's rows to ``target`` in chunks (runs on executors)."""
    from ._client import BrokerClient

    client = BrokerClient(brokers)
    path = f"/v1/topics/{urllib.parse.quote(target, safe='')}/messages"
    sent = 0
    batch: list[dict[str, Any]] = []
    first: tuple[int, int] | None = None

    def flush() -> None:
        nonlocal batch, sent, first
        if not batch or first is None:
            return
        producer = f"replay:{source}:{first[0]}:{first[1]}"[:200]
        body = json.dumps({"messages": batch, "producer_id": producer, "sequence": 0}).encode()
        status, data, _ = client.request(
            path, method="POST", body=body, headers={"Content-Type": "application/json"}
        )
        if status != 200:
            raise RuntimeError(f"republish to {target!r}: HTTP {status}: {data[:300]!r}")
        sent += len(batch)
        batch, first = [], None

    try:
        for r in rows:
            if first is None:
                first = (r.partition, r.offset)
            m: dict[str, Any] = {"value_b64": base64.b64encode(r.value or b"").decode()}
            if r.key is not None:
                m["key"] = r.key.decode("utf-8", errors="replace")
            if r.headers:
                m["headers"] = {h.key: (h.value or b"").decode("utf-8", errors="replace") for h in r.headers}
            if keep_queue:
                m["queue"] = r.partition
            batch.append(m)
            if len(batch) >= chunk:
                flush()
        flush()
    finally:
        client.close()
    yield sent


def republish(spark: Any, args: argparse.Namespace) -> int:
    from ._client import Brokers

    df = _read(spark, args, include_headers=True)
    brokers = Brokers.from_options({"brokers": args.brokers, "caFile": args.ca_file})
    target, keep, chunk, source = args.to, args.keep_queue, args.chunk, args.topic
    sent = df.rdd.mapPartitions(
        lambda rows: _produce_partition(rows, brokers, target, keep, chunk, source)
    ).sum()
    print(json.dumps({"job": "republish", "rows": int(sent), "to": target}))
    return 0


JOBS = {"copy": copy, "count": count, "republish": republish}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spark = _session(args.master)
    try:
        return JOBS[args.job](spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
