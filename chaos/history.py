"""The history of a run: every client and nemesis operation, in the order it happened.

One operation is one JSON object (one line of ``history.jsonl``)::

    {"index": 12, "time": 1532000000, "type": "invoke", "process": 3, "f": "enqueue",
     "node": "n2", "queue": 1, "value": "3-17"}
    {"index": 13, "time": 1547000000, "type": "ok", "process": 3, "f": "enqueue",
     "node": "n2", "queue": 1, "value": "3-17", "offset": 41}

- ``time``: nanoseconds since the run started, from the monotonic clock.
- ``type``: ``invoke``, then one of ``ok`` (it happened), ``fail`` (it certainly did not happen) or
  ``info`` (unknown: a timeout, a reset connection, an error with ``definite: false``). A process
  that saw ``info`` never invokes again: its worker carries on under a new process id.
- ``f``: ``enqueue`` (produce one message), ``fetch`` (a consumer reads a queue by offset),
  ``drain`` (the final reads after healing), ``read`` (a replica's own copy, ``read_from=local``).
  ``fetch``, ``drain`` and ``read`` complete with ``messages``: ``[[offset, value], ...]``.
- The nemesis is process ``"nemesis"``; its operations have type ``info`` and ``f`` ``start`` or
  ``stop``, with ``fault`` (the nemesis' name), ``fault_id`` (pairs a start with its stop) and
  ``value`` (what it did: nodes, grudges, offsets).
- ``error``: the broker's error code (``not_leader``, ``timeout``, ...) or a transport one
  (``connect_failed``, ``connection_reset``, ``client_timeout``, ``node_down``).

A run's history lives on disk, not in memory (``History(keep=False)``): a soak at production load
records tens of millions of operations. :class:`HistoryFile` reads it back one operation at a time
(each iteration reads the file again), and the checkers that need every message stream over it
(``streaming``).

Invariant: a history file is in time order. ``time`` is taken under the history's lock as each
operation is written, so each file is; :meth:`History.merge_files` keeps it so.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["INVOKE", "NEMESIS", "History", "HistoryFile", "Op", "completed", "load_history", "nemesis_ops"]

Op = dict[str, Any]
INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
NEMESIS = "nemesis"
# The file is written through a buffer of this size and flushed at least every FLUSH_NS: a harness
# that dies keeps all but its last second, and the event loop makes no system call per operation.
WRITE_BUFFER_BYTES = 1 << 20
FLUSH_NS = 1_000_000_000


class History:
    """An append-only history, written through to ``path`` (JSON lines) as it grows.

    Safe to append to from several threads (the nemesis runs docker calls in threads). Another
    process (the production load's, ``load``) keeps its own history on the same clock (``t0_ns``:
    the monotonic clock is the machine's) with its own process ids (from ``first_process``);
    :meth:`merge_files` takes its operations in by time. Without ``keep`` the operations are only
    in the file (``ops`` stays empty): read them back with :class:`HistoryFile`.
    """

    def __init__(
        self, path: Path | None = None, *, t0_ns: int | None = None, first_process: int = 0, keep: bool = True
    ) -> None:
        self.ops: list[Op] = []
        self.path = path
        self._keep = keep
        self._lock = threading.Lock()
        self._t0 = time.monotonic_ns() if t0_ns is None else t0_ns
        self._file: IO[bytes] | None = open(path, "wb", buffering=WRITE_BUFFER_BYTES) if path else None  # noqa: SIM115
        self._next_process = first_process
        self._count = 0
        self._flushed_ns = 0

    @property
    def t0_ns(self) -> int:
        return self._t0

    def now_ns(self) -> int:
        return time.monotonic_ns() - self._t0

    def new_process(self) -> int:
        with self._lock:
            self._next_process += 1
            return self._next_process

    def append(self, **fields: Any) -> Op:
        with self._lock:
            op: Op = {"index": self._count, "time": self.now_ns(), **fields}
            self._count += 1
            if self._keep:
                self.ops.append(op)
            if self._file is not None:
                self._file.write(orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE))
                if op["time"] - self._flushed_ns >= FLUSH_NS:
                    self._file.flush()
                    self._flushed_ns = op["time"]
            return op

    def merge_files(self, paths: Sequence[Path]) -> int:
        """Take in other histories' files (each in time order): the file is rewritten with every
        operation in time order (ties keep this history's operations first, then the files' in the
        order given, each file's in its own order), indexes renumbered; one operation at a time in
        memory. Returns how many were added. Needs a file; later appends go on after the merge."""
        if self.path is None or self._file is None:
            raise ValueError("merge_files needs a history with a file")
        with self._lock:
            self._file.close()
            merged_path = self.path.with_name(self.path.name + ".merging")
            added = 0
            with open(merged_path, "wb", buffering=WRITE_BUFFER_BYTES) as out:
                sources = [HistoryFile(self.path), *(HistoryFile(p) for p in paths)]
                tagged = [_tagged(n, src) for n, src in enumerate(sources)]
                index = 0
                for _, source, op in heapq.merge(*tagged, key=lambda t: (t[0], t[1])):
                    added += source > 0
                    op["index"] = index
                    index += 1
                    out.write(orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE))
            os.replace(merged_path, self.path)
            self._count = index
            self._file = open(self.path, "ab", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115
            if self._keep:
                self.ops = load_history(self.path)
            return added

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __iter__(self) -> Iterator[Op]:
        return iter(list(self.ops))

    def __len__(self) -> int:
        return len(self.ops)


def _tagged(source: int, ops: Iterable[Op]) -> Iterator[tuple[int, int, Op]]:
    for op in ops:
        yield op["time"], source, op


class HistoryFile:
    """A history on disk, read one operation at a time: each iteration reads the file again, so a
    checker may walk it several times and hold only what it keeps itself."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __iter__(self) -> Iterator[Op]:
        with open(self.path, "rb", buffering=WRITE_BUFFER_BYTES) as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)

    def size_bytes(self) -> int:
        return self.path.stat().st_size


def load_history(path: Path) -> list[Op]:
    """The whole history in memory (small histories: tests, one look at a short run)."""
    return list(HistoryFile(path))


def completions(history: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """(invoke, completion) pairs of client operations, in invoke order. A process whose last
    invoke never completed (the run ended) yields ``None`` as its completion."""
    pending: dict[Any, Op] = {}
    pairs: list[tuple[Op, Op | None]] = []
    slots: dict[int, int] = {}
    for op in history:
        if op.get("process") == NEMESIS:
            continue
        if op["type"] == INVOKE:
            pending[op["process"]] = op
            slots[op["index"]] = len(pairs)
            pairs.append((op, None))
        else:
            inv = pending.pop(op["process"], None)
            if inv is not None:
                pairs[slots[inv["index"]]] = (inv, op)
    return iter(pairs)


def completed(history: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """The pairs of :func:`completions` as each completes (then those that never did), holding only
    the operations in flight: for counting and plotting, where the order does not matter."""
    pending: dict[Any, Op] = {}
    for op in history:
        if op.get("process") == NEMESIS:
            continue
        if op["type"] == INVOKE:
            earlier = pending.pop(op["process"], None)
            if earlier is not None:  # invoked again without completing: never will
                yield earlier, None
            pending[op["process"]] = op
        else:
            inv = pending.pop(op["process"], None)
            if inv is not None:
                yield inv, op
    for inv in pending.values():
        yield inv, None


def nemesis_ops(history: Iterable[Op]) -> tuple[list[Op], int]:
    """The nemesis' operations (a few hundred in a long run) and the last operation's time, in one
    walk."""
    end = 0
    ops: list[Op] = []
    for op in history:
        end = max(end, op["time"])
        if op.get("process") == NEMESIS:
            ops.append(op)
    return ops, end


def fault_windows(history: Iterable[Op]) -> list[tuple[str, int, int | None]]:
    """(fault, start ns, stop ns or None if never stopped) for every nemesis fault, by start time."""
    starts: dict[Any, Op] = {}
    windows: list[tuple[str, int, int | None]] = []
    index: dict[Any, int] = {}
    for op in history:
        if op.get("process") != NEMESIS:
            continue
        if op["f"] == "start":
            starts[op["fault_id"]] = op
            index[op["fault_id"]] = len(windows)
            windows.append((op["fault"], op["time"], None))
        elif op["f"] == "stop" and op.get("fault_id") in starts:
            start = starts.pop(op["fault_id"])
            windows[index[op["fault_id"]]] = (start["fault"], start["time"], op["time"])
    return windows
