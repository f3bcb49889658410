"""Sizing benchmark: disk per message and node memory, for docs/operations.md (Sizing).

A real 3-node cluster (tests/integration/harness.Cluster: 3 queue groups, replication 3,
``durability = "fsync"``, segments sealed every ``--seal-every`` messages per queue) gets
``--messages`` messages of ``--sizes`` bytes of random base64 text (with a 9-byte key) over 6
queues, 1,000 per request. Then, on every node, it measures:

- ``state``: the RocksDB state stores (the messages themselves, offsets, ...), per message;
- ``journal``: the Raft journals before compaction (entries since the last snapshot), per message,
  and the entries left after a forced compaction of every group (RocksDB frees their disk space
  later, in its own compactions);
- ``segments``: sealed Arrow + Parquet files (written by the leader that sealed: one copy per
  cluster, on the leaders' nodes);
- resident memory (VmRSS) of each node process, idle (topic created) and after the load.

    .venv/bin/python tests/bench/bench_sizing.py                          # 100 B and 1 KiB values
    .venv/bin/python tests/bench/bench_sizing.py --sizes 100 --messages 1000000
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from _common import header, table, write_result  # noqa: E402

from tests.integration.harness import Cluster  # noqa: E402

QUEUES = 6
GROUPS = ("meta", "0", "1", "2")


def du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # a compaction removed it meanwhile
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def node_disk(c: Cluster, nid: str) -> dict[str, int]:
    groups = c.data_dir / nid / "groups"
    return {
        "state": sum(du(groups / g / "state") for g in GROUPS),
        "journal": sum(du(groups / g / "raft") for g in GROUPS),
        "segments": du(c.data_dir / nid / "segments"),
    }


def produce(c: Cluster, messages: int, value_bytes: int) -> float:
    urls = [n.url for n in c.nodes.values()]
    per_request = 1000

    def send(i: int) -> None:
        # Random base64 text: about as incompressible as a text payload gets (a worst case for disk).
        body = {
            "messages": [
                {
                    "key": f"key-{j % 1000:05d}",
                    "value": base64.b64encode(os.urandom(value_bytes))[:value_bytes].decode(),
                }
                for j in range(per_request)
            ]
        }
        for attempt in range(20):  # a leader change under load answers 421/503: try again
            r = requests.post(f"{urls[(i + attempt) % 3]}/v1/topics/sizing/messages", json=body, timeout=60)
            if r.status_code not in (421, 503, 504):
                r.raise_for_status()
                return
            time.sleep(0.2)
        r.raise_for_status()

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(messages // per_request)))
    return time.monotonic() - started


def run_size(tmp: Path, messages: int, value_bytes: int, seal_every: int) -> dict[str, Any]:
    extra = f"[segments]\nmax_messages = {seal_every}\ncheck_ms = 500\n"
    with Cluster(tmp, nodes=3, extra_toml=extra) as c:
        c.start()
        c.wait_ready(timeout_s=60)
        c.create_topic("sizing", queues=QUEUES)
        time.sleep(1.0)
        pids = {nid: n.proc.pid for nid, n in c.nodes.items() if n.proc is not None}
        idle_rss = {nid: rss_bytes(pid) for nid, pid in pids.items()}
        empty = {nid: node_disk(c, nid) for nid in c.nodes}
        seconds = produce(c, messages, value_bytes)
        # What is stored (a retried unknown outcome may have stored a request twice).
        topic = c.get("/v1/topics/sizing").json()
        messages = sum(q["high_offset"] - q["low_offset"] for q in topic["queues"])
        for g in GROUPS:
            c.wait_replicas_equal(g, timeout_s=120)
        time.sleep(3.0)  # let the sealer catch up
        loaded = {nid: node_disk(c, nid) for nid in c.nodes}
        loaded_rss = {nid: rss_bytes(pid) for nid, pid in pids.items()}
        for nid in c.nodes:
            for g in GROUPS:
                c.internal("POST", f"/internal/groups/{g}/compact", nid)
        time.sleep(3.0)
        compacted = {
            nid: sum(g["journal_entries"] for g in c.status(nid)["groups"].values()) for nid in c.nodes
        }
    per_node = []
    for nid in sorted(loaded):
        per_node.append(
            {
                "node": nid,
                "state_bytes_per_msg": (loaded[nid]["state"] - empty[nid]["state"]) / messages,
                "journal_bytes_per_msg": (loaded[nid]["journal"] - empty[nid]["journal"]) / messages,
                "journal_entries_after_compaction": compacted[nid],
                "segments_bytes": loaded[nid]["segments"],
                "rss_idle_mb": idle_rss[nid] / 1e6,
                "rss_loaded_mb": loaded_rss[nid] / 1e6,
            }
        )
    segments_total = sum(n["segments_bytes"] for n in per_node)
    return {
        "value_bytes": value_bytes,
        "messages": messages,
        "produce_seconds": seconds,
        "payload_bytes_per_msg": value_bytes + 9,
        "segments_bytes_per_msg_cluster": segments_total / messages,
        "nodes": per_node,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000", help="value sizes in bytes, comma-separated")
    parser.add_argument("--messages", type=int, default=300_000, help="messages per size (100 B)")
    parser.add_argument("--seal-every", type=int, default=4_000, help="segments.max_messages")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    result = header("sizing", vars(args))
    result["runs"] = []
    rows = []
    for size in sizes:
        # Keep about the same bytes for bigger values, so each run takes about as long.
        messages = max(10_000, args.messages * 100 // max(size, 100) // 1000 * 1000)
        with tempfile.TemporaryDirectory(prefix="raftmq-sizing-") as tmp:
            run = run_size(Path(tmp), messages, size, args.seal_every)
        result["runs"].append(run)
        for n in run["nodes"]:
            rows.append(
                [
                    size,
                    run["messages"],
                    n["node"],
                    n["state_bytes_per_msg"],
                    n["journal_bytes_per_msg"],
                    n["journal_entries_after_compaction"],
                    run["segments_bytes_per_msg_cluster"],
                    n["rss_idle_mb"],
                    n["rss_loaded_mb"],
                ]
            )
    headers = [
        "value B",
        "messages",
        "node",
        "state B/msg",
        "journal B/msg",
        "journal entries compacted",
        "segments B/msg (cluster)",
        "RSS idle MB",
        "RSS loaded MB",
    ]
    print(table(rows, headers))
    print(f"written to {write_result('sizing', result)}")


if __name__ == "__main__":
    main()
