"""The client's side of format v2: :class:`BatchBuilder` appends messages into per-section
buffers (one ``struct.pack`` and two or three ``bytearray`` appends per message) and
:meth:`BatchBuilder.finish` joins them, computing the CRC once over the whole batch."""

from __future__ import annotations

import time
from array import array
from collections.abc import Mapping

import crc32c

from ._format import (
    COVERED,
    CRC_START,
    HEADER_ENTRY,
    HEADER_ENTRY_SIZE,
    HEADER_SIZE,
    MAGIC,
    MAX_U32,
    MAX_U64,
    RECORD_BINARY,
    RECORD_DELAY,
    RECORD_ENTRY,
    RECORD_ENTRY_SIZE,
    RECORD_KEY,
    RECORD_TTL,
    STAMPED,
    U32,
)

__all__ = ["BatchBuilder"]

_pack_entry = RECORD_ENTRY.pack
_pack_header = HEADER_ENTRY.pack


_time_ns = time.time_ns


def _now_ms() -> int:
    return _time_ns() // 1_000_000


class BatchBuilder:
    """Builds one v2 record batch for one queue.

    Example::

        b = BatchBuilder(producer_id="p-1", base_sequence=7)
        b.append(b"\\x00\\x01")                      # binary value
        b.append("hello", key="customer-7", headers={"trace": "a1"}, ttl_ms=60_000)
        payload = b.finish()                          # bytes: validate(payload, limits) accepts it

    The builder checks only what it must to write the format (field widths, no lone surrogates:
    ``str.encode`` raises); limits are the node's business (:func:`raftmq.batch.validate`).
    A builder is not thread-safe and is spent by :meth:`finish`.

    Args:
        producer_id: The idempotent producer's id (1-255 bytes of UTF-8), or None.
        base_sequence: The batch's sequence number for that producer (u64).
        producer_epoch: Reserved for producer fencing (u16; 0 today).
        base_timestamp_ms: The batch's base time (ms since the epoch); default: now. Records
            carry their own time as a delta from it.
        timestamps: Stamp each record with the time of its :meth:`append` (default). False gives
            every record the base time and saves a clock read per message.
    """

    __slots__ = (
        "_delays",
        "_epoch",
        "_header_names",
        "_header_table",
        "_header_values",
        "_keys",
        "_n_headers",
        "_producer_id",
        "_sequence",
        "_table",
        "_timestamps",
        "_ttls",
        "_values",
        "base_timestamp_ms",
        "count",
    )

    def __init__(
        self,
        producer_id: str | None = None,
        base_sequence: int = 0,
        producer_epoch: int = 0,
        base_timestamp_ms: int | None = None,
        timestamps: bool = True,
    ) -> None:
        pid = b"" if producer_id is None else producer_id.encode("utf-8")
        if producer_id is not None and not 0 < len(pid) <= 255:
            raise ValueError("producer_id must be 1-255 bytes of UTF-8")
        if producer_id is None and base_sequence:
            raise ValueError("base_sequence needs a producer_id")
        if not 0 <= base_sequence <= MAX_U64 or not 0 <= producer_epoch <= 0xFFFF:
            raise ValueError("base_sequence must fit u64 and producer_epoch u16")
        self._producer_id = pid
        self._sequence = base_sequence
        self._epoch = producer_epoch
        self.base_timestamp_ms = _now_ms() if base_timestamp_ms is None else base_timestamp_ms
        self._timestamps = timestamps
        self._table = bytearray()
        self._header_table = bytearray()
        self._keys = bytearray()
        self._header_names = bytearray()
        self._header_values = bytearray()
        self._values = bytearray()
        self._delays = array("Q")
        self._ttls = array("Q")
        self._n_headers = 0
        self.count = 0
        """Records appended so far."""

    def __len__(self) -> int:
        return self.count

    @property
    def size(self) -> int:
        """The size in bytes :meth:`finish` returns now (to close a batch at a byte budget)."""
        return (
            HEADER_SIZE
            + len(self._producer_id)
            + len(self._table)
            + len(self._header_table)
            + len(self._keys)
            + len(self._header_names)
            + len(self._header_values)
            + len(self._values)
            + 8 * (len(self._delays) + len(self._ttls))
        )

    def append(
        self,
        value: bytes | bytearray | memoryview | str,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay_ms: int = 0,
        ttl_ms: int = 0,
        timestamp_ms: int | None = None,
    ) -> int:
        """Append one message; returns its index in the batch.

        Args:
            value: ``str`` (a text value, stored as UTF-8) or bytes-like (a binary value).
            key: The message key, or None (no key; ``""`` is an empty key).
            headers: ``str -> str`` headers, or None.
            delay_ms: Deliver no earlier than this long after the leader appends it (0: at once).
            ttl_ms: Expire this long after it becomes deliverable (0: never).
            timestamp_ms: The record's time (default: now, or the base time with
                ``timestamps=False``); clamped to ``[base, base + 2**32)``.

        Raises:
            UnicodeEncodeError: a string holds a lone surrogate.
            ValueError: a field does not fit the format (delay, ttl or a length beyond u32).
        """
        if type(value) is str:
            data: bytes | bytearray | memoryview = value.encode("utf-8")
            attributes = 0
        else:
            data = value  # type: ignore[assignment]
            attributes = RECORD_BINARY
        key_len = header_count = 0
        if key is not None:
            kb = key.encode("utf-8")
            key_len = len(kb)
            self._keys += kb
            attributes |= RECORD_KEY
        if headers:
            header_count = self._append_headers(headers)
        if delay_ms or ttl_ms:
            attributes |= self._append_timing(delay_ms, ttl_ms)
        if timestamp_ms is not None:
            delta = timestamp_ms - self.base_timestamp_ms
        elif self._timestamps:
            delta = _time_ns() // 1_000_000 - self.base_timestamp_ms
        else:
            delta = 0
        if not 0 <= delta <= MAX_U32:
            delta = 0 if delta < 0 else MAX_U32
        self._values += data
        self._table += _pack_entry(attributes, header_count, 0, delta, key_len, len(data))
        self.count += 1
        return self.count - 1

    def _append_headers(self, headers: Mapping[str, str]) -> int:
        if len(headers) > 255:
            raise ValueError("at most 255 headers per message fit the format")
        for name, text in headers.items():
            nb, vb = name.encode("utf-8"), text.encode("utf-8")
            self._header_names += nb
            self._header_values += vb
            self._header_table += _pack_header(len(nb), len(vb))
        self._n_headers += len(headers)
        return len(headers)

    def _append_timing(self, delay_ms: int, ttl_ms: int) -> int:
        attributes = 0
        if not 0 <= delay_ms <= MAX_U64 or not 0 <= ttl_ms <= MAX_U64:
            raise ValueError("delay_ms and ttl_ms must be from 0 to 2**64 - 1")
        if delay_ms:
            self._delays.append(delay_ms)
            attributes |= RECORD_DELAY
        if ttl_ms:
            self._ttls.append(ttl_ms)
            attributes |= RECORD_TTL
        return attributes

    def finish(self) -> bytes:
        """The batch bytes (unstamped: base offset, append time and Raft index are 0).

        Raises:
            ValueError: the batch is empty, or a section is 4 GiB or more.
        """
        if not self.count:
            raise ValueError("a batch holds at least one record")
        sections = (
            self._producer_id,
            self._table,
            self._header_table,
            self._keys,
            self._header_names,
            self._header_values,
            self._values,
            self._delays.tobytes(),
            self._ttls.tobytes(),
        )
        if any(len(s) > MAX_U32 for s in sections):
            raise ValueError("a batch section is 4 GiB or more")
        covered = COVERED.pack(
            HEADER_SIZE,
            0,  # attributes
            RECORD_ENTRY_SIZE,
            HEADER_ENTRY_SIZE,
            self._epoch,
            self.count,
            self._n_headers,
            self.base_timestamp_ms,
            self._sequence,
            len(self._keys),
            len(self._header_names),
            len(self._header_values),
            len(self._values),
            8 * (len(self._delays) + len(self._ttls)),
            len(self._producer_id),
        )
        body = b"".join((covered, *sections))
        total = CRC_START + len(body)
        if total > MAX_U32:
            raise ValueError("a batch is 4 GiB or more")
        stamped = STAMPED.pack(MAGIC, total, 0, 0, 0)
        return b"".join((stamped, U32.pack(crc32c.crc32c(stamped)), U32.pack(crc32c.crc32c(body)), body))
