"""The ``[raft]`` section of the cluster file: Raft timing and replication bounds of every group
(docs/operations.md; turned into each group's settings by ``cluster/node/raft_settings.py``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RaftTimingConfig"]


@dataclass(frozen=True)
class RaftTimingConfig:
    # Failover takes one election timeout (plus a vote round): 0.8-1.6 s keeps it under 3 s while
    # staying far above a loaded tick (heartbeats go every 100 ms: 8 per shortest election timeout,
    # etcd's ratio). Entries and commit indexes go at once, not with the heartbeats, so the period
    # sets only an idle group's cost: its messages are most of an idle node's CPU.
    election_min_ms: int = 800
    election_max_ms: int = 1600
    heartbeat_ms: int = 100
    leader_fallback_ms: int = 2000
    compaction_min_entries: int = 20_000
    compaction_min_time_s: int = 120
    compaction_max_bytes: int = 64 * 1024 * 1024
    group_commit_bytes: int = 256 * 1024  # coalesce produce requests into entries up to this size
    group_commit_inflight: int = 2  # entries in flight per group before requests accumulate
    retention_check_ms: int = 10_000  # how often a queue group's leader proposes a retention tick
    # How far a retain tick's time may move past the stamps' own progress (a leader clock that
    # jumped ahead); at least 3 retention_check_ms is used. Other commands move the group's time by
    # at most storage.keys.GROUP_MAX_STEP_MS. 0 for either: off, retain written as by releases
    # before it (only for a rolling upgrade).
    retention_max_jump_ms: int = 300_000
    retention_max_batches: int = 1000  # record batches one retain command removes at most
    # A leader queues at most about this much for one follower; more goes as the follower reads
    # (docs/architecture.md, "A leader's backlog to a follower").
    max_follower_backlog_bytes: int = 8 * 1024 * 1024
    # A replica downloading a checkpoint for a snapshot install gives up on a peer that sends
    # nothing for this long (per socket operation; the archive arrives as the peer makes it).
    checkpoint_io_timeout_ms: int = 30_000
