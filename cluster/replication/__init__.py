"""Raft replication over pysyncobj: the adapter, its durable journal, group commit.

The only room importing pysyncobj (``replication/pso.py``, for the adapter ``raft.py``;
docs/architecture.md, "Layers")."""
