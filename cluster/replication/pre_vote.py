"""Raft's pre-vote (Ongaro's thesis, section 9.6), added to pysyncobj 0.3.17 through its seams.

pysyncobj's follower campaigns the moment its election deadline passes, with its term raised. A
follower that is only behind (its leader's messages queued unread behind a backlog, or one long
tick) cannot win, but its higher term makes the leader and the other voters adopt it: the leader
steps down, campaigns and wins again. A follower that then stays a candidate (it drops the
leader's messages of the old term without pushing its deadline) does it again every election
timeout: 58 leader changes in 2 minutes under load (docs/benchmarks.md, "Elections under load").

Here a follower (or candidate) whose deadline passed first asks every voter whether it would vote
for it at its term + 1 (``pre_vote``), and no term changes anywhere. A voter grants it
(``pre_vote_response``) only if the asker's log is at least as up to date as its own, it does not
lead, and it has not heard a leader within ``lease_s`` (half the minimum election timeout). With the
grants of a majority (itself included) the follower campaigns as pysyncobj does; otherwise it asks
again once another election timeout has passed. A follower kept at its leader's term reads that
leader's backlog as current messages, each of which pushes its deadline on.

A follower whose connection to its leader closes (the leader's process ended: its kernel closes
every socket at once, so both followers see it within milliseconds) does not wait out its election
timeout (``leader_lost``): it stops counting the leader as heard, so it grants pre-votes, and asks
itself soon, the survivors one after the other by address (``LOST_STEP`` of the lease apart), so
two of them rarely campaign at once and split the vote; one that grants another's pre-vote first
waits a whole timeout. A leader that is alive and whose connection only failed is still heard by
the others, who refuse: the follower's round is refused, and it grants pre-votes until it hears
its leader again (as it would once the lease ran out).

Invariants:
- Nothing here changes a term, a vote or a log entry: a pre-vote only decides *whether*
  pysyncobj's own election starts now, so Raft's safety is pysyncobj's.
- Liveness where pre-vote is not understood: when a majority of the voters left a round
  unanswered and the voters never seen answering one (nodes from before pre-vote ignore the
  message) could make a majority with the grants, the next timeout campaigns as pysyncobj would.
  A voter that answered before and is silent now is slow or cut off: no election.
- A replica whose term is above a majority's (its vote requests were lost after a campaign)
  campaigns when the answers say so (``voter_term``): pysyncobj drops a lower-term leader's
  messages unanswered and the voters refuse pre-votes while they hear that leader, so only a
  vote request carries its term to the group.
- A leadership transfer (``timeout_now``) and a lone voter campaign at once, as before.
- A group's preferred replica that starts (``ask_first``) asks as soon as a majority of the voters
  is connected, if that comes before its deadline, and refuses others' pre-votes until that round
  is over; an ordinary round of its own under way (its deadline came first) is never cut short.
- A round's answers count only while its term is above this replica's: once it reached that term
  otherwise (it voted for a candidate that asked at the same moment), they are stale.

Tick thread only: pysyncobj's ticks and message handlers run there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

__all__ = ["PRE_VOTE_MESSAGES", "PreVote", "install_pre_vote"]

PRE_VOTE_MESSAGES = frozenset({"pre_vote", "pre_vote_response"})  # handled here, never by pysyncobj
LOST_STEP = 0.25  # after a leader's connection closed, the survivors ask this share of the lease apart


class PreVote:
    """The pre-vote state of one replica (its ``SyncObj`` is ``sync``)."""

    def __init__(self, sync: Any, lease_s: float, clock: Callable[[], float]) -> None:
        self._sync = sync
        self.lease_s = lease_s
        # pysyncobj's clock, the one its deadlines are on (pso.py passes it; not time.monotonic)
        self._clock = clock
        self.heard_leader_at = -math.inf  # when the last append_entries of a leader came (clock)
        self._round_term: int | None = None  # the term the last round asked about
        self._answered: set[str] = set()  # voters (and self) that answered that round
        self._granted: set[str] = set()  # voters (and self) that granted it
        self._won_term: int | None = None  # a majority granted this term: campaign for it
        self._won_by_grants = False  # that majority granted it (not voters behind this term)
        # Voters seen answering a pre-vote: their silence means slow or cut off, not a release
        # from before pre-vote, so it lets no election start.
        self._capable: set[str] = set()
        self._behind: set[str] = set()  # voters of the last round whose term is below ours
        # A round started and no leader was heard since: the deadline the round pushed on says
        # nothing about a leader (pso.hears_a_leader).
        self.asking = False
        # ask_first: until when this starting preferred replica asks early and refuses others (clock)
        self._first_until: float | None = None
        self._first_asked = False
        self.rounds = 0  # rounds started (tests and metrics)
        self.campaigns_unanswered = 0  # campaigns after a round a majority left unanswered
        self.leaders_lost = 0  # the leader's connection closed (leader_lost): tests and metrics
        self._asks_early = False  # leader_lost brought this replica's deadline forward

    # -- the replica whose election deadline passed -----------------------------------------------

    def before_tick(self) -> None:
        """At the start of every tick, before pysyncobj's own election check: a due election waits
        for a majority's grants (the round pushes the deadline on)."""
        sync = self._sync
        if self._first_until is not None:
            self._first_tick()
        if sync._isLeader() or sync._SyncObj__raftElectionDeadline >= self._clock():
            return
        if sync._SyncObj__transferInProgress or not sync._SyncObj__otherNodes or sync.selfNode is None:
            return  # a transfer or a lone voter: pysyncobj campaigns at once (a non-voter never)
        if not sync._SyncObj__connectedNodes:
            return  # pysyncobj does not campaign either
        term = int(sync.raftCurrentTerm) + 1
        if self._won_term == term:
            return  # a majority would vote for it: pysyncobj campaigns in this tick
        if (
            self._round_term == term
            and not self._majority(self._answered)
            and self._majority(self._granted | self._maybe_old())
        ):
            # A majority left the round unanswered, and the grants with the voters never seen
            # answering one (a release before pre-vote ignores it) could make a majority:
            # campaign as pysyncobj would. A voter that answered before and is silent now is
            # slow or cut off, and lets no election start.
            self.campaigns_unanswered += 1
            return
        self._ask(term)

    def ask_first(self) -> None:
        """This replica is its group's preferred one (where the leader balancer moves the leadership)
        and starts: if a majority of the voters is connected before its election deadline passes, it
        asks at once instead of at the deadline, and until that round is over (a leader heard,
        refusals that leave no majority to grant, or the round's own deadline) it refuses the
        others' pre-votes (from this call on, before its round is sent too), so a replica that was
        already waiting to ask when it started does not split the vote with it. The round reaches a
        majority, whose answers count (none is taken for a release before pre-vote), and the voters
        that hear a leader refuse. If its deadline passes first, it goes on as any replica. (raftmq's
        replicas always have a ``selfNode``: no read-only pysyncobj node asks.)"""
        self._first_until = self._clock() + self._sync._SyncObj__conf.raftMaxTimeout

    def _first_tick(self) -> None:
        sync, now = self._sync, self._clock()
        assert self._first_until is not None
        if self._first_asked:
            if self.heard_leader_at != -math.inf or now > self._first_until:
                self._first_until = None
            return
        if (
            self.heard_leader_at != -math.inf
            or sync._SyncObj__raftElectionDeadline < now
            or self._round_term is not None
        ):
            self._first_until = None  # a leader is heard, or its deadline came first: as any replica
            return
        me = str(sync.selfNode.id)
        connected = sync._SyncObj__connectedNodes
        if self._majority({str(n.id) for n in sync._SyncObj__otherNodes if n in connected} | {me}):
            self._first_asked = True
            sync._SyncObj__raftElectionDeadline = 0.0  # ask in this tick
            self._first_until = now + sync._SyncObj__generateRaftTimeout()  # the round's own deadline

    def _maybe_old(self) -> set[str]:
        """The voters that left this round unanswered and never answered one."""
        voters = {str(node.id) for node in self._sync._SyncObj__otherNodes}
        return voters - self._answered - self._capable

    def _ask(self, term: int) -> None:
        sync = self._sync
        me = str(sync.selfNode.id)
        self._round_term, self._won_term = term, None
        self._answered, self._granted, self._behind = {me}, {me}, set()
        self.asking = True
        self.rounds += 1
        sync._SyncObj__raftElectionDeadline = self._clock() + sync._SyncObj__generateRaftTimeout()
        message = {
            "type": "pre_vote",
            "term": term,
            "last_log_index": sync._SyncObj__getCurrentLogIndex(),
            "last_log_term": sync._SyncObj__getCurrentLogTerm(),
        }
        for node in sync._SyncObj__otherNodes:
            sync._SyncObj__transport.send(node, message)

    def on_response(self, voter: str, message: dict[str, Any]) -> None:
        """A voter's ``pre_vote_response`` (the caller checked it comes from a voter)."""
        self._capable.add(voter)
        if self._round_term is None or message.get("term") != self._round_term or self._won_term is not None:
            return
        if self._round_term <= int(self._sync.raftCurrentTerm):
            # Stale: this replica reached the round's term otherwise (it voted for another
            # candidate, or heard a leader of it). Counted, it cut short the timer that vote
            # started and asked for the next term while the new leader was still unheard.
            return
        self._answered.add(voter)
        if message.get("granted") is True:
            self._granted.add(voter)
        if self._first_asked and self._first_until is not None:  # the starting preferred replica only
            sync = self._sync
            voters = {str(node.id) for node in sync._SyncObj__otherNodes} | {str(sync.selfNode.id)}
            if not self._majority(voters - (self._answered - self._granted)):
                self._first_until = None  # the early round lost: its refusals leave no majority to grant
        voter_term = message.get("voter_term")
        if type(voter_term) is int and voter_term < int(self._sync.raftCurrentTerm):
            self._behind.add(voter)
        # A majority behind this replica's own term cannot hear it otherwise: pysyncobj drops a
        # lower-term leader's messages without an answer, and only a vote request carries a term
        # to the others. Such a replica (its requests lost after a campaign) campaigns, which makes
        # the group adopt its term, as plain Raft would; the voters still vote on the logs.
        if self._majority(self._granted) or self._majority(self._granted | self._behind):
            self._won_term = self._round_term
            self._won_by_grants = self._majority(self._granted)
            self._sync._SyncObj__raftElectionDeadline = 0.0  # campaign at the next tick

    def granted(self, term: int) -> bool:
        """Whether a majority granted this replica's round for ``term`` (its campaign for that
        term followed their grants, not answers behind its term: ``term_record.py``)."""
        return self._won_term == term and self._won_by_grants

    def _majority(self, voters: set[str]) -> bool:
        return len(voters) > (len(self._sync._SyncObj__otherNodes) + 1) / 2

    # -- every replica ------------------------------------------------------------------------------

    def heard_leader(self) -> None:
        """An append_entries of a leader at this replica's term or later arrived: the round under
        way ends (a grant of it arriving later, asked while the leader's message sat unread, would
        depose the leader this replica hears), one already won no longer counts, and this replica
        refuses pre-votes for ``lease_s``."""
        self.heard_leader_at = self._clock()
        self._round_term = self._won_term = None
        self.asking = False
        self._asks_early = False
        self._first_until = None

    def leader_lost(self, leader: str) -> None:
        """The connection to ``leader``, the leader this replica follows, closed. It is no longer
        heard (this replica grants pre-votes), and this replica asks, unless its timer runs out
        first, after ``rank`` steps of ``LOST_STEP`` x the lease plus up to half a step at random:
        ``rank`` is its place by address among the voters but the lost leader, so the survivors
        ask one after the other and the second, asked by the first, grants (and then waits a whole
        election timeout: ``answer``). Once per leader heard: the reconnects that fail after it
        change nothing more."""
        sync = self._sync
        if self.heard_leader_at == -math.inf or sync.selfNode is None:
            return
        me = str(sync.selfNode.id)
        voters = sorted({str(node.id) for node in sync._SyncObj__otherNodes} - {leader} | {me})
        step = LOST_STEP * self.lease_s
        due = self._clock() + step * (voters.index(me) + random.random() / 2)
        self.heard_leader_at = -math.inf
        self.leaders_lost += 1
        if due < sync._SyncObj__raftElectionDeadline:
            sync._SyncObj__raftElectionDeadline = due
            self._asks_early = True

    def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The ``pre_vote_response`` to a voter's ``pre_vote``. Changes no term, vote or entry; a
        grant after ``leader_lost`` brought this replica's own deadline forward puts it back a whole
        election timeout on."""
        sync = self._sync
        term, index, last_term = (message.get(k) for k in ("term", "last_log_index", "last_log_term"))
        granted = (
            type(term) is int
            and type(index) is int
            and type(last_term) is int
            and term > sync.raftCurrentTerm
            and (last_term, index)
            >= (sync._SyncObj__getCurrentLogTerm(), sync._SyncObj__getCurrentLogIndex())
            and not sync._isLeader()
            and self._clock() - self.heard_leader_at >= self.lease_s
            and (self._first_until is None or self._clock() > self._first_until)
        )
        if granted and self._asks_early:
            # Another survivor of a lost leader asks first: it will campaign, so this one waits a
            # whole election timeout rather than asking soon itself and splitting the vote.
            self._asks_early = False
            sync._SyncObj__raftElectionDeadline = max(
                sync._SyncObj__raftElectionDeadline, self._clock() + sync._SyncObj__generateRaftTimeout()
            )
        return {
            "type": "pre_vote_response",
            "term": term if type(term) is int else None,
            "granted": bool(granted),
            "voter_term": int(sync.raftCurrentTerm),
        }


def install_pre_vote(sync: Any, lease_s: float, clock: Callable[[], float]) -> PreVote:
    """Put pre-vote in front of ``sync``'s elections: its tick (an instance attribute: pysyncobj's
    tick thread and ``doTick`` look ``_onTick`` up on the object) asks first, and
    ``FlushingTransport`` hands it the pre-vote messages (``sync.raftmq_pre_vote``). ``clock``:
    pysyncobj's, which its election deadline is on (pso.py's ``monotonic``; not ``time.monotonic``)."""
    pre_vote = PreVote(sync, lease_s, clock)
    tick = sync._onTick

    def on_tick(timeToWait: float = 0.0) -> None:
        pre_vote.before_tick()
        tick(timeToWait)

    sync.raftmq_pre_vote = pre_vote
    sync._onTick = on_tick
    return pre_vote
