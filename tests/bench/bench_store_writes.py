"""Write amplification of one queue group's store pair (state and Raft journal) under RocksStore's
options against the alternatives, in one process per variant (no Raft, no sockets, no fsync per
entry).

The write pattern of a replica applying produce entries: each entry carries 4 record batches of 16
messages of 1 KiB (the client's sticky 16 KiB) to the next queues of ``--queues`` in turn, so every
memtable flush holds keys of every queue; the state store gets each batch at ``R topic queue
base_offset`` with the queue's meta and the applied index beside it, the journal the entry at
``E index``, and the journal drops its entries each 64 MiB (pysyncobj's compaction). Per variant:
bytes this process caused to be written to the disk (``/proc/self/io``) per byte of batches, as
the store grows and once RocksDB's background work is done; CPU; then 2,000 reads of 256 messages
at old offsets; then retention: 90% of every queue removed and compacted as the node's compactor
does, and 63 of 64 queues of a second store removed while one keeps its batches (a topic with
retention beside one without).

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_store_writes.py   # ~2 min, 2.5 GB of disk
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import string
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, RESULTS, header, table, write_result

from raftmq.storage import rocks
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

VARIANTS = {
    "blob files (kept)": "RocksStore's options",
    "no blob files (before)": "the options before blob files: messages in the SST files",
    "blob files + RocksDB's blob GC": "blob GC on, age cutoff 0.25 (RocksDB's default)",
}
MIB = 1 << 20
_U64 = struct.Struct(">Q")


def _variant(name: str) -> None:
    current = rocks._options

    def options() -> rocks.Options:
        opts = current()
        if name == "no blob files (before)":
            opts.set_enable_blob_files(False)
        elif name == "blob files + RocksDB's blob GC":
            opts.set_enable_blob_gc(True)
        return opts

    rocks._options = options


def _io(field: str) -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/io")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rkey(queue: int, offset: int) -> bytes:
    return b"R" + struct.pack(">II", 1, queue) + _U64.pack(offset)


def _idle(*stores: RocksStore) -> bool:
    props = ("rocksdb.estimate-pending-compaction-bytes", "rocksdb.num-running-compactions")
    return not any(s.int_property(p) for s in stores for p in (*props, "rocksdb.num-running-flushes"))


def _fill(
    state: RocksStore, journal: RocksStore, mib: int, queues: int, steps: list[dict[str, Any]]
) -> list[int]:
    rnd = random.Random(1)
    pool = ["".join(rnd.choices(string.ascii_letters + string.digits, k=1024)).encode() for _ in range(997)]
    high = [0] * queues
    index = logical = journal_bytes = turn = sent = 0
    w0, c0, t0 = _io("write_bytes"), _cpu_s(), time.perf_counter()
    last_w, last_t, last_l = w0, t0, 0
    while logical < mib * MIB:
        index += 1
        entry, values = Batch(), []
        for _ in range(4):
            q = turn % queues
            turn += 1
            value = b"".join(pool[(sent + i) % 997] for i in range(16))
            sent += 16
            entry.put(_rkey(q, high[q]), value)
            high[q] += 16
            entry.put(b"Q" + struct.pack(">II", 1, q), _U64.pack(high[q]) * 3)
            values.append(value)
            logical += len(value)
        entry.put(b"A", _U64.pack(index))
        command = b"".join(values)
        record = Batch()
        record.put(b"E" + _U64.pack(index), _U64.pack(1) + b"crc." + command)
        journal.write(record, sync=index % 8 == 0)
        state.write(entry)
        journal_bytes += len(command)
        if journal_bytes > 64 * MIB:
            drop = Batch()
            drop.delete_range(b"E" + _U64.pack(0), b"E" + _U64.pack(index))
            journal.write(drop, sync=True)
            journal_bytes = 0
        if logical - last_l >= 128 * MIB:
            now, w = time.perf_counter(), _io("write_bytes")
            steps.append(
                {
                    "held_mib": round(logical / MIB),
                    "mib_per_s": round((logical - last_l) / MIB / (now - last_t), 1),
                    "written_x_step": round((w - last_w) / (logical - last_l), 2),
                    "written_x_so_far": round((w - w0) / logical, 2),
                    "cpu_s": round(_cpu_s() - c0, 1),
                }
            )
            last_w, last_t, last_l = w, now, logical
    return high


def run_one(name: str, mib: int, queues: int, root: Path) -> dict[str, Any]:
    _variant(name)
    state, journal = RocksStore.open(str(root / "state")), RocksStore.open(str(root / "raft"))
    steps: list[dict[str, Any]] = []
    w0, c0, t0 = _io("write_bytes"), _cpu_s(), time.perf_counter()
    high = _fill(state, journal, mib, queues, steps)
    fill_s, fill_w = time.perf_counter() - t0, _io("write_bytes") - w0
    while not _idle(state, journal):
        time.sleep(0.2)
    logical = mib * MIB
    out: dict[str, Any] = {
        "fill_s": round(fill_s, 1),
        "fill_mib_per_s": round(mib / fill_s, 1),
        "fill_written_x": round(fill_w / logical, 2),
        "settled_written_x": round((_io("write_bytes") - w0) / logical, 2),
        "cpu_s": round(_cpu_s() - c0, 1),
        "disk_mib": round(_disk(root) / MIB),
        "steps": steps,
    }
    rnd, n, t = random.Random(2), 0, time.perf_counter()
    for _ in range(2000):
        q = rnd.randrange(queues)
        offset = rnd.randrange(max(1, high[q] // 2)) // 16 * 16
        end = _rkey(q, offset + 256)
        n += sum(len(v) for _, v in state.scan(_rkey(q, offset), end))
    out["old_reads_ms"] = round((time.perf_counter() - t) / 2000 * 1000, 3)
    removal, ends = Batch(), {q: _rkey(q, high[q] * 9 // 10 // 16 * 16) for q in range(queues)}
    for q, end in ends.items():
        removal.delete_range(_rkey(q, 0), end)
    state.write(removal, sync=True)
    t = time.perf_counter()
    for q, end in ends.items():
        state.compact_range(_rkey(q, 0), end)
    out["retention_90_s"] = round(time.perf_counter() - t, 2)
    out["retention_90_disk_mib"] = round(_disk(root / "state") / MIB)
    # A topic with retention beside one without, in one store: 63 queues removed, 1 kept.
    journal.close()
    removal, ends = Batch(), {q: _rkey(q, 1 << 62) for q in range(1, queues)}
    for q, end in ends.items():
        removal.delete_range(_rkey(q, 0), end)
    state.write(removal, sync=True)
    w = _io("write_bytes")
    for q, end in ends.items():
        state.compact_range(_rkey(q, 0), end)
    out["one_queue_kept_disk_mib"] = round(_disk(root / "state") / MIB)
    out["one_queue_kept_written_mib"] = round((_io("write_bytes") - w) / MIB)
    state.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="MiB of record batches per variant")
    ap.add_argument("--queues", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: run this variant, print its JSON
    args = ap.parse_args()
    if args.one:
        root = Path(tempfile.mkdtemp(prefix="bench-store-", dir=RESULTS.parent))
        try:
            print(json.dumps(run_one(args.one, args.mib, args.queues, root)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    data = header("store_writes", {"mib": args.mib, "queues": args.queues})
    data["variants"] = {}
    for name in args.variants.split(","):
        cmd = [PYTHON, __file__, "--one", name, "--mib", str(args.mib), "--queues", str(args.queues)]
        result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        data["variants"][name] = result
        print(f"{name}: " + ", ".join(f"{s['held_mib']} MiB {s['written_x_step']}x" for s in result["steps"]))
    rows = [
        [
            name,
            r["fill_written_x"],
            r["settled_written_x"],
            r["fill_mib_per_s"],
            r["cpu_s"],
            r["old_reads_ms"],
            f"{r['disk_mib']} -> {r['retention_90_disk_mib']}",
            r["one_queue_kept_disk_mib"],
        ]
        for name, r in data["variants"].items()
    ]
    print(
        table(
            rows,
            [
                "variant",
                "written/held (fill)",
                "(settled)",
                "MiB/s",
                "CPU s",
                "256 old msgs, ms",
                "disk MiB, 90% removed",
                "1 of 64 queues kept, MiB",
            ],
        )
    )
    print(write_result("store_writes", data))


if __name__ == "__main__":
    main()
