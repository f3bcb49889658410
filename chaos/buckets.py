"""Records spread over files on disk by a hash of their key, read back one file (bucket) at a time:
how the streamed checkers (``streaming``, ``streaming_log``) keep their memory bounded by a bucket
whatever a run's length. Every record with the same key lands in the same bucket, so a check whose
every part depends on one key judges each bucket alone, and the buckets' verdicts add up."""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

__all__ = ["BUCKET_BYTES", "HELD_BYTES", "SAMPLE", "Buckets", "bucket_count", "first_examples"]

SAMPLE = 20  # how many examples a verdict lists of each kind of problem (as the checkers)
# History bytes per bucket: a bucket's records then take about 100 MiB in memory (a proof run:
# 64 MiB of history took some 300 MiB).
BUCKET_BYTES = 16 << 20
# Records held before they are written to their buckets, all buckets together.
HELD_BYTES = 8 << 20
_LINE = orjson.OPT_APPEND_NEWLINE


class Buckets:
    """Records (JSON arrays) spread over ``count`` files by a hash of a key, read back one file at
    a time. What is written waits in memory until ``HELD_BYTES`` of it are held in all, then goes to
    the files (each opened to append, then closed): the write buffers stay bounded however many
    buckets there are. The files are the caller's to remove (they live in its temporary directory)."""

    def __init__(self, directory: Path, name: str, count: int) -> None:
        self.paths = [directory / f"{name}-{i}.jsonl" for i in range(count)]
        self._pending = [bytearray() for _ in range(count)]
        self._held = 0
        self._limit = HELD_BYTES
        self.largest = 0  # the most records one bucket held, once read

    def add(self, key: str, record: list[Any]) -> None:
        line = orjson.dumps(record, option=_LINE)
        self._pending[zlib.crc32(key.encode()) % len(self._pending)] += line
        self._held += len(line)
        if self._held >= self._limit:
            self.close()

    def close(self) -> None:
        """Write out what is held (the buckets may be read once it is)."""
        for path, pending in zip(self.paths, self._pending, strict=True):
            if pending:
                with open(path, "ab") as f:
                    f.write(pending)
                pending.clear()
        self._held = 0

    def read(self, i: int) -> list[list[Any]]:
        if not self.paths[i].exists():
            return []
        with open(self.paths[i], "rb") as f:
            records = [orjson.loads(line) for line in f]
        self.largest = max(self.largest, len(records))
        return records


def bucket_count(path: Path, bucket_bytes: int) -> int:
    """One bucket per ``bucket_bytes`` of the history in ``path``: a bucket holds about as much
    whatever the history's length."""
    return max(1, math.ceil(path.stat().st_size / bucket_bytes))


def first_examples(values: Iterable[Any], key: Any = str) -> list[Any]:
    """The first ``SAMPLE`` by ``key`` (by default ``str``, the checkers' order of examples)."""
    return heapq.nsmallest(SAMPLE, values, key=key)
