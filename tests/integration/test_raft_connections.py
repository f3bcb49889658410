"""Strangers on the Raft ports are bounded (issue 19, item 4; cluster/replication/admission.py).

Real sockets against a real node's Raft ports: an idle connection, one that sent part of a frame
and one that trickles a byte at a time are all closed once ``raft_auth_timeout_ms`` has passed
without an authenticated handshake; over ``raft_max_unauthenticated_per_source`` from one address,
or ``raft_max_unauthenticated`` on the node, a new connection is closed at once; each is counted by
reason in ``raftmq_raft_connections_refused``, and the cluster serves throughout. Loopback
addresses other than 127.0.0.1 stand in for other hosts.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

# The product's default. A shorter deadline left a loaded CI machine too little time: the cap test
# must do all it does (a dozen socket waits, two metrics reads, a produce) before the connections
# it holds time out, and each "at once" must be told apart from "at the deadline".
AUTH_TIMEOUT_S = 5.0
AT_ONCE_S = 1.5  # "closed at once": well before AUTH_TIMEOUT_S, when a kept one would be closed
LATE_S = 5.0  # slack past the deadline for the node's sweep on a loaded machine (a leak: never)
PER_SOURCE = 6
PER_NODE = 10
LIMITS = f"""[limits]
raft_auth_timeout_ms = {int(AUTH_TIMEOUT_S * 1000)}
raft_max_unauthenticated = {PER_NODE}
raft_max_unauthenticated_per_source = {PER_SOURCE}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=3, queue_groups=2, extra_toml=LIMITS) as c:
        c.start()
        c.wait_ready()
        c.create_topic("conns", queues=2)
        yield c


def raft_ports(c: Cluster, node: str) -> list[int]:
    base = c.nodes[node].raft_base
    return [base, base + 1, base + 2]  # the metadata group, queue groups 0 and 1


