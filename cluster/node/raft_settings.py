"""A replicated group's Raft settings, from the cluster file (``[raft]``, docs/operations.md)."""

from __future__ import annotations

from raftmq.cluster.base.groups import META
from raftmq.cluster.config.cluster_file import ClusterConfig
from raftmq.cluster.replication.contract import RaftSettings

__all__ = ["group_raft_settings"]


def group_raft_settings(config: ClusterConfig, password: str, name: str, node_id: str) -> RaftSettings:
    """The settings of group ``name`` under the Raft key ``password`` on node ``node_id``."""
    timing = config.raft
    return RaftSettings(
        password=password,
        fsync=config.durability == "fsync",
        election_min_s=timing.election_min_ms / 1000,
        election_max_s=timing.election_max_ms / 1000,
        heartbeat_s=timing.heartbeat_ms / 1000,
        leader_fallback_s=timing.leader_fallback_ms / 1000,
        compaction_min_entries=timing.compaction_min_entries,
        compaction_min_time_s=timing.compaction_min_time_s,
        compaction_max_bytes=timing.compaction_max_bytes,
        max_entry_bytes=config.limits.max_request_bytes + 64 * 1024,
        crash_after_snapshot=config.faults.crash_after_snapshot,
        # A metadata write through a follower waits for its replica (router._metadata_applied).
        prompt_commit_notice=name == META,
        max_follower_backlog_bytes=timing.max_follower_backlog_bytes,
        # TEST FAULT: the release before shared bodies on its Raft wire neither offers nor reads them.
        shared_bodies=config.faults.previous_release_node != node_id,
    )
