"""One replica of one queue group for ``bench_core.py``: RocksStores + QueueGroupMachine + RaftGroup.

Not a test and not a node: no HTTP, no metadata group. ``bench_core.py`` starts three of these
processes and drives them over a line protocol (one JSON object per line):

- requests arrive on stdin;
- replies go to the process's *original* stdout (fd 1 is then pointed at stderr so that any
  logging or stray print cannot corrupt the protocol).

Requests (``op``): ``status``, ``latency``, ``throughput``, ``groupcommit``, ``quit``. The load runs
INSIDE this process (the replica that is leader), so it measures the replicated core: submit ->
journal (+fsync) -> pickle/zlib/Fernet -> TCP -> followers (journal + fsync + ack) -> commit ->
apply (decode + encode + RocksDB write) -> callback. Nothing else.

Experiments: ``--pso KEY=VALUE`` overrides a pysyncobj ``SyncObjConf`` argument that RaftGroup sets
(e.g. ``appendEntriesUseBatch=1``, ``password=none``) by wrapping the constructor in this process
only; cluster/replication/raft.py is not changed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from typing import Any

import orjson

# -- the protocol channel: keep the real stdout for replies, send everything else to stderr -------
_PROTO = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
sys.stdout = sys.stderr

import raftmq.cluster.replication.raft as raft_mod  # noqa: E402
from raftmq.cluster import commands  # noqa: E402
from raftmq.cluster.base.errors import ProduceFailed  # noqa: E402
from raftmq.cluster.machines.queue_group import QueueGroupMachine  # noqa: E402
from raftmq.cluster.replication.group_commit import GroupCommitter  # noqa: E402
from raftmq.cluster.replication.raft import Outcome, RaftGroup, RaftSettings  # noqa: E402
from raftmq.storage.rocks import RocksStore  # noqa: E402

SECRET = "bench-secret-0123456789abcdef"
MSG_BYTES = 100
BATCH_MESSAGES = 100
TOPIC_ID = 1


def reply(obj: dict[str, Any]) -> None:
    _PROTO.write(orjson.dumps(obj) + b"\n")


def one_batch(queue: int) -> dict[str, Any]:
    """One 100-message produce batch of 100-byte values (the same dict shape the HTTP layer makes)."""
    return {"topic_id": TOPIC_ID, "queue": queue, "messages": [{"value": "x" * MSG_BYTES}] * BATCH_MESSAGES}


# The node's GroupCommitter sizes a request as sum(message size + 32) (api.app.produce).
BATCH_SIZE_ESTIMATE = BATCH_MESSAGES * (MSG_BYTES + 32)


def batches_per_entry(max_entry_bytes: int) -> int:
    """How many 100-message batches the node's GroupCommitter puts in one entry of this size."""
    return max(1, max_entry_bytes // BATCH_SIZE_ESTIMATE)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


class Replica:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        ports = [int(p) for p in args.ports.split(",")]
        addrs = [f"127.0.0.1:{p}" for p in ports]
        base = os.path.join(args.dir, f"r{args.index}")
        os.makedirs(base, exist_ok=True)
        self.state_store = RocksStore.open(os.path.join(base, "state"))
        self.journal_store = RocksStore.open(os.path.join(base, "raft"))
        self.machine = QueueGroupMachine(self.state_store, 0)
        settings = RaftSettings(
            password=SECRET,
            fsync=args.durability == "fsync",
            heartbeat_s=args.heartbeat_ms / 1000,
            tick_s=args.tick_ms / 1000,
        )
        self.group = RaftGroup(
            name="0",
            node_id=f"r{args.index}",
            self_addr=addrs[args.index],
            peer_addrs=addrs,
            journal_store=self.journal_store,
            machine=self.machine,
            snapshot_file=os.path.join(base, "snapshot", "manifest.json"),
            settings=settings,
        )

    # -- requests ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        s = self.group.status()
        return {
            "is_leader": s.is_leader,
            "leader": s.leader,
            "term": s.term,
            "commit_index": s.commit_index,
            "applied_index": s.applied_index,
            "journal_entries": s.journal_entries,
            "pid": os.getpid(),
        }

    def _command(self, n_batches: int, seq: int) -> bytes:
        queues = self.args.queues
        return commands.produce(
            time.time_ns() // 1_000_000, [one_batch((seq + i) % queues) for i in range(n_batches)]
        )

    def latency(self, samples: int, n_batches: int) -> dict[str, Any]:
        """One command in flight at a time; latency from submit() to on_done (on the tick thread)."""
        lat: list[float] = []
        errors: dict[str, int] = {}
        done = threading.Event()
        box: list[Any] = [None, 0.0]

        def on_done(outcome: Outcome) -> None:
            box[0], box[1] = outcome, time.perf_counter()
            done.set()

        for i in range(samples):
            cmd = self._command(n_batches, i)
            done.clear()
            t0 = time.perf_counter()
            self.group.submit(cmd, on_done)
            if not done.wait(10):
                errors["timeout"] = errors.get("timeout", 0) + 1
                continue
            err = _outcome_error(box[0])
            if err:
                errors[err] = errors.get(err, 0) + 1
            else:
                lat.append(box[1] - t0)
            if self.args.latency_gap_ms:
                time.sleep(self.args.latency_gap_ms / 1000)
        lat.sort()
        return {
            "samples": len(lat),
            "errors": errors,
            "p50_ms": percentile(lat, 50) * 1e3,
            "p90_ms": percentile(lat, 90) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
            "max_ms": (lat[-1] if lat else float("nan")) * 1e3,
            "mean_ms": (sum(lat) / len(lat) if lat else float("nan")) * 1e3,
        }

    def throughput(self, inflight: int, n_batches: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
        """Closed loop: ``inflight`` commands outstanding, each of ``n_batches`` 100-message batches.
        Counts commands whose on_done arrived inside [warm-up end, warm-up end + duration]."""
        sem = threading.Semaphore(inflight)
        lock = threading.Lock()
        stats = {"entries": 0, "messages": 0, "errors": {}}
        lat: list[float] = []
        t_start = time.perf_counter()
        t_measure = t_start + warmup_s
        t_end = t_measure + duration_s
        per_cmd = n_batches * BATCH_MESSAGES
        cmd_bytes = len(self._command(n_batches, 0))
        commit_start = [0]

        def make_cb(t0: float) -> Any:
            def on_done(outcome: Outcome) -> None:
                now = time.perf_counter()
                err = _outcome_error(outcome)
                if t_measure <= now <= t_end:
                    with lock:
                        if err:
                            errs = stats["errors"]
                            errs[err] = errs.get(err, 0) + 1  # type: ignore[index,union-attr]
                        else:
                            stats["entries"] += 1  # type: ignore[operator]
                            stats["messages"] += per_cmd  # type: ignore[operator]
                            lat.append(now - t0)
                sem.release()

            return on_done

        seq = 0
        measuring = False
        while True:
            if not sem.acquire(timeout=10):
                break  # stuck: report what we have
            now = time.perf_counter()
            if now >= t_end:
                sem.release()
                break
            if not measuring and now >= t_measure:
                measuring = True
                commit_start[0] = self.group.status().commit_index
            cmd = self._command(n_batches, seq)
            seq += n_batches
            self.group.submit(cmd, make_cb(time.perf_counter()))
        # let the outstanding ones drain (they are not counted)
        for _ in range(inflight):
            sem.acquire(timeout=10)
        lat.sort()
        return {
            "inflight": inflight,
            "batches_per_entry": n_batches,
            "entry_bytes": cmd_bytes,
            "duration_s": duration_s,
            "entries": stats["entries"],
            "messages": stats["messages"],
            "msgs_per_s": stats["messages"] / duration_s,  # type: ignore[operator]
            "entries_per_s": stats["entries"] / duration_s,  # type: ignore[operator]
            "mb_per_s": stats["messages"] * MSG_BYTES / duration_s / 1e6,  # type: ignore[operator]
            "errors": stats["errors"],
            "entry_p50_ms": percentile(lat, 50) * 1e3,
            "entry_p99_ms": percentile(lat, 99) * 1e3,
        }

    def groupcommit(
        self, producers: int, max_inflight: int, max_entry_bytes: int, warmup_s: float, duration_s: float
    ) -> dict[str, Any]:
        """The node's own GroupCommitter on an asyncio loop, fed by ``producers`` concurrent
        producers each awaiting one 100-message batch at a time (what HTTP handlers do)."""

        async def run() -> dict[str, Any]:
            loop = asyncio.get_running_loop()
            committer = GroupCommitter(
                self.group,
                loop,
                now_ms=lambda: time.time_ns() // 1_000_000,
                max_entry_bytes=max_entry_bytes,
                max_inflight=max_inflight,
            )
            # count entries proposed (to report the coalescing that happened)
            proposed = {"entries": 0, "batches": 0}
            original = committer._propose

            def counting_propose(requests: list[Any]) -> None:
                if requests:
                    proposed["entries"] += 1
                    proposed["batches"] += sum(len(r.batches) for r in requests)
                original(requests)

            committer._propose = counting_propose  # type: ignore[method-assign]
            t_start = loop.time()
            t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
            counts = {"messages": 0, "errors": 0}
            lat: list[float] = []
            snap: dict[str, int] = {}

            async def producer(p: int) -> None:
                q = p % self.args.queues
                while loop.time() < t_end:
                    t0 = loop.time()
                    try:
                        await committer.produce([one_batch(q)], BATCH_SIZE_ESTIMATE)
                        ok = True
                    except ProduceFailed:
                        ok = False
                    t1 = loop.time()
                    if t_measure <= t1 <= t_end:
                        if ok:
                            counts["messages"] += BATCH_MESSAGES
                            lat.append(t1 - t0)
                        else:
                            counts["errors"] += 1

            async def marker() -> None:
                await asyncio.sleep(max(0.0, t_measure - loop.time()))
                snap.update(proposed)
                await asyncio.sleep(max(0.0, t_end - loop.time()))
                snap["entries_end"], snap["batches_end"] = proposed["entries"], proposed["batches"]

            await asyncio.gather(marker(), *(producer(p) for p in range(producers)))
            lat.sort()
            entries = snap["entries_end"] - snap["entries"]
            batches = snap["batches_end"] - snap["batches"]
            return {
                "producers": producers,
                "max_inflight": max_inflight,
                "max_entry_bytes": max_entry_bytes,
                "duration_s": duration_s,
                "messages": counts["messages"],
                "msgs_per_s": counts["messages"] / duration_s,
                "errors": counts["errors"],
                "entries_per_s": entries / duration_s,
                "avg_batches_per_entry": batches / entries if entries else 0.0,
                "request_p50_ms": percentile(lat, 50) * 1e3,
                "request_p99_ms": percentile(lat, 99) * 1e3,
            }

        return asyncio.run(run())


def _outcome_error(outcome: Outcome | None) -> str | None:
    if outcome is None:
        return "none"
    if outcome.error is not None:
        return str(outcome.error)
    result = outcome.result
    if not isinstance(result, dict) or "results" not in result:
        return "rejected"
    return None


def _install_pso_overrides(pairs: list[str]) -> dict[str, Any]:
    """Wrap SyncObjConf in cluster/replication/raft.py's namespace (this process only) to override
    settings."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        value: Any
        if raw.lower() in ("none", "null"):
            value = None
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        overrides[key] = value
    if overrides:
        original = raft_mod.SyncObjConf

        def patched(**kwargs: Any) -> Any:
            kwargs.update(overrides)
            return original(**kwargs)

        raft_mod.SyncObjConf = patched  # type: ignore[misc,assignment]
    return overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--ports", required=True, help="three comma-separated Raft ports")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    ap.add_argument("--heartbeat-ms", type=float, default=50)
    ap.add_argument("--tick-ms", type=float, default=50)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--latency-gap-ms", type=float, default=0)
    ap.add_argument("--pso", action="append", default=[], help="SyncObjConf override KEY=VALUE")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        import structlog

        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
    except Exception:  # pragma: no cover - logging setup is best effort
        pass
    overrides = _install_pso_overrides(args.pso)
    replica = Replica(args)
    reply({"ready": True, "pid": os.getpid(), "overrides": overrides})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = orjson.loads(line)
        op = req.get("op")
        try:
            if op == "status":
                reply({"ok": True, **replica.status()})
            elif op == "latency":
                reply({"ok": True, **replica.latency(req["samples"], req.get("batches", 1))})
            elif op == "throughput":
                reply(
                    {
                        "ok": True,
                        **replica.throughput(
                            req["inflight"], req["batches"], req["warmup_s"], req["duration_s"]
                        ),
                    }
                )
            elif op == "groupcommit":
                reply(
                    {
                        "ok": True,
                        **replica.groupcommit(
                            req["producers"],
                            req["max_inflight"],
                            req["max_entry_bytes"],
                            req["warmup_s"],
                            req["duration_s"],
                        ),
                    }
                )
            elif op == "quit":
                reply({"ok": True})
                break
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:  # report, keep serving
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    replica.group.destroy()
    replica.state_store.close()
    replica.journal_store.close()


if __name__ == "__main__":
    main()
