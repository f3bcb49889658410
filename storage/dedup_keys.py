"""The keys of the deduplication window (``cluster/machines/dedup.py``; prefixes and layout in
``storage/keys.py``): an entry per remembered key, an index by expiry, a count per queue."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .keys import DEDUP, DEDUP_COUNT, DEDUP_EXPIRY
from .records import CorruptRecord

__all__ = ["DedupEntry", "decode_dedup_expiry_key", "dedup_count_key", "dedup_expiry_key", "dedup_key"]

_QUEUE = struct.Struct(">cII")
_EXPIRY_HEAD = struct.Struct(">cQII")
_TWO_U64 = struct.Struct(">QQ")


def dedup_key(topic_id: int, queue: int, dedup: bytes) -> bytes:
    return _QUEUE.pack(DEDUP, topic_id, queue) + dedup


def dedup_expiry_key(expires_ms: int, topic_id: int, queue: int, dedup: bytes) -> bytes:
    return _EXPIRY_HEAD.pack(DEDUP_EXPIRY, expires_ms, topic_id, queue) + dedup


def decode_dedup_expiry_key(key: bytes) -> tuple[int, int, int, bytes]:
    """``(expires_ms, topic_id, queue, dedup)`` of a :func:`dedup_expiry_key`."""
    _, expires_ms, topic_id, queue = _EXPIRY_HEAD.unpack_from(key)
    return expires_ms, topic_id, queue, key[_EXPIRY_HEAD.size :]


def dedup_count_key(topic_id: int, queue: int) -> bytes:
    return _QUEUE.pack(DEDUP_COUNT, topic_id, queue)


@dataclass(frozen=True, slots=True)
class DedupEntry:
    """A deduplication id remembered by a queue: when it is forgotten, and the message it sent.

    Attributes:
        expires_ms: The group time after which the id is forgotten (sent + the window).
        offset: The offset of the message stored under the id.
        message_id: The id the message was answered with (an SQS MessageId).
    """

    expires_ms: int
    offset: int
    message_id: str

    def encode(self) -> bytes:
        return _TWO_U64.pack(self.expires_ms, self.offset) + self.message_id.encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> DedupEntry:
        """Raises: CorruptRecord: ``data`` is not an encoded entry."""
        if len(data) < _TWO_U64.size:
            raise CorruptRecord("dedup entry too short")
        expires_ms, offset = _TWO_U64.unpack_from(data)
        try:
            return cls(expires_ms, offset, data[_TWO_U64.size :].decode("utf-8"))
        except UnicodeDecodeError:
            raise CorruptRecord("dedup entry message id is not UTF-8") from None
