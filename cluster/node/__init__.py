"""The node process: its Raft groups, peers, checkpoints, ticks, cluster changes, sealing."""
