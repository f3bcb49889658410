"""A tar archive of files on disk, produced chunk by chunk (no archive written anywhere first).

A peer installing a snapshot downloads a checkpoint of a group's whole state: gigabytes once a
node holds a large backlog. Written to a tar file first, the archive cost one more copy of every
byte on the sender's disk and sent nothing until it was complete, so a download whose peer waited
longer than its timeout for the first byte failed, and the next attempt began a new archive
(docs/architecture.md, "Snapshots are manifests; state moves out of band"). Here each file's
header and bytes are yielded as they are read, in chunks of about ``chunk_bytes``.

The archive is what ``tarfile`` reads (POSIX pax headers): directories and regular files only,
mode 0644/0755, no owner, each file read exactly at the size it had when its header was written
(a file that changes size meanwhile raises: a checkpoint's files never change).
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator, Sequence

__all__ = ["tar_chunks"]

_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # 10240: an archive's length is a multiple of it


def _header(arcname: str, st: os.stat_result, is_dir: bool) -> bytes:
    info = tarfile.TarInfo(arcname)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir else 0o644
    info.size = 0 if is_dir else st.st_size
    info.mtime = int(st.st_mtime)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _members(path: str, arcname: str) -> Iterator[tuple[str, str, os.stat_result, bool]]:
    """``path`` (a file or a directory, walked in name order) as (path, arcname, stat, is_dir).
    Anything else (a link, a FIFO, a device) raises: a checkpoint holds none."""
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        yield path, arcname, st, False
        return
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is neither a regular file nor a directory: not archived")
    yield path, arcname, st, True
    for name in sorted(os.listdir(path)):
        yield from _members(os.path.join(path, name), f"{arcname}/{name}")


def _file_bytes(path: str, size: int, chunk_bytes: int) -> Iterator[bytes]:
    left = size
    with open(path, "rb") as f:
        while left:
            data = f.read(min(chunk_bytes, left))
            if not data:
                raise OSError(f"{path} ended {left} bytes before its size {size} while archived")
            left -= len(data)
            yield data
        if f.read(1):
            raise OSError(f"{path} grew past its size {size} while archived")


def tar_chunks(entries: Sequence[tuple[str, str]], chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The tar archive of ``entries`` (``(path on disk, name in the archive)``; a directory with
    everything under it), in chunks of about ``chunk_bytes`` (a file's last piece and the headers
    go with the next chunk)."""
    pending = bytearray()
    total = 0
    for path, arcname in entries:
        for member, name, st, is_dir in _members(path, arcname):
            pending += _header(name, st, is_dir)
            if is_dir:
                continue
            for data in _file_bytes(member, st.st_size, chunk_bytes):
                pending += data
                if len(pending) >= chunk_bytes:
                    total += len(pending)
                    yield bytes(pending)
                    pending.clear()
            pending += bytes(-st.st_size % _BLOCK)
    pending += bytes(2 * _BLOCK)  # the end of the archive
    pending += bytes(-(total + len(pending)) % _RECORD)
    yield bytes(pending)
