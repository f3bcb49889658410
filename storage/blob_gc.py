"""When and in which pieces ``RocksStore.compact_range`` collects blob garbage (storage/rocks.py):
the values of deleted keys stay in their blob files until every value of a file is deleted, and
with the messages of every queue in each file, retention on some queues leaves every file partly
garbage. Once garbage is half the blob files' bytes, the store's live values are moved into new
files, one key range of about :data:`PIECE_BYTES` of them per call, so that no compaction rewrites
a large store at once (it would hold a compaction slot and the disk for minutes).

Where the next piece starts is kept in the store's own directory (:data:`CURSOR_FILE`), so that a
restart goes on from there (the node calls the store again when its replica starts) instead of
rewriting the pieces already done again; it goes with the
database (a checkpoint does not copy it, a restore replaces the directory). Any key is a valid
start, so a lost or stale cursor costs rewrites, never data: it is written without an fsync.

No rocksdict here: the database is typed by what these functions read of it (:class:`BlobDb`).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Protocol

__all__ = [
    "CURSOR_FILE",
    "GARBAGE_SHARE",
    "PIECE_BYTES",
    "BlobDb",
    "garbage_due",
    "piece",
    "read_cursor",
    "write_cursor",
]

# Collect once garbage is at least this share of the blob files' bytes: each byte rewritten pays
# for at least one byte freed, and the blob files never take more than twice their live values for long.
GARBAGE_SHARE = 0.5
# A piece holds about this many bytes of blob values (live and garbage): its compaction stays
# bounded at any store size, and a close waits for at most one of them.
PIECE_BYTES = 256 << 20
BLOB_SIZE = "rocksdb.live-blob-file-size"
BLOB_GARBAGE = "rocksdb.live-blob-file-garbage-size"
# In the store's directory: the hex of the next piece's start (RocksDB leaves files of names it
# does not use alone). Absent: no collection under way.
CURSOR_FILE = "RAFTMQ-BLOB-GC"


class BlobDb(Protocol):
    """What these functions read of rocksdict's ``Rdict``."""

    def property_int_value(self, name: str) -> int | None: ...
    def live_files(self) -> list[dict[str, Any]]: ...


def garbage_due(db: BlobDb) -> bool:
    """Whether the blob files' garbage is worth a collection."""
    garbage = int(db.property_int_value(BLOB_GARBAGE) or 0)
    return garbage > 0 and garbage >= GARBAGE_SHARE * int(db.property_int_value(BLOB_SIZE) or 0)


def piece(db: BlobDb, start: bytes) -> tuple[bytes | None, bytes | None]:
    """The piece of a collection from ``start``: as many SST files of the largest level as hold
    about :data:`PIECE_BYTES` of blob values (a key's share of them is about the same in every
    file). Returns the piece's last key (RocksDB's compaction ends are inclusive) and the next
    piece's start; (None, None) for the rest of the store."""
    files = db.live_files()
    levels: dict[int, int] = {}
    for f in files:
        levels[f["level"]] = levels.get(f["level"], 0) + int(f["size"])
    level = max(levels, key=lambda n: levels[n], default=0)
    if level == 0:
        return None, None  # level 0's files overlap: nothing to cut at (a small store, one piece)
    # Past level 0 a level's files hold disjoint key ranges, so sorted by start they are in order.
    ahead = sorted(
        (f for f in files if f["level"] == level and f["end_key"] >= start), key=lambda f: f["start_key"]
    )
    blob_bytes = int(db.property_int_value(BLOB_SIZE) or 0)
    share = PIECE_BYTES / blob_bytes if blob_bytes else 1.0
    count = max(1, math.ceil(share * sum(1 for f in files if f["level"] == level)))
    if count >= len(ahead):
        return None, None
    last = bytes(ahead[count - 1]["end_key"])
    # The next piece starts just past this one's last key, not at the next file's first key: files
    # of other levels between the two would be in neither piece.
    return last, last + b"\x00"


def read_cursor(store_dir: str) -> bytes | None:
    """Where the collection under way in the store at ``store_dir`` goes on (b"": from the start);
    None when none is (no file, or one that does not read as a key ending in its newline, such as
    an empty file a power loss left: the next due collection starts anew)."""
    try:
        with open(os.path.join(store_dir, CURSOR_FILE), encoding="ascii") as f:
            text = f.read()
        return bytes.fromhex(text[:-1]) if text.endswith("\n") else None
    except (OSError, ValueError):
        return None


def write_cursor(store_dir: str, cursor: bytes | None) -> None:
    """Keep ``cursor`` (None: the collection is done) for the store at ``store_dir``, replaced whole
    (a new file renamed over the old one). A failure (a full disk) is passed over: a cursor not kept
    costs rewrites only."""
    path = os.path.join(store_dir, CURSOR_FILE)
    try:
        if cursor is None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            return
        with open(path + ".tmp", "w", encoding="ascii") as f:
            f.write(cursor.hex() + "\n")  # the newline: the file was written whole
        os.replace(path + ".tmp", path)
    except OSError:
        pass
