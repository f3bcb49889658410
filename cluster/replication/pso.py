"""pysyncobj 0.3.17 and raftmq's patches of it: the only module that imports pysyncobj.

The Raft adapter (``raft.py``) takes every pysyncobj name from here. The seams, each a place
pysyncobj (pinned exactly) lets a subclass or a module attribute in:

- ``syncobj.createJournal`` (module attribute): a :class:`DurableJournal` passed as ``journalFile``
  is used as is (:func:`install_journal_seam`);
- ``nodeClass=`` (constructor argument): :class:`RaftNode`, hashed in C (:class:`RaftNodeSyncObj`);
- ``transportClass=`` (constructor argument): :class:`FlushingTransport`, which flushes the journal
  before any message but a leader's entries leaves and before a follower's acknowledgement is read,
  filters votes from non-voters, connects to hinted peers and tells pre-vote when the leader's
  connection closes;
- the transport's two connection factories, ``TCPTransport.addNode`` (outgoing) and
  ``TCPTransport._onNewIncomingConnection`` (incoming, from ``TcpServer``): each connection is
  turned into a :class:`RaftConnection` before it sends or reads a byte;
- pysyncobj's handshake (``TCPTransport._onOutgoingConnected`` and the first step of
  ``_onIncomingMessageReceived``): the random key each side sends first carries the mark that says
  this node reads shared bodies (``shared_bodies.py``);
- the poller's ``poll`` (an attribute of the object's poller): the tick thread sleeps for as long as
  the adapter says, not pysyncobj's fixed ``autoTickPeriod`` (:func:`install_deadline_poll`);
- the object's ``_SyncObj__sendAppendEntries`` (an instance attribute): a leader's message that
  would carry nothing but its commit index waits for its next entries or heartbeat
  (:func:`hold_commit_notices`);
- the object's ``_SyncObj__tryLogCompaction`` (an instance attribute): a leader's due compaction
  waits while a connected follower would need a snapshot for it, counted (:func:`defer_compaction`).

:class:`RaftConnection` replaces how pysyncobj's ``TcpConnection`` frames, buffers and protects
messages (docs/architecture.md, "The Raft wire"): its frames, their buffers and their AES-256-GCM
are ``wire.py``'s, which needs no pysyncobj; what is here hooks them into pysyncobj's connection.
pysyncobj's handshake stays as it is: each side sends a random 32-byte key first, and every later
message must carry the key its receiver chose, so a frame recorded on one connection is worthless
on another.
"""

from __future__ import annotations

import errno
import functools
import operator
import socket
from collections.abc import Callable
from typing import Any

import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso_syncobj
import structlog
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.monotonic import monotonic
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from raftmq.cluster.replication.admission import AUTH_TIMEOUT, BAD_FRAME, RaftAdmission
from raftmq.cluster.replication.compaction_deferral import CompactionDeferrals
from raftmq.cluster.replication.contract import RaftSettings
from raftmq.cluster.replication.follower_backlog import FollowerBacklog, bound_follower_backlog
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.leader_reads import LeaderReads
from raftmq.cluster.replication.pre_vote import PRE_VOTE_MESSAGES, PreVote, install_pre_vote
from raftmq.cluster.replication.shared_bodies import SharedBodies, handshake_key
from raftmq.cluster.replication.wire import RECV_CHUNK_BYTES, FrameTooLarge, FrameWire, SendQueue, raft_key

log = structlog.get_logger(__name__)

__all__ = [
    "CONNECT_CHECK_S",
    "FAIL_REASON",
    "PINNED_PYSYNCOBJ",
    "FlushingTransport",
    "RaftConnection",
    "RaftNode",
    "RaftNodeSyncObj",
    "SyncObj",
    "SyncObjConf",
    "SyncObjException",
    "TCPNode",
    "compaction_due",
    "defer_compaction",
    "followers_behind_compaction",
    "hears_a_leader",
    "hold_commit_notices",
    "install_deadline_poll",
    "install_journal_seam",
    "install_tick_seams",
    "membership_change",
    "monotonic",
    "only_the_commit_index_to_send",
    "own_deadline_s",
    "pso_pickle",
    "replicated",
    "stop_tick_thread",
    "voters_now",
    "wake_tick_thread",
]

PINNED_PYSYNCOBJ = "0.3.17"
if PYSYNCOBJ_VERSION != PINNED_PYSYNCOBJ:  # the seams below are written against this version
    raise ImportError(f"raftmq needs pysyncobj=={PINNED_PYSYNCOBJ}, found {PYSYNCOBJ_VERSION}")

