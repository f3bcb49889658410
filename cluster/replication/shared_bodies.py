"""Entries sealed once for every follower: the shared bodies of the Raft wire (docs/architecture.md,
"The Raft wire").

A leader sends the same ``append_entries`` to each follower that is up to date: pysyncobj builds one
message per follower, equal in every field, and each connection pickled and encrypted it on its
own (per 1 KiB message about 40% of a leader's CPU in bench_vs_nats). :class:`SharedBodies` (one
per transport, the tick thread's) pickles such a message once and seals it once under a key of its
own; each connection then sends a small **envelope** of its own (sealed under the connection's key,
numbered in its frame sequence) followed by the same body buffer, queued as is (no copy).

Why a shared body is as safe as a frame of its own (the wire's properties, kept):

- *Authenticated encryption under the cluster secret*: the body is AES-256-GCM under
  ``HMAC-SHA256(Raft key, "raftmq/v3/raft-shared-body" || salt)``, the salt random per transport;
  its nonce is the transport's body counter (from 1), so no nonce repeats under one key, and the
  one plaintext sealed under a nonce goes to every follower as the same ciphertext.
- *Bound to one connection*: a receiver accepts a body only right after an envelope on its own
  connection, and the envelope (authenticated, counted +1 like every frame, carrying the key the
  receiver chose in pysyncobj's handshake) names the body's salt, counter, length and GCM tag. A
  body recorded on one connection and replayed to another has no envelope there: the receiver
  reads its bytes as the next frame, which fails its checks, and hangs up. An envelope cannot be
  moved either (the connection's key, counter and handshake key).
- *Nothing parsed before it is authenticated*: the envelope's tag is checked before its fields are
  read, the body's before it is unpickled.

Rolling upgrades: a node that reads envelopes says so in pysyncobj's handshake (the random key it
sends ends with :data:`HANDSHAKE_MARK`; a release before sends 32 random bytes, and echoes back any
key it was given). A connection sends envelopes only to a peer whose key carried the mark; every
node still reads the frames of its own.
"""

from __future__ import annotations

import hmac
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "ENVELOPE_MAGIC",
    "HANDSHAKE_MARK",
    "SALT_BYTES",
    "SHARED_BODY_MIN_BYTES",
    "Envelope",
    "SharedBodies",
    "SharedBody",
    "body_cipher",
    "envelope_plaintext",
    "frame_cipher",
    "handshake_key",
    "nonce",
    "read_envelope",
    "reads_shared_bodies",
]

SALT_BYTES = 16
TAG_BYTES = 16
_FRAME_KEY_CONTEXT = b"raftmq/v2/raft-frame"
_BODY_KEY_CONTEXT = b"raftmq/v3/raft-shared-body"
HANDSHAKE_MARK = b"raftmq/shared-bodies/1"
"""Appended to the random key a node sends in pysyncobj's handshake: it reads envelopes."""
ENVELOPE_MAGIC = b"\x00RSB"
"""The first bytes of an envelope's plaintext (a frame's plaintext is otherwise a pickle: 0x80)."""
# magic, body salt, body counter, body length (ciphertext and tag), body tag; then the handshake key
_ENVELOPE = struct.Struct("<4s16sQI16s")
_BODY_AAD = struct.Struct("<16sQ")
SHARED_BODY_MIN_BYTES = 16 << 10
"""Entries below this many bytes go in a frame of their own: an envelope costs a seal per follower
(about a microsecond), more than pickling and sealing a few KiB again."""
_APPEND_KEYS = frozenset({"type", "term", "commit_index", "entries", "prevLogIdx", "prevLogTerm"})


def frame_cipher(key: bytes, salt: bytes) -> AESGCM:
    """The cipher of one sender's frames on one connection (``salt``: random per connection)."""
    return AESGCM(hmac.digest(key, _FRAME_KEY_CONTEXT + salt, "sha256"))


def body_cipher(key: bytes, salt: bytes) -> AESGCM:
    """The cipher of one transport's shared bodies (``salt``: random per transport)."""
    return AESGCM(hmac.digest(key, _BODY_KEY_CONTEXT + salt, "sha256"))


def nonce(counter: int) -> bytes:
    return b"\0\0\0\0" + counter.to_bytes(8, "big")


def handshake_key(shared_bodies: bool) -> bytes:
    """The random key this node sends first on a connection (pysyncobj's handshake)."""
    return os.urandom(32) + (HANDSHAKE_MARK if shared_bodies else b"")


def reads_shared_bodies(peer_key: Any) -> bool:
    """Whether the peer whose handshake key is ``peer_key`` reads envelopes."""
    if type(peer_key) is not bytes or len(peer_key) != 32 + len(HANDSHAKE_MARK):
        return False
    return peer_key.endswith(HANDSHAKE_MARK)


