"""A node's py-spy profile split by where its samples pass: the Raft wire (send, receive), RocksDB
writes, pysyncobj's command pickle, HTTP; in µs per message.

``bench_vs_nats.py --profile`` leaves each process's raw samples in
``bench-results/profile-vs_nats-<name>.raw.txt`` and its CPU per message in the result file; this
script turns each node's busy samples (idle and fsync waits left out, as the benchmark does) into
µs per message per category, a sample counted in the first category one of its frames matches.

    .venv/bin/python tests/bench/split_profile.py bench-results/vs_nats-<commit>-<time>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import IDLE_LEAVES, IO_LEAVES, _frame_name

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "send: pickle + seal",
        ("FrameWire.frame", "FrameWire._seal", "SharedBodies.body_for"),  # wire.py
    ),
    ("send: socket writes", ("SendQueue.send_to", "RaftConnection._TcpConnection__processSend")),
    (
        "receive: recv, parse, decrypt, unpickle",
        ("RaftConnection._TcpConnection__processRead", "RaftConnection._TcpConnection__processParseMessage"),
    ),
    ("RocksDB writes", ("RocksStore.write",)),
    ("pysyncobj command pickle", ("dumps (pysyncobj/pickle.py)", "loads (pysyncobj/pickle.py)")),
    ("HTTP (aiohttp)", ("aiohttp/",)),
)


def split(raw: Path, us_per_msg: float) -> dict[str, float]:
    """µs per message of each category in the raw profile ``raw`` of a process that spent
    ``us_per_msg`` CPU µs per message; "other" is the rest."""
    busy = 0
    counts = dict.fromkeys([name for name, _ in CATEGORIES], 0)
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        leaf = frames[-1]
        if any(leaf.startswith(w) or w in leaf for w in IDLE_LEAVES) or leaf.startswith(IO_LEAVES):
            continue
        busy += int(count_s)
        for name, needles in CATEGORIES:
            if any(n in f for f in frames for n in needles):
                counts[name] += int(count_s)
                break
    out = {name: round(c / max(1, busy) * us_per_msg, 2) for name, c in counts.items()}
    out["other"] = round(us_per_msg - sum(out.values()), 2)
    return out


def main() -> None:
    result_file = Path(sys.argv[1])
    result = json.loads(result_file.read_text())
    for name, process in result["profile"]["processes"].items():
        raw = result_file.parent / f"profile-vs_nats-{name}.raw.txt"
        if name != "client" and raw.exists():
            us = float(process["cpu_us_per_msg"])
            print(f"{name}: {us} CPU µs/msg", json.dumps(split(raw, us)))


if __name__ == "__main__":
    main()