_MEMBERSHIP = bytes([pso_syncobj._COMMAND_TYPE.MEMBERSHIP])
_VOTE_MESSAGES = frozenset({"request_vote", "response_vote"})  # accepted from voters only
# A leader's messages that vouch for nothing on its disk: its entries (their commit waits for its
# own flush, see FlushingTransport) and the index it gave a command forwarded through pysyncobj.
_LEADER_SENDS_UNFLUSHED = frozenset({"append_entries", "apply_command_response"})

# How often a tick looks at the peers' connections (FlushingTransport._onTick): far below
# pysyncobj's connectionRetryTime (0.5 s by default), so a retry is at most this much later.
CONNECT_CHECK_S = 0.05

# -- the nodes -------------------------------------------------------------------------------------


class RaftNode(str, TCPNode):  # type: ignore[misc]
    """pysyncobj's ``TCPNode`` that is also its address as a ``str``: hashed and compared in C.

    pysyncobj keys its per-peer state by node, and a ``TCPNode`` hashes and compares in Python
    (its ``id`` property): about 50 hashes per entry on a leader. ``str``'s methods come first in
    this MRO; for a mixed pair ``str`` declines and ``Node.__eq__`` answers, so it equals and hashes
    like a ``TCPNode`` of its address. It pickles as that ``TCPNode``. It also equals its address
    as a plain ``str``, where a ``TCPNode`` never does (pysyncobj's snapshot load then drops its
    own address, which raftmq's deserializer leaves out anyway).
    """

    def __new__(cls, address: str, **kwargs: Any) -> RaftNode:
        return super().__new__(cls, str(address))

    def __init__(self, address: str, **kwargs: Any) -> None:  # a str: the handshake pickles it
        super().__init__(str(address), **kwargs)

    id = property(operator.attrgetter("_id"))  # TCPNode's, read in C
    __repr__ = TCPNode.__repr__

    def __reduce_ex__(self, _protocol: Any) -> tuple[Any, ...]:
        return TCPNode, (str(self),)


