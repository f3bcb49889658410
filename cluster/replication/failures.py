"""What pysyncobj's failure reasons mean to raftmq's callers: the boundary with the library as a
table (:data:`FAILURES`), shared by a group's submits (``raft.py``) and its voter changes
(``voter_changes.py``)."""

from __future__ import annotations

from raftmq.cluster.replication.contract import Outcome
from raftmq.cluster.replication.pso import FAIL_REASON

__all__ = ["FAILURES", "failure_outcome"]

# pysyncobj failure reason -> (error code, definite)
FAILURES: dict[int, tuple[str, bool]] = {
    FAIL_REASON.QUEUE_FULL: ("unavailable", True),
    FAIL_REASON.MISSING_LEADER: ("unavailable", True),
    FAIL_REASON.DISCARDED: ("not_leader", True),  # another entry won this index: ours is gone
    FAIL_REASON.NOT_LEADER: ("not_leader", True),
    FAIL_REASON.LEADER_CHANGED: ("unknown_outcome", False),
    FAIL_REASON.REQUEST_DENIED: ("unavailable", True),
    FAIL_REASON.UNKNOWN_OUTCOME: ("unknown_outcome", False),
}


def failure_outcome(error: int) -> Outcome:
    """The outcome of a command pysyncobj failed with ``error`` (a reason not in the table: an
    unknown outcome, not definite)."""
    code, definite = FAILURES.get(error, ("unknown_outcome", False))
    return Outcome(error=code, definite=definite)
