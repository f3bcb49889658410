"""What pysyncobj does to every Raft entry it sends, per entry, on incompressible data.

pysyncobj 0.3.17 (``tcp_connection.py``, ``TcpConnection.send`` and ``__processParseMessage``)
sends each append_entries message as ``encrypt_at_time(zlib.compress(pickle.dumps(message), 3))``
with the Fernet key of ``encryptor.getEncryptor(password)`` (PBKDF2 of the Raft key), and the
follower does ``pickle.loads(zlib.decompress(fernet.decrypt(data)))``. The entry inside is the
pickled replicated call around the command bytes. This script repeats those steps on one entry
whose command is ``size`` bytes of ``os.urandom`` (a v2 batch of binary or already compressed
values looks like this to zlib) and, for contrast, of random ASCII letters (text values), and
times each step per entry, with two alternatives: no zlib, and AES-GCM instead of Fernet; and
raftmq's own connection (``cluster/replication/pso.py``, ``RaftConnection``, its frames
``wire.py``'s), which replaced those steps: its ``frame`` (pickle + AES-256-GCM) and its parse of
one frame from the read buffer.
A second table times one connection's write buffer per 1 KiB frame with a standing backlog:
pysyncobj's ``bytes`` (``+=``, then ``[sent:]``) against RaftConnection's bytearray.
A third (``--followers``, alone) times what a leader pays to queue one new entry for two up-to-date
followers (``RaftConnection.frames`` on both connections: a shared body and two envelopes where the
tree has them, two frames of their own where it has not: run it with another tree's venv to compare)
and what one follower pays to parse it.

    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_raft_entry.py   # ~1 min
    flock /tmp/raftmq-heavy.lock .venv/bin/python tests/bench/bench_raft_entry.py --followers
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import string
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, add_quiet_argument, loadavg, quiet_header, table, timeit, write_result
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj.encryptor import getEncryptor

from raftmq.cluster.replication.pso import RaftConnection
from raftmq.cluster.replication.wire import raft_key

SECRET = "bench-secret-0123456789abcdef"
SIZES = (1024, 10 * 1024, 100 * 1024, 1024 * 1024)


def message(command: bytes) -> dict[str, Any]:
    """An append_entries message carrying one entry, as pysyncobj builds it (the entry is the
    pickled replicated call: function id, args, kwargs)."""
    entry = b"\x00" + pickle.dumps((0, (command,), {}))
    return {
        "type": "append_entries",
        "term": 7,
        "commit_index": 1_000,
        "entries": [(entry, 1_001, 7)],
        "prevLogIdx": 1_000,
        "prevLogTerm": 7,
    }


def measure(size: int, data: str, min_time: float) -> dict[str, Any]:
    fernet = getEncryptor(SECRET)
    gcm = AESGCM(AESGCM.generate_key(bit_length=128))
    nonce = os.urandom(12)
    rng = random.Random(size)
    command = (
        os.urandom(size) if data == "random" else "".join(rng.choices(string.ascii_letters, k=size)).encode()
    )
    msg = message(command)
    pickled = pickle.dumps(msg)
    compressed = zlib.compress(pickled, 3)
    sealed = fernet.encrypt_at_time(compressed, int(time.monotonic()))
    sealed_plain = fernet.encrypt_at_time(pickled, int(time.monotonic()))
    gcm_sealed = gcm.encrypt(nonce, pickled, None)

    sender, receiver = RaftConnection(None), RaftConnection(None)
    sender.raft_key = receiver.raft_key = raft_key(os.urandom(32).hex())

    def raftmq_send_receive() -> Any:
        receiver._TcpConnection__readBuffer = bytearray(sender.frame(msg))
        return receiver._TcpConnection__processParseMessage()

    assert raftmq_send_receive() == msg
    frame = sender.frame(msg)

    def receive() -> Any:
        fernet.extract_timestamp(sealed)
        return pickle.loads(zlib.decompress(fernet.decrypt(sealed)))

    steps: dict[str, Callable[[], Any]] = {
        "pickle.dumps (send)": lambda: pickle.dumps(msg),
        "zlib.compress level 3 (send)": lambda: zlib.compress(pickled, 3),
        "Fernet encrypt (send)": lambda: fernet.encrypt_at_time(compressed, int(time.monotonic())),
        "Fernet timestamp + decrypt (receive)": lambda: (
            fernet.extract_timestamp(sealed),
            fernet.decrypt(sealed),
        ),
        "zlib.decompress (receive)": lambda: zlib.decompress(compressed),
        "pickle.loads (receive)": lambda: pickle.loads(pickled),
        "pysyncobj today: send + receive": lambda: (
            fernet.encrypt_at_time(zlib.compress(pickle.dumps(msg), 3), int(time.monotonic())),
            receive(),
        ),
        "without zlib: send + receive": lambda: (
            fernet.encrypt_at_time(pickle.dumps(msg), int(time.monotonic())),
            pickle.loads(fernet.decrypt(sealed_plain)),
        ),
        "AES-128-GCM, no zlib: send + receive": lambda: (
            gcm.encrypt(nonce, pickle.dumps(msg), None),
            pickle.loads(gcm.decrypt(nonce, gcm_sealed, None)),
        ),
        "raftmq RaftConnection.frame (send: pickle + AES-256-GCM)": lambda: sender.frame(msg),
        "raftmq RaftConnection frame + parse: send + receive": raftmq_send_receive,
    }
    us = {name: round(timeit(fn, min_time) * 1e6, 1) for name, fn in steps.items()}
    return {
        "size": size,
        "data": data,
        "us_per_entry": us,
        "zlib_ratio": round(len(compressed) / len(pickled), 3),
        "wire_bytes_today": len(sealed),
        "wire_bytes_without_zlib": len(sealed_plain),
        "wire_bytes_gcm": len(gcm_sealed) + len(nonce),
        "wire_bytes_raftmq": len(frame),
    }


def followers_case(size: int, min_time: float) -> dict[str, Any]:
    """µs per new entry of ``size`` random bytes: the leader queueing it for two followers, and one
    follower parsing what it was sent (shared bodies where this tree has them)."""
    try:
        from raftmq.cluster.replication.shared_bodies import SharedBodies, handshake_key
    except ImportError:  # a tree before shared bodies: frames of their own
        SharedBodies = handshake_key = None  # type: ignore[assignment,misc]
    key = raft_key(os.urandom(32).hex())
    assert key is not None
    shared = SharedBodies(key) if SharedBodies is not None else None
    command = os.urandom(size)
    leaders, followers = [], []
    for _ in range(2):
        leader, follower = RaftConnection(None), RaftConnection(None)
        leader.raft_key = follower.raft_key = key
        rand = handshake_key(True) if handshake_key is not None else os.urandom(32)
        leader.sendRandKey = follower.recvRandKey = rand
        leader.shared_bodies = shared
        follower.shared_bodies = SharedBodies(key) if SharedBodies is not None else None
        leaders.append(leader)
        followers.append(follower)
    index = [1_000]

    def queue(conn: Any, msg: dict[str, Any]) -> list[Any]:
        frames = getattr(conn, "frames", None)
        return list(frames(msg)) if frames is not None else [conn.frame(msg)]

    def to_two_followers() -> list[list[Any]]:
        index[0] += 1
        entries = [(command, index[0], 7)]  # a new entry: nothing sealed for it yet
        return [queue(conn, {**message(b""), "entries": entries}) for conn in leaders]

    def parse_one() -> Any:
        sent = to_two_followers()[0]
        follower = followers[0]
        follower._TcpConnection__readBuffer = bytearray(b"".join(bytes(f) for f in sent))
        return follower._TcpConnection__processParseMessage()

    assert parse_one()["entries"][0][0] == command
    send_us = timeit(to_two_followers, min_time) * 1e6
    both_us = timeit(parse_one, min_time) * 1e6
    return {
        "size": size,
        "shared_bodies": shared is not None,
        "leader_us_two_followers": round(send_us, 1),
        "follower_parse_us": round(both_us - send_us, 1),  # parse_one sends to both first
    }


def buffer_case(backlog: int, min_time: float) -> dict[str, Any]:
    """µs per 1 KiB frame to append to and trim from a write buffer holding ``backlog`` bytes."""
    frame = os.urandom(1024 + 40)
    old = os.urandom(backlog)
    new = bytearray(old)

    def pysyncobj_bytes() -> None:
        nonlocal old
        old += frame
        old = old[len(frame) :]

    def raftmq_bytearray() -> None:
        new.extend(frame)
        del new[: len(frame)]

    return {
        "backlog_bytes": backlog,
        "us_per_frame": {
            "pysyncobj bytes buffer": round(timeit(pysyncobj_bytes, min_time) * 1e6, 2),
            "raftmq bytearray buffer": round(timeit(raftmq_bytearray, min_time) * 1e6, 2),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds per step and case")
    ap.add_argument("--followers", action="store_true", help="only the two-follower table")
    add_quiet_argument(ap)
    args = ap.parse_args()
    result = quiet_header("raft_entry", vars(args), args.wait_quiet)
    if args.followers:
        rows = [followers_case(size, args.min_time) for size in (1024, 16 << 10, 64 << 10, 256 << 10)]
        result["followers"] = rows
        print(f"\nbench_raft_entry --followers  commit {result['commit']}  shared {rows[0]['shared_bodies']}")
        heads = ["us per entry", *(f"{r['size'] // 1024} KiB" for r in rows)]
        print(
            table(
                [
                    ["leader: queue it for 2 followers", *(r["leader_us_two_followers"] for r in rows)],
                    ["a follower: parse it", *(r["follower_parse_us"] for r in rows)],
                ],
                heads,
            )
        )
        path = write_result("raft_entry_followers", result)
        print(f"\nwrote {path.relative_to(RESULTS.parent)}")
        return
    cases = [measure(size, data, args.min_time) for data in ("random", "letters") for size in SIZES]
    result["cases"] = cases
    buffers = [buffer_case(b, args.min_time) for b in (0, 64 << 10, 1 << 20, 8 << 20)]
    result["write_buffer"] = buffers
    result["loadavg_end"] = loadavg()
    names = list(cases[0]["us_per_entry"])
    rows = [[name, *(c["us_per_entry"][name] for c in cases)] for name in names]
    rows.append(["zlib output / input", *(c["zlib_ratio"] for c in cases)])
    rows.append(["wire bytes today", *(c["wire_bytes_today"] for c in cases)])
    rows.append(["wire bytes without zlib (Fernet)", *(c["wire_bytes_without_zlib"] for c in cases)])
    rows.append(["wire bytes AES-GCM", *(c["wire_bytes_gcm"] for c in cases)])
    rows.append(["wire bytes raftmq RaftConnection", *(c["wire_bytes_raftmq"] for c in cases)])
    heads = ["us per entry", *(f"{c['size'] // 1024}KiB {c['data']}" for c in cases)]
    print(
        f"\nbench_raft_entry  commit {result['commit']}  {result['date']}  loadavg {result['loadavg_start']}"
    )
    print(table(rows, heads))
    names = list(buffers[0]["us_per_frame"])
    rows = [[name, *(b["us_per_frame"][name] for b in buffers)] for name in names]
    print(
        table(rows, ["us per 1 KiB frame", *(f"backlog {b['backlog_bytes'] // 1024} KiB" for b in buffers)])
    )
    path = write_result("raft_entry", result)
    print(f"\nwrote {path.relative_to(RESULTS.parent)}")


if __name__ == "__main__":
    main()
