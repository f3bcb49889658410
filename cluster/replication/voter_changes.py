"""A Raft group replica's voter changes, one at a time (:class:`VoterChanges`, behind
``RaftGroup.change_membership``).

Membership (``dynamicMembershipChange``): single-server changes, effective on every replica as soon as
the entry is appended. pysyncobj's guard against a second change in flight is dead code, so
:meth:`VoterChanges.start` refuses one while a membership entry is uncommitted or its own change is
unanswered. pysyncobj calls a change back only once its entry is applied through this replica's log,
so the change in flight is answered ``unknown_outcome`` when its leader loses the leadership or a
snapshot replaces the log (:meth:`VoterChanges.abandon`); the late callback, if any, is ignored.

Tick thread only: every method but the constructor runs there, pysyncobj's callbacks too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import structlog

from raftmq.cluster.replication.contract import Outcome
from raftmq.cluster.replication.failures import failure_outcome
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.members import MembershipChange
from raftmq.cluster.replication.pso import FAIL_REASON, membership_change

__all__ = ["VoterChanges", "live_members"]

# Logged under the adapter's name, as before the voter changes had a module of their own.
log = structlog.get_logger("raftmq.cluster.replication.raft")


def live_members(sync: Any, self_addr: str) -> list[str]:
    """The voters pysyncobj's ``sync`` uses now, this replica (``self_addr``) included, sorted."""
    return sorted({str(n.id) for n in sync.otherNodes} | {self_addr})


class VoterChanges:
    """The voter change this replica proposed as its group's leader and has not answered: at most one."""

    def __init__(self, group: str, self_addr: str, journal: DurableJournal) -> None:
        self._group = group
        self._self_addr = self_addr
        self._journal = journal
        self.in_flight: MembershipChange | None = None

    def start(self, sync: Any, action: str, addr: str, on_done: Callable[[Outcome], None]) -> None:
        """Propose adding (``action="add"``) or removing (``"remove"``) the voter ``addr`` through
        ``sync`` (the group's ``SyncObj``), or answer ``on_done`` at once (what each answer means:
        ``RaftGroup.change_membership``)."""
        members = live_members(sync, self._self_addr)
        if not sync._isLeader():
            on_done(Outcome(error="not_leader"))
        elif action not in ("add", "remove") or (action == "remove" and addr == self._self_addr):
            on_done(Outcome(error="bad_request"))
        elif self.in_flight is not None or self._uncommitted(sync):
            # Also when the change asked for is the one in flight: "already so" must mean committed.
            on_done(Outcome(error="unavailable"))
        elif (action == "add") == (addr in members):
            on_done(Outcome(result={"changed": False, "members": members}))
        else:
            change = self.in_flight = MembershipChange(action, addr, on_done)
            log.info("membership_change", group=self._group, action=action, addr=addr)
            propose = sync.addNodeToCluster if action == "add" else sync.removeNodeFromCluster
            propose(addr, callback=functools.partial(self._done, sync, change))

    def abandon(self, reason: str) -> None:
        """Answer the change in flight as ``unknown_outcome`` (it may still commit under another
        leader; the caller checks the voters and retries, which is idempotent)."""
        change = self.in_flight
        if change is not None:
            log.info(
                "membership_change_abandoned",
                group=self._group,
                action=change.action,
                addr=change.addr,
                reason=reason,
            )
            self._answer(change, Outcome(error="unknown_outcome", definite=False))

    def _done(self, sync: Any, change: MembershipChange, _result: Any, error: int) -> None:
        if error == FAIL_REASON.SUCCESS:
            members = live_members(sync, self._self_addr)
            self._answer(change, Outcome(result={"changed": True, "members": members}))
        else:
            self._answer(change, failure_outcome(error))

    def _answer(self, change: MembershipChange, outcome: Outcome) -> None:
        """Answer ``change`` once and let the next one start. pysyncobj's callback comes only when
        the entry is applied through the log; :meth:`abandon` answers first when it may never come,
        and the late callback (if any) is then ignored here."""
        if self.in_flight is not change:
            return
        self.in_flight = None
        try:
            change.on_done(outcome)
        except Exception:  # an exception escaping a pysyncobj callback applies the entry twice
            log.exception("membership_callback_failed", group=self._group)

    def _uncommitted(self, sync: Any) -> bool:
        """A membership entry after ``sync``'s commit index is in the log."""
        commit = int(sync.raftCommitIndex)
        tail = self._journal[-64:]  # one change at a time: an uncommitted one is near the end
        return any(e[1] > commit and membership_change(e[0]) is not None for e in tail)
