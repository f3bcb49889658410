"""The producer's record batches, written column by column: a cheaper append than
:class:`raftmq.batch.BatchBuilder`'s for the same bytes.

``BatchBuilder.append`` packs each message into the format's sections as it comes (a
``struct.pack``, two or three buffer appends, a clock read), in the producer under the
accumulator's lock. The producer does not need the bytes until the batch is sent, so
:class:`ColumnBatch` only keeps each message's value (and key, headers, time) in lists, and
:meth:`ColumnBatch.finish` writes the batch at once: the values section is one ``str.join`` and
one encode, the record table one numpy array (a ``struct.pack`` per record up to
:data:`SMALL_BATCH_RECORDS`, where numpy's cost per call would be most of the work). A batch with
headers is written by ``BatchBuilder`` itself, record by record (headers are rare on the fast
path, and this keeps one writer of the header table). ``bench_producer_client.py`` measures
both: 0.63 against 0.84 µs per 100-byte message, append and write included, and the writing
happens on the I/O thread, outside the lock the application's ``send`` takes.

The bytes are format v2 exactly as docs/format.md defines them and ``BatchBuilder`` writes them:
a unit test builds the same messages both ways and compares the bytes.
"""

from __future__ import annotations

import struct
import time
from array import array
from collections.abc import Mapping

import crc32c
import numpy as np

from raftmq.batch import HEADER_SIZE, MAGIC, RECORD_BINARY, RECORD_KEY, BatchBuilder

__all__ = ["ColumnBatch"]

# docs/format.md, "The batch": the stamped part (bytes 0..31), then from byte 40 the covered
# header; "Record table entry": 16 bytes.
_STAMPED = struct.Struct("<B3xIQQQ")
_COVERED = struct.Struct("<HHBBHIIQQIIIIIB3x")
_U32 = struct.Struct("<I")
_CRC_START = 40
_RECORD_ENTRY_SIZE = 16
_HEADER_ENTRY_SIZE = 8
_MAX_U32 = 0xFFFF_FFFF
_RECORD = np.dtype(
    {
        "names": ["attributes", "header_count", "reserved", "timestamp_delta", "key_len", "value_len"],
        "formats": ["u1", "u1", "<u2", "<u4", "<u4", "<u4"],
        "offsets": [0, 1, 2, 4, 8, 12],
        "itemsize": _RECORD_ENTRY_SIZE,
    }
)
_ENTRY = struct.Struct("<BBHIII")  # one record table entry, the fields of _RECORD
assert _CRC_START + _COVERED.size == HEADER_SIZE and _ENTRY.size == _RECORD.itemsize
# Up to this many records a batch's table is packed record by record (:func:`_small_table`),
# above it written by numpy (:func:`_numpy_table`): the same bytes. At ordinary rates nearly every
# batch holds a few messages, and numpy's fixed cost per call was most of their writing: a whole
# finish() of 1 keyed 100 B message 13.8 -> 3.3 µs, of 3 13.8 -> 4.6, of 10 17.9 -> 8.9. At 32 the
# two were even in a quiet run (23.3 against 21.8) and numpy far cheaper beside other load (22.7
# against 41.3): 12 keeps this path where it surely pays (docs/benchmarks.md, issue 23).
SMALL_BATCH_RECORDS = 12

_time_ns = time.time_ns


