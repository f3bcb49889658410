"""The Raft adapter: one :class:`RaftGroup` per replicated group, on pysyncobj through ``pso.py``.

pysyncobj (pinned to 0.3.17) provides elections and replication. This module makes it durable and
safe to embed (each hazard, as docs/architecture.md lists them under "The hazards and what
neutralises each", and what neutralises it):

1. No fsync → :class:`~raftmq.cluster.replication.journal.DurableJournal` replaces the journal through
   the ``createJournal`` seam; the transport flushes it before every message but a leader's entries, and
   before it hands a follower's acknowledgement to pysyncobj, and a tick callback after every tick (and
   each tick begins so: one that failed before its end did not, and a lone voter counts itself at once),
   so an entry is synced before it is acknowledged or counted (a leader's own fsync overlaps the followers').
2. Snapshot/compaction crash window → the deserializer aligns the journal to the snapshot before
   pysyncobj compares them, and compaction fsyncs the snapshot's directory first.
3. ``journalFile`` without ``fullDumpFile`` → both are always set here.
4. Torn journal → checksummed records; a bad tail is cut on load, a bad record in the middle
   stops the start (``JournalCorruptError``; ``raftmq repair-journal``).
5. Truncation of matching entries → a no-op in the journal.
6. Replay after restart → the state machine skips indexes at or below its ``applied_index``.
Poison pills: the state machine never raises; a storage failure stops the process.
Snapshots are manifests (a few hundred bytes); a replica whose state is behind a snapshot pulls a
RocksDB checkpoint from a peer out of band (``fetch_checkpoint``), never through Raft's 64 KiB chunks.
That install is all or nothing: pysyncobj sees the snapshot only once a verified checkpoint was
restored (``snapshot_gate.py``); until then the follower's state, journal and commit index stay as
they were and the leader sends the snapshot again.

Membership (``dynamicMembershipChange``): single-server changes, one at a time
(:meth:`RaftGroup.change_membership`; ``voter_changes.py``). Votes count only between voters:
the transport drops vote requests and votes from non-voters, so a removed voter that never learnt of
its removal cannot depose the leader with its campaigns. A group's voters are what its own log says:
the snapshot manifest records the voters as of its last entry (pysyncobj would store the live set,
which may include an uncommitted change), and on start the voters are that set plus the membership
entries after it in the journal (Raft's rule: the latest configuration in the log counts, committed
or not). ``peer_addrs`` only seeds a group whose log holds no configuration yet. Every term rise is
recorded by cause and sender (``term_record.py``: the term before and after each message; a rise
between messages is the replica's own campaign), for its status and metrics.

Reads that must see every acknowledged write wait for ``reads.ready()`` (``leader_reads.py``).
Threading: every apply, callback, journal write and snapshot hook runs on the group's tick thread;
``submit`` may be called from any thread (its ``on_done`` runs there and must be short); a snapshot
install's checkpoint is fetched and checked on a background thread of its own.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from raftmq.cluster.base.timing import LatencyHistogram
from raftmq.cluster.replication.admission import RaftAdmission
from raftmq.cluster.replication.contract import (
    GroupStatus,
    Outcome,
    RaftBindError,
    RaftSettings,
    StateMachine,
)
from raftmq.cluster.replication.failures import failure_outcome
from raftmq.cluster.replication.held_answers import HeldAnswers
from raftmq.cluster.replication.journal import DurableJournal, Entry
from raftmq.cluster.replication.log_filter import install_log_filter
from raftmq.cluster.replication.members import members_after, members_on_start
from raftmq.cluster.replication.pso import (
    FAIL_REASON,
    PINNED_PYSYNCOBJ,
    FlushingTransport,
    RaftNode,
    RaftNodeSyncObj,
    SyncObjConf,
    SyncObjException,
    hears_a_leader,
    install_journal_seam,
    install_tick_seams,
    membership_change,
    monotonic,
    replicated,
    stop_tick_thread,
    voters_now,
    wake_tick_thread,
)
from raftmq.cluster.replication.shared_bodies import SharedBodies
from raftmq.cluster.replication.snapshot_gate import (
    EXIT_STORAGE_FAILURE,
    SnapshotGate,
    entry_from_json,
    entry_to_json,
    fsync_dir,
    read_durable_manifest,
    read_manifest,
    write_manifest,
)
from raftmq.cluster.replication.term_record import TermRecord
from raftmq.cluster.replication.voter_changes import VoterChanges, live_members
from raftmq.storage.durable_dirs import make_dirs_durable
from raftmq.storage.store import Store, StoreError

__all__ = [
    "PINNED_PYSYNCOBJ",
    "GroupStatus",
    "Outcome",
    "RaftBindError",
    "RaftGroup",
    "RaftSettings",
    "StateMachine",
    "members_after",
    "membership_change",
]

log = structlog.get_logger(__name__)

_VOTE_LOG_EVERY_S = 10.0  # ignored votes are counted always, logged at most this often per group


class _GroupSyncObj(RaftNodeSyncObj):
    """pysyncobj's object with exactly one replicated method taking bytes (never add another:
    pysyncobj numbers replicated methods by sorted name)."""

    def __init__(self, group: RaftGroup, journal: DurableJournal, **kwargs: Any) -> None:
        # Set before SyncObj.__init__: its tick thread starts inside it and may send at once.
        self.raftmq_group = group
        self.raftmq_journal = journal
        super().__init__(**kwargs)
        group.terms.look(self._SyncObj__raftCurrentTerm)  # as loaded: a campaign is a timeout away

    def _onTick(self, timeToWait: float = 0.0) -> None:
        self.raftmq_journal.flush()  # a no-op unless the last tick failed before its end (hazard 1)
        super()._onTick(timeToWait)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> Any:
        # Inside a replicated method the entry being applied is raftLastApplied + 1.
        return self.raftmq_group._apply(self.raftLastApplied + 1, data)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        # SyncObj.__init__ registers self.__onMessageReceived: this override is what it finds. The
        # snapshot gate sees messages first; term rises are recorded (term_record.py).
        terms, term, leading = self.raftmq_group.terms, self._SyncObj__raftCurrentTerm, self._isLeader()
        terms.look(term)  # risen since the last look, by no message: its own campaign
        gated = self.raftmq_group.snapshot_gate.gate(int(term), int(self.raftCommitIndex), message)
        try:
            super()._SyncObj__onMessageReceived(node, gated)
        finally:  # a rise by a message whose handling then failed is still the sender's
            if self._SyncObj__raftCurrentTerm != term:
                voter, deposed = node in self._SyncObj__otherNodes, leading and not self._isLeader()
                terms.raised(self._SyncObj__raftCurrentTerm, message["type"], str(node.id), voter, deposed)


class RaftGroup:
    """One replica of one Raft group: pysyncobj, a durable journal and a state machine."""

    def __init__(
        self,
        *,
        name: str,
        node_id: str,
        self_addr: str,
        peer_addrs: list[str],
        journal_store: Store,
        machine: StateMachine,
        snapshot_file: str,
        settings: RaftSettings,
        fetch_checkpoint: Callable[[dict[str, Any]], tuple[str, int]] | None = None,
        bind_addr: str | None = None,
        joining: bool = False,
        campaign_first: bool = False,
        admission: RaftAdmission | None = None,
    ) -> None:
        install_journal_seam()
        install_log_filter()
        self.name = name
        self.node_id = node_id
        self.self_addr = self_addr
        # Unauthenticated Raft connections: shared by the node's groups (the transport reads it).
        self.admission = admission if admission is not None else RaftAdmission()
        self.shared_bodies = settings.shared_bodies  # whether its transport offers them (pso.py)
        self._machine = machine
        self._settings = settings
        self._snapshot_file = snapshot_file
        self._fetch_checkpoint = fetch_checkpoint
        self._journal = DurableJournal(journal_store, fsync=settings.fsync, group=name)
        self._journal.before_compaction = self._before_compaction
        self._journal.on_storage_failure = self._journal_storage_failed
        self._destroyed = threading.Event()
        self.became_leader_count = 0  # written on the tick thread, read by metrics
        # Read by metrics: submit (at this node) until applied here, and one state machine apply.
        self.commit_latency = LatencyHistogram()
        self.apply_latency = LatencyHistogram()
        make_dirs_durable(os.path.dirname(snapshot_file))  # its entry too: fsync_dir covers what is in it
        fresh = len(self._journal) == 0 and not os.path.exists(snapshot_file)
        # Membership: (index, voters) the journal's entries after `index` apply to; see the docstring.
        self._base_index, self._base_members, members = members_on_start(
            read_manifest(snapshot_file), self._journal[:], list(peer_addrs)
        )
        self.peer_addrs = [a for a in members if a != self_addr]
        self._members: tuple[str, ...] = tuple(members)  # published by the tick thread
        self._loading_on_start = os.path.exists(snapshot_file)
        self._voter_changes = VoterChanges(name, self_addr, self._journal)  # tick thread only
        self.votes_ignored = 0  # vote requests and votes dropped from non-voters (tick thread)
        self.terms = TermRecord(self_addr)  # who raised this replica's term (tick thread writes)
        self._vote_log_at = 0.0  # tick thread
        self._hinted: frozenset[str] = frozenset()  # tick thread only
        self._tick_calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # Snapshot install, all or nothing (snapshot_gate.py).
        self.snapshot_gate = SnapshotGate(name, machine, fetch_checkpoint)
        conf = SyncObjConf(
            password=settings.password,
            journalFile=self._journal,
            fullDumpFile=snapshot_file,
            serializer=self._serialize,
            deserializer=self._deserialize,
            raftMinTimeout=settings.election_min_s,
            raftMaxTimeout=settings.election_max_s,
            appendEntriesPeriod=settings.heartbeat_s,
            autoTickPeriod=settings.tick_s,
            leaderFallbackTimeout=settings.leader_fallback_s,
            connectionRetryTime=settings.connection_retry_s,
            connectionTimeout=max(3.5, settings.election_max_s),
            # Send on every new entry (with a pipe wake-up) rather than once per period: latency.
            appendEntriesUseBatch=False,
            # Entries stay far below this, so pysyncobj's broken chunked path is never taken.
            appendEntriesBatchSizeBytes=max(2 * settings.max_entry_bytes, 1 << 20),
            logCompactionMinEntries=settings.compaction_min_entries,
            logCompactionMinTime=settings.compaction_min_time_s,
            dynamicMembershipChange=True,
            onStateChanged=self._on_state_changed,
            bindAddress=bind_addr,
            # Give up binding the Raft port after ~5 s (pysyncobj retries forever by default, and
            # silently): start-up then fails with RaftBindError instead of hanging.
            bindRetryTime=0.5,
            maxBindRetries=10,
        )
        self._sync = _GroupSyncObj(
            self,
            self._journal,
            selfNode=self_addr,
            otherNodes=self.peer_addrs,
            conf=conf,
            transportClass=FlushingTransport,
        )
        # Metrics read pre_vote, backlog, deferrals, snapshot_gate, the bodies sealed as a leader
        # (None: it offers none); reads.ready() is Raft's read rule (leader_reads.py).
        seams = install_tick_seams(self._sync, settings, self._busy, name)
        self.pre_vote, self.backlog, self.reads, self.compaction_deferrals = seams
        self.terms.pre_vote_granted = self.pre_vote.granted
        self.sealed_bodies: SharedBodies | None = self._sync._SyncObj__transport.shared_bodies
        self._held = HeldAnswers(self._sync, settings)  # a lost leadership's submits (held_answers.py)
        self._quiet = joining and fresh  # tick thread: until a leader reaches this replica
        if self._quiet:  # set before the first election deadline (the tick thread sleeps 0.1 s first)
            self._sync._SyncObj__raftElectionDeadline = monotonic() + self._settings.join_quiet_s
        elif not joining and not self.peer_addrs:
            # A lone voter campaigns at its first tick (nobody else can lead or vote: a start waited).
            self._sync._SyncObj__raftElectionDeadline = 0.0
        elif not joining and campaign_first:
            self.pre_vote.ask_first()  # the group's preferred replica asks early (pre_vote.py)
        try:
            self._sync.waitBinded()
        except SyncObjException:
            self._sync.destroy_synchronous()
            raise RaftBindError(f"group {name}: cannot listen on the Raft address {self_addr}") from None
        self._sync.addOnTickCallback(self._after_tick)

    # -- client side ------------------------------------------------------------------------------

    def submit(self, command: bytes, on_done: Callable[[Outcome], None]) -> None:
        """Propose ``command``. ``on_done`` is called once, on the tick thread, when the entry is
        applied here (result) or has failed; it must not block. May be called from any thread."""
        submitted = time.perf_counter()

        def callback(result: Any, error: int) -> None:
            # An exception escaping a pysyncobj callback makes the leader apply the entry twice.
            try:
                if error == FAIL_REASON.SUCCESS:
                    self.commit_latency.observe(time.perf_counter() - submitted)
                    on_done(Outcome(result=result))
                else:
                    on_done(failure_outcome(error))
            except Exception:
                log.exception("submit_callback_failed", group=self.name)

        if len(command) > self._settings.max_entry_bytes:
            on_done(Outcome(error="request_too_large", definite=True))
            return
        self._sync.apply_command(command, callback=callback)

    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    def leader(self) -> str | None:
        node = self._sync._getLeader()
        return None if node is None else str(node.id)

    def status(self) -> GroupStatus:
        s = self._sync
        return GroupStatus(
            name=self.name,
            leader=self.leader(),
            is_leader=self.is_leader(),
            term=int(s.raftCurrentTerm),
            commit_index=int(s.raftCommitIndex),
            applied_index=int(s.raftLastApplied),
            state_index=self._machine.applied_index,
            has_quorum=bool(s.hasQuorum),
            journal_entries=len(self._journal),
            members=self._members,
            hears_leader=hears_a_leader(s),
            term_rises=self.terms.rows(),
        )

    def members(self) -> tuple[str, ...]:
        """The voters (Raft addresses) this replica uses now, itself included."""
        return self._members

    def journal_stats(self) -> dict[str, float]:
        """Journal figures for metrics: retained bytes, fsync count and total fsync seconds."""
        j = self._journal
        return {"bytes": j.size_bytes, "syncs": j.syncs, "sync_seconds": j.sync_seconds}

    @property
    def fsync_latency(self) -> LatencyHistogram:
        """The journal's fsync durations (for metrics)."""
        return self._journal.sync_latency

    def transfer_leadership(self, to_addr: str | None = None, within_s: float = 2.0) -> None:
        """Ask this leader to hand leadership to ``to_addr`` (or any up-to-date peer). Best effort:
        pysyncobj refuses unless the target has matched the whole log, which under steady writes
        holds only between entries, so the request is retried every tick for up to ``within_s``
        seconds. Watch ``leader()`` for the result."""
        deadline = time.monotonic() + within_s

        def attempt() -> None:
            if self._destroyed.is_set() or not self.is_leader() or time.monotonic() > deadline:
                return
            refused: list[int] = []
            self._sync.transferLeadership(node=to_addr, callback=lambda _r, e: refused.append(e))
            if refused and refused[0] != FAIL_REASON.SUCCESS:
                self._tick_calls.put(attempt)  # the next tick, after this tick's acks were read

        self._on_tick_thread(attempt)

    def hint_peers(self, addrs: Iterable[str]) -> None:
        """Keep connections to ``addrs`` (the group's replicas as the placement says) besides the
        voters, so that this replica hears from a leader its own log does not know yet. Hints
        never vote, never count for a quorum and get no entries from this replica."""
        wanted = frozenset(addrs) - {self.self_addr}

        def apply() -> None:
            transport = self._sync._SyncObj__transport
            voters = {str(n.id) for n in self._sync.otherNodes}
            present = {str(n.id) for n in transport._nodes}  # a snapshot load may have dropped one
            for addr in sorted(wanted - voters - present):
                transport.addNode(RaftNode(addr))
            for addr in sorted((self._hinted - wanted - voters) & present):
                transport.dropNode(RaftNode(addr))
            self._hinted = self.terms.hinted = wanted

        self._on_tick_thread(apply, wake=wanted != self._hinted)  # the same again: the next tick

    def change_membership(self, action: str, addr: str, on_done: Callable[[Outcome], None]) -> None:
        """Add (``action="add"``) or remove (``"remove"``) the voter at Raft address ``addr``.

        One single-server change at a time: refused (``unavailable``, retriable) unless this
        replica leads, its leadership is established (its no-op entry applied) and no membership
        entry is uncommitted. ``on_done`` gets ``result={"changed": bool, "members": [...]}`` once
        the change is committed (``changed=False``: it was so already, committed), on the tick
        thread. A leader cannot remove itself (``bad_request``): transfer leadership first.
        """
        self._on_tick_thread(lambda: self._voter_changes.start(self._sync, action, addr, on_done))

    def _on_tick_thread(self, call: Callable[[], None], wake: bool = True) -> None:
        """Run ``call`` at the tick thread's next tick, waking it unless ``wake`` is False."""
        self._tick_calls.put(call)
        if wake:
            wake_tick_thread(self._sync)

    def _vote_ignored(self, node: Any, message: dict[str, Any]) -> None:
        """Tick thread: a vote request or vote from ``node``, not a voter here, was dropped."""
        self.votes_ignored += 1
        now = time.monotonic()
        if now >= self._vote_log_at:
            self._vote_log_at = now + _VOTE_LOG_EVERY_S
            log.warning(
                "vote_request_ignored",
                group=self.name,
                sender=str(node.id),
                message=message.get("type"),
                term=message.get("term"),
                ignored_total=self.votes_ignored,
            )

    def force_compaction(self) -> None:
        self._sync.forceLogCompaction()

    def destroy(self) -> None:
        """Stop the tick thread and close the transport (the stores stay open: the caller owns them)."""
        if not self._destroyed.is_set():
            self._destroyed.set()
            stop_tick_thread(self._sync)
            self._held.answer_all()  # the tick thread is gone: nothing would answer them

    # -- tick thread ------------------------------------------------------------------------------

    def _apply(self, index: int, data: bytes) -> Any:
        started = time.perf_counter()
        try:
            return self._machine.apply(index, data)
        except StoreError:
            # A replica that cannot write must stop; carrying on would let it diverge silently.
            log.critical("storage_failure_stopping", group=self.name, index=index, exc_info=True)
            os._exit(EXIT_STORAGE_FAILURE)
        finally:
            self.apply_latency.observe(time.perf_counter() - started)

    def _journal_storage_failed(self, error: StoreError) -> None:
        # Disk full or broken: pysyncobj would retry every tick; stop (the others carry on, it recovers).
        log.critical("journal_storage_failure_stopping", group=self.name, error=str(error))
        os._exit(EXIT_STORAGE_FAILURE)

    def _after_tick(self) -> None:
        self._journal.flush()
        self.terms.look(self._sync._SyncObj__raftCurrentTerm)  # this tick's campaign (messages follow)
        if self._journal.size_bytes > self._settings.compaction_max_bytes:
            self._sync.forceLogCompaction()
        if self._quiet:
            if self._sync._getLeader() is not None or len(self._journal) > 1:
                self._quiet = False  # a leader reached us: an ordinary voter from now on
            else:
                self._sync._SyncObj__raftElectionDeadline = monotonic() + self._settings.join_quiet_s
        for _ in range(self._tick_calls.qsize()):  # not those queued meanwhile: they wait a tick
            try:
                call = self._tick_calls.get_nowait()
            except queue.Empty:
                break
            try:
                call()
            except Exception:
                log.exception("tick_call_failed", group=self.name)
        self._members = voters_now(self._sync, self.self_addr, self._members)

    def _busy(self) -> bool:
        """Tick every ``tick_s``: entries await a commit, a call waits, a quiet joiner (not to campaign)."""
        waiting = len(self._journal) > 0 and self._journal[-1][1] > self._sync.raftCommitIndex
        return waiting or self._quiet or not self._tick_calls.empty()

    def _on_state_changed(self, old: int, new: int) -> None:
        names = {0: "follower", 1: "candidate", 2: "leader"}
        if new == 2:
            self.became_leader_count += 1
        elif old == 2:
            # A change this leader proposed is answered now (its entry may end up under a snapshot
            # here: never called back); other submits once applied here, or after a grace (held_answers.py).
            self._voter_changes.abandon("leadership_lost")
            self._held.hold()
        log.info(
            "raft_state_changed",
            group=self.name,
            node_id=self.node_id,
            state=names.get(new, str(new)),
            term=int(self._sync.raftCurrentTerm) if hasattr(self, "_sync") else None,
        )

    def _before_compaction(self) -> None:
        # pysyncobj renamed the new snapshot into place without syncing the directory; make the
        # rename durable before the journal entries it covers disappear.
        fsync_dir(os.path.dirname(self._snapshot_file))
        if self._settings.crash_after_snapshot:
            log.warning("test_fault_crash_after_snapshot", group=self.name)
            os._exit(137)

    # -- snapshots ------------------------------------------------------------------------------

    def _reset_election_deadline(self) -> None:
        """After a blocking checkpoint fetch on this tick thread: without this the replica would
        start an election (pysyncobj checks the deadline before reading the heartbeats queued)."""
        sync = getattr(self, "_sync", None)
        if sync is not None:
            sync._SyncObj__raftElectionDeadline = monotonic() + self._settings.election_max_s

    def _serialize(self, tmp_path: str, data: tuple[Entry, Entry, Any]) -> None:
        last, prev, _live_cluster = data
        # Invariant: the state covers every entry up to `last`; make it durable before the
        # journal entries up to it can be compacted away.
        self._machine.store.sync()
        # The voters as of `last` (pysyncobj's live set may hold a later, uncommitted change).
        members = members_after(self._base_members, self._journal[:], self._base_index, last[1])
        self._base_index, self._base_members = last[1], members
        manifest = {
            "format": 1,
            "group": self.name,
            "node_id": self.node_id,
            "raft_addr": self.self_addr,
            "state_index": self._machine.applied_index,
            "last": entry_to_json(last),
            "prev": entry_to_json(prev),
            "cluster": members,
        }
        write_manifest(tmp_path, manifest)

    def _deserialize(self, path: str) -> tuple[Entry, Entry, list[str]]:
        # The log gives way to a snapshot: a voter change's entry under it is never applied here.
        self._voter_changes.abandon("snapshot_loaded")
        manifest = read_durable_manifest(path)  # before pysyncobj replaces the journal with its entries
        last = entry_from_json(manifest["last"])
        prev = entry_from_json(manifest["prev"])
        self._journal.align_to_snapshot(prev, last)
        restart, self._loading_on_start = self._loading_on_start, False
        # A manifest from before membership changes has no "cluster": keep the voters in use.
        base = list(manifest.get("cluster") or live_members(self._sync, self.self_addr))
        entries = self._journal[:]
        if restart and len(entries) >= 2 and entries[0] == prev and entries[1] == last:
            members = members_after(base, entries, last[1])  # pysyncobj keeps this journal
        else:
            members = base  # an installed snapshot: pysyncobj clears the journal after this
        self._base_index, self._base_members = last[1], base
        if self._machine.applied_index < manifest["state_index"]:
            # The gate lets an installed snapshot through only once the state covers it, so this
            # is a start whose state is behind its own snapshot (see SnapshotGate.install_blocking).
            self.snapshot_gate.install_blocking(manifest, self._reset_election_deadline)
        # pysyncobj drops its own address only if its self node equals a str (a RaftNode): drop it here.
        return last, prev, [m for m in members if m != self.self_addr]
