"""The Raft wire (cluster/replication/wire.py, in pso.py's :class:`RaftConnection`): real pysyncobj
connections over real sockets on 127.0.0.1.

A backlog far larger than the socket buffers arrives intact and in order; a forged, replayed,
reflected or wrongly keyed frame drops the connection and delivers nothing; no zlib on the wire;
and two real RaftGroups replicate through it, while a node with the wrong Raft key gets its
connection closed without anything applied.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE
from raft_doubles import Machine, free_port, settled_leader, submit_all

from raftmq.cluster.replication import wire
from raftmq.cluster.replication.pso import CONNECT_CHECK_S, FlushingTransport, RaftConnection
from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.cluster.replication.wire import MAX_FIRST_FRAME_BYTES, raft_key
from raftmq.storage.memory import MemoryStore

KEY = bytes(range(32))
OTHER_KEY = bytes(32)


def wait_for(
    condition: Callable[[], Any], what: str, timeout: float = 20.0, step: Callable[[], None] | None = None
) -> Any:
    """Polls ``condition`` (running ``step`` between tries) until true; a guard against hanging."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.005)
    return value


class Pair:
    """Two RaftConnections on the two ends of one TCP connection, driven by one pysyncobj poller."""

    def __init__(self, key_a: bytes | None = KEY, key_b: bytes | None = KEY, sndbuf: int = 1 << 16) -> None:
        self.poller = createPoller("select")
        with socket.create_server(("127.0.0.1", 0)) as listener:
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
        for s in (client, server):
            s.setblocking(False)
        self.a = RaftConnection(self.poller, socket=client, timeout=60.0)
        self.b = RaftConnection(self.poller, socket=server, timeout=60.0)
        self.a.raft_key, self.b.raft_key = key_a, key_b
        self.got: list[Any] = []
        self.b.setOnMessageReceivedCallback(self.got.append)

    def pump(self) -> None:
        self.poller.poll(0.01)

    def close(self) -> None:
        self.a.disconnect()
        self.b.disconnect()


class RawPeer:
    """A raw socket to ``b`` of a fresh pair: frames are written to it byte for byte."""

    def __init__(self, key: bytes | None = KEY) -> None:
        self.pair = Pair(key_b=key)
        self.sock = self.pair.a._TcpConnection__socket  # write around a's buffers
        self.sealer = RaftConnection(None)  # frames only, never connected
        self.sealer.raft_key = key

    def write(self, frame: bytes) -> None:
        self.sock.sendall(frame)
        self.settle()

    def settle(self) -> None:
        for _ in range(20):  # a few polls: enough for the bytes written above to be read
            self.pair.pump()

    @property
    def dropped(self) -> bool:
        return bool(self.pair.b.state == CONNECTION_STATE.DISCONNECTED)


@pytest.fixture
def raw() -> Iterator[Callable[..., RawPeer]]:
    made: list[RawPeer] = []

    def make(key: bytes | None = KEY) -> RawPeer:
        made.append(RawPeer(key))
        return made[-1]

    yield make
    for peer in made:
        peer.pair.close()


def test_a_large_backlog_arrives_intact_and_in_order() -> None:
    pair = Pair()
    try:
        messages = [{"i": i, "data": os.urandom(4096 + i % 97)} for i in range(3000)]
        for m in messages:
            pair.a.send(m)  # no polling meanwhile: the backlog piles up in a's write buffer
        backlog = pair.a.getSendBufferSize()
        print(f"backlog after 3000 sends: {backlog} bytes")
        assert backlog > 1 << 20  # most of ~12 MiB is still queued: the socket took little
        wait_for(lambda: len(pair.got) == len(messages), "the whole backlog", step=pair.pump)
        assert pair.got == messages
        assert pair.a.getSendBufferSize() == 0
        assert pair.b.state == CONNECTION_STATE.CONNECTED
    finally:
        pair.close()