class ColumnBatch:
    """One queue's batch of messages, kept as columns until :meth:`finish` writes it.

    Not thread-safe (the accumulator appends under its lock); spent by :meth:`finish`.
    """

    __slots__ = ("_headers", "_keys", "_producer_id", "_sequence", "_times", "_values")

    def __init__(self, producer_id: str | None, sequence: int) -> None:
        self._producer_id = producer_id
        self._sequence = sequence
        self._values: list[str | bytes] = []
        self._times = array("q")  # time.time_ns() of each append
        self._keys: list[str | None] | None = None  # made by the first key
        self._headers: list[Mapping[str, str] | None] | None = None  # made by the first headers

    def __len__(self) -> int:
        return len(self._values)

    def append(self, value: str | bytes, key: str | None, headers: Mapping[str, str] | None) -> int:
        """Keep one message (its time is now); returns its index in the batch."""
        index = len(self._values)
        self._values.append(value)
        self._times.append(_time_ns())
        if key is not None or self._keys is not None:
            if self._keys is None:
                self._keys = [None] * index
            self._keys.append(key)
        if headers or self._headers is not None:
            if self._headers is None:
                self._headers = [None] * index
            self._headers.append(headers or None)
        return index

    def finish(self) -> bytes:
        """The batch's bytes (unstamped), as ``BatchBuilder`` writes them for these messages
        with ``base_timestamp_ms`` the first message's time.

        Raises:
            ValueError: the batch is empty, or a section is 4 GiB or more.
            UnicodeEncodeError: a string holds a lone surrogate.
        """
        n = len(self._values)
        if not n:
            raise ValueError("a batch holds at least one record")
        if self._headers is not None:
            millis = np.frombuffer(self._times, dtype=np.int64) // 1_000_000
            return self._finish_with_builder(int(millis[0]), millis)
        values, value_lens, binary = _section(self._values)
        keys = b""
        key_lens: list[int] | None = None
        if self._keys is not None:
            keys, key_lens, _ = _section([k for k in self._keys if k is not None])
        write_table = _small_table if n <= SMALL_BATCH_RECORDS else _numpy_table
        base, table = write_table(self._times, value_lens, binary, self._keys, key_lens)
        pid = b"" if self._producer_id is None else self._producer_id.encode("utf-8")
        sections = (pid, table, keys, values)
        if any(len(s) > _MAX_U32 for s in sections):
            raise ValueError("a batch section is 4 GiB or more")
        covered = _COVERED.pack(
            HEADER_SIZE,
            0,  # attributes
            _RECORD_ENTRY_SIZE,
            _HEADER_ENTRY_SIZE,
            0,  # producer_epoch
            n,
            0,  # header_count
            base,
            self._sequence,
            len(keys),
            0,  # header names
            0,  # header values
            len(values),
            0,  # extras: no delays or TTLs
            len(pid),
        )
        body = b"".join((covered, *sections))
        total = _CRC_START + len(body)
        if total > _MAX_U32:
            raise ValueError("a batch is 4 GiB or more")
        stamped = _STAMPED.pack(MAGIC, total, 0, 0, 0)
        return b"".join((stamped, _U32.pack(crc32c.crc32c(stamped)), _U32.pack(crc32c.crc32c(body)), body))

    def _finish_with_builder(self, base: int, millis: np.ndarray) -> bytes:
        builder = BatchBuilder(self._producer_id, self._sequence, base_timestamp_ms=base)
        keys = self._keys or [None] * len(self._values)
        headers = self._headers or [None] * len(self._values)
        for value, key, hdrs, ms in zip(self._values, keys, headers, millis.tolist(), strict=True):
            builder.append(value, key, hdrs, timestamp_ms=ms)
        return builder.finish()


def _small_table(
    times: array[int],
    value_lens: list[int],
    binary: list[int] | None,
    keys: list[str | None] | None,
    key_lens: list[int] | None,
) -> tuple[int, bytes]:
    """The base time (ms) and the record table of a small batch, one ``struct.pack`` a record:
    what :func:`_numpy_table` writes, without numpy's cost per call (about 20 µs a batch)."""
    base = times[0] // 1_000_000
    next_key_len = iter(key_lens or ()).__next__
    entries = []
    for i, value_len in enumerate(value_lens):
        attributes = 0 if binary is None else binary[i]
        key_len = 0
        if keys is not None and keys[i] is not None:
            attributes |= RECORD_KEY
            key_len = next_key_len()
        delta = min(max(times[i] // 1_000_000 - base, 0), _MAX_U32)
        entries.append(_ENTRY.pack(attributes, 0, 0, delta, key_len, value_len))
    return base, b"".join(entries)


def _numpy_table(
    times: array[int],
    value_lens: list[int],
    binary: list[int] | None,
    keys: list[str | None] | None,
    key_lens: list[int] | None,
) -> tuple[int, bytes]:
    """The base time (ms) and the record table of a batch, one numpy array for all records."""
    millis = np.frombuffer(times, dtype=np.int64) // 1_000_000
    base = int(millis[0])
    table = np.zeros(len(value_lens), dtype=_RECORD)
    np.clip(millis - base, 0, _MAX_U32, out=millis)
    table["timestamp_delta"] = millis
    table["value_len"] = value_lens
    if binary is not None:
        table["attributes"] = binary
    if keys is not None:
        has_key = [k is not None for k in keys]
        if all(has_key):
            table["key_len"] = key_lens
            table["attributes"] |= RECORD_KEY
        else:
            mask = np.array(has_key, dtype=bool)
            table["key_len"][mask] = key_lens
            table["attributes"][mask] |= RECORD_KEY
    return base, table.tobytes()


def _section(items: list[str | bytes] | list[str]) -> tuple[bytes, list[int], list[int] | None]:
    """``items`` concatenated as bytes (text as UTF-8), each one's length in bytes, and the
    records' BINARY attribute (None when every item is text)."""
    try:
        text = "".join(items)  # type: ignore[arg-type]
    except TypeError:  # some are bytes
        encoded = [i.encode("utf-8") if isinstance(i, str) else i for i in items]
        binary = [0 if type(i) is str else RECORD_BINARY for i in items]
        return b"".join(encoded), [len(e) for e in encoded], binary
    if text.isascii():
        return text.encode("ascii"), list(map(len, items)), None
    encoded = [i.encode("utf-8") if isinstance(i, str) else i for i in items]
    return b"".join(encoded), list(map(len, encoded)), None