class RaftNodeSyncObj(SyncObj):  # type: ignore[misc]
    """pysyncobj's object on :class:`RaftNode` s: its ``nodeClass`` unless told otherwise. A
    membership entry pickles pysyncobj's own ``TCPNode`` (the entry's bytes as ever), and the voter
    such an entry brings in is a ``RaftNode`` like the others once applied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("nodeClass", RaftNode)
        super().__init__(*args, **kwargs)

    def addNodeToCluster(self, node: Any, callback: Any = None) -> None:
        super().addNodeToCluster(TCPNode(str(node)), callback)

    def removeNodeFromCluster(self, node: Any, callback: Any = None) -> None:
        super().removeNodeFromCluster(TCPNode(str(node)), callback)

    def _SyncObj__doChangeCluster(self, request: list[Any], reverse: bool = False) -> Any:
        if len(request) >= 3 and type(request[2]) is TCPNode:
            request = [request[0], request[1], RaftNode(str(request[1]))]
        return super()._SyncObj__doChangeCluster(request, reverse)


# -- the Raft connection ---------------------------------------------------------------------------


class RaftConnection(FrameWire, TcpConnection):  # type: ignore[misc]
    """pysyncobj's connection with cheap buffers, no zlib and AES-GCM frames (``wire.py``).

    Its frames are :class:`~raftmq.cluster.replication.wire.FrameWire`'s, queued in a
    :class:`~raftmq.cluster.replication.wire.SendQueue`; a frame the wire refuses drops the
    connection and delivers nothing more. Only the methods that touch the buffers are replaced;
    pysyncobj's connect/poll/timeout logic stays. Its buffers are reset to ``bytes()`` on
    (dis)connect, so each use makes them bytearrays. Per-connection state lives in class defaults,
    so a ``TcpConnection`` can be re-classed in place.
    """

    _TcpConnection__writeBuffer: bytes | SendQueue  # pysyncobj's private buffers (annotations only)
    _TcpConnection__readBuffer: bytes | bytearray
    _TcpConnection__state: int  # a CONNECTION_STATE
    # Why this side closed the connection, for RaftAdmission's count (None: the peer closed it).
    drop_reason: str | None = None

    def connect(self, host: str, port: int) -> bool:
        self.reset_wire()
        return bool(super().connect(host, port))

    def disconnect(self) -> None:
        self.reset_wire()
        super().disconnect()

    def send(self, message: Any) -> None:
        try:
            frames = self.frames(message)
        except FrameTooLarge as e:
            # The receiver would hang up on it, silently. The cluster file's check on
            # limits.max_request_bytes keeps every message pysyncobj builds under the limit; if one
            # is not, this side says so and drops the link (pysyncobj reconnects), as the peer would.
            log.error(
                "raft_frame_too_large",
                frame_bytes=e.frame_bytes,
                max_frame_bytes=e.max_frame_bytes,
                message_type=message.get("type") if isinstance(message, dict) else type(message).__name__,
            )
            self.disconnect()
            return
        buf = self._TcpConnection__writeBuffer
        if not isinstance(buf, SendQueue):  # pysyncobj's (dis)connect put bytes() back
            buf = self._TcpConnection__writeBuffer = SendQueue(buf)
        for data in frames:
            buf.add(data)
        self._TcpConnection__trySendBuffer()
        if buf and self.state == CONNECTION_STATE.CONNECTED:
            # What the socket did not take now must go as soon as it is writable. pysyncobj asks
            # its poller for "writable" only while it handles a write event, so after a quiet spell
            # the rest of a large entry waited for the next send: a heartbeat, then 50 ms later (a
            # 200 KB entry took 65 ms to commit, a 20 KB one 10 ms; docs/benchmarks.md).
            self._TcpConnection__poller.subscribe(
                self._TcpConnection__fileno,
                self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
            )

    def _TcpConnection__processConnection(self, descr: int, eventType: int) -> None:
        self._process_event(descr, eventType)
        if self.state == CONNECTION_STATE.CONNECTING and self.fileno() == descr:
            # A send in pysyncobj's write handler failed (a reset), the transport reconnected from
            # the disconnect callback, the new socket got the same fd, and the handler then
            # subscribed that fd for reading only: the connect's completion (a write event) would
            # never be seen, and the link would stay down until a restart. Ask for it again.
            self._TcpConnection__poller.subscribe(
                descr,
                self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
            )

    def _process_event(self, descr: int, eventType: int) -> None:
        """pysyncobj's ``TcpConnection.__processConnection``, asking the socket for a pending error
        (``SO_ERROR``) only while it connects, where that says whether the connect succeeded.
        pysyncobj asked on every event, a system call per message received; on a connected socket
        an error shows in the recv or send that follows (and disconnects there)."""
        poller = self._TcpConnection__poller
        if descr != self._TcpConnection__fileno:
            poller.unsubscribe(descr)
            return
        if eventType & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        self._TcpConnection__processConnectionTimeout()
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return
        connecting = self._TcpConnection__state == CONNECTION_STATE.CONNECTING
        if connecting and eventType & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE):  # it completed
            if self._TcpConnection__socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            if self._TcpConnection__onConnected is not None:
                self._TcpConnection__onConnected()
            if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
                return
            self._TcpConnection__state = CONNECTION_STATE.CONNECTED
            self._TcpConnection__lastReadTime = monotonic()
            return
        if eventType & POLL_EVENT_TYPE.WRITE:
            self._TcpConnection__trySendBuffer()
            if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
                return
            event = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            if len(self._TcpConnection__writeBuffer) > 0:
                event |= POLL_EVENT_TYPE.WRITE
            poller.subscribe(descr, self._TcpConnection__processConnection, event)
        if eventType & POLL_EVENT_TYPE.READ:
            self._TcpConnection__tryReadBuffer()
            if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
                return
            while True:
                message = self._TcpConnection__processParseMessage()
                if message is None:
                    break
                if self._TcpConnection__onMessageReceived is not None:
                    self._TcpConnection__onMessageReceived(message)
                if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
                    return

    def _TcpConnection__processSend(self) -> bool:
        buf = self._TcpConnection__writeBuffer
        if not isinstance(buf, SendQueue) or not buf:  # only send() fills it, as a SendQueue
            return False
        try:
            sent = buf.send_to(self._TcpConnection__socket)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        return sent > 0

    def _TcpConnection__processRead(self) -> bool:
        size: int = max(self._TcpConnection__recvBufferSize, RECV_CHUNK_BYTES)
        try:
            incoming: bytes = self._TcpConnection__socket.recv(size)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming:  # the peer closed it (an error raises from recv)
            self.disconnect()
            return False
        buf = self._TcpConnection__readBuffer
        if type(buf) is not bytearray:  # pysyncobj's (dis)connect put bytes() back
            buf = self._TcpConnection__readBuffer = bytearray(buf)
        buf += incoming
        if self.refuses_first_frame(buf):  # nobody authenticated yet: refuse before buffering it
            self.drop_reason = BAD_FRAME
            self.disconnect()
            return False
        # Read again (pysyncobj's loop) only after a read that filled the buffer: a shorter one took
        # all the socket held, and another would only fail with EAGAIN, a system call and an
        # exception per message. The poll is level-triggered: bytes that come later wake it.
        return len(incoming) >= size

    def _TcpConnection__processParseMessage(self) -> Any:
        buf = self._TcpConnection__readBuffer
        if not isinstance(buf, bytearray):  # filled as a bytearray
            return None
        try:
            return self.parse_frame(buf)
        except Exception:  # forged, replayed, reflected or garbled: the peer is not trusted any more
            self.drop_reason = BAD_FRAME
            self.disconnect()
            return None


# -- transport and journal seams -------------------------------------------------------------------


class FlushingTransport(TCPTransport):  # type: ignore[misc]
    """TCP transport that makes the journal durable before the node vouches for it.

    Every message but ``append_entries`` leaves after a flush (an acknowledgement says "durable
    here", a vote carries the term). A leader's ``append_entries`` leave at once: its own fsync
    overlaps the followers' receive and fsync (Raft lets a leader write its log in parallel with
    replicating it), and a follower's acknowledgement is read only after a flush, so the leader
    never counts itself in a quorum before its own copy is durable.

    Its connections are :class:`RaftConnection` s under the Raft key (``conf.password``).

    It also connects to *hinted* peers (``RaftGroup.hint_peers``): pysyncobj's transport talks
    only to the voters of this replica's own configuration and hangs up on anyone else, so a
    replica that missed a membership change (it was down) could never hear from a new voter that
    leads. A hinted peer gets a connection but no vote and no entries from this replica.

    Votes count only between voters: a vote request (or a vote) from a node outside this replica's
    voters is dropped before pysyncobj sees it. pysyncobj answers any connected node's request and
    adopts its term, so a removed voter that never learnt of its removal (the leader stops sending
    to it when it appends the change) would campaign, and its higher term would depose the leader
    through the connections that hints keep open. Entries and heartbeats from any node still pass.

    Strangers are bounded (``admission.py``): an incoming connection that has not named a node of
    the group ``auth_timeout_s`` after it was accepted is closed on the next tick, and one accepted
    while the node (all its groups) or its source address holds the most unauthenticated ones
    allowed is closed at once. pysyncobj itself times a connection out only when it has an event
    (a read or write), so an idle stranger stayed open for good.
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        # Before TCPTransport.__init__: it adds the nodes (and makes their connections) inside.
        self.raft_key = raft_key(syncObj.conf.password)
        group = getattr(syncObj, "raftmq_group", None)
        admission = getattr(group, "admission", None)
        # Bodies sealed once for every follower (shared_bodies.py); a bare SyncObj (seam tests) too.
        offer = self.raft_key is not None and getattr(group, "shared_bodies", True)
        self.shared_bodies = SharedBodies(self.raft_key) if offer and self.raft_key is not None else None
        self.admission: RaftAdmission = admission if admission is not None else RaftAdmission()
        # Incoming connections not authenticated yet -> (source address, deadline). Tick thread only.
        # Invariant: exactly these are counted in self.admission for this transport.
        self._strangers: dict[Any, tuple[str, float]] = {}
        self._connect_check_at = 0.0  # the tick at or after this looks at the peers' connections
        super().__init__(syncObj, selfNode, otherNodes)

    def _wire(self, conn: Any) -> None:
        # Seam: pysyncobj builds a plain TcpConnection (addNode; TcpServer for incoming ones);
        # it becomes a RaftConnection here, before a byte goes through it.
        if type(conn) is TcpConnection:
            conn.__class__ = RaftConnection
        conn.raft_key = self.raft_key
        conn.shared_bodies = self.shared_bodies

    def _handshake(self, conn: Any) -> None:
        # pysyncobj's handshake step (a random key this side chose, sent first), with the mark that
        # says this node reads shared bodies (shared_bodies.py) when it does.
        conn.recvRandKey = handshake_key(self.shared_bodies is not None)
        conn.send(conn.recvRandKey)

    def _onOutgoingConnected(self, conn: Any) -> None:
        if not self._syncObj.encryptor:
            super()._onOutgoingConnected(conn)
            return
        # pysyncobj's, with raftmq's key: the peer's key is read by _onOutgoingMessageReceived.
        conn.setOnMessageReceivedCallback(functools.partial(self._onOutgoingMessageReceived, conn))
        self._handshake(conn)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        self._wire(conn)
        source = _source_address(conn)
        if self.admission.admit(source) is not None:  # over a cap: closed at once (and counted)
            conn.disconnect()
            return
        self._strangers[conn] = (source, monotonic() + self.admission.limits.auth_timeout_s)
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # The handshake: the peer's random key, then its Raft address. pysyncobj hangs up on an
        # address that is not a node of the group (counted as a bad frame).
        conn.drop_reason = BAD_FRAME
        if self._syncObj.encryptor and not conn.sendRandKey:  # pysyncobj's first step, raftmq's key
            conn.sendRandKey = message
            self._handshake(conn)
            conn.drop_reason = None
            return
        super()._onIncomingMessageReceived(conn, message)
        conn.drop_reason = None
        if conn not in self._unknownConnections:  # it named a node of the group: authenticated
            stranger = self._strangers.pop(conn, None)
            if stranger is not None:
                self.admission.release(stranger[0])

    def _onDisconnected(self, conn: Any) -> None:
        stranger = self._strangers.pop(conn, None)
        if stranger is not None:  # closed before it authenticated: by whom and why
            self.admission.release(stranger[0], conn.drop_reason)
        sync, node = self._syncObj, self._connToNode(conn)
        pre_vote = getattr(sync, "raftmq_pre_vote", None)
        try:
            if pre_vote and node is not None and node == sync._getLeader() and not sync._isLeader():
                pre_vote.leader_lost(str(node.id))  # its process ended, most likely: elect at once
        finally:
            super()._onDisconnected(conn)

    def _onTick(self) -> None:
        now = monotonic()
        if now >= self._connect_check_at or not self._ready:
            # pysyncobj's transport tick binds the port until it is bound and (re)connects to the
            # peers, looking at each one's connection; on every tick that was a dozen calls, and a
            # busy leader ticks several times per entry. Its retries wait connectionRetryTime
            # anyway, a lost connection is retried at once (_onDisconnected) and a node added is
            # looked at on the next tick (addNode), so looking every CONNECT_CHECK_S loses nothing.
            self._connect_check_at = now + CONNECT_CHECK_S
            super()._onTick()
        if self._strangers:
            for conn, (_source, deadline) in list(self._strangers.items()):
                if now >= deadline:
                    conn.drop_reason = AUTH_TIMEOUT
                    conn.disconnect()  # _onDisconnected releases it and forgets it

    def send(self, node: Any, message: Any) -> Any:
        # Whatever this node tells a peer about its log (an acknowledgement, a vote) is on disk
        # first. A leader's entries are the exception: they go to the followers before its own
        # fsync, which then runs while they travel and are fsynced there (RaftGroup._after_tick
        # flushes at the end of the tick that added them). The leader counts itself only once
        # durable: an acknowledgement is read after a flush (_onMessageReceived).
        if not (isinstance(message, dict) and message.get("type") in _LEADER_SENDS_UNFLUSHED):
            self._syncObj.raftmq_journal.flush()
        return super().send(node, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        # Every connection delivers through this method (tick thread). Only votes are checked.
        kind = message.get("type") if isinstance(message, dict) else None
        pre_vote = getattr(self._syncObj, "raftmq_pre_vote", None)
        if kind in PRE_VOTE_MESSAGES:  # pre_vote.py; pysyncobj never sees them
            if pre_vote is not None and node in self._syncObj.otherNodes:  # between voters only
                if kind == "pre_vote":
                    self.send(node, pre_vote.answer(message))
                else:
                    pre_vote.on_response(str(node.id), message)
            return
        if kind == "append_entries" and pre_vote is not None:
            term = message.get("term")
            if type(term) is int and term >= self._syncObj.raftCurrentTerm:
                pre_vote.heard_leader()
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            # A follower's acknowledgement may complete a quorum in which pysyncobj counts this
            # leader (count = 1 in its commit loop): its own entries become durable first. The
            # tick's end flushed them already, except entries added while polling (the no-op of
            # a leadership won on a vote), so this is nearly always a no-op. (A bare SyncObj, as
            # seam tests build, has no durable journal to flush.)
            journal = getattr(self._syncObj, "raftmq_journal", None)
            if journal is not None:
                journal.flush()
        if (
            isinstance(message, dict)
            and message.get("type") in _VOTE_MESSAGES
            and node not in self._syncObj.otherNodes
            and not self._log_ahead_of_ours(message)
        ):
            self._syncObj.raftmq_group._vote_ignored(node, message)
            return
        super()._onMessageReceived(node, message)

    def _log_ahead_of_ours(self, message: dict[str, Any]) -> bool:
        """Whether a vote request's candidate has a log strictly ahead of this replica's (by last
        term, then last index): it holds entries this replica lacks, so it may be a voter added in
        one of them (this replica missed the change). Such a candidate is heard; a removed voter
        never is by a replica holding its removal (the candidate lacks that entry)."""
        if message.get("type") != "request_vote":
            return False
        term, index = message.get("last_log_term"), message.get("last_log_index")
        if type(term) is not int or type(index) is not int:
            return False
        _, last_index, last_term = self._syncObj._SyncObj__raftLog[-1]  # pysyncobj's own log view
        return (term, index) > (last_term, last_index)

    def addNode(self, node: Any) -> None:
        if node in self._nodes:  # a hinted peer became a voter: keep its connection
            return
        super().addNode(node)
        self._connect_check_at = 0.0  # connect at the next tick
        conn = self._connections.get(node)
        if conn is not None:
            self._wire(conn)


def _source_address(conn: Any) -> str:
    """The host an accepted connection comes from ("?" if the socket is gone already)."""
    try:
        return str(conn._TcpConnection__socket.getpeername()[0])
    except (OSError, AttributeError, TypeError):
        return "?"


def install_journal_seam() -> None:
    """Make pysyncobj use a DurableJournal passed as ``journalFile`` (idempotent)."""
    original = pso_syncobj.createJournal
    if getattr(original, "raftmq_seam", False):
        return

    def create_journal(journal_file: Any = None) -> Any:
        if isinstance(journal_file, DurableJournal):
            return journal_file
        return original(journal_file)

    create_journal.raftmq_seam = True  # type: ignore[attr-defined]
    pso_syncobj.createJournal = create_journal


def install_tick_seams(
    sync: Any, settings: RaftSettings, busy: Callable[[], bool], group: str
) -> tuple[PreVote, FollowerBacklog, LeaderReads, CompactionDeferrals]:
    """The seams of ``sync``'s tick thread: its sleep (:func:`install_deadline_poll`), a pre-vote
    before each election (``pre_vote.py``), unless ``settings.prompt_commit_notice`` a leader's
    commit notices (:func:`hold_commit_notices`), and the bound on what a leader queues for each
    follower (``follower_backlog.py``), and the leader's read rule (``leader_reads.py``, a tick
    callback), and a leader's journal compaction deferred while a follower would need a snapshot
    for it (:func:`defer_compaction`). Returns the replica's :class:`PreVote`,
    :class:`FollowerBacklog`, :class:`LeaderReads` and group ``group``'s
    :class:`CompactionDeferrals`."""
    install_deadline_poll(sync, settings.tick_s, settings.max_tick_s, busy)
    # Half the minimum election timeout: a follower that heard its leader that recently (several
    # heartbeats) refuses; one asked by a follower whose timer ran out because the leader died heard
    # it about as long ago as the asker, at least the minimum timeout, and grants.
    pre_vote = install_pre_vote(sync, settings.election_min_s / 2, monotonic)
    if not settings.prompt_commit_notice:
        hold_commit_notices(sync)
    backlog = bound_follower_backlog(sync, settings.max_follower_backlog_bytes, CONNECTION_STATE.CONNECTED)
    deferrals = defer_compaction(sync, 2 * settings.compaction_max_bytes, group)
    return pre_vote, backlog, LeaderReads(sync), deferrals


def hold_commit_notices(sync: Any) -> None:
    """Make the leader ``sync`` tell its followers a new commit index with its next entries or
    heartbeat, not in a message of its own.

    pysyncobj sends an append_entries to every follower after each tick in which its leader
    applied entries, so that they learn the commit index at once; each answers it. At ordinary
    rates that is half the group's Raft messages (a second message to each follower per entry,
    and its reply), each a wake-up of a tick thread that takes its node's GIL. Held, the index
    goes with the next entries (they are sent at once) or the next heartbeat, and a follower
    applies an entry up to one heartbeat later. Nothing else changes: a message with entries for
    a follower, or a due heartbeat, goes as before (:func:`only_the_commit_index_to_send`).
    """
    send = sync._SyncObj__sendAppendEntries

    def send_unless_only_the_commit_index() -> None:
        if not only_the_commit_index_to_send(sync):
            send()

    sync._SyncObj__sendAppendEntries = send_unless_only_the_commit_index


def defer_compaction(sync: Any, max_bytes: int, group: str = "") -> CompactionDeferrals:
    """Make the leader ``sync`` start a journal compaction, once pysyncobj's own triggers call for
    one (:func:`compaction_due`), only when every connected follower was sent the entries up to the
    cut (:func:`followers_behind_compaction`), or its journal (a DurableJournal) holds more than
    ``max_bytes``. Returns the deferrals of group ``group``, counted and logged
    (``compaction_deferral.py``).

    Why: a compaction cuts the journal at the last applied entry, and a follower whose next entries
    were not sent yet (held back under load: ``follower_backlog.py``) then gets a snapshot and
    installs a checkpoint of the group's whole state (gigabytes with a large backlog) instead of
    the few entries it lacks. A follower that stays behind gets its snapshot at ``max_bytes``, as
    it would have before. A compaction already serialized (our serializer writes the snapshot at
    once) is always finished: its entries are deleted at the next tick as before."""
    try_compaction = sync._SyncObj__tryLogCompaction
    serializer = sync._SyncObj__serializer
    journal = sync._SyncObj__raftLog
    deferrals = CompactionDeferrals(group, max_bytes)

    def try_compaction_unless_a_follower_needs_a_snapshot() -> None:
        if serializer._Serializer__pid == 0 and journal.size_bytes <= max_bytes:
            # Nothing serializing: pysyncobj's call does nothing unless a compaction is due, and
            # one that falls due after this look (the time trigger, a forced one from another
            # thread) must wait for the next tick's look at the followers, not run past it.
            if not compaction_due(sync):
                return
            behind = followers_behind_compaction(sync)
            if behind:
                deferrals.held(monotonic(), journal.size_bytes, behind)
                return
        if deferrals.deferring:
            deferrals.released(monotonic(), journal.size_bytes, leading=sync._isLeader())
        try_compaction()

    sync._SyncObj__tryLogCompaction = try_compaction_unless_a_follower_needs_a_snapshot
    return deferrals


def compaction_due(sync: Any) -> bool:
    """Whether pysyncobj's own triggers call for a compaction of ``sync``'s journal now: more than
    ``logCompactionMinEntries`` entries, more than ``logCompactionMinTime`` since the last one, or
    ``forceLogCompaction`` (the first check of its ``__tryLogCompaction``; not due, it does
    nothing). raftmq leaves ``logCompactionSplit`` off."""
    conf = sync._SyncObj__conf
    return bool(
        sync._SyncObj__forceLogCompaction
        or len(sync._SyncObj__raftLog) > conf.logCompactionMinEntries
        or monotonic() - sync._SyncObj__lastSerializedTime > conf.logCompactionMinTime
    )


def followers_behind_compaction(sync: Any) -> int:
    """On the leader ``sync``: its connected followers that a compaction now would send a snapshot
    to, a checkpoint of the group's whole state to install, instead of the entries they lack.
    pysyncobj cuts the journal at the entry before the last applied one and sends a follower a
    snapshot once its next index is not past the journal's first entry; a follower's next index
    lags when the leader holds back what it sends it (``follower_backlog.py``). 0 on a follower."""
    if not sync._isLeader():
        return 0
    cut = sync._SyncObj__raftLastApplied - 1
    next_index = sync._SyncObj__raftNextIndex
    connected = sync._SyncObj__connectedNodes
    followers = sync._SyncObj__otherNodes | sync._SyncObj__readonlyNodes
    return sum(1 for node in followers if node in connected and next_index.get(node, 0) <= cut)


def install_deadline_poll(sync: Any, tick_s: float, max_tick_s: float, busy: Callable[[], bool]) -> None:
    """Make ``sync``'s tick thread sleep after a tick until its own next deadline (a leader's next
    heartbeat, a follower's or candidate's election deadline), at most ``max_tick_s``, instead of
    pysyncobj's fixed ``autoTickPeriod``; ``tick_s`` while ``busy()`` or once the deadline passed
    with nothing done (a follower connected to no peer does not campaign). Everything else wakes
    the poll: a peer's message, a proposal (the pipe) and :func:`wake_tick_thread`. pysyncobj's
    other timers (reconnects, a leader's fallback, compaction) are coarser than ``max_tick_s``.
    Decided at every poll, the last thing a tick does (after its callbacks)."""
    poller = sync._poller
    poll = poller.poll

    def sleep_s() -> float:
        if commits_alone(sync):
            return 0.0  # nothing would wake it: a lone voter's next tick commits (else tick_s later)
        left = own_deadline_s(sync)
        return tick_s if busy() or left <= 0 else min(left, max_tick_s)

    poller.poll = lambda _period: poll(sleep_s())


def voters_now(sync: Any, self_addr: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """The voters (Raft addresses, sorted) ``sync`` uses now, itself included: ``known`` itself
    when they have not changed since the call that returned it. Told apart by comparing pysyncobj's
    set of nodes with the one seen then (a tick calls this; building the list each time was a
    tenth of an idle tick). Tick thread only."""
    nodes = sync._SyncObj__otherNodes
    if known and getattr(sync, "raftmq_voters_seen", None) == nodes:
        return known
    sync.raftmq_voters_seen = frozenset(nodes)
    return tuple(sorted({str(n.id) for n in nodes} | {self_addr}))


def commits_alone(sync: Any) -> bool:
    """Whether ``sync`` leads with no other voter and has entries above its commit index: their
    commit waits for no acknowledgement, only the next tick (the tick that added them flushed them
    at its end, before this poll), so nothing else would wake the poll for it."""
    if sync._SyncObj__otherNodes or not sync._isLeader():
        return False
    return bool(sync._SyncObj__getCurrentLogIndex() > sync.raftCommitIndex)


def own_deadline_s(sync: Any) -> float:
    """Seconds until ``sync``'s own next deadline (<= 0: passed): a leader's next heartbeat, a
    follower's or candidate's election deadline."""
    leading = sync._isLeader()
    due = sync._SyncObj__newAppendEntriesTime if leading else sync._SyncObj__raftElectionDeadline
    return float(due - monotonic())


def only_the_commit_index_to_send(sync: Any) -> bool:
    """Whether the leader ``sync``'s append_entries now would tell its followers nothing but its
    commit index: no heartbeat is due and every connected follower has been sent every entry (a
    follower behind, or being sent a snapshot, has entries to send)."""
    if monotonic() > sync._SyncObj__newAppendEntriesTime:
        return False
    last = sync._SyncObj__getCurrentLogIndex()
    next_index = sync._SyncObj__raftNextIndex
    connected = sync._SyncObj__connectedNodes
    followers = sync._SyncObj__otherNodes | sync._SyncObj__readonlyNodes
    return all(next_index.get(node, 0) > last for node in followers if node in connected)


def hears_a_leader(sync: Any) -> bool:
    """Whether ``sync`` leads, or knows a leader whose last message came within its election
    timeout (pysyncobj pushes a follower's deadline on with every ``append_entries``). A replica
    asking for pre-votes hears none: its timer ran out, and the round pushed the deadline on."""
    if sync._isLeader():
        return True
    pre_vote = getattr(sync, "raftmq_pre_vote", None)
    if pre_vote is not None and pre_vote.asking:
        return False
    return sync._getLeader() is not None and own_deadline_s(sync) > 0


def stop_tick_thread(sync: Any) -> None:
    """pysyncobj's ``destroy_synchronous``, with the tick thread woken from its poll (it checks
    for the stop at its next tick)."""
    sync.destroy()
    wake_tick_thread(sync)
    sync.destroy_synchronous()


def wake_tick_thread(sync: Any) -> None:
    """Wake ``sync``'s tick thread from its poll (pysyncobj's pipe, as a proposal does)."""
    notifier = getattr(sync, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        notifier.notify()


def membership_change(command: bytes) -> tuple[str, str] | None:
    """``("add" | "rem", raft address)`` when ``command`` is a pysyncobj membership entry."""
    if command[:1] != _MEMBERSHIP:
        return None
    request = pso_pickle.loads(command[1:])  # ["add" | "rem", node id (= address), node]
    return str(request[0]), str(request[1])
