"""Raft's read rule for a leader (the Raft thesis, 6.4): :class:`LeaderReads` says whether this
replica's state may answer a read that must see every acknowledged write.

A replica that has just taken the leadership may hold entries that the previous leader committed
(and answered) which it has not applied: a follower learns the commit index only with its leader's
next message (a queue group's leader holds its commit notices back: ``pso.hold_commit_notices``),
and Raft lets a new leader count an entry committed only once an entry of its own term is. pysyncobj
0.3.17 appends a no-op entry of the new term the moment a replica becomes leader
(``SyncObj.__onBecomeLeader`` records its index as ``__noopIDx``) and applies entries on its tick.
Once that no-op is applied, every entry committed before it is applied too, so the leader's state
holds every write any leader acknowledged; until then a queue's high offset, a consumer group's
offsets and its lag read from it may be behind what clients were told.

This costs no Raft entry per read (the no-op is one per term), and holds for a replica that leads.
A leader cut off from its group goes on leading for up to ``leader_fallback_s`` and may miss writes
a newer leader acknowledged meanwhile: a read that must exclude that too waits for a barrier entry
proposed after it arrived (``LeaderActions.barrier``, shared by the reads waiting at once:
``cluster/node/barriers.py``), as the committed offsets do.

Invariant: :meth:`LeaderReads.ready` is True only while the replica leads in the very term in which
its tick thread saw the no-op of that term applied (the term is published by the tick thread, and
leadership and term are read again at every call, from any thread).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LeaderReads"]


class LeaderReads:
    """Whether the leader ``sync`` (a pysyncobj ``SyncObj``) has applied its term's no-op entry."""

    def __init__(self, sync: Any) -> None:
        self._sync = sync
        self._term = -1  # the last term whose no-op this replica applied as leader (tick thread)
        sync.addOnTickCallback(self._after_tick)

    def _after_tick(self) -> None:
        """Tick thread, after the tick's applies: record the term once its no-op is applied."""
        s = self._sync
        noop = s._SyncObj__noopIDx  # set on the tick thread, with the state, when it took the lead
        if s._isLeader() and noop is not None and s.raftLastApplied >= noop:
            self._term = int(s.raftCurrentTerm)

    def ready(self) -> bool:
        """This replica leads, and its state holds every entry committed before its term."""
        s = self._sync
        # The term read before and after the leadership: terms only rise, so equal reads pin one
        # term (the replica could lose and regain the lead in between, T to T+2, with its no-op
        # of T+2 not applied yet while _term still says T).
        term = int(s.raftCurrentTerm)
        leads = bool(s._isLeader())
        return leads and self._term == term == int(s.raftCurrentTerm)
