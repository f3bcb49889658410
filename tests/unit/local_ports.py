"""Ports on 127.0.0.1 for the replicas the unit tests start (``raft_doubles.free_port``).

A port found free by binding port 0 and closing is in the kernel's ephemeral range: another
test's bind to port 0, or an outgoing connection's local port, can take it before the replica
binds it (seen about once in 10,000). So ports come from blocks below the ephemeral range,
where the kernel never hands one out by itself, and each process claims its blocks: it holds a
listening socket on a block's first port for its lifetime, so another test run (or another
pytest-xdist worker) finds that port taken and claims another block. Blocks are aligned, so two
blocks are the same (the claim tells) or share no port.

Invariant: a port is handed out at most once per process, and only from a block this process
claimed; a port something else already binds is skipped.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

__all__ = ["BLOCK_PORTS", "PortBlocks", "ephemeral_ports"]

BLOCK_PORTS = 128
# The region the blocks come from: clear of the ports below 10,000 that services commonly use, and
# of 20,000-32,000, where the integration harness and bench_http place their nodes' blocks.
_REGION = (10_000, 20_000)


def ephemeral_ports() -> range:
    """The kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortBlocks:
    """Hands out ports from blocks this process claimed (see the module docstring)."""

    def __init__(self, block_ports: int = BLOCK_PORTS) -> None:
        low, high = _REGION[0], min(_REGION[1], ephemeral_ports().start)
        first = -(-low // block_ports) * block_ports  # blocks start at multiples of block_ports
        self._bases = range(first, high - block_ports + 1, block_ports)
        if not self._bases:
            raise RuntimeError(f"no block of {block_ports} ports between {low} and {high}")
        self._block_ports = block_ports
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._claims: list[socket.socket] = []  # held open: the blocks stay this process's
        self._next = self._end = 0

    def take(self) -> int:
        """A port no other call of this process got, and no other process claimed."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's blocks are not its own
                self._pid, self._claims, self._next, self._end = os.getpid(), [], 0, 0
            while True:
                if self._next >= self._end:
                    self._claim()
                port, self._next = self._next, self._next + 1
                if _bindable(port):
                    return port

    def _claim(self) -> None:
        for base in random.sample(self._bases, len(self._bases)):
            claim = socket.socket()
            try:
                claim.bind(("127.0.0.1", base))  # no SO_REUSEADDR: any other bind of it fails
                claim.listen()
            except OSError:
                claim.close()
                continue
            self._claims.append(claim)
            self._next, self._end = base + 1, base + self._block_ports
            return
        raise RuntimeError(f"every block of {self._block_ports} ports in {self._bases} is taken")
