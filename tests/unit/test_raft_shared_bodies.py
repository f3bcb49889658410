"""Shared bodies on the Raft wire (cluster/replication/shared_bodies.py, pso.py's RaftConnection):
a leader's append_entries that is the same for several followers is pickled and sealed once, and
each follower gets an envelope of its own and the same body bytes; the wire's properties hold (a
body replayed to another connection, swapped or altered drops the connection and delivers
nothing), and a peer of the release before (no mark in its handshake key) gets frames of its own.

Real sockets on 127.0.0.1 and real RaftGroups (raft_doubles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.tcp_connection import CONNECTION_STATE
from raft_doubles import Machine, fast_settings, start_three, submit_all
from test_raft_wire import KEY, Pair, wait_for

from raftmq.cluster.replication.pso import RaftConnection
from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.cluster.replication.shared_bodies import (
    SHARED_BODY_MIN_BYTES,
    SharedBodies,
    handshake_key,
    reads_shared_bodies,
)


def handshake(pair: Pair, offer: bool = True, shared: SharedBodies | None = None) -> None:
    """What pysyncobj's handshake leaves on a pair: b chose a key (marked if ``offer``), a sends
    it back with every frame; a seals bodies with ``shared``, b reads them if it offered."""
    pair.b.recvRandKey = pair.a.sendRandKey = handshake_key(offer)
    pair.a.shared_bodies = shared
    pair.b.shared_bodies = SharedBodies(KEY) if offer else None


def append_entries(entries: list[tuple[bytes, int, int]], commit_index: int = 3) -> dict[str, Any]:
    """pysyncobj's append_entries (a new dict per follower, the same entry objects)."""
    return {
        "type": "append_entries",
        "term": 2,
        "commit_index": commit_index,
        "entries": list(entries),
        "prevLogIdx": 4,
        "prevLogTerm": 2,
    }


class Wire:
    """The bytes a connection hands its socket, recorded on the way."""

    def __init__(self, conn: RaftConnection) -> None:
        self.data = bytearray()
        sock = conn._TcpConnection__socket
        wire = self

        class Recording:
            def send(self, data: Any) -> int:
                sent = sock.send(data)
                wire.data += bytes(data)[:sent]
                return int(sent)

            def sendmsg(self, buffers: Any) -> int:
                parts = [bytes(b) for b in buffers]
                sent = sock.sendmsg(parts)
                wire.data += b"".join(parts)[:sent]
                return int(sent)

            def __getattr__(self, name: str) -> Any:
                return getattr(sock, name)

        conn._TcpConnection__socket = Recording()


@pytest.fixture
def pairs() -> Iterator[list[Pair]]:
    made = [Pair(), Pair()]
    yield made
    for p in made:
        p.close()


def test_the_same_entries_for_two_followers_are_sealed_once_and_sent_as_the_same_bytes(
    pairs: list[Pair],
) -> None:
    shared = SharedBodies(KEY)
    for p in pairs:
        handshake(p, shared=shared)
    wires = [Wire(p.a) for p in pairs]
    entries = [(os.urandom(SHARED_BODY_MIN_BYTES), 5, 2), (os.urandom(1024), 6, 2)]
    for p in pairs:
        p.a.send(append_entries(entries))
    for p in pairs:
        wait_for(lambda p=p: p.got, "the entries", step=p.pump)
        assert p.got == [append_entries(entries)]
        assert p.b.state == CONNECTION_STATE.CONNECTED
    assert shared.sealed == 1
    # the body: the same ciphertext on both wires (frames of their own differ in every byte)
    sample = wires[0].data[-4096:]
    assert len(wires[0].data) > SHARED_BODY_MIN_BYTES and sample in wires[1].data
    assert entries[0][0][:64] not in wires[0].data  # and it is encrypted


def test_a_different_message_or_small_entries_are_not_shared(pairs: list[Pair]) -> None:
    shared = SharedBodies(KEY)
    for p in pairs:
        handshake(p, shared=shared)
    big = [(os.urandom(SHARED_BODY_MIN_BYTES), 5, 2)]
    pairs[0].a.send(append_entries(big, commit_index=3))
    pairs[1].a.send(append_entries(big, commit_index=4))  # the commit index moved: another body
    small = [(os.urandom(100), 6, 2)]
    for p in pairs:
        p.a.send(append_entries(small))
    for p, commit in zip(pairs, (3, 4), strict=True):
        wait_for(lambda p=p: len(p.got) == 2, "both messages", step=p.pump)
        assert p.got == [append_entries(big, commit_index=commit), append_entries(small)]
    assert shared.sealed == 2


