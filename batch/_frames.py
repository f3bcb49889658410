"""Frames: how several batches travel in one HTTP body (produce, binary fetch) or one buffer.

``frame := queue u32 | topic_len u8 | topic (UTF-8) | prefix_crc u32 | batch`` (little-endian),
where ``prefix_crc`` is the CRC-32C of the bytes before it in the frame (the batch has its own
CRCs, so every byte of a body is covered) and the batch carries its own length
(``batch_length`` at byte 4). ``topic_len`` 0 means the topic named by
the request's path; ``queue`` ``ANY_QUEUE`` lets the node choose the queue. Splitting reads a
constant number of fields per batch and copies nothing (each batch is a ``memoryview``).
"""

from __future__ import annotations

from typing import NamedTuple

import crc32c

from ._format import ANY_QUEUE, CRC_START, FRAME_PREFIX, MAGIC, MAX_U32, U32, BadBatch

__all__ = ["Frame", "frame_prefix", "join_frames", "split_batches", "split_frames"]

Buffer = bytes | bytearray | memoryview


class Frame(NamedTuple):
    """One batch of a frame sequence and where it goes.

    Attributes:
        queue: The queue, or None when the node chooses (``ANY_QUEUE`` on the wire).
        topic: The topic, or None for the topic of the request's path.
        batch: The batch bytes (a view into the body: not copied, not checked).
    """

    queue: int | None
    topic: str | None
    batch: memoryview


def frame_prefix(queue: int | None, topic: str | None = None) -> bytes:
    """The bytes that go before a batch in a frame (``b"".join`` them with the batch)."""
    tb = b"" if topic is None else topic.encode("utf-8")
    if not 0 < len(tb) <= 255 and topic is not None:
        raise ValueError("a frame's topic is 1-255 bytes of UTF-8")
    if queue is not None and not 0 <= queue < ANY_QUEUE:
        raise ValueError(f"queue must be from 0 to {ANY_QUEUE - 1}")
    head = FRAME_PREFIX.pack(ANY_QUEUE if queue is None else queue, len(tb)) + tb
    return head + U32.pack(crc32c.crc32c(head))


def join_frames(frames: list[tuple[int | None, str | None, Buffer]]) -> bytes:
    """One body of ``(queue, topic, batch)`` frames, in order."""
    parts: list[Buffer] = []
    for queue, topic, batch in frames:
        parts.append(frame_prefix(queue, topic))
        parts.append(batch)
    return b"".join(parts)


def _batch_length(buf: memoryview, at: int, index: int) -> int:
    if len(buf) - at < CRC_START:
        raise BadBatch(
            "truncated", f"batch {index}: {len(buf) - at} bytes left, shorter than a header", None, index
        )
    if buf[at] != MAGIC:
        raise BadBatch(
            "unknown_version", f"batch {index}: unknown batch format version {buf[at]}", None, index
        )
    (length,) = U32.unpack_from(buf, at + 4)
    if length < CRC_START or length > len(buf) - at:
        raise BadBatch(
            "truncated", f"batch {index}: it says {length} bytes, {len(buf) - at} are left", None, index
        )
    return int(length)


def split_frames(body: Buffer, max_frames: int = 1024) -> list[Frame]:
    """The ``(queue, topic, batch)`` frames of ``body``, each batch a view (its contents are
    checked by ``validate``).

    Raises:
        BadBatch: a frame is truncated, names a topic that is not UTF-8, or there are more than
            ``max_frames``; ``batch`` names the frame.
    """
    buf = memoryview(body).cast("B")
    frames: list[Frame] = []
    pos, size = 0, len(buf)
    if not size:
        raise BadBatch("truncated", "the body is empty", None, None)
    while pos < size:
        index = len(frames)
        if index >= max_frames:
            raise BadBatch("too_many_batches", f"more than {max_frames} batches in one body", None, index)
        if size - pos < FRAME_PREFIX.size:
            raise BadBatch("truncated", f"batch {index}: the frame is truncated", None, index)
        queue, topic_len = FRAME_PREFIX.unpack_from(buf, pos)
        head_at = pos
        pos += FRAME_PREFIX.size
        if size - pos < topic_len + U32.size:
            raise BadBatch("truncated", f"batch {index}: the frame is truncated", None, index)
        topic_at = pos
        pos += topic_len
        if crc32c.crc32c(buf[head_at:pos]) != U32.unpack_from(buf, pos)[0]:
            raise BadBatch("frame_crc_mismatch", f"batch {index}: the frame CRC does not match", None, index)
        pos += U32.size
        topic = None
        if topic_len:
            try:
                topic = str(buf[topic_at : topic_at + topic_len], "utf-8")
            except UnicodeDecodeError:
                raise BadBatch("bad_utf8", f"batch {index}: the topic is not UTF-8", None, index) from None
        length = _batch_length(buf, pos, index)
        frames.append(Frame(None if queue == ANY_QUEUE else queue, topic, buf[pos : pos + length]))
        pos += length
    return frames


def split_batches(buf: Buffer, max_batches: int = MAX_U32) -> list[memoryview]:
    """The batches of ``buf``, a plain concatenation of v2 batches (as a group commit or a store
    read may build), each a view; only their lengths are read.

    Raises:
        BadBatch: a batch is truncated or not v2 (``batch`` names it).
    """
    view = memoryview(buf).cast("B")
    out: list[memoryview] = []
    pos = 0
    while pos < len(view):
        if len(out) >= max_batches:
            raise BadBatch("too_many_batches", f"more than {max_batches} batches", None, len(out))
        length = _batch_length(view, pos, len(out))
        out.append(view[pos : pos + length])
        pos += length
    return out
