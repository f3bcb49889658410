"""Sealed segments: committed offset ranges of one queue as immutable Arrow IPC and Parquet files.

A segment holds the messages ``[base, end)`` of one queue as rows of ``columns.SCHEMA`` (Kafka's
columns; ``columns.py`` decodes stored batches into them). This module owns the files:

- :func:`segment_name`, :class:`SegmentFile`: a segment file's relative path and what it says.
- :class:`SegmentStore`: where segment files live (a local directory or any filesystem pyarrow
  reaches by URI). Files are written to a hidden temporary name and then renamed, so a crash in
  the middle leaves no half-visible segment (a local write is also fsynced before the rename).
  Every path is checked to stay under the store's root (:func:`checked_rel`).
- :func:`read_segment`: read one segment file (verifying its CRC32C) as record batches of a range.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import crc32c
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from raftmq.errors import RaftmqError

from .columns import BATCH_ROWS, SCHEMA
from .records import CorruptRecord

__all__ = [
    "SegmentFile",
    "SegmentStore",
    "UnsafePath",
    "WrittenSegment",
    "checked_rel",
    "read_segment",
    "segment_name",
    "verify_crc",
]

# -- segment files ------------------------------------------------------------------------------

_NAME = re.compile(
    r"^(?P<fmt>arrow|parquet)/(?P<topic>[A-Za-z0-9._-]+)\.(?P<topic_id>\d+)/"
    r"(?P<queue>\d+)-(?P<base>\d+)-(?P<end>\d+)\.(?P<node>[A-Za-z0-9_-]+)\.(?:arrow|parquet)$"
)


def segment_name(topic: str, topic_id: int, queue: int, base: int, end: int, node: str, fmt: str) -> str:
    """The relative path of a segment file: ``<fmt>/<topic>.<topic_id>/<queue>-<base>-<end>.<node>.<fmt>``
    (zero-padded numbers, so names sort in offset order; the Parquet files of a topic sit in one
    directory, which ``spark.read.parquet`` reads)."""
    return f"{fmt}/{topic}.{topic_id}/{queue:05d}-{base:020d}-{end:020d}.{node}.{fmt}"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """What a segment file's relative path says about it."""

    fmt: str
    topic: str
    topic_id: int
    queue: int
    base: int
    end: int
    node: str

    @classmethod
    def parse(cls, rel: str) -> SegmentFile | None:
        m = _NAME.match(rel)
        if m is None:
            return None
        return cls(
            m["fmt"],
            m["topic"],
            int(m["topic_id"]),
            int(m["queue"]),
            int(m["base"]),
            int(m["end"]),
            m["node"],
        )


@dataclass(frozen=True, slots=True)
class WrittenSegment:
    """A segment written by :meth:`SegmentStore.write`."""

    arrow: str  # relative paths
    parquet: str | None
    rows: int
    bytes: int  # size of the Arrow file
    crc32c: int  # of the whole Arrow file
    parquet_crc32c: int | None
    first_ts_ms: int
    last_ts_ms: int


_REL = re.compile(r"[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*")


class UnsafePath(RaftmqError, ValueError):
    """A segment path that could leave the segment store's root (``..``, absolute, odd characters)."""


def checked_rel(rel: str) -> str:
    """``rel`` if it is a path relative to a segment store's root that stays under it: parts of
    ``[A-Za-z0-9._-]`` joined by ``/``, none of them ``.`` or ``..``. Raises :class:`UnsafePath`."""
    if not _REL.fullmatch(rel) or any(part in (".", "..") for part in rel.split("/")):
        raise UnsafePath(f"not a segment path: {rel!r}")
    return rel


def verify_crc(data: Any, expected: int | None, what: str) -> None:
    """Raise CorruptRecord when ``data``'s CRC32C is not ``expected`` (None: not checked)."""
    if expected is not None and crc32c.crc32c(data) != expected:
        raise CorruptRecord(f"{what}: CRC32C mismatch (the file is damaged or not the sealed one)")