def test_a_peer_of_the_release_before_gets_frames_of_its_own(pairs: list[Pair]) -> None:
    """No mark in the peer's handshake key: no envelope goes to it, and a node that did not offer
    hangs up on one (as the release before, which cannot unpickle it, does)."""
    shared = SharedBodies(KEY)
    old, new = pairs
    handshake(old, offer=False, shared=shared)
    entries = [(os.urandom(SHARED_BODY_MIN_BYTES), 5, 2)]
    old.a.send(append_entries(entries))
    wait_for(lambda: old.got, "the entries", step=old.pump)
    assert old.got == [append_entries(entries)] and shared.sealed == 0
    assert not reads_shared_bodies(old.a.sendRandKey)
    # an envelope all the same (a sender that ignored the handshake): refused, nothing delivered
    handshake(new, shared=shared)
    new.b.shared_bodies = None  # b did not offer
    new.a.send(append_entries(entries))
    wait_for(lambda: new.b.state == CONNECTION_STATE.DISCONNECTED, "the hang-up", step=new.pump)
    assert new.got == []


def test_a_body_replayed_to_another_connection_swapped_or_altered_drops_it(pairs: list[Pair]) -> None:
    """Streams a leader's connection could carry, written to a follower's socket byte for byte."""
    made: list[Pair] = []
    entries = [(os.urandom(SHARED_BODY_MIN_BYTES), 5, 2)]

    def outcome(stream: Callable[[RaftConnection], bytes], padding: int = 0) -> list[Any]:
        """What b delivers of ``stream(sender)`` (a sender on b's connection, handshake done)
        before it hangs up; ["open", ...] if it did not."""
        made.append(p := Pair())
        handshake(p)
        p.b.max_frame_bytes = 1 << 20
        sender = RaftConnection(None)
        sender.raft_key, sender.shared_bodies = KEY, SharedBodies(KEY)
        sender.sendRandKey = p.b.recvRandKey
        data, sock = memoryview(stream(sender) + bytes(padding)), p.a._TcpConnection__socket
        while data and p.b.state != CONNECTION_STATE.DISCONNECTED:  # written as b reads
            with contextlib.suppress(BlockingIOError):
                data = data[sock.send(data[: 1 << 16]) :]
            p.pump()
        for _ in range(40):
            p.pump()
        return p.got if p.b.state == CONNECTION_STATE.DISCONNECTED else ["open", *p.got]

    def frames(sender: RaftConnection, commit_index: int = 3) -> list[bytes]:
        return [bytes(f) for f in sender.frames(append_entries(entries, commit_index))]

    def elsewhere(sender: RaftConnection) -> list[bytes]:
        sender.sendRandKey = handshake_key(True)  # the key another connection's receiver chose
        return frames(sender)

    try:
        ok = outcome(lambda s: bytes(s.frame("first")) + b"".join(frames(s)))
        assert ok == ["open", "first", append_entries(entries)]  # the stream as sent
        # the body alone, as recorded on another connection (padded: its first bytes, read as a
        # length prefix, are up to b's limit; the frame then fails its checks)
        assert outcome(lambda s: bytes(s.frame("first")) + frames(s)[1], padding=1 << 20) == ["first"]
        # this connection's envelope, then another body of the same leader
        assert outcome(lambda s: bytes(s.frame("first")) + frames(s)[0] + frames(s, 9)[1]) == ["first"]
        # the body altered
        altered = lambda s: (lambda e, b: e + b[:100] + bytes([b[100] ^ 1]) + b[101:])(*frames(s))  # noqa: E731
        assert outcome(lambda s: bytes(s.frame("first")) + altered(s)) == ["first"]
        # an envelope for the connection to another follower (its handshake key)
        assert outcome(lambda s: bytes(s.frame("first")) + b"".join(elsewhere(s))) == ["first"]
    finally:
        for p in made:
            p.close()


# -- real RaftGroups ---------------------------------------------------------------------------------


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[list[RaftGroup]]:
    made: list[RaftGroup] = []
    yield made
    for g in made:
        g.destroy()


