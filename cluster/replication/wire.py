"""The Raft wire without pysyncobj: how a Raft connection frames, seals, queues and opens messages
(docs/architecture.md, "The Raft wire").

``pso.py``'s ``RaftConnection`` (a pysyncobj ``TcpConnection``) takes its frames from
:class:`FrameWire` and queues them in a :class:`SendQueue`; pysyncobj's connect, poll, timeout and
handshake logic stay there. Nothing here imports pysyncobj or touches a socket but
:meth:`SendQueue.send_to`.

A frame is ``length (4 bytes, LE) | salt (16) | counter (8, LE) | AES-GCM(pickle(message))``;
without a key (no password) it is ``length | pickle(message)``. Each sender picks a random salt per
connection and numbers its frames from 1; the receiver refuses (the caller drops the connection
and delivers nothing more) a bad tag, a salt that changes or equals its own (a reflected frame), a
counter that is not the previous one plus 1 (a replayed, reordered or removed frame), a frame over
``max_frame_bytes`` (over :data:`MAX_FIRST_FRAME_BYTES` before one was authenticated) or anything
that does not unpickle. A leader's entries may go as an envelope and a body sealed once for every
follower (``shared_bodies.py``, which says why that is as safe).

Invariant: a connection's send counter counts exactly the frames it sealed, its receive counter
exactly the frames it opened; both start again from 0 with its salts (:meth:`FrameWire.reset_wire`)
when the connection does.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import pickle
import socket
import struct
from collections import deque
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from raftmq.cluster.base.limits import RAFT_MAX_FRAME_BYTES
from raftmq.cluster.replication.shared_bodies import (
    ENVELOPE_MAGIC,
    SALT_BYTES,
    Envelope,
    SharedBodies,
    body_cipher,
    envelope_plaintext,
    frame_cipher,
    nonce,
    read_envelope,
    reads_shared_bodies,
)
from raftmq.errors import RaftmqError

__all__ = [
    "MAX_FIRST_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "RECV_CHUNK_BYTES",
    "FrameTooLarge",
    "FrameWire",
    "SendQueue",
    "raft_key",
]

_LENGTH = struct.Struct("<I")
_HEADER = struct.Struct("<16sQ")  # the sender's salt for this connection, its frame counter
_PREFIX = struct.Struct("<I16sQ")  # the length, then the header: a sealed frame's first bytes
MAX_FRAME_BYTES = RAFT_MAX_FRAME_BYTES  # a longer length prefix is garbage: the connection is dropped
_SEAL_BYTES = _HEADER.size + 16  # salt, counter and the GCM tag around a sealed pickle
# Until a frame of a connection has been authenticated, a longer one is refused as soon as its
# length prefix arrives: pysyncobj's first frame is its handshake key (about 100 bytes), and a
# stranger must not make a node buffer up to MAX_FRAME_BYTES per connection it opens.
MAX_FIRST_FRAME_BYTES = 64 << 10
RECV_CHUNK_BYTES = 1 << 16  # the least a connection asks its socket for in one recv
# A longer plaintext is sealed straight into its frame's buffer: cryptography's
# ``AESGCM.encrypt_into``, which the releases before it lack (pyproject asks for >= 42): with one of
# those every frame is sealed with one concatenation, as small frames always are.
_SEAL_INTO_BYTES = (8 << 10) if hasattr(AESGCM, "encrypt_into") else None
_SEND_CHUNKS = 64  # the most chunks one sendmsg takes (Linux allows 1,024)


def raft_key(password: str | None) -> bytes | None:
    """The AES-256 key of a Raft password (raftmq passes the derived Raft key, 64 hex digits)."""
    if password is None:
        return None
    try:
        key = bytes.fromhex(password)
    except ValueError:
        key = b""
    return key if len(key) == 32 else hashlib.sha256(password.encode()).digest()


class SendQueue:
    """A connection's frames waiting for the socket, kept as they are (no concatenation).

    One bytearray grown by every frame and trimmed by every send copied the whole backlog when it
    had to grow: with a follower behind by megabytes, each 200 KB entry moved all of it again
    (``RaftConnection.send`` was 13-21 µs of node CPU per 1 KiB message in bench_vs_nats). Here a
    frame is queued as is, and a send takes from the first ones (an envelope and the shared body
    after it go in one system call).
    """

    __slots__ = ("_chunks", "_size")

    def __init__(self, initial: bytes | bytearray = b"") -> None:
        self._chunks: deque[memoryview] = deque()
        self._size = 0
        if initial:
            self.add(bytes(initial))

    def __len__(self) -> int:
        return self._size

    def add(self, data: bytes | bytearray) -> None:
        self._chunks.append(memoryview(data))
        self._size += len(data)

    def send_to(self, sock: socket.socket) -> int:
        """One ``sock.send`` of (the start of) the first chunk, or one ``sock.sendmsg`` of the
        first :data:`_SEND_CHUNKS`; the bytes sent (0: nothing).

        Raises:
            OSError: as ``socket.send`` (EAGAIN: the socket takes nothing now).
        """
        chunks = self._chunks
        if len(chunks) == 1:
            sent = sock.send(chunks[0])
        else:
            sent = sock.sendmsg(itertools.islice(chunks, _SEND_CHUNKS))
        self._size -= max(sent, 0)
        left = sent
        while left > 0:
            first = chunks[0]
            if left < len(first):
                chunks[0] = first[left:]
                break
            chunks.popleft()
            left -= len(first)
        return sent


class FrameTooLarge(RaftmqError, ValueError):
    """A message whose frame would be longer than the receiver accepts."""

    def __init__(self, frame_bytes: int, max_frame_bytes: int) -> None:
        super().__init__(f"a Raft frame of {frame_bytes} bytes exceeds {max_frame_bytes}")
        self.frame_bytes = frame_bytes
        self.max_frame_bytes = max_frame_bytes


class FrameWire:
    """The frames of one Raft connection, both ways: a mixin of ``pso.RaftConnection``.

    ``sendRandKey`` and ``recvRandKey`` are pysyncobj's handshake keys (the peer's, sent with
    every message, and this side's, checked on every message; None before the handshake).
    Per-connection state lives in class defaults, so a connection can be re-classed in place.
    """

    sendRandKey: Any
    recvRandKey: Any
    raft_key: bytes | None = None
    max_frame_bytes = MAX_FRAME_BYTES  # the longest frame either side sends or accepts
    shared_bodies: SharedBodies | None = None  # the transport's (None: frames of its own only)
    _send_salt: bytes | None = None
    _send_cipher: AESGCM | None = None
    _send_counter = 0
    _recv_salt: bytes | None = None
    _recv_cipher: AESGCM | None = None
    _recv_counter = 0
    _body: Envelope | None = None  # an envelope read, its body not yet
    _body_salt: bytes | None = None  # the salt of the peer's bodies, and their cipher
    _body_cipher: AESGCM | None = None

    def reset_wire(self) -> None:
        """Forget the salts, ciphers and counters (the connection (re)connects or closes)."""
        self._send_salt = self._send_cipher = self._recv_salt = self._recv_cipher = None
        self._send_counter = self._recv_counter = 0
        self._body = self._body_salt = self._body_cipher = None

    def frame(self, message: Any) -> bytes | bytearray:
        """The bytes a send queues for ``message`` in a frame of its own (advances this
        connection's counter).

        Raises:
            FrameTooLarge: the frame would be longer than the receiver accepts
                (:attr:`max_frame_bytes`); nothing was sealed or counted.
        """
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        return self._seal(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _seal(self, data: bytes) -> bytes | bytearray:
        """The frame of the plaintext ``data``, written into one buffer (no concatenation).

        Raises:
            FrameTooLarge: as :meth:`frame`.
        """
        if self.raft_key is None:
            if len(data) > self.max_frame_bytes:
                raise FrameTooLarge(len(data), self.max_frame_bytes)
            return _LENGTH.pack(len(data)) + data
        length = len(data) + _SEAL_BYTES
        if length > self.max_frame_bytes:
            raise FrameTooLarge(length, self.max_frame_bytes)
        if self._send_cipher is None:
            self._send_salt = os.urandom(SALT_BYTES)
            self._send_cipher = frame_cipher(self.raft_key, self._send_salt)
        self._send_counter += 1
        if _SEAL_INTO_BYTES is None or len(data) < _SEAL_INTO_BYTES:  # one small concatenation costs less
            prefix = _PREFIX.pack(length, self._send_salt, self._send_counter)
            return prefix + self._send_cipher.encrypt(nonce(self._send_counter), data, prefix[_LENGTH.size :])
        out = bytearray(_LENGTH.size + length)
        _PREFIX.pack_into(out, 0, length, self._send_salt, self._send_counter)
        view = memoryview(out)  # the header is the associated data, the ciphertext goes after it
        self._send_cipher.encrypt_into(
            nonce(self._send_counter), data, view[_LENGTH.size : _PREFIX.size], view[_PREFIX.size :]
        )
        return out

    def frames(self, message: Any) -> list[bytes | bytearray]:
        """What a send queues for ``message``: a frame of its own, or an envelope and the
        shared body (an ``append_entries`` the transport sealed once for every follower it is the
        same for, to a peer that reads them).

        Raises:
            FrameTooLarge: as :meth:`frame`.
        """
        shared = self.shared_bodies
        if shared is not None and type(message) is dict and reads_shared_bodies(self.sendRandKey):
            body = shared.body_for(message)
            if body is not None:
                if len(body.data) > self.max_frame_bytes:
                    raise FrameTooLarge(len(body.data), self.max_frame_bytes)
                return [self._seal(envelope_plaintext(body, self.sendRandKey)), body.data]
        return [self.frame(message)]

    def refuses_first_frame(self, buf: bytearray) -> bool:
        """Whether ``buf`` starts with the length prefix of a first frame longer than a stranger
        may send (:data:`MAX_FIRST_FRAME_BYTES`; no frame of the connection opened yet)."""
        if self.raft_key is None or self._recv_cipher is not None or len(buf) < _LENGTH.size:
            return False
        (length,) = _LENGTH.unpack_from(buf)
        return bool(length > MAX_FIRST_FRAME_BYTES)

    def parse_frame(self, buf: bytearray) -> Any:
        """The next message of the received bytes ``buf``, taken off its front (None: not whole
        yet).

        Raises:
            Exception: a forged, replayed, reflected, garbled or foreign frame (ValueError,
                cryptography's InvalidTag, pickle's errors): the peer is not trusted any more.
        """
        if self._body is not None:
            return self._parse_body(buf)
        if len(buf) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(buf)
        if length > self.max_frame_bytes:
            raise ValueError("a frame longer than accepted")
        end = _LENGTH.size + length
        if len(buf) < end:
            return None
        with memoryview(buf) as view:  # read in place: the frame is not copied out first
            plain = self._open(view[_LENGTH.size : end])
        del buf[:end]
        if self.raft_key is not None and plain.startswith(ENVELOPE_MAGIC):
            if self.shared_bodies is None:  # not offered in the handshake (a release before)
                raise ValueError("an envelope this side never offered to read")
            self._body = read_envelope(plain, self.recvRandKey, self.max_frame_bytes)
            return self._parse_body(buf)
        message = pickle.loads(plain)
        if self.recvRandKey:
            rand_key, message = message
            if not hmac.compare_digest(rand_key, self.recvRandKey):
                raise ValueError("frame for another connection")
        return message

    def _open(self, data: memoryview) -> bytes:
        """The plaintext of the frame ``data`` (its bytes after the length prefix).

        Raises:
            ValueError, cryptography.exceptions.InvalidTag: not the next frame of the peer.
        """
        if self.raft_key is None:
            return bytes(data)
        salt, counter = _HEADER.unpack_from(data)
        if self._recv_cipher is None:
            if salt == self._send_salt:
                raise ValueError("reflected frame")
            self._recv_salt, self._recv_cipher = salt, frame_cipher(self.raft_key, salt)
        elif salt != self._recv_salt:
            raise ValueError("salt changed within a connection")
        if counter != self._recv_counter + 1:  # TCP keeps the order: each frame is the next one
            raise ValueError("replayed, reordered or removed frame")
        # InvalidTag on a forged frame or a wrong key: the caller drops the connection.
        plain = self._recv_cipher.decrypt(nonce(counter), data[_HEADER.size :], data[: _HEADER.size])
        self._recv_counter = counter
        return plain

    def _parse_body(self, buf: bytearray) -> Any:
        """The message of the body its envelope announced, once the buffer holds it (else None).

        Raises:
            ValueError, cryptography.exceptions.InvalidTag: not the body the envelope names.
        """
        body = self._body
        assert body is not None and self.raft_key is not None
        if len(buf) < body.length:
            return None
        if self._body_cipher is None or self._body_salt != body.salt:
            self._body_salt, self._body_cipher = body.salt, body_cipher(self.raft_key, body.salt)
        with memoryview(buf) as view:
            plain = body.open_body(self._body_cipher, view[: body.length])
        del buf[: body.length]
        self._body = None
        message = pickle.loads(plain)
        if type(message) is not dict or message.get("type") != "append_entries":
            raise ValueError("a shared body holds entries only")
        return message
