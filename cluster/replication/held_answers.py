"""A leader's submits left unanswered when it loses its leadership (:class:`HeldAnswers`).

pysyncobj answers a leader's command when its replica applies the entry's index (its result, or
``DISCARDED`` when another entry took the index). A leader that lost its leadership applies that
index only when the next leader's log reaches it: under a leadership transfer within an election;
in an idle group or one without a quorum, never. The commands are held for a grace instead of
answered at once, so that one the next leader commits is answered with its result.
"""

from __future__ import annotations

import math
from typing import Any

import structlog

from raftmq.cluster.replication.contract import RaftSettings
from raftmq.cluster.replication.pso import FAIL_REASON, monotonic

__all__ = ["HeldAnswers"]

log = structlog.get_logger(__name__)


class HeldAnswers:
    """The commands of a leader that lost its leadership with their entries above its commit
    index (tick thread; :meth:`hold` at the loss). pysyncobj answers a command only when this
    replica applies the entry's index, which comes when the next leader's log grows that far:
    in an idle group or one without a quorum, never. Such an entry may yet commit under the next
    leader (often this replica again, or the one a transfer handed over to) or vanish: each is
    held for ``grace_s`` (about an election and the new leader's first commit), answered by
    pysyncobj meanwhile if its index is applied here (its result, or ``DISCARDED`` for another
    entry there), else ``LEADER_CHANGED`` (an unknown outcome) at the end (``grace_s``: two
    election timeouts from the last loss; none while this replica leads again with the entry
    still in its log).
    Answered unknown at once, a ``receive`` that then committed leased its messages to nobody
    for a visibility timeout (a push stream stalled 30 s across a transfer)."""

    def __init__(self, sync: Any, settings: RaftSettings) -> None:
        self._sync = sync
        self._grace_s = 2 * settings.election_max_s
        self._held: list[tuple[float, int, Any]] = []  # (deadline, index, (term, callback))
        sync.addOnTickCallback(self._after_tick)

    def hold(self) -> None:
        """The leader just lost its leadership: hold what waits above its commit index, and what
        it still held from an earlier loss (it led again meanwhile), for a grace from now."""
        waiting = self._sync._SyncObj__commandsWaitingCommit
        commit = int(self._sync.raftCommitIndex)
        deadline = monotonic() + self._grace_s
        above = sorted(i for i in waiting if i > commit)
        fresh = [(index, entry) for index in above for entry in waiting[index]]
        seen = {(index, id(entry)) for index, entry in fresh}
        earlier = [(index, entry) for _, index, entry in self._held if (index, id(entry)) not in seen]
        self._held = [(deadline, index, entry) for index, entry in earlier + fresh]

    def answer_all(self) -> None:
        """Answer every command still held, unknown (the replica stops: its tick thread is gone)."""
        self._held = [(0.0, index, entry) for _, index, entry in self._held]  # all past due
        self._answer(leading=False)

    def _after_tick(self) -> None:
        """After each tick (a state change comes within one, before this reads a deadline)."""
        if self._held:
            self._answer(leading=self._sync._isLeader())

    def _answer(self, leading: bool) -> None:
        """Forget the held commands pysyncobj answered; answer those past their deadline, and
        those whose index this replica passed without applying it (a checkpoint installed over
        it: pysyncobj never answers them). ``leading``: this replica leads again, so an entry
        still in its log (its index and term there) waits without a deadline, answered by its
        own commit (its no-op commits every entry of its log below it); counted from the first
        loss, the grace could end just before that commit and answer ``LEADER_CHANGED``
        (unknown) for an entry that then committed. It restarts at the next loss (:meth:`hold`).
        One its log lost while it followed (another leader's entries cut it) keeps its grace:
        no commit of this replica answers it (its index holds another entry, or is past the log
        and applied only when the log grows that far: in an idle group, never), and it is not
        provably gone either (a replica that holds it may yet lead and commit it)."""
        if leading:
            self._held = [
                (math.inf if self._in_log(index, entry) else deadline, index, entry)
                for deadline, index, entry in self._held
            ]
        waiting = self._sync._SyncObj__commandsWaitingCommit
        now, kept, applied = monotonic(), [], int(self._sync.raftLastApplied)
        for deadline, index, entry in self._held:
            entries = waiting.get(index)
            if entries is None or entry not in entries:
                continue  # applied here (pysyncobj answered it)
            if now < deadline and index > applied:
                kept.append((deadline, index, entry))
                continue
            entries.remove(entry)
            if not entries:
                del waiting[index]
            try:  # one failing callback must not cut the others short
                entry[1](None, FAIL_REASON.LEADER_CHANGED)
            except Exception:
                log.exception("uncommitted_answer_failed", index=index)
        self._held = kept

    def _in_log(self, index: int, entry: Any) -> bool:
        """The held entry is still in this replica's log: its index there has the entry's term."""
        there = self._sync._SyncObj__getEntries(index, 1)  # [] below the log's first or past its last
        return bool(there) and int(there[0][2]) == int(entry[0])