def replica_settings(offer: bool) -> RaftSettings:
    """Elections slower than fast_settings' (under this load those changed leaders mid-run, and
    a deposed leader answers what it had not committed unknown_outcome), and a replica of the
    release before slower still: it never leads (a leader that offers none seals nothing)."""
    election_min_s = 1.0 if offer else 10.0
    return dataclasses.replace(
        fast_settings(), election_min_s=election_min_s, election_max_s=2 * election_min_s, shared_bodies=offer
    )


@pytest.mark.parametrize("offers", [[True, True, True], [True, True, False]], ids=["all new", "one old"])
def test_three_replicas_apply_every_entry_with_bodies_shared_where_both_ends_read_them(
    tmp_path: Path, groups: list[RaftGroup], offers: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each body the leader seals goes to every follower that reads shared bodies: two envelopes
    a body with two such followers (bar the rounds a follower is behind the other, when each is
    sent a message of its own), one with one (the other gets frames of its own)."""
    sent = _record_envelopes(monkeypatch)
    machines = [Machine() for _ in offers]
    start_three(tmp_path, [replica_settings(o) for o in offers], groups, machines)
    leader = next(g for g in groups if g.is_leader())
    assert leader.shared_bodies, "a replica of the release before leads"
    commands = [os.urandom(64 * 1024) for _ in range(30)] + [os.urandom(1024) for _ in range(200)]
    outcomes = submit_all(leader, commands)
    assert [o for o in outcomes if o.error is not None] == []
    for m in machines:
        wait_for(
            lambda m=m: len([c for c in m.commands() if len(c) in (1024, 64 * 1024)]) == 230, "a replica"
        )
        assert [c for c in m.commands() if len(c) in (1024, 64 * 1024)] == commands
    offered = {g.self_addr: offer for g, offer in zip(groups, offers, strict=True)}
    for g in groups:
        transport = g._sync._SyncObj__transport

        def marks(transport: Any = transport) -> dict[str, bool]:
            # each peer's handshake key carries the mark if and only if that peer offered
            return {str(n.id): reads_shared_bodies(c.sendRandKey) for n, c in transport._connections.items()}

        peers = {a: o for a, o in offered.items() if a != g.self_addr}
        wait_for(lambda marks=marks, peers=peers: marks() == peers, "both peers' handshakes")
        assert (transport.shared_bodies is None) == (not offered[g.self_addr])
    # One envelope a body and a follower that reads them: as many as the bodies with one such
    # follower; with two, more (1.7-1.8 times in three runs; a body sealed again for the second
    # follower would make them as many). Counted over every replica that offers: under load the
    # leader picked can lose an election just after it starts, and a follower forwards what it is
    # given to the new leader, which seals the bodies (CI once saw 0 at the one picked). And
    # counted once a connection, however often a body went there: pysyncobj sends a follower the
    # same entries again when it asks for them (with one such follower, 40 envelopes for 39 bodies
    # once in six runs under load).
    counts = [g.sealed_bodies for g in groups if g.sealed_bodies is not None]
    assert len(counts) == offers.count(True)
    sealed = sum(c.sealed for c in counts)
    assert sealed > 0  # a body for at least the 64 KiB entries
    if offers.count(True) == 2:
        assert len(sent) == sealed, (sealed, len(sent))
    else:
        assert sealed < len(sent) <= 2 * sealed, (sealed, len(sent))


def _record_envelopes(monkeypatch: pytest.MonkeyPatch) -> set[tuple[bytes, tuple[bytes, int]]]:
    """The envelopes sent from now on: (the handshake key of the connection's peer, the body's
    salt and counter), once each (connections bind nothing of RaftConnection's at start)."""
    sent: set[tuple[bytes, tuple[bytes, int]]] = set()
    frames = RaftConnection.frames

    def recording_frames(self: RaftConnection, message: Any) -> list[bytes | bytearray]:
        out = frames(self, message)
        if len(out) == 2 and self.shared_bodies is not None and self.shared_bodies._last is not None:
            body = self.shared_bodies._last
            sent.add((bytes(self.sendRandKey), (body.salt, body.counter)))
        return out

    monkeypatch.setattr(RaftConnection, "frames", recording_frames)
    return sent
