"""Which incoming Raft connections a node keeps before they authenticate (pysyncobj-free).

Anyone who reaches a Raft port can open TCP connections to it; until a connection has named a node
of the group in frames sealed with the Raft key, it is a stranger's and costs the node a file
descriptor. :class:`RaftAdmission` is shared by every group (every Raft port) of a node and bounds
what strangers can hold:

- a connection that has not authenticated ``auth_timeout_s`` after it was accepted is closed
  (idle, garbage that is not a whole frame yet, or a slow trickle of bytes alike);
- at most ``max_unauthenticated`` connections are unauthenticated at once on the node, and at most
  ``max_per_source`` from one source address: a connection over either is closed as soon as it is
  accepted;
- every connection closed before it authenticated is counted by reason (:data:`REASONS`).

Invariant: ``unauthenticated`` is the number of connections admitted and not yet released, and
``sum(per_source.values()) == unauthenticated``. Thread-safe: each group's tick thread calls in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["REASONS", "AdmissionLimits", "RaftAdmission"]

# Why a connection was closed before it authenticated (the metric's label values).
NODE_LIMIT = "node_limit"  # refused at accept: the node's unauthenticated connections are at the cap
SOURCE_LIMIT = "source_limit"  # refused at accept: its source address's are at the cap
AUTH_TIMEOUT = "auth_timeout"  # not authenticated by the deadline
BAD_FRAME = "bad_frame"  # a frame that did not authenticate (wrong key, garbage, too long, a stranger)
REASONS = (NODE_LIMIT, SOURCE_LIMIT, AUTH_TIMEOUT, BAD_FRAME)


@dataclass(frozen=True)
class AdmissionLimits:
    """The bounds on a node's unauthenticated Raft connections (``[limits]`` raft_* keys)."""

    auth_timeout_s: float = 5.0
    max_unauthenticated: int = 512
    max_per_source: int = 64


class RaftAdmission:
    """One node's count of unauthenticated Raft connections, and of those closed, by reason."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self._lock = threading.Lock()
        self._per_source: dict[str, int] = {}
        self._unauthenticated = 0
        self._closed = dict.fromkeys(REASONS, 0)

    def admit(self, source: str) -> str | None:
        """Take a new connection from ``source`` into the count; the reason it must be closed
        instead (counted, and not taken in), or None."""
        with self._lock:
            reason = None
            if self._unauthenticated >= self.limits.max_unauthenticated:
                reason = NODE_LIMIT
            elif self._per_source.get(source, 0) >= self.limits.max_per_source:
                reason = SOURCE_LIMIT
            if reason is not None:
                self._closed[reason] += 1
                return reason
            self._per_source[source] = self._per_source.get(source, 0) + 1
            self._unauthenticated += 1
            return None

    def release(self, source: str, closed: str | None = None) -> None:
        """An admitted connection authenticated (``closed`` None) or was closed before (why)."""
        with self._lock:
            left = self._per_source.get(source, 0) - 1
            if left < 0:  # never admitted: nothing to release
                return
            if left:
                self._per_source[source] = left
            else:
                del self._per_source[source]
            self._unauthenticated -= 1
            if closed is not None:
                self._closed[closed] += 1

    @property
    def unauthenticated(self) -> int:
        return self._unauthenticated

    def closed(self) -> dict[str, int]:
        """Connections closed before they authenticated, by reason, since the node started."""
        with self._lock:
            return dict(self._closed)
