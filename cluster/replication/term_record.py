"""Who raised a Raft replica's term, and why: the record that tells an election the group's own
voters held (a follower of a stalled machine that timed out) from one a replica outside them caused
(a removed voter that never learnt of its removal, campaigning with a higher term).

``raft.py`` feeds it on the tick thread: after every message whose handling raised the term (the
sender and the message's type name the cause), and at every tick and message, where a term risen
since the last look without a message is the replica's own campaign. A rise that ended this
replica's leadership is counted once more, as a deposition. Nothing here does I/O or reads a clock.

Bounded: the causes are the five below, and a sender is named by its address only when it is one of
this replica's voters or a peer the placement hints (``RaftGroup.hint_peers``); any other sender is
counted under ``"other"``. What a client or a stranger sends never adds a row.

Threads: the tick thread writes; any thread reads :meth:`TermRecord.rows` (copies).
"""

from __future__ import annotations

from collections.abc import Callable

from raftmq.cluster.replication.contract import TermRise

__all__ = [
    "APPEND_ENTRIES",
    "CAMPAIGN",
    "NON_VOTER_VOTE_REQUEST",
    "OTHER",
    "PRE_VOTE_GRANTED",
    "VOTE_REQUEST",
    "TermRecord",
    "TermRise",
]

# Its own election: a majority granted its pre-vote (pre_vote.py) ...
PRE_VOTE_GRANTED = "pre_vote_granted"
# ... or not: a leadership transfer, a lone voter, a round a majority left unanswered, or answered
# with terms behind its own (pysyncobj drops a lower-term leader's messages: only a campaign helps).
CAMPAIGN = "campaign"
VOTE_REQUEST = "vote_request"  # a voter's candidacy
# A candidacy from outside its voters: the transport lets one through only when the candidate's log
# is ahead of this replica's (a voter added in entries it lacks); a removed voter's never.
NON_VOTER_VOTE_REQUEST = "non_voter_vote_request"
APPEND_ENTRIES = "append_entries"  # a leader of a higher term
OTHER = "other"  # a sender neither a voter nor hinted, or a message type raising no term in Raft


class TermRecord:
    """The term rises of one replica by (cause, peer), and which of them deposed it as leader."""

    def __init__(self, self_addr: str) -> None:
        self.self_addr = self_addr
        # The term at the last look; None: not looked at yet (the first look comes before the
        # replica can campaign: pysyncobj's first election deadline is a timeout away).
        self.term: int | None = None
        self.hinted: frozenset[str] = frozenset()  # peers the placement lists besides the voters
        # Whether a majority granted its pre-vote for a term (pre_vote.py; none: never).
        self.pre_vote_granted: Callable[[int], bool] = lambda _term: False
        self._rises: dict[tuple[str, str], int] = {}
        self._deposed: dict[tuple[str, str], int] = {}

    def look(self, term: int) -> None:
        """The term now, between messages: above the one last seen, it is the replica's own
        campaign (no message raised it since)."""
        if self.term is not None and term > self.term:
            cause = PRE_VOTE_GRANTED if self.pre_vote_granted(term) else CAMPAIGN
            self._count(self._rises, (cause, self.self_addr))
        self.term = term

    def raised(self, term: int, kind: str, sender: str, voter: bool, deposed: bool) -> None:
        """A message of type ``kind`` from ``sender`` (one of this replica's voters: ``voter``)
        raised the term to ``term``; ``deposed``: this replica led before it and does not now."""
        if kind == "request_vote":
            cause = VOTE_REQUEST if voter else NON_VOTER_VOTE_REQUEST
        else:  # pysyncobj adopts the term of no other message
            cause = APPEND_ENTRIES if kind == "append_entries" else OTHER
        key = (cause, sender if voter or sender in self.hinted else OTHER)
        self._count(self._rises, key)
        if deposed:
            self._count(self._deposed, key)
        self.term = term

    def rows(self) -> tuple[TermRise, ...]:
        """Every (cause, peer) counted so far, sorted (any thread: the dicts are copied whole)."""
        # Deposed first: the tick thread counts a rise before its deposition, so no row shows more
        # depositions than rises.
        deposed, rises = dict(self._deposed), dict(self._rises)
        return tuple(TermRise(c, p, n, deposed.get((c, p), 0)) for (c, p), n in sorted(rises.items()))

    @staticmethod
    def _count(counts: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
        counts[key] = counts.get(key, 0) + 1
