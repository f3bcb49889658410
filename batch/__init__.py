"""raftmq's record-batch format v2: one binary unit from the producer to disk to the consumer.

The same bytes are the produce request's body (in frames), the Raft command's payload, the
stored value and the binary fetch answer. docs/format.md describes every byte; this package is
the only code that reads or writes them. It is pure (stdlib, crc32c, numpy; pyarrow only in
:meth:`Columns.to_arrow`) and imports nothing else of raftmq.

- Client: :class:`BatchBuilder` -> ``bytes``; :func:`frame_prefix` / :func:`join_frames`.
- Node: :func:`split_frames`, then :func:`validate` (vectorised: no per-message Python work but
  for records with a delay or TTL, :meth:`BatchView.timing`), then :func:`stamp` at apply.
- Readers: :func:`read` (:func:`read_stored`: a value this node stored, its records' contents
  not checked again, their lengths against their sections are) and :meth:`BatchView.records`
  (lazy), :func:`columns` (Arrow), :func:`read_v1` / :func:`v1_to_v2` for values stored before v2.

Every malformed input raises :class:`BadBatch` (code ``bad_batch``), never anything else; but
:func:`read_stored` trusts the records' contents (UTF-8, fields; its callers turn any error
into a corrupt record: storage/records.py, storage/columns.py).
"""

from ._builder import BatchBuilder
from ._columns import Columns, columns
from ._format import (
    ANY_QUEUE,
    BATCH_MEDIA_TYPE,
    HEADER_SIZE,
    MAGIC,
    MAGIC_V1,
    RECORD_BINARY,
    RECORD_DELAY,
    RECORD_KEY,
    RECORD_TTL,
    RESERVED_HEADER_PREFIX,
    BadBatch,
    is_reserved_header,
)
from ._frames import Frame, frame_prefix, join_frames, split_batches, split_frames
from ._v1 import V1Batch, read_v1, v1_to_v2
from ._validate import Limits, read, read_stored, reserved_header_record, validate
from ._view import BatchView, Record, stamp, stamp_into

__all__ = [
    "ANY_QUEUE",
    "BATCH_MEDIA_TYPE",
    "HEADER_SIZE",
    "MAGIC",
    "MAGIC_V1",
    "RECORD_BINARY",
    "RECORD_DELAY",
    "RECORD_KEY",
    "RECORD_TTL",
    "RESERVED_HEADER_PREFIX",
    "BadBatch",
    "BatchBuilder",
    "BatchView",
    "Columns",
    "Frame",
    "Limits",
    "Record",
    "V1Batch",
    "columns",
    "frame_prefix",
    "is_reserved_header",
    "join_frames",
    "read",
    "read_stored",
    "read_v1",
    "reserved_header_record",
    "split_batches",
    "split_frames",
    "stamp",
    "stamp_into",
    "v1_to_v2",
    "validate",
]
