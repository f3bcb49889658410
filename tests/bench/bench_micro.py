"""CPU cost of each step an entry goes through, in one process (no Raft, no sockets).

Explains bench_core's figures: on one machine the three replicas share the cores, so the cluster's
ceiling is about ``cores / (leader CPU per message + 2 x follower CPU per message)``.

Steps timed for one produce entry (1 batch = 100 messages, and 19 batches = what the GroupCommitter
packs in 256 KiB), with the benchmark's "x"*100 values and with random (incompressible) ASCII:

- leader:   commands.produce (orjson) -> pysyncobj's @replicated pickle -> journal add (crc32c +
            RocksDB write) -> per follower: pickle + zlib(3) + Fernet encrypt -> apply
- follower: Fernet decrypt + zlib + unpickle -> journal add -> apply
- apply:    pickle.loads + commands.decode (validation of every message) + encode_batch + RocksDB write
- fsync:    RocksDB flush_wal(sync=True) after a write of the entry

    .venv/bin/python tests/bench/bench_micro.py          # ~20 s
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import string
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, header, loadavg, table, timeit, write_result
from pysyncobj.encryptor import getEncryptor

from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.storage.records import encode_batch
from raftmq.storage.rocks import RocksStore

BATCH = 100
COALESCED = 19
SECRET = "bench-secret-0123456789abcdef"


def make_batches(n_batches: int, values: str, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n_batches):
        if values == "x":
            msgs = [{"value": "x" * 100}] * BATCH
        else:
            msgs = [
                {"value": "".join(rng.choices(string.ascii_letters + string.digits, k=100))}
                for _ in range(BATCH)
            ]
        out.append({"topic_id": 1, "queue": i % 4, "messages": msgs})
    return out


def measure(n_batches: int, values: str, tmp: Path) -> dict[str, Any]:
    rng = random.Random(1)
    batches = make_batches(n_batches, values, rng)
    msgs = n_batches * BATCH
    fernet = getEncryptor(SECRET)
    cmd = commands.produce(1_700_000_000_000, batches)
    replicated = b"\x00" + pickle.dumps((0, (cmd,), {}), 2)  # what @replicated puts in the log
    entry = (replicated, 123, 5)
    message = {
        "type": "append_entries",
        "term": 5,
        "commit_index": 100,
        "entries": [entry],
        "prevLogIdx": 122,
        "prevLogTerm": 5,
    }
    wire_plain = zlib.compress(pickle.dumps(message), 3)
    wire = fernet.encrypt_at_time(wire_plain, 1000)
    decoded = commands.decode(cmd)

    store = RocksStore.open(str(tmp / f"state-{n_batches}-{values}"))
    jstore = RocksStore.open(str(tmp / f"journal-{n_batches}-{values}"))
    journal = DurableJournal(jstore, fsync=True)
    machine = QueueGroupMachine(store, 0)
    counter = {"idx": 1}

    def journal_add() -> None:
        counter["idx"] += 1
        journal.add(replicated, counter["idx"], 1)

    def journal_add_sync() -> None:
        journal_add()
        journal.flush()

    apply_idx = {"i": 1}

    def apply() -> None:
        apply_idx["i"] += 1
        pickle.loads(replicated[1:])
        machine.apply(apply_idx["i"], cmd)

    def apply_parts_encode() -> None:
        for b in decoded["batches"]:  # type: ignore[typeddict-item]
            encode_batch(1, 1, 0, b["messages"])

    steps: dict[str, float] = {
        "produce: orjson dumps": timeit(lambda: commands.produce(1_700_000_000_000, batches)),
        "@replicated pickle": timeit(lambda: pickle.dumps((0, (cmd,), {}), 2)),
        "send: pickle message": timeit(lambda: pickle.dumps(message)),
        "send: zlib level 3": timeit(lambda: zlib.compress(pickle.dumps(message), 3)) - 0,
        "send: Fernet encrypt": timeit(lambda: fernet.encrypt_at_time(wire_plain, 1000)),
        "recv: Fernet decrypt": timeit(lambda: fernet.decrypt(wire)),
        "recv: zlib + unpickle": timeit(lambda: pickle.loads(zlib.decompress(wire_plain))),
        "journal add (crc + write)": timeit(journal_add),
        "journal add + fsync": timeit(journal_add_sync),
        "apply total": timeit(apply),
        "apply: commands.decode": timeit(lambda: commands.decode(cmd)),
        "apply: encode_batch": timeit(apply_parts_encode),
    }
    steps["send: zlib level 3"] -= steps["send: pickle message"]
    store.close()
    jstore.close()
    fsync = steps["journal add + fsync"] - steps["journal add (crc + write)"]
    per_send = steps["send: pickle message"] + steps["send: zlib level 3"] + steps["send: Fernet encrypt"]
    leader = (
        steps["produce: orjson dumps"]
        + steps["@replicated pickle"]
        + steps["journal add (crc + write)"]
        + 2 * per_send
        + steps["apply total"]
    )
    follower = (
        steps["recv: Fernet decrypt"]
        + steps["recv: zlib + unpickle"]
        + steps["journal add (crc + write)"]
        + steps["apply total"]
    )
    return {
        "batches_per_entry": n_batches,
        "values": values,
        "messages": msgs,
        "command_bytes": len(cmd),
        "wire_bytes": len(wire),
        "steps_us": {k: round(v * 1e6, 1) for k, v in steps.items()},
        "fsync_us": round(fsync * 1e6, 1),
        "leader_cpu_us_per_msg": round(leader * 1e6 / msgs, 2),
        "follower_cpu_us_per_msg": round(follower * 1e6 / msgs, 2),
        "cluster_cpu_us_per_msg": round((leader + 2 * follower) * 1e6 / msgs, 2),
        "ceiling_msgs_per_s_2_cores": round(2 / ((leader + 2 * follower) / msgs)),
        "ceiling_msgs_per_s_leader_thread": round(1 / (leader / msgs)),
    }


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="micro-"))
    result = header("micro", {"tmp": str(tmp)})
    result["loadavg_start"] = loadavg()
    cases = []
    try:
        for n in (1, COALESCED):
            for values in ("x", "random"):
                print(f"  {n} batch(es)/entry, values {values} ...", flush=True)
                cases.append(measure(n, values, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["cases"] = cases
    result["loadavg_end"] = loadavg()
    names = list(cases[0]["steps_us"])
    rows = [[name, *(c["steps_us"][name] / c["messages"] for c in cases)] for name in names]
    rows.append(["fsync (flush_wal sync) per entry, us", *(c["fsync_us"] for c in cases)])
    rows.append(["leader CPU us/msg (2 followers)", *(c["leader_cpu_us_per_msg"] for c in cases)])
    rows.append(["follower CPU us/msg", *(c["follower_cpu_us_per_msg"] for c in cases)])
    rows.append(["cluster CPU us/msg (L + 2F)", *(c["cluster_cpu_us_per_msg"] for c in cases)])
    rows.append(["ceiling msgs/s on 2 cores", *(c["ceiling_msgs_per_s_2_cores"] for c in cases)])
    rows.append(
        ["ceiling msgs/s, leader tick thread", *(c["ceiling_msgs_per_s_leader_thread"] for c in cases)]
    )
    rows.append(["wire bytes per entry per follower", *(c["wire_bytes"] for c in cases)])
    heads = ["us per message (unless noted)", *(f"{c['batches_per_entry']}b/{c['values']}" for c in cases)]
    print(
        f"\nbench_micro  commit {result['commit']}  {result['date']}  nproc {result['machine']['nproc']}  "
        f"loadavg {result['loadavg_start']}"
    )
    print(table(rows, heads))
    path = write_result("micro", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