class CountingSocket:
    """A socket that counts the system calls a connection makes on it (the rest passes through)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def recv(self, size: int) -> bytes:
        self._count("recv")
        return self._sock.recv(size)

    def getsockopt(self, *args: Any) -> Any:
        self._count("getsockopt")
        return self._sock.getsockopt(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_small_message_on_a_connected_socket_costs_one_recv_and_no_error_check() -> None:
    """pysyncobj asked the socket for SO_ERROR on every event and after every read, and read until
    EAGAIN: per message two getsockopt and two recv, the second one failing. One recv now, which
    takes all the socket holds; an error shows in it (or in a send) and disconnects there."""
    pair = Pair()
    try:
        counting = CountingSocket(pair.b._TcpConnection__socket)
        pair.b._TcpConnection__socket = counting
        for i in range(10):
            pair.a.send({"i": i, "data": b"x" * 200})
            wait_for(lambda i=i: len(pair.got) == i + 1, f"message {i}", step=pair.pump)
        assert pair.got == [{"i": i, "data": b"x" * 200} for i in range(10)]
        assert counting.calls == {"recv": 10}
        pair.a.disconnect()  # the peer closes: the next read returns nothing and disconnects
        wait_for(lambda: pair.b.state == CONNECTION_STATE.DISCONNECTED, "the disconnect", step=pair.pump)
    finally:
        pair.close()


def test_what_the_socket_did_not_take_goes_when_it_is_writable_without_another_send() -> None:
    """A large entry sent after a quiet spell: pysyncobj asked its poller for "writable" only while
    handling a write event, so the rest of the frame waited for the next send (a heartbeat, 50 ms
    on): a 200 KB entry took 65 ms to commit. Now the connection asks when its buffer is left
    non-empty, and polling alone delivers the frame."""
    pair = Pair(sndbuf=1 << 14)
    try:
        pair.a.send("hello")  # a first frame (a long one would be refused before it)
        wait_for(lambda: pair.got, "the first frame", step=pair.pump)
        for _ in range(5):  # connected and idle: no write interest left
            pair.pump()
        big = os.urandom(2 << 20)
        pair.a.send(["append_entries", big])
        assert pair.a._TcpConnection__writeBuffer  # the socket took only part of it
        wait_for(lambda: len(pair.got) == 2, "the frame, by polling alone", timeout=10, step=pair.pump)
        assert pair.got == ["hello", ["append_entries", big]]
    finally:
        pair.close()


def test_a_connection_reset_in_the_write_handler_and_a_reconnect_on_the_same_fd_connects() -> None:
    """pysyncobj's write handler sends; a reset there disconnects, the transport reconnects from
    the callback, the new socket gets the old fd number, and the handler then subscribed it for
    reading only: the connect never completed and the link stayed down (review finding)."""
    poller = createPoller("poll")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    host, port = listener.getsockname()
    conn = RaftConnection(poller, timeout=60.0)
    conn.raft_key = KEY
    conn.setOnConnectedCallback(lambda: conn.send("hello"))
    conn.setOnDisconnectedCallback(lambda: conn.connect(host, port))  # what TCPTransport does
    conn.connect(host, port)
    peers: list[socket.socket] = []

    def pump() -> None:
        poller.poll(0.01)
        with contextlib.suppress(BlockingIOError):
            peers.append(listener.accept()[0])

    try:
        wait_for(lambda: conn.state == CONNECTION_STATE.CONNECTED and peers, "connected", step=pump)
        old_fd = conn.fileno()
        for _ in range(300):  # a backlog: bytes left, write interest on
            conn.send(b"x" * 65536)
        real = conn._TcpConnection__socket

        class Reset:  # a reset arriving between poll() and the handler's send
            def send(self, data: Any) -> int:
                raise ConnectionResetError(errno.ECONNRESET, "reset")

            def sendmsg(self, buffers: Any) -> int:
                raise ConnectionResetError(errno.ECONNRESET, "reset")

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        conn._TcpConnection__socket = Reset()
        peers[0].setblocking(False)
        with contextlib.suppress(BlockingIOError):
            peers[0].recv(1 << 20)  # the socket is writable again
        poller.poll(0.5)  # write event -> reset -> disconnect -> reconnect
        assert conn.fileno() == old_fd  # the case: the new socket has the old fd number
        wait_for(lambda: conn.state == CONNECTION_STATE.CONNECTED, "reconnected", timeout=5, step=pump)
    finally:
        conn.disconnect()
        listener.close()
        for peer in peers:
            peer.close()


def test_a_message_longer_than_the_receiver_accepts_is_never_sent_and_is_logged() -> None:
    """The sender checks a frame against the receiver's limit (``max_frame_bytes``, 256 MiB on a
    node; small here): it drops the link and logs the error instead of sending a frame the peer
    would hang up on without a word. A message that fits goes through afterwards."""
    pair = Pair()
    try:
        pair.a.max_frame_bytes = pair.b.max_frame_bytes = 10_000
        with structlog.testing.capture_logs() as logs:
            pair.a.send({"type": "append_entries", "entries": [os.urandom(20_000)]})
        assert [e["event"] for e in logs] == ["raft_frame_too_large"]
        assert logs[0]["message_type"] == "append_entries" and logs[0]["frame_bytes"] > 20_000
        assert pair.a.getSendBufferSize() == 0  # nothing went on the wire
        assert pair.a.state == CONNECTION_STATE.DISCONNECTED
        wait_for(
            lambda: pair.b.state == CONNECTION_STATE.DISCONNECTED,
            "the peer sees the link closed",
            step=pair.pump,
        )
        assert pair.got == []
    finally:
        pair.close()
    pair = Pair()
    try:
        pair.a.max_frame_bytes = pair.b.max_frame_bytes = 10_000
        pair.a.send({"i": 1, "data": os.urandom(9_000)})
        wait_for(lambda: len(pair.got) == 1, "a frame under the limit", step=pair.pump)
    finally:
        pair.close()


def test_frames_carry_no_zlib_and_encrypt_the_pickle() -> None:
    sealer = RaftConnection(None)
    sealer.raft_key = KEY
    message = {"type": "append_entries", "entries": [(b"a" * 100_000, 5, 1)]}
    plain = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    frame = sealer.frame(message)
    print(f"pickle {len(plain)} bytes, frame {len(frame)} bytes")
    # length (4) + salt (16) + counter (8) + ciphertext (as long as the pickle) + tag (16)
    assert len(frame) == 4 + 16 + 8 + len(plain) + 16
    assert b"a" * 64 not in frame  # encrypted, not sent in the clear
    assert struct.unpack_from("<I", frame)[0] == len(frame) - 4


def test_frames_reach_the_peer_through_a_raw_socket(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    peer.write(peer.sealer.frame({"n": 1}) + peer.sealer.frame({"n": 2}))
    assert peer.pair.got == [{"n": 1}, {"n": 2}] and not peer.dropped


@pytest.mark.parametrize("seal_into", [True, False], ids=["encrypt_into", "without-encrypt_into"])
def test_large_frames_reach_the_peer_with_or_without_encrypt_into(
    raw: Callable[..., RawPeer], monkeypatch: pytest.MonkeyPatch, seal_into: bool
) -> None:
    """cryptography's AESGCM.encrypt_into is newer than the release pyproject allows: without it
    a large frame is sealed by one concatenation, and the peer reads it the same."""
    if seal_into and wire._SEAL_INTO_BYTES is None:
        pytest.skip("this cryptography has no AESGCM.encrypt_into")
    if not seal_into:
        monkeypatch.setattr(wire, "_SEAL_INTO_BYTES", None)
    peer = raw()
    messages = [{"n": 1, "data": os.urandom(16 << 10)}, {"n": 2, "data": b"x" * 100}]
    peer.write(b"".join(bytes(peer.sealer.frame(m)) for m in messages))
    assert peer.pair.got == messages and not peer.dropped


def test_a_tampered_frame_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    peer.write(peer.sealer.frame({"n": 1}))
    frame = bytearray(peer.sealer.frame({"n": 2}))
    frame[-20] ^= 0x01  # one bit of the ciphertext
    peer.write(bytes(frame) + peer.sealer.frame({"n": 3}))
    assert peer.dropped
    assert peer.pair.got == [{"n": 1}]  # neither the tampered frame nor anything after it


def test_a_replayed_frame_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    first, second = peer.sealer.frame({"n": 1}), peer.sealer.frame({"n": 2})
    peer.write(first + second)
    peer.write(first)  # a valid frame, again
    assert peer.dropped and peer.pair.got == [{"n": 1}, {"n": 2}]


def test_frames_out_of_order_drop_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    first, second = peer.sealer.frame({"n": 1}), peer.sealer.frame({"n": 2})
    peer.write(second + first)
    assert peer.dropped and peer.pair.got == []  # frame 2 where frame 1 must come


def test_a_removed_frame_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    """Frames are numbered 1, 2, 3... on a connection: one taken out of the stream is noticed."""
    peer = raw()
    first, _, third = (peer.sealer.frame({"n": n}) for n in (1, 2, 3))
    peer.write(first + third)
    assert peer.dropped and peer.pair.got == [{"n": 1}]


def test_a_long_first_frame_is_refused_from_its_length_prefix(raw: Callable[..., RawPeer]) -> None:
    """Before any frame was authenticated, a length prefix over MAX_FIRST_FRAME_BYTES hangs up at
    once, before the frame's bytes are buffered; afterwards long frames pass."""
    peer = raw()
    peer.write(struct.pack("<I", MAX_FIRST_FRAME_BYTES + 1))  # the prefix alone, nothing after it
    assert peer.dropped and peer.pair.got == []
    peer = raw()
    big = {"n": os.urandom(MAX_FIRST_FRAME_BYTES)}
    peer.write(peer.sealer.frame({"n": 1}))
    peer.write(peer.sealer.frame(big))
    wait_for(lambda: len(peer.pair.got) == 2, "the long second frame", step=peer.pair.pump)
    assert not peer.dropped and peer.pair.got == [{"n": 1}, big]


