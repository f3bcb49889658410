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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["INVOKE", "NEMESIS", "History", "Op", "load_history"]

Op = dict[str, Any]
INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
NEMESIS = "nemesis"


class History:
    """An append-only history, written through to ``path`` (JSON lines) as it grows.

    Safe to append to from several threads (the nemesis runs docker calls in threads). Another
    process (the production load's, ``load``) keeps its own history on the same clock (``t0_ns``:
    the monotonic clock is the machine's) with its own process ids (from ``first_process``), and
    without ``keep`` only in its file; :meth:`merge` takes its operations in by time.
    """

    def __init__(
        self, path: Path | None = None, *, t0_ns: int | None = None, first_process: int = 0, keep: bool = True
    ) -> None:
        self.ops: list[Op] = []
        self.path = path
        self._keep = keep
        self._lock = threading.Lock()
        self._t0 = time.monotonic_ns() if t0_ns is None else t0_ns
        self._file: IO[bytes] | None = open(path, "wb") if path else None  # noqa: SIM115
        self._next_process = first_process
        self._count = 0

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
            return op

    def merge(self, ops: Iterable[Op]) -> int:
        """Take in another history's operations: every operation in time order (a stable sort, so
        each history keeps its own order), indexes renumbered, the file written again. Returns
        how many were added."""
        with self._lock:
            added = list(ops)
            merged = sorted([*self.ops, *added], key=lambda op: op["time"])
            for i, op in enumerate(merged):
                op["index"] = i
            self.ops = merged
            self._count = len(merged)
            if self._file is not None and self.path is not None:
                self._file.close()
                self._file = open(self.path, "wb")  # noqa: SIM115
                for op in merged:
                    self._file.write(orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE))
            return len(added)

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


def load_history(path: Path) -> list[Op]:
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]


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
