"""A leader's backlog to each follower, bounded (etcd's ``MaxInflightMsgs``, in bytes).

pysyncobj 0.3.17's leader sends entries without waiting for their answers: each tick it sends a
follower everything from the follower's next index to the end of its log (``__sendAppendEntries``,
for up to one heartbeat period of sending), and moves the next index on at the send. A follower
that reads more slowly than its leader writes (it holds other groups' leaders, a long tick, a slow
disk) therefore has everything it has not read queued in the leader's memory
(``RaftConnection``'s :class:`~raftmq.cluster.replication.wire.SendQueue`), with no bound: under
saturating load that backlog grew for as long as the load lasted, and what the follower read was
seconds old (docs/benchmarks.md, "Elections under load").

Here, once the bytes queued for a follower reach ``max_bytes``, the leader sends that follower
nothing more (not even a heartbeat: the queued messages it has not read push its election deadline
on as it reads them) until its queue is below the bound again; pysyncobj's own rule then sends it
what follows from its next index. Nothing about what is sent changes, only when, so Raft's safety
is pysyncobj's: a follower's acknowledgement still counts only what it appended.

How, through pysyncobj's seams: around each ``__sendAppendEntries``, a follower over the bound is
left out of pysyncobj's connected set (the loop skips a follower not connected, and stops sending
to one that leaves the set after a send), and put back afterwards if its connection is still up.
pysyncobj would cancel a snapshot transmission to a follower left out; raftmq's snapshots are
manifests of a few hundred bytes (a checkpoint travels out of band), so the next round starts it
again. A held follower is still timed out as pysyncobj would (nothing read from it for its
connection timeout), here, since nothing is sent to it. While a follower is left out, pysyncobj's
``hasQuorum`` read from another thread may count it as disconnected (status and metrics only).

Tick thread only: pysyncobj's ticks, sends and handlers run there.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FollowerBacklog", "bound_follower_backlog"]


class FollowerBacklog:
    """The bound on the bytes a leader (``sync``) queues for each follower."""

    def __init__(self, sync: Any, max_bytes: int, connected_state: Any) -> None:
        self._sync = sync
        self.max_bytes = max_bytes
        self._connected_state = connected_state  # pysyncobj's CONNECTION_STATE.CONNECTED
        self._held: set[Any] = set()  # followers left out of the connected set now
        self._in_round = False
        self.holds = 0  # times a follower was left out of a round (tests and metrics)

    def queued_bytes(self, node: Any) -> int:
        """Bytes waiting in the leader's connection to ``node`` (0 without one)."""
        conn = self._sync._SyncObj__transport._connections.get(node)
        return 0 if conn is None else len(conn._TcpConnection__writeBuffer)

    def _hold(self, node: Any) -> None:
        connected = self._sync._SyncObj__connectedNodes
        if node in connected:
            connected.discard(node)
            self._held.add(node)
            self.holds += 1

    def before_round(self) -> None:
        """Leave every follower whose queue is at the bound out of this round of sends."""
        sync = self._sync
        self._in_round = True
        connections = sync._SyncObj__transport._connections
        for node in sync._SyncObj__otherNodes | sync._SyncObj__readonlyNodes:
            if self.queued_bytes(node) >= self.max_bytes:
                # pysyncobj times a connection out (nothing read for connectionTimeout) only when
                # it sends on it or the socket has an event; a held follower that is gone (a host
                # down, a network cut: no reset, its socket full) gives neither, so look here.
                connections[node]._TcpConnection__processConnectionTimeout()
                self._hold(node)  # a connection timed out left the connected set: nothing to hold

    def after_send(self, node: Any, message: Any) -> None:
        """After an ``append_entries`` to ``node``: once its queue reached the bound, pysyncobj's
        loop sends it nothing more in this round."""
        if (
            self._in_round
            and isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "serialized" not in message  # a snapshot's last part sets the next index after it
            and self.queued_bytes(node) >= self.max_bytes
        ):
            self._hold(node)

    def after_round(self) -> None:
        """Put the followers left out back, those whose connection is still up."""
        self._in_round = False
        connections = self._sync._SyncObj__transport._connections
        connected = self._sync._SyncObj__connectedNodes
        for node in self._held:
            conn = connections.get(node)
            if conn is not None and conn.state == self._connected_state:
                connected.add(node)
        self._held.clear()


def bound_follower_backlog(sync: Any, max_bytes: int, connected_state: Any) -> FollowerBacklog:
    """Bound what the leader ``sync`` queues for each follower to about ``max_bytes`` (plus the
    message that crossed it: a batch of entries, up to twice the largest entry). Installed on the
    instance: pysyncobj calls ``self.__sendAppendEntries()`` and ``self.__transport.send(...)``,
    which look the attributes up on the objects. ``connected_state``: pysyncobj's
    ``CONNECTION_STATE.CONNECTED`` (only the adapter imports pysyncobj)."""
    backlog = FollowerBacklog(sync, max_bytes, connected_state)
    send_round = sync._SyncObj__sendAppendEntries
    transport = sync._SyncObj__transport
    send = transport.send

    def bounded_round() -> None:
        backlog.before_round()
        try:
            send_round()
        finally:
            backlog.after_round()

    def bounded_send(node: Any, message: Any) -> Any:
        result = send(node, message)
        backlog.after_send(node, message)
        return result

    sync._SyncObj__sendAppendEntries = bounded_round
    transport.send = bounded_send
    return backlog
