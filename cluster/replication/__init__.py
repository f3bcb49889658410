"""Raft replication over pysyncobj: the adapter, its durable journal, group commit.

The only room importing pysyncobj (``replication/raft.py``; docs/architecture.md, "Layers")."""