def sockets_from(c: Cluster, node: str, sources: set[str]) -> int:
    """How many of ``node``'s descriptors are TCP sockets whose peer is one of ``sources``.

    Only the node's own sockets to those addresses count, so files RocksDB opens or closes meanwhile
    (a process-wide descriptor count once missed by two on a loaded CI machine) cannot blur a leak."""
    proc = c.nodes[node].proc
    assert proc is not None
    inodes = set()
    for fd in os.listdir(f"/proc/{proc.pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            link = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    peers = {socket.inet_aton(a)[::-1].hex().upper() for a in sources}  # /proc/net/tcp: little-endian hex
    count = 0
    for line in Path(f"/proc/{proc.pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2].split(":")[0] in peers and fields[9] in inodes:
            count += 1
    return count


def strangers(c: Cluster, node: str) -> float:
    return c.metric_sum(node, "raftmq_raft_unauthenticated_connections")


def refused(c: Cluster, node: str) -> dict[str, float]:
    text = c.get("/metrics", node).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "raftmq_raft_connections_refused_total"
    }


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_peer(s: socket.socket, within_s: float) -> bool:
    """The node closed ``s`` within ``within_s`` (EOF or a reset); False if it is still open."""
    ready, _, _ = select.select([s], [], [], within_s)
    if not ready:
        return False
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def wait_closed(socks: list[socket.socket], deadline: float) -> dict[socket.socket, float]:
    """When each of ``socks`` was closed by the node (monotonic), waiting until ``deadline``."""
    closed: dict[socket.socket, float] = {}
    while len(closed) < len(socks) and time.monotonic() < deadline:
        open_ = [s for s in socks if s not in closed]
        ready, _, _ = select.select(open_, [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                data = b""
            if data == b"":
                closed[s] = time.monotonic()
    return closed


def produce_works(c: Cluster, value: str) -> None:
    r = c.produce("conns", [{"value": value}], node="n1")
    assert r.status_code == 200, r.text


def test_idle_partial_and_trickling_connections_are_closed_at_the_auth_deadline(cluster: Cluster) -> None:
    c = cluster
    counted = refused(c, "n1").get("auth_timeout", 0)
    ports = raft_ports(c, "n1")
    opened = time.monotonic()
    # Three of each kind, one per Raft port, each kind from its own address (under the caps).
    idle = [connect(ports[i], "127.0.0.11") for i in range(3)]
    partial = [connect(ports[i], "127.0.0.12") for i in range(3)]
    for s in partial:  # a frame that claims 1,000 bytes, of which 10 ever come
        s.sendall(struct.pack("<I", 1000) + os.urandom(10))
    trickling = [connect(ports[i], "127.0.0.13") for i in range(3)]
    stop = threading.Event()

    def trickle() -> None:  # one byte of a 60,000-byte frame every 0.2 s: never a whole frame
        for s in trickling:
            s.sendall(struct.pack("<I", 60_000))
        while not stop.wait(0.2):
            for s in trickling:
                with contextlib.suppress(OSError):  # closed by the node
                    s.send(b"x")

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    socks = idle + partial + trickling
    sources = {"127.0.0.11", "127.0.0.12", "127.0.0.13"}
    try:
        wait_until(
            lambda: sockets_from(c, "n1", sources) == len(socks), AUTH_TIMEOUT_S - 1, what="n1 holds them"
        )
        closed = wait_closed(socks, opened + AUTH_TIMEOUT_S + LATE_S)
        still_open = len(socks) - len(closed)
        assert still_open == 0, f"{still_open} of {len(socks)} open {AUTH_TIMEOUT_S + LATE_S} s after opening"
        for at in closed.values():
            assert at - opened >= AUTH_TIMEOUT_S - 0.2, "closed before the deadline"
        # Closed at the node too, not only shut down towards us: no descriptor of n1 still holds one.
        wait_until(lambda: sockets_from(c, "n1", sources) == 0, 10, what="n1's sockets to them closed")
        wait_until(
            lambda: refused(c, "n1").get("auth_timeout", 0) >= counted + 9 and not strangers(c, "n1"),
            5,
            what="each counted as timed out, none left",
        )
        produce_works(c, "after the strangers")
    finally:
        stop.set()
        sender.join()
        for s in socks:
            s.close()


def test_over_the_caps_a_new_connection_is_closed_at_once(cluster: Cluster) -> None:
    c = cluster
    ports = raft_ports(c, "n1")
    before = refused(c, "n1")
    # PER_SOURCE from one address, all but one of the rest of the node's cap from another.
    held = [connect(ports[i % 3], "127.0.0.2") for i in range(PER_SOURCE)]
    held += [connect(ports[i % 3], "127.0.0.3") for i in range(PER_NODE - PER_SOURCE - 1)]
    try:
        # (All of this within AUTH_TIMEOUT_S of opening them: later they are closed anyway.)
        assert wait_closed(held, time.monotonic() + 0.3) == {}, "a connection under the caps was closed"
        over_source = connect(ports[0], "127.0.0.2")
        assert closed_by_peer(over_source, AT_ONCE_S), "a connection over the per-source cap was kept"
        held.append(connect(ports[2], "127.0.0.4"))  # the node's last place
        assert not closed_by_peer(held[-1], 0.3), "the node's last place was refused"
        assert strangers(c, "n1") == PER_NODE
        over_node = connect(ports[1], "127.0.0.5")
        assert closed_by_peer(over_node, AT_ONCE_S), "a connection over the node's cap was kept"
        assert not any(closed_by_peer(s, 0.0) for s in held), "a connection under the caps was closed"
        after = refused(c, "n1")  # counted before they were closed
        assert after.get("source_limit", 0) - before.get("source_limit", 0) >= 1
        assert after.get("node_limit", 0) - before.get("node_limit", 0) >= 1
        produce_works(c, "while the caps are full")  # the peers' connections are authenticated
        # Another node's Raft ports keep their own count.
        other = connect(raft_ports(c, "n2")[0], "127.0.0.2")
        assert not closed_by_peer(other, 0.5)
        other.close()
    finally:
        for s in held:
            s.close()
    # Once the strangers are gone, new connections are taken again.
    wait_until(lambda: strangers(c, "n1") == 0, 10, what="n1 counts no stranger")
    again = connect(ports[0], "127.0.0.2")
    assert not closed_by_peer(again, 0.5)
    again.close()


def test_a_garbage_frame_is_closed_at_once_and_counted(cluster: Cluster) -> None:
    c = cluster
    counted = refused(c, "n1").get("bad_frame", 0)
    for port in raft_ports(c, "n1"):
        s = connect(port, "127.0.0.6")
        s.sendall(struct.pack("<I", 200) + os.urandom(200))  # whole, but sealed with no key
        assert closed_by_peer(s, AT_ONCE_S), port
        s.close()
    # (The node counts a connection just after it closed it.)
    wait_until(lambda: refused(c, "n1").get("bad_frame", 0) - counted >= 3, 5, what="3 bad frames counted")
    produce_works(c, "after garbage")
