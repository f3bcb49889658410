"""Test doubles shared by the pysyncobj seam tests (``test_raft_seams.py``), the RaftGroup tests
(``test_raft_group.py``, ``test_raft_wire.py``, ``test_raft_pre_vote.py``, ...) and the snapshot
install tests (``test_snapshot_install.py``): a tiny state machine, fast Raft timings, a free port,
a polling wait, a leader every replica follows, and three RaftGroups on localhost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from local_ports import PortBlocks

from raftmq.cluster.replication.raft import Outcome, RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore

__all__ = ["Machine", "fast_settings", "free_port", "settled_leader", "start_three", "submit_all", "wait_for"]


class Machine:
    """A tiny state machine recording the (index, command) pairs it applied."""

    def __init__(self, check: Callable[[int], None] | None = None) -> None:
        self._store = MemoryStore()
        self.applied: list[tuple[int, bytes]] = []
        self.check = check

    @property
    def store(self) -> MemoryStore:
        return self._store

    @property
    def applied_index(self) -> int:
        return self.applied[-1][0] if self.applied else 0

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self.applied_index:
            return {"skipped": True}
        if self.check is not None:
            self.check(index)
        self.applied.append((index, command))
        return {"index": index}

    def commands(self) -> list[bytes]:
        """The commands applied, in order (a copy: safe while the tick thread applies more)."""
        return [c for _, c in list(self.applied)]

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


def fast_settings() -> RaftSettings:
    return RaftSettings(
        password="x" * 16,
        election_min_s=0.15,
        election_max_s=0.3,
        heartbeat_s=0.02,
        tick_s=0.01,
    )


_PORTS: list[PortBlocks] = []  # made at the first call: a module that imports this starts none


def free_port() -> int:
    """A port on 127.0.0.1 for a replica to bind: never handed out twice, and no ephemeral bind
    (another test's port 0, a connection's local port) can take it first (see local_ports)."""
    if not _PORTS:
        _PORTS.append(PortBlocks())  # raises, saying why, when no block fits below the ephemeral range
    return _PORTS[0].take()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """``condition()``'s first truthy answer, asked every 5 ms; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def settled_leader(groups: Sequence[RaftGroup], timeout: float = 10.0) -> RaftGroup:
    """The replica that leads once every one of ``groups`` follows it and hears it. Until a
    replica has heard the winner of an election it still grants pre-votes, so a follower slowed
    just then (a long tick under load) can depose the new leader: a test that picks the leader
    and later reads what only a leader holds picks it here. (While pre-vote read the wrong clock,
    37 starts in 100 with fast_settings had a second leader within 0.6 s; 1 in 80 after this.)"""

    def settled() -> RaftGroup | None:
        leader = next((g for g in groups if g.is_leader()), None)
        if leader is None or not all(g.leader() == leader.self_addr for g in groups):
            return None
        return leader if all(g.status().hears_leader for g in groups) else None

    leader: RaftGroup = wait_for(settled, "a leader every replica follows", timeout)
    return leader


def start_three(
    tmp_path: Path,
    settings: RaftSettings | Sequence[RaftSettings],
    into: list[RaftGroup],
    machines: Sequence[Machine] | None = None,
) -> list[RaftGroup]:
    """Three replicas of group ``g`` on localhost (in-memory journals), appended to ``into`` as
    they start (the caller destroys them), once one of them leads and the others follow it
    (:func:`settled_leader`). ``settings``: the same for all,
    or one each; ``machines``: theirs (else a new :class:`Machine` each)."""
    each = [settings] * 3 if isinstance(settings, RaftSettings) else list(settings)
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    for i, addr in enumerate(addrs):
        into.append(
            RaftGroup(
                name="g",
                node_id=f"n{i + 1}",
                self_addr=addr,
                peer_addrs=[a for a in addrs if a != addr],
                journal_store=MemoryStore(),
                machine=Machine() if machines is None else machines[i],
                snapshot_file=str(tmp_path / f"n{i + 1}" / "g.snapshot"),
                settings=each[i],
            )
        )
    settled_leader(into)
    return list(into)


def submit_all(group: RaftGroup, commands: list[bytes], timeout: float = 30.0) -> list[Outcome]:
    """Submit ``commands`` to ``group`` and wait for every outcome (in the order they came)."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def done(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)

    for c in commands:
        group.submit(c, done)
    wait_for(lambda: len(outcomes) == len(commands), "every outcome", timeout=timeout)
    return outcomes
