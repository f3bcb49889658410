"""The raft-strangers nemesis's traffic: strangers' connections to every Raft port of every node.

From the harness (the host, one source address to the nodes), a thread keeps on every node more
idle connections than a node lets one address hold unauthenticated (``raft_max_unauthenticated_per_source``,
64), a third of them with a partial frame, opens one more every round (0.1 s) that sends a whole
frame of garbage, and opens again whatever a node closed. None of it may cost the cluster anything
but the descriptors the caps allow: the nodes close each connection at its deadline or at once, and
the checkers must find nothing lost. What the nodes did is counted here and read from their
``raftmq_raft_connections_refused_total``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["RaftStrangers", "refused_by_node"]

HELD_PER_NODE = 72  # above the per-source cap: the rest are refused at accept (source_limit)
ROUND_S = 0.1  # a garbage frame per node and the refused ones opened again, per round
CONNECT_TIMEOUT_S = 3.0  # a SYN dropped on a full accept backlog is sent again after 1 s
STATS = ("opened", "closed_by_node", "garbage_frames", "connect_errors")


class RaftStrangers:
    """Strangers' connections to ``targets`` (node id -> its Raft (host, port)s) until :meth:`stop`:
    one thread per node, so that a connect waiting on a full accept backlog holds up only its node."""

    def __init__(self, targets: dict[str, list[tuple[str, int]]], seed: int) -> None:
        self._stop = threading.Event()
        self._stats = {nid: dict.fromkeys(STATS, 0) for nid in targets}
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(ports, self._stats[nid], seed + i),
                name=f"raft-strangers-{nid}",
                daemon=True,
            )
            for i, (nid, ports) in enumerate(targets.items())
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> dict[str, int]:
        """Stop, close every connection, and return the counts summed over the nodes."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        return {key: sum(stats[key] for stats in self._stats.values()) for key in STATS}

    def _run(self, ports: list[tuple[str, int]], stats: dict[str, int], turn: int) -> None:
        held: list[socket.socket] = []

        def connect() -> socket.socket | None:
            nonlocal turn
            turn += 1
            try:
                s = socket.create_connection(ports[turn % len(ports)], CONNECT_TIMEOUT_S)
            except OSError:  # the port's accept backlog is full, or the node is down
                stats["connect_errors"] += 1
                return None
            stats["opened"] += 1
            return s

        try:
            while not self._stop.is_set():
                for s in [s for s in held if _closed(s)]:  # the node closed it: count, open another
                    stats["closed_by_node"] += 1
                    held.remove(s)
                    s.close()
                # Garbage first: right after the node closed the held ones at their deadline it
                # is taken (and fails to authenticate); while the address is at its cap it is refused.
                garbage = connect()
                if garbage is not None:
                    _send(garbage, struct.pack("<I", 200) + os.urandom(200))
                    stats["garbage_frames"] += 1
                    with contextlib.suppress(OSError):  # the node hangs up (closing first, it would
                        garbage.recv(1)  # see the peer leave before it reads the frame)
                    garbage.close()
                while len(held) < HELD_PER_NODE and not self._stop.is_set():
                    new = connect()
                    if new is None:
                        break
                    if turn % 3 == 0:  # a frame that claims 1,000 bytes, of which 10 ever come
                        _send(new, struct.pack("<I", 1000) + os.urandom(10))
                    held.append(new)
                self._stop.wait(ROUND_S)
        finally:
            for s in held:
                s.close()


def _send(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # closed by the node already: the next round counts it
        s.sendall(data)


def _closed(s: socket.socket) -> bool:
    """The node closed ``s`` (EOF or a reset); never blocks."""
    try:
        s.setblocking(False)
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def refused_by_node(urls: dict[str, str]) -> dict[str, Any]:
    """Each node's ``raftmq_raft_connections_refused_total`` by reason (or the error reading it)."""
    out: dict[str, Any] = {}
    for nid, url in urls.items():
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError as e:
            out[nid] = {"error": str(e)}
            continue
        out[nid] = {
            s.labels["reason"]: int(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "raftmq_raft_connections_refused_total"
        }
    return out
