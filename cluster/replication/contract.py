"""What the Raft adapter (``raft.py``) offers and asks, free of pysyncobj: the state machine it
replicates into (:class:`StateMachine`), a group's settings (:class:`RaftSettings`), how a
submitted command ended (:class:`Outcome`), a replica's status (:class:`GroupStatus`, with who
raised its term: :class:`TermRise`), and :class:`RaftBindError`. Callers import these without
loading pysyncobj's types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from raftmq.errors import RaftmqError
from raftmq.storage.store import Store

__all__ = ["GroupStatus", "Outcome", "RaftBindError", "RaftSettings", "StateMachine", "TermRise"]


class StateMachine(Protocol):
    """What a Raft group replicates into. ``apply`` must be pure and must not raise."""

    @property
    def store(self) -> Store: ...

    @property
    def applied_index(self) -> int: ...

    def apply(self, index: int, command: bytes) -> Any: ...

    def restore(self, checkpoint_dir: str) -> None:
        """Replace the whole state with a checkpoint taken on a peer."""
        ...


class RaftBindError(RaftmqError):
    """A Raft group could not listen on its address (the port is taken or not local)."""


@dataclass(frozen=True)
class RaftSettings:
    """Timing and durability of one group. Defaults favour low latency and stable leadership."""

    password: str
    fsync: bool = True
    election_min_s: float = 0.8
    election_max_s: float = 1.6
    heartbeat_s: float = 0.1
    # The tick thread sleeps until its own next deadline (a leader's next heartbeat, a follower's
    # or candidate's election deadline), at most max_tick_s; a message, a proposal or a call queued
    # for it wakes it sooner. tick_s is its period while that deadline has passed and nothing
    # happens (a follower cut off from every peer waits to reconnect before it campaigns).
    tick_s: float = 0.05
    max_tick_s: float = 0.5
    leader_fallback_s: float = 2.0  # a cut-off leader steps down after this long
    connection_retry_s: float = 0.5
    compaction_min_entries: int = 20_000
    compaction_min_time_s: float = 120.0
    compaction_max_bytes: int = 64 * 1024 * 1024
    max_entry_bytes: int = 256 * 1024
    crash_after_snapshot: bool = False  # test fault: exit between snapshot and journal compaction
    # A replica joining a running group starts with an empty log: it must not campaign (its higher
    # term would depose the leader, and it cannot win) until a leader reached it. Its election
    # deadline is pushed this far ahead, again and again, until then.
    join_quiet_s: float = 30.0
    # A leader that has just applied entries tells its followers the new commit index at once, in
    # an append_entries of its own (pysyncobj's way: one more message to each follower per commit,
    # and its reply). False: the commit index goes with the leader's next entries or heartbeat,
    # whichever comes first, and a follower applies up to one heartbeat later. No answer to a
    # client waits on a follower's apply (reads go to the leader unless asked otherwise).
    prompt_commit_notice: bool = True
    # A leader queues at most about this much for one follower (follower_backlog.py): a follower
    # that reads more slowly than its leader writes is sent more as it reads, not all at once.
    max_follower_backlog_bytes: int = 8 * 1024 * 1024
    # A leader seals an append_entries that is the same for several followers once, and sends each
    # follower that reads them an envelope of its own and that body (shared_bodies.py). False: the
    # release before (a test fault plays it): it neither offers nor reads them.
    shared_bodies: bool = True


@dataclass(frozen=True)
class Outcome:
    """How a submitted command ended. ``error`` is an error code from ``cluster/base/errors.py``;
    ``definite=False`` means the command may or may not have been applied."""

    result: Any = None
    error: str | None = None
    definite: bool = True


@dataclass(frozen=True)
class TermRise:
    """Times a replica's term rose for one ``cause`` that ``peer`` (a Raft address, or ``"other"``)
    brought; ``deposed``: how many of them ended its leadership (``term_record.py``)."""

    cause: str
    peer: str
    count: int
    deposed: int = 0


@dataclass(frozen=True)
class GroupStatus:
    name: str
    leader: str | None  # Raft address of the leader this replica knows, if any
    is_leader: bool
    term: int
    commit_index: int
    applied_index: int
    state_index: int  # the state machine's applied_index (last non-empty entry applied)
    has_quorum: bool
    journal_entries: int
    members: tuple[str, ...] = ()  # Raft addresses of the voters as this replica sees them
    # It leads, or its leader reached it within its election timeout (every message from the
    # leader pushes that deadline on): what it applies is current, not a cut-off replica's.
    hears_leader: bool = False
    term_rises: tuple[TermRise, ...] = ()  # since this replica started, by (cause, peer)
