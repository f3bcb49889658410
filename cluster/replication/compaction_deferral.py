"""A leader's journal compaction held back for a follower behind (``pso.defer_compaction``),
counted and logged once per deferral.

A deferral starts at the first tick at which a due compaction is held back because a connected
follower would otherwise need a snapshot, and ends at the first tick it is not: the compaction runs
(no connected follower is behind the cut any more, or the journal passed the cap and the follower
behind gets its snapshot), or this replica stopped leading. Each is logged twice, when it starts
(``journal_compaction_deferred``) and when it ends (``journal_compaction_resumed``, with its
duration), however many ticks it holds: a deferral of minutes logs two lines, not one per tick.

Invariant: ``deferrals`` counts the deferrals started; one is open exactly while ``_since`` is
set. Tick thread only (metrics read ``deferrals``).
"""

from __future__ import annotations

import structlog

__all__ = ["CAUGHT_UP", "NOT_LEADING", "OVER_CAP", "CompactionDeferrals"]

log = structlog.get_logger(__name__)

# Why a deferral ended (the ``reason`` of ``journal_compaction_resumed``).
# The compaction runs: every connected follower was sent the entries up to the cut (a follower
# that stays silent for the longest election timeout is disconnected, and no longer counts).
CAUGHT_UP = "no_follower_behind"
OVER_CAP = "journal_over_cap"  # the compaction runs; a follower still behind gets a snapshot
NOT_LEADING = "not_leading"  # this replica stepped down: its own compaction needs no follower


class CompactionDeferrals:
    """The deferrals of one group's journal compaction on this replica (``cap_bytes``: the journal
    size at which a deferral ends anyway)."""

    def __init__(self, group: str, cap_bytes: int) -> None:
        self.group = group
        self.cap_bytes = cap_bytes
        self.deferrals = 0
        self._since: float | None = None  # when the open deferral started (monotonic seconds)

    @property
    def deferring(self) -> bool:
        return self._since is not None

    def held(self, now_s: float, journal_bytes: int, followers_behind: int) -> None:
        """A tick held a due compaction back for ``followers_behind`` connected followers."""
        if self._since is not None:
            return
        self._since = now_s
        self.deferrals += 1
        log.info(
            "journal_compaction_deferred",
            group=self.group,
            journal_bytes=journal_bytes,
            cap_bytes=self.cap_bytes,
            followers_behind=followers_behind,
        )

    def released(self, now_s: float, journal_bytes: int, *, leading: bool) -> None:
        """A tick held nothing back: its compaction runs, or this replica no longer leads."""
        if self._since is None:
            return
        duration_s = now_s - self._since
        self._since = None
        reason = OVER_CAP if journal_bytes > self.cap_bytes else CAUGHT_UP if leading else NOT_LEADING
        log.info(
            "journal_compaction_resumed",
            group=self.group,
            duration_s=round(duration_s, 3),
            journal_bytes=journal_bytes,
            cap_bytes=self.cap_bytes,
            reason=reason,
        )