@dataclass(frozen=True, slots=True)
class Envelope:
    """What an envelope says of the body that follows it on the connection."""

    salt: bytes
    counter: int
    length: int  # of the body on the wire: ciphertext and tag
    tag: bytes

    def open_body(self, cipher: AESGCM, body: memoryview) -> bytes:
        """The body's plaintext (``body``: its bytes on the wire).

        Raises:
            ValueError, cryptography.exceptions.InvalidTag: not the body the envelope names.
        """
        if not hmac.compare_digest(body[-TAG_BYTES:], self.tag):
            raise ValueError("a body other than the one its envelope names")
        return cipher.decrypt(nonce(self.counter), body, _BODY_AAD.pack(self.salt, self.counter))


@dataclass(frozen=True, slots=True)
class SharedBody:
    """One ``append_entries`` message, pickled and sealed once."""

    message: dict[str, Any]  # kept: its entries are compared by identity with the next message's
    salt: bytes
    counter: int
    data: bytes  # ciphertext and tag, as sent

    def serves(self, message: dict[str, Any]) -> bool:
        """Whether ``message`` is this one: the same fields, and the same entry objects of the
        leader's log (Raft's log matching: an index and term name one entry)."""
        mine = self.message
        if (
            message["term"] != mine["term"]
            or message["commit_index"] != mine["commit_index"]
            or message["prevLogIdx"] != mine["prevLogIdx"]
            or message["prevLogTerm"] != mine["prevLogTerm"]
        ):
            return False
        entries, theirs = message["entries"], mine["entries"]
        return len(entries) == len(theirs) and all(a is b for a, b in zip(entries, theirs, strict=True))


class SharedBodies:
    """A transport's bodies: the last ``append_entries`` sealed, reused for each follower it is
    the same for. Tick thread only.

    Invariant: each body is sealed under a nonce (the counter) used for no other plaintext: the
    counter only grows, and the key is this object's (its salt is random)."""

    def __init__(self, key: bytes, min_bytes: int = SHARED_BODY_MIN_BYTES) -> None:
        self._salt = os.urandom(SALT_BYTES)
        self._cipher = body_cipher(key, self._salt)
        self._counter = 0
        self._last: SharedBody | None = None
        self.min_bytes = min_bytes
        # Read by metrics and tests: bodies sealed, and bodies handed to a connection (each sent
        # behind an envelope); more envelopes than bodies is the saving.
        self.sealed = 0
        self.envelopes = 0

    def body_for(self, message: Any) -> SharedBody | None:
        """The body of ``message`` if it is an ``append_entries`` with at least :attr:`min_bytes`
        of entries (the one sealed for the previous follower when it is the same), else None."""
        entries = message.get("entries") if type(message) is dict else None
        if not entries or message.get("type") != "append_entries":
            return None  # no entries: a heartbeat, a snapshot part or a chunk of one large entry
        size = 0
        for entry in entries:
            size += len(entry[0])
        if size < self.min_bytes or message.keys() != _APPEND_KEYS:
            return None  # (a body sealed is never this small: no need to look at the last one)
        self.envelopes += 1
        last = self._last
        if last is not None and last.serves(message):
            return last
        plain = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._counter += 1
        data = self._cipher.encrypt(nonce(self._counter), plain, _BODY_AAD.pack(self._salt, self._counter))
        self._last = SharedBody(message, self._salt, self._counter, data)
        self.sealed += 1
        return self._last


def envelope_plaintext(body: SharedBody, peer_key: bytes) -> bytes:
    """The plaintext of the envelope of ``body`` to the peer whose handshake key is ``peer_key``."""
    tag = body.data[-TAG_BYTES:]
    return _ENVELOPE.pack(ENVELOPE_MAGIC, body.salt, body.counter, len(body.data), tag) + peer_key


def read_envelope(plain: bytes, own_key: bytes | None, max_body_bytes: int) -> Envelope:
    """The envelope in an authenticated frame's plaintext ``plain`` (it starts with
    :data:`ENVELOPE_MAGIC`) on a connection where this side chose the handshake key ``own_key``.

    Raises:
        ValueError: malformed, for another connection, or a body over ``max_body_bytes``.
    """
    if own_key is None or len(plain) != _ENVELOPE.size + len(own_key):
        raise ValueError("a malformed envelope")
    _magic, salt, counter, length, tag = _ENVELOPE.unpack_from(plain)
    if not hmac.compare_digest(plain[_ENVELOPE.size :], own_key):
        raise ValueError("an envelope for another connection")
    if not TAG_BYTES < length <= max_body_bytes:
        raise ValueError("a body length out of bounds")
    return Envelope(salt, counter, length, tag)
