"""The constants of record-batch format v2 (docs/format.md is the byte-by-byte reference) and the
one error every reader raises.

All integers are little-endian. A batch is::

    stamped part (40 bytes, written by the leader; covered by header_crc, not by crc)
    covered header (header_size - 40 bytes; covered by crc)
    producer id, record table, header table, keys, header names, header values, values,
    delays, ttls (all covered by crc)

Invariant: ``crc`` covers bytes ``[CRC_START, batch_length)`` and nothing the leader writes, so
stamping a batch (:func:`raftmq.batch.stamp`) never touches a record and never recomputes it.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

from raftmq.errors import BadBatch

__all__ = [
    "ANY_QUEUE",
    "BATCH_MEDIA_TYPE",
    "CRC_START",
    "HEADER_ENTRY_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "MAGIC_V1",
    "RECORD_BINARY",
    "RECORD_DELAY",
    "RECORD_ENTRY_SIZE",
    "RECORD_KEY",
    "RECORD_TTL",
    "RESERVED_HEADER_PREFIX",
    "STAMP_SIZE",
    "BadBatch",
    "is_reserved_header",
]

MAGIC: Final = 2
"""The first byte of a v2 batch (a v1 value, ``storage/records.py``, starts with 1)."""
MAGIC_V1: Final = 1

BATCH_MEDIA_TYPE: Final = "application/vnd.raftmq.batch"
"""The HTTP ``Content-Type`` of a produce body and the ``Accept`` of a binary fetch."""

RESERVED_HEADER_PREFIX: Final = "raftmq-"
"""Header names starting with this, in any ASCII case, are the broker's own (``raftmq-dlq-*``,
``raftmq-redrive-group``): a node refuses them in a produced message (``reserved_header``)."""


def is_reserved_header(name: str) -> bool:
    """Whether ``name`` starts with :data:`RESERVED_HEADER_PREFIX`, ASCII letters compared without
    case (``Raftmq-X`` is reserved; a look-alike outside ASCII is not the broker's header)."""
    head = name[: len(RESERVED_HEADER_PREFIX)]
    return head.isascii() and head.lower() == RESERVED_HEADER_PREFIX


# -- the stamped part: magic u8 | 3 reserved | batch_length u32 | base_offset u64 |
#    append_time_ms u64 | raft_index u64 | header_crc u32 | crc u32
STAMPED: Final = struct.Struct("<B3xIQQQ")  # what header_crc covers: bytes [0, 32)
STAMP_SIZE: Final = 32
HEADER_CRC_AT: Final = 32
CRC_AT: Final = 36
CRC_START: Final = 40
STAMP_FIELDS: Final = struct.Struct("<QQQ")  # base_offset, append_time_ms, raft_index at byte 8
STAMP_FIELDS_AT: Final = 8

# -- the covered header, from byte 40 (see docs/format.md for each field)
COVERED: Final = struct.Struct("<HHBBHIIQQIIIIIB3x")
HEADER_SIZE: Final = CRC_START + COVERED.size  # 96: where the producer id starts
assert HEADER_SIZE == 96

U32: Final = struct.Struct("<I")

# -- one record table entry: attributes u8 | header_count u8 | reserved u16 | timestamp_delta u32 |
#    key_len u32 | value_len u32
RECORD_ENTRY: Final = struct.Struct("<BBHIII")
RECORD_ENTRY_SIZE: Final = RECORD_ENTRY.size  # 16
RECORD_BINARY: Final = 0x01
RECORD_KEY: Final = 0x02
RECORD_DELAY: Final = 0x04
RECORD_TTL: Final = 0x08
RECORD_KNOWN: Final = RECORD_BINARY | RECORD_KEY | RECORD_DELAY | RECORD_TTL

# -- one header table entry: name_len u32 | value_len u32
HEADER_ENTRY: Final = struct.Struct("<II")
HEADER_ENTRY_SIZE: Final = HEADER_ENTRY.size  # 8

ANY_QUEUE: Final = 0xFFFF_FFFF
"""A frame's queue field meaning "the node chooses the queue"."""
FRAME_PREFIX: Final = struct.Struct("<IB")  # queue u32 | topic_len u8, then the topic

MAX_U32: Final = 0xFFFF_FFFF
MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF


def record_dtype(stride: int) -> np.dtype[np.void]:
    """The numpy view of one record table entry; ``stride`` >= 16 (a later version may append
    fields to an entry: readers skip them)."""
    return np.dtype(
        {
            "names": ["attributes", "header_count", "reserved", "timestamp_delta", "key_len", "value_len"],
            "formats": ["u1", "u1", "<u2", "<u4", "<u4", "<u4"],
            "offsets": [0, 1, 2, 4, 8, 12],
            "itemsize": stride,
        }
    )


def header_dtype(stride: int) -> np.dtype[np.void]:
    """The numpy view of one header table entry; ``stride`` >= 8."""
    return np.dtype(
        {"names": ["name_len", "value_len"], "formats": ["<u4", "<u4"], "offsets": [0, 4], "itemsize": stride}
    )