def test_a_frame_from_another_sender_within_a_connection_drops_it(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    other = RaftConnection(None)
    other.raft_key = KEY  # same key, its own salt: a frame spliced in from another connection
    peer.write(peer.sealer.frame({"n": 1}))
    peer.write(other.frame({"n": 1}) + other.frame({"n": 2}))
    assert peer.dropped and peer.pair.got == [{"n": 1}]


def test_a_reflected_frame_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    receiver = peer.pair.b
    own = receiver.frame({"n": 1})  # what b would send on this connection, sent back to it
    peer.write(own)
    assert peer.dropped and peer.pair.got == []


def test_a_wrong_key_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    peer.sealer.raft_key = OTHER_KEY
    peer.write(peer.sealer.frame({"n": 1}))
    assert peer.dropped and peer.pair.got == []


def test_a_frame_for_another_connection_drops_it(raw: Callable[..., RawPeer]) -> None:
    """pysyncobj's handshake: once b chose a random key, every frame must carry it."""
    peer = raw()
    peer.pair.b.recvRandKey = os.urandom(32)
    peer.sealer.sendRandKey = os.urandom(32)  # not the one b chose
    peer.write(peer.sealer.frame({"n": 1}))
    assert peer.dropped and peer.pair.got == []


def test_an_absurd_length_drops_the_connection(raw: Callable[..., RawPeer]) -> None:
    peer = raw()
    peer.write(struct.pack("<I", 0xFFFFFFFF))
    assert peer.dropped and peer.pair.got == []


def test_raft_key_takes_the_derived_hex_key() -> None:
    assert raft_key(KEY.hex()) == KEY
    assert raft_key(None) is None
    assert len(raft_key("not hex") or b"") == 32


class BareWire(wire.FrameWire):
    """wire.py's frames with no pysyncobj connection around them (its handshake keys set by hand)."""

    def __init__(self, key: bytes | None, send_rand_key: bytes | None, recv_rand_key: bytes | None) -> None:
        self.raft_key, self.sendRandKey, self.recvRandKey = key, send_rand_key, recv_rand_key


def test_the_wire_frames_and_refuses_without_pysyncobj() -> None:
    """FrameWire alone: frames open in order on the other side, a replayed one raises (the
    connection drops it), and a first frame over MAX_FIRST_FRAME_BYTES is refused from its prefix."""
    a_key, b_key = os.urandom(32), os.urandom(32)
    sender, receiver = BareWire(KEY, b_key, a_key), BareWire(KEY, a_key, b_key)
    assert receiver.refuses_first_frame(bytearray(struct.pack("<I", MAX_FIRST_FRAME_BYTES + 1)))
    first, second = sender.frame({"n": 1}), sender.frame({"n": 2})
    buf = bytearray(first) + second + first[:3]
    assert [receiver.parse_frame(buf), receiver.parse_frame(buf), receiver.parse_frame(buf)] == [
        {"n": 1},
        {"n": 2},
        None,  # not whole yet
    ]
    assert not receiver.refuses_first_frame(bytearray(struct.pack("<I", MAX_FIRST_FRAME_BYTES + 1)))
    buf += first[3:]
    with pytest.raises(ValueError, match="replayed"):
        receiver.parse_frame(buf)


# -- real RaftGroups ---------------------------------------------------------------------------------


def settings(key: bytes) -> RaftSettings:
    return RaftSettings(
        password=key.hex(), election_min_s=0.3, election_max_s=0.6, heartbeat_s=0.02, tick_s=0.01
    )


@pytest.fixture
def two_groups(tmp_path: Path) -> Iterator[tuple[list[RaftGroup], list[Machine]]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    machines = [Machine(), Machine()]
    groups = [
        RaftGroup(
            name="g",
            node_id=f"n{i}",
            self_addr=addr,
            peer_addrs=addrs,
            journal_store=MemoryStore(),
            machine=machines[i],
            snapshot_file=str(tmp_path / f"n{i}" / "g.snapshot"),
            settings=settings(KEY),
        )
        for i, addr in enumerate(addrs)
    ]
    try:
        yield groups, machines
    finally:
        for g in groups:
            g.destroy()


def test_two_groups_replicate_large_and_small_entries_over_raft_connections(
    two_groups: tuple[list[RaftGroup], list[Machine]],
) -> None:
    groups, machines = two_groups
    assert all(isinstance(g._sync._SyncObj__transport, FlushingTransport) for g in groups)
    leader = settled_leader(groups)
    commands = [os.urandom(100 * 1024) for _ in range(20)] + [os.urandom(1024) for _ in range(500)]
    outcomes = submit_all(leader, commands)
    assert all(o.error is None for o in outcomes)
    wait_for(lambda: all(len(m.commands()) >= len(commands) for m in machines), "both replicas")
    for m in machines:
        assert [c for c in m.commands() if len(c) in (1024, 100 * 1024)] == commands
    conns = list(leader._sync._SyncObj__transport._connections.values())
    assert conns and all(type(c) is RaftConnection for c in conns)


def test_a_node_with_the_wrong_key_gets_its_connection_closed_and_applies_nothing(
    two_groups: tuple[list[RaftGroup], list[Machine]],
) -> None:
    groups, machines = two_groups
    leader = settled_leader(groups)
    submit_all(leader, [b"before"])
    wait_for(lambda: all(b"before" in m.commands() for m in machines), "both replicas")
    applied = [list(m.applied) for m in machines]
    host, port = leader.self_addr.rsplit(":", 1)

    def handshake(key: bytes) -> bytes:
        """What the leader's Raft port answers to a new connection's first frame (pysyncobj's
        handshake: a random key) sealed with ``key``: its own first frame, or b"" (closed)."""
        sealer = RaftConnection(None)
        sealer.raft_key = key
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(sealer.frame(os.urandom(32)))
            # then a forged entry for the case the handshake were accepted
            sealer.sendRandKey = os.urandom(32)
            s.sendall(sealer.frame({"type": "append_entries", "term": 10**6, "entries": []}))
            try:
                return s.recv(65536)
            except ConnectionResetError:
                return b""

    assert handshake(KEY) != b""  # the right key gets the server's random key back
    assert handshake(OTHER_KEY) == b""  # the wrong key: closed without a word
    submit_all(leader, [b"after"])
    wait_for(lambda: all(b"after" in m.commands() for m in machines), "both replicas")
    for m, before in zip(machines, applied, strict=True):
        assert m.applied[: len(before)] == before and m.commands()[len(before) :] == [b"after"]
    assert leader.is_leader()


def test_a_tick_looks_at_the_peers_connections_at_most_every_connect_check_period(
    two_groups: tuple[list[RaftGroup], list[Machine]],
) -> None:
    """pysyncobj's transport looked at every peer's connection (to bind, connect, retry) on every
    tick, several per entry on a busy leader; it now looks every CONNECT_CHECK_S."""
    groups, _ = two_groups
    leader = settled_leader(groups)
    transport = leader._sync._SyncObj__transport
    looks: list[float] = []
    ticks: list[float] = []
    connect = transport._connectIfNecessary
    transport._connectIfNecessary = lambda: (looks.append(time.monotonic()), connect())[1]
    leader._sync.addOnTickCallback(lambda: ticks.append(time.monotonic()))
    started = time.monotonic()
    for _ in range(100):  # one entry at a time: a tick for the entry and for each answer
        submit_all(leader, [os.urandom(100)])
    elapsed = time.monotonic() - started
    assert len(ticks) >= 200
    assert len(looks) <= elapsed / CONNECT_CHECK_S + 2, f"{len(looks)} looks in {len(ticks)} ticks"
