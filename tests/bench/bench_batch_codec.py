"""CPU cost per message of the record-batch format v2 (raftmq.batch) against today's JSON path,
in one process and one run (no Raft, no sockets).

v2 steps: build (client: BatchBuilder.append per message + finish), validate (node: CRC, lengths,
limits, UTF-8, vectorised), stamp (apply: base offset, append time, Raft index), read (CRC and
structure, no limits: a consumer's check), lazy decode (Record per message), columns (+ Arrow).
Today's steps, per message: the client's orjson encode of the body, the node's orjson decode and
validation (cluster/api/validation.py parse_produce), and the replica's storage/records.py
encode_batch (from NewMessage tuples); decode_messages for reading.

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_batch_codec.py   # ~1 min
"""

from __future__ import annotations

import argparse
import os
import random
import string
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, add_quiet_argument, loadavg, quiet_header, table, timeit, write_result

from raftmq.batch import BatchBuilder, Limits, columns, read, stamp, validate
from raftmq.cluster.api.validation import parse_produce
from raftmq.cluster.config.cluster_file import Limits as NodeLimits
from raftmq.storage.records import NewMessage, decode_messages, encode_batch

NOW_MS = 1_700_000_000_000


def measure(records: int, value_bytes: int, keyed: bool, min_time: float) -> dict[str, Any]:
    rng = random.Random(records * 7919 + value_bytes)
    values = ["".join(rng.choices(string.ascii_letters, k=value_bytes)) for _ in range(records)]
    keys = [f"customer-{i % 97}" if keyed else None for i in range(records)]
    headers = [{"trace": f"{i:08x}"} if keyed else None for i in range(records)]
    limits, node_limits = Limits(), NodeLimits()

    def build() -> bytes:
        b = BatchBuilder("p-bench", 1)
        append = b.append
        for v, k, h in zip(values, keys, headers, strict=True):
            append(v, k, h)
        return b.finish()

    batch = build()
    stored = stamp(batch, 1_000, NOW_MS, 42)
    view = read(stored)

    def json_messages() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for v, k, h in zip(values, keys, headers, strict=True):
            m: dict[str, Any] = {"value": v}
            if k is not None:
                m["key"] = k
                m["headers"] = h
            out.append(m)
        return out

    def json_encode() -> bytes:
        return orjson.dumps({"messages": json_messages(), "producer_id": "p-bench", "sequence": 1})

    body = json_encode()
    parsed = orjson.loads(body)
    request = parse_produce(parsed, node_limits, node_limits.max_message_bytes, NOW_MS)
    news = [NewMessage(m.value.encode(), False, m.key, m.headers) for m in request.messages]
    v1 = encode_batch(42, NOW_MS, 1_000, news)

    def v1_encode() -> bytes:
        msgs = [NewMessage(m.value.encode(), False, m.key, m.headers) for m in request.messages]
        return encode_batch(42, NOW_MS, 1_000, msgs)

    steps: dict[str, Callable[[], Any]] = {
        "v2 build (client)": build,
        "v2 validate (node)": lambda: validate(batch, limits),
        "v2 stamp (apply)": lambda: stamp(batch, 1_000, NOW_MS, 42),
        "v2 read (CRC + structure)": lambda: read(stored),
        "v2 lazy decode (all records)": lambda: list(read(stored).records()),
        "v2 values only (BatchView.values)": lambda: list(read(stored).values()),
        "v2 columns + to_arrow": lambda: columns([view]).to_arrow(),
        "json encode (client)": json_encode,
        "json orjson decode (node)": lambda: orjson.loads(body),
        "json validate parse_produce (node)": lambda: parse_produce(
            orjson.loads(body), node_limits, node_limits.max_message_bytes, NOW_MS
        ),
        "v1 encode_batch (apply, each replica)": v1_encode,
        "v1 decode_messages (fetch)": lambda: decode_messages(v1, 0, records + 1_000),
    }
    us = {name: timeit(fn, min_time) * 1e6 / records for name, fn in steps.items()}
    node_v2 = us["v2 validate (node)"] + 3 * us["v2 stamp (apply)"]
    node_json = us["json validate parse_produce (node)"] + 3 * us["v1 encode_batch (apply, each replica)"]
    return {
        "records": records,
        "value_bytes": value_bytes,
        "keyed": keyed,
        "batch_bytes": len(batch),
        "json_body_bytes": len(body),
        "v1_bytes": len(v1),
        "us_per_msg": {k: round(v, 4) for k, v in us.items()},
        "node_v2_us_per_msg": round(node_v2, 4),
        "node_json_us_per_msg": round(node_json, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per step and case")
    add_quiet_argument(ap)
    args = ap.parse_args()
    result = quiet_header("batch_codec", vars(args), args.wait_quiet)
    cases = []
    for keyed in (False, True):
        for value_bytes in (100, 1024):
            for records in (100, 1_000):
                print(
                    f"  {records} records of {value_bytes} B{' +key +header' if keyed else ''} ...",
                    flush=True,
                )
                cases.append(measure(records, value_bytes, keyed, args.min_time))
    result["cases"] = cases
    result["loadavg_end"] = loadavg()
    names = list(cases[0]["us_per_msg"])
    rows = [[name, *(c["us_per_msg"][name] for c in cases)] for name in names]
    rows.append(["node: v2 validate + 3 stamps (RF 3)", *(c["node_v2_us_per_msg"] for c in cases)])
    rows.append(["node: json validate + 3 v1 encodes", *(c["node_json_us_per_msg"] for c in cases)])
    rows.append(["v2 batch bytes per msg", *(c["batch_bytes"] / c["records"] for c in cases)])
    rows.append(["json body bytes per msg", *(c["json_body_bytes"] / c["records"] for c in cases)])
    heads = [
        "us per message",
        *(f"{c['records']}x{c['value_bytes']}{'k' if c['keyed'] else ''}" for c in cases),
    ]
    print(
        f"\nbench_batch_codec  commit {result['commit']}  {result['date']}  "
        f"nproc {result['machine']['nproc']}  loadavg {result['loadavg_start']}  "
        "(column suffix k: each message has a key and a header)"
    )
    print(table(rows, heads))
    path = write_result("batch_codec", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