class Readable(Protocol):
    """A file open for reading (a local file, or pyarrow's)."""

    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class SegmentStore:
    """Where one node writes its segment files.

    Args:
        root: A local directory, or a URI pyarrow's filesystems understand (``file://``,
            ``s3://bucket/prefix``, ``gs://``, ``hdfs://``...).
    """

    def __init__(self, root: str) -> None:
        if "://" in root:
            self.fs, path = pafs.FileSystem.from_uri(root)
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
            self.base = path.rstrip("/")
        else:
            self.fs = pafs.LocalFileSystem()
            self.local = True
            self.base = os.path.abspath(root)
        self.root = root

    def location(self, rel: str) -> str:
        """Where a reader finds ``rel``: an absolute local path, or a URI."""
        if "://" in self.root:
            return self.root.rstrip("/") + "/" + checked_rel(rel)
        return self._path(rel)

    def _path(self, rel: str) -> str:
        """The full path of ``rel``. Every file operation goes through here, so no name, id or
        request value can reach outside the root: ``rel`` is checked, and a local path must not
        resolve (through a symlink) outside the root either. Raises :class:`UnsafePath`."""
        path = f"{self.base}/{checked_rel(rel)}"
        if self.local and not self._inside(path):
            raise UnsafePath(f"{rel!r} resolves outside the segment store {self.base}")
        return path

    def _inside(self, path: str) -> bool:
        root = os.path.realpath(str(self.base))
        return bool(os.path.commonpath([root, os.path.realpath(path)]) == root)

    def write(
        self, batches: Sequence[pa.RecordBatch], rel_arrow: str, rel_parquet: str | None
    ) -> WrittenSegment:
        """Write the segment files (temporary name, then rename) and return what to record.

        Raises:
            OSError: the store failed; nothing is visible under the final names then.
        """
        table = pa.Table.from_batches(list(batches), schema=SCHEMA)
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, SCHEMA) as writer:
            for b in table.to_batches(max_chunksize=BATCH_ROWS):
                writer.write_batch(b)
        arrow_buf = sink.getvalue()
        arrow_crc = int(crc32c.crc32c(arrow_buf))
        parquet_crc = None
        if rel_parquet is not None:
            psink = pa.BufferOutputStream()
            pq.write_table(table, psink, row_group_size=1 << 20, compression="snappy")
            parquet_buf = psink.getvalue()
            parquet_crc = int(crc32c.crc32c(parquet_buf))
            self._put(rel_parquet, parquet_buf)
        self._put(rel_arrow, arrow_buf)
        ts = table.column("timestamp")
        first_ts = ts[0].value // 1000 if table.num_rows else 0
        last_ts = ts[table.num_rows - 1].value // 1000 if table.num_rows else 0
        return WrittenSegment(
            rel_arrow, rel_parquet, table.num_rows, arrow_buf.size, arrow_crc, parquet_crc, first_ts, last_ts
        )

    def _put(self, rel: str, data: pa.Buffer) -> None:
        final = self._path(rel)
        parent, name = final.rsplit("/", 1)
        tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"  # hidden: Spark skips names starting with "."
        if self.local:
            os.makedirs(parent, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(memoryview(data))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
            dfd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            return
        self.fs.create_dir(parent, recursive=True)
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            self.fs.move(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            raise

    def open_file(self, rel: str) -> tuple[Readable, int]:
        """``rel`` open for reading (the caller closes it), and its size: a segment of up to
        ``max_bytes`` is sent part by part, never held whole for a client that reads slowly.
        Raises FileNotFoundError (or OSError) when it is not there."""
        if self.local:
            f = open(self._path(rel), "rb")  # noqa: SIM115 (closed by the caller)
            return f, os.fstat(f.fileno()).st_size
        remote = self.fs.open_input_file(self._path(rel))
        return remote, remote.size()

    def exists(self, rel: str) -> bool:
        return bool(self.fs.get_file_info(self._path(rel)).type == pafs.FileType.File)

    def delete(self, rel: str) -> bool:
        """Delete ``rel``; False if it was not there."""
        try:
            self.fs.delete_file(self._path(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            if not self.exists(rel):
                return False
            raise

    def list_files(self) -> Iterator[tuple[str, float, bool]]:
        """``(relative path, mtime in s since the epoch, is a leftover temporary file)`` of every
        file under the root (nothing if the root does not exist)."""
        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(self.base) + 1 :]
            if self.local and not self._inside(info.path):
                continue  # reached through a symlink to elsewhere: not this store's file
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            yield rel, mtime, info.base_name.startswith(".") and info.base_name.endswith(".tmp")


def read_segment(
    data: Any,
    start: int,
    end: int,
    base: int,
    expected_crc: int | None,
    what: str = "segment",
) -> Iterator[pa.RecordBatch]:
    """The rows ``[start, end)`` of the Arrow IPC segment file ``data`` (bytes, a pyarrow Buffer or
    a memory map) whose first row has offset ``base``, as record batches of :data:`SCHEMA`.

    Raises:
        CorruptRecord: the CRC32C differs from ``expected_crc``, or the file does not hold the
            offsets it should.
    """
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    verify_crc(buf, expected_crc, what)
    reader = ipc.open_file(buf)
    row = base
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        n = batch.num_rows
        if row + n <= start:
            row += n
            continue
        if row >= end:
            break
        lo, hi = max(start - row, 0), min(end - row, n)
        piece = batch if (lo, hi) == (0, n) else batch.slice(lo, hi - lo)
        if piece.num_rows and piece.column(4)[0].as_py() != row + lo:
            raise CorruptRecord(f"{what}: row {row + lo} holds offset {piece.column(4)[0].as_py()}")
        yield piece
        row += n
