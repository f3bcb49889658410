"""Membership changes of one Raft group at the adapter level: real ``RaftGroup``s in this process on
127.0.0.1 over real RocksDB journals and states (the node-level operations are in
``test_membership.py``).

Every test ends by restarting the replicas with a *stale* seed (the voters the group started with):
the voters must come from the group's own log and snapshot manifest, never from the seed.

A test that a replica (joining, or behind on the voters) causes no election asserts just that: no
other replica's term rose because of it (``RaftGroup.status().term_rises`` names who raised each
term). An election this process's stall caused (all four replicas run in it) is printed, not failed,
unless the replica under test brought it without a majority's pre-vote grants.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from raftmq.cluster.replication.raft import Outcome, RaftGroup, RaftSettings
from raftmq.cluster.replication.term_record import CAMPAIGN, OTHER, PRE_VOTE_GRANTED
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, StoreClosed

from .harness import free_port_block

_APPLIED = b"A"


class LogMachine:
    """Stores every applied command under its index (and the applied index) in a RocksStore."""

    def __init__(self, store: RocksStore) -> None:
        self._store = store
        raw = store.get(_APPLIED)
        self._applied = struct.unpack(">Q", raw)[0] if raw else 0

    @property
    def store(self) -> RocksStore:
        return self._store

    @property
    def applied_index(self) -> int:
        return self._applied

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self._applied:
            return {"skipped": True}
        batch = Batch()
        batch.put(b"C" + struct.pack(">Q", index), command)
        batch.put(_APPLIED, struct.pack(">Q", index))
        self._store.write(batch)
        self._applied = index
        return {"index": index}

    def restore(self, checkpoint_dir: str) -> None:
        self._store.restore_from(checkpoint_dir)
        raw = self._store.get(_APPLIED)
        self._applied = struct.unpack(">Q", raw)[0] if raw else 0

    def commands(self) -> list[bytes]:
        try:
            return [v for _, v in self._store.scan(b"C", b"D")]
        except StoreClosed:  # a checkpoint install swaps the database under us (tick thread)
            return []


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# The production election and fallback timeouts (a follower waits at least 0.8 s without a
# heartbeat): the tests that assert "no election" must not see one because a busy machine stalled
# this process (all four replicas run in it) for a few hundred milliseconds.
SETTINGS = RaftSettings(
    password="membership-test-secret",
    election_min_s=0.8,
    election_max_s=1.6,
    heartbeat_s=0.03,
    tick_s=0.01,
    leader_fallback_s=2.0,
    join_quiet_s=0.5,
)


class Replica:
    def __init__(self, root: Path, name: str, addr: str) -> None:
        self.root = root / name
        self.name = name
        self.addr = addr
        self.group: RaftGroup | None = None
        self.machine: LogMachine | None = None
        self._stores: list[RocksStore] = []
        self.checkpoints_fetched = 0

    def start(self, seed: list[str], peers: dict[str, Replica], joining: bool = False) -> RaftGroup:
        journal = RocksStore.open(str(self.root / "raft"))
        state = RocksStore.open(str(self.root / "state"))
        self._stores = [journal, state]
        self.machine = LogMachine(state)

        def fetch(manifest: dict[str, Any]) -> tuple[str, int]:
            source = next(p for p in peers.values() if p.addr == manifest["raft_addr"])
            assert source.machine is not None
            dest = str(self.root / f"incoming-{time.time_ns()}")
            source.machine.store.checkpoint(dest)
            self.checkpoints_fetched += 1
            ckpt = RocksStore.open(dest)
            raw = ckpt.get(_APPLIED)
            ckpt.close()
            return dest, struct.unpack(">Q", raw)[0] if raw else 0

        self.group = RaftGroup(
            name="g",
            node_id=self.name,
            self_addr=self.addr,
            peer_addrs=seed,
            journal_store=journal,
            machine=self.machine,
            snapshot_file=str(self.root / "snapshot" / "manifest.json"),
            settings=SETTINGS,
            fetch_checkpoint=fetch,
            joining=joining,
        )
        return self.group

    def stop(self) -> None:
        if self.group is not None:
            self.group.destroy()
            self.group = None
        for store in self._stores:
            store.close()
        self._stores = []

    @property
    def g(self) -> RaftGroup:
        assert self.group is not None
        return self.group


class Cluster:
    def __init__(self, root: Path, names: list[str]) -> None:
        # Free ports below the ephemeral range: a port the kernel hands out (bind to 0) could be
        # taken, before its replica starts, as the local end of a connection to it from a peer
        # (d is dialled before it listens), which would then be connected to itself.
        base = free_port_block(len(names))
        self.replicas = {n: Replica(root, n, f"127.0.0.1:{base + i}") for i, n in enumerate(names)}

    def addrs(self, *names: str) -> list[str]:
        return [self.replicas[n].addr for n in names]

    def running(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.group is not None]

    def leader(self) -> Replica:
        def find() -> Replica | None:
            leaders = [r for r in self.running() if r.g.is_leader()]
            return leaders[0] if len(leaders) == 1 else None

        found: Replica = wait_for(find, "one leader")
        return found

    def call(self, fn: Callable[[Callable[[Outcome], None]], None]) -> Outcome:
        done = threading.Event()
        outcomes: list[Outcome] = []

        def on_done(outcome: Outcome) -> None:
            outcomes.append(outcome)
            done.set()

        fn(on_done)
        assert done.wait(10), "no outcome"
        return outcomes[0]

    def submit(self, commands: list[bytes]) -> None:
        for command in commands:
            for _ in range(50):
                outcome = self.call(functools.partial(self._submit_at_leader, command))
                if outcome.error is None:
                    break
                assert outcome.definite, outcome
                time.sleep(0.1)
            else:
                raise AssertionError(f"{command!r} not committed")

    def _submit_at_leader(self, command: bytes, on_done: Callable[[Outcome], None]) -> None:
        self.leader().g.submit(command, on_done)

    def change(self, action: str, name: str) -> Outcome:
        addr = self.replicas[name].addr
        for _ in range(100):
            outcome = self.call(lambda cb: self.leader().g.change_membership(action, addr, cb))
            if outcome.error is None:
                return outcome
            assert outcome.error in ("unavailable", "not_leader"), outcome
            time.sleep(0.1)
        raise AssertionError(f"{action} {name} never committed")

    def transfer_away_from(self, name: str) -> None:
        if self.leader().name != name:
            return

        def moved() -> bool:
            leader = self.leader()
            if leader.name == name:
                leader.g.transfer_leadership()
                return False
            return True

        wait_for(moved, f"leadership away from {name}")

    def wait_applied(self, names: list[str], count: int) -> None:
        for n in names:
            machine = self.replicas[n].machine
            assert machine is not None
            wait_for(functools.partial(lambda m: len(m.commands()) == count, machine), f"{n} applied")

    def stop_all(self) -> None:
        for r in self.replicas.values():
            r.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, ["a", "b", "c", "d"])
    yield c
    c.stop_all()


Rises = dict[tuple[str, str], int]  # a replica's term rises by (cause, peer)


def rises(c: Cluster) -> dict[str, Rises]:
    """Every running replica's term rises so far, by replica."""
    return {r.name: {(t.cause, t.peer): t.count for t in r.g.status().term_rises} for r in c.running()}


def _since(now: Rises, before: Rises) -> Rises:
    return {k: count - before.get(k, 0) for k, count in now.items() if count > before.get(k, 0)}


def assert_caused_no_election(c: Cluster, name: str, before: dict[str, Rises]) -> None:
    """Since ``before``, no other replica's term rose because of ``name`` (nor of a sender they do
    not know), unless a majority granted ``name``'s pre-vote every time it campaigned: their leader
    was unheard, an election of the voters' own (a stalled process), which is printed."""
    addr = c.replicas[name].addr
    new = {n: _since(now, before.get(n, {})) for n, now in rises(c).items()}
    own = new.pop(name, {})
    brought = {n: {k: v for k, v in rows.items() if k[1] in (addr, OTHER)} for n, rows in new.items()}
    brought = {n: rows for n, rows in brought.items() if rows}
    print(f"term rises since {name} started: its own {own}, the others' {new}")
    granted = own.get((PRE_VOTE_GRANTED, addr), 0) > 0 and (CAMPAIGN, addr) not in own
    if granted and not any(k[1] == OTHER for rows in brought.values() for k in rows):
        return  # the voters' election: printed above
    assert not brought, f"{name} ({addr}) raised other replicas' terms: {brought}"


def _commands(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _move_a_to_d(c: Cluster, compact_before_join: bool) -> None:
    """a, b, c → add d → d catches up → remove a (after moving leadership off a)."""
    for n in "abc":
        c.replicas[n].start(c.addrs("a", "b", "c"), c.replicas)
    c.submit(_commands("one", 30))
    if compact_before_join:
        for r in c.running():
            r.g.force_compaction()
        dumped = [r.root / "snapshot" / "manifest.json" for r in c.running()]
        wait_for(lambda: all(os.path.exists(p) for p in dumped), "snapshots")
    added = c.change("add", "d")
    assert added.result["changed"] is True
    assert added.result["members"] == sorted(c.addrs("a", "b", "c", "d"))
    c.replicas["d"].start(c.addrs("a", "b", "c", "d"), c.replicas, joining=True)
    c.wait_applied(["d"], 30)
    c.transfer_away_from("a")
    removed = c.change("remove", "a")
    assert removed.result["members"] == sorted(c.addrs("b", "c", "d"))
    c.replicas["a"].stop()
    shutil.rmtree(c.replicas["a"].root)
    c.submit(_commands("two", 10))
    c.wait_applied(["b", "c", "d"], 40)


def _restart_with_stale_seed(c: Cluster) -> None:
    c.stop_all()
    for n in "bcd":
        group = c.replicas[n].start(c.addrs("a", "b", "c"), c.replicas)
        assert sorted(group.members()) == sorted(c.addrs("b", "c", "d")), n
    c.submit(_commands("three", 5))
    c.wait_applied(["b", "c", "d"], 45)
    for n in "bcd":  # pysyncobj's own view, after it loaded the snapshot (if any) on its first tick
        others = {str(x.id) for x in c.replicas[n].g._sync.otherNodes}
        assert others == set(c.addrs("b", "c", "d")) - {c.replicas[n].addr}, n
    expected = c.replicas["b"].machine.commands()  # type: ignore[union-attr]
    assert expected[:30] == _commands("one", 30) and expected[30:40] == _commands("two", 10)
    for n in "cd":
        assert c.replicas[n].machine.commands() == expected  # type: ignore[union-attr]


def test_move_a_voter_by_log_replay_survives_restart(cluster: Cluster) -> None:
    _move_a_to_d(cluster, compact_before_join=False)
    assert cluster.replicas["d"].checkpoints_fetched == 0  # d replayed the log from index 1
    _restart_with_stale_seed(cluster)


def test_move_a_voter_by_snapshot_survives_compaction_and_restart(cluster: Cluster) -> None:
    _move_a_to_d(cluster, compact_before_join=True)
    assert cluster.replicas["d"].checkpoints_fetched == 1  # the leader's log was compacted
    # Compact after the changes: the membership entries leave the journals for the manifests.
    for r in cluster.running():
        r.g.force_compaction()

    def compacted(r: Replica) -> bool:
        manifest = orjson.loads((r.root / "snapshot" / "manifest.json").read_bytes())
        return bool(manifest["last"][1] > 40 and manifest["cluster"] == sorted(cluster.addrs("b", "c", "d")))

    wait_for(lambda: all(compacted(r) for r in cluster.running()), "manifests with the new voters")
    _restart_with_stale_seed(cluster)


def test_second_change_while_one_is_in_flight_is_refused(cluster: Cluster) -> None:
    for n in "abc":
        cluster.replicas[n].start(cluster.addrs("a", "b", "c"), cluster.replicas)
    cluster.change("add", "a")  # waits until the leader's no-op is applied; a is already a voter
    leader = cluster.leader()
    outcomes: list[Outcome] = []
    both = threading.Event()

    def collect(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 2:
            both.set()

    # Both reach the tick thread in one batch: the first is proposed, the second refused. The
    # second removes a follower (a leader removing itself is refused as bad_request anyway).
    follower = next(r for r in (cluster.replicas[n] for n in "abc") if r is not leader)
    leader.g.change_membership("add", cluster.replicas["d"].addr, collect)
    leader.g.change_membership("remove", follower.addr, collect)
    assert both.wait(10)
    refused = [o for o in outcomes if o.error is not None]
    assert [o.error for o in refused] == ["unavailable"] and refused[0].definite
    assert sorted(leader.g.members()) == sorted(cluster.addrs("a", "b", "c", "d"))


def test_leader_cannot_remove_itself(cluster: Cluster) -> None:
    for n in "abc":
        cluster.replicas[n].start(cluster.addrs("a", "b", "c"), cluster.replicas)
    leader = cluster.leader()
    outcome = cluster.call(lambda cb: leader.g.change_membership("remove", leader.addr, cb))
    assert outcome.error == "bad_request"
    assert sorted(leader.g.members()) == sorted(cluster.addrs("a", "b", "c"))


def test_a_replica_that_missed_a_voter_change_hears_the_new_leader_through_hints(cluster: Cluster) -> None:
    """c is down while d is added and takes the leadership. Restarted, c's log still says {a, b, c}:
    pysyncobj would hang up on d and c would never catch up (it would campaign instead and depose
    d). With the placement's replicas hinted, c follows d without an election."""
    c = cluster
    for n in "abc":
        c.replicas[n].start(c.addrs("a", "b", "c"), c.replicas)
    c.submit(_commands("one", 10))
    c.replicas["c"].stop()
    c.replicas["d"].start(c.addrs("a", "b", "c", "d"), c.replicas, joining=True)
    c.change("add", "d")
    c.wait_applied(["d"], 10)

    def d_leads() -> bool:
        leader = c.leader()
        if leader.name != "d":
            leader.g.transfer_leadership(c.replicas["d"].addr)
            return False
        return True

    wait_for(d_leads, "d leading")
    c.submit(_commands("two", 10))
    term = c.replicas["d"].g.status().term
    before = rises(c)
    restarted = c.replicas["c"].start(c.addrs("a", "b", "c"), c.replicas)
    assert sorted(restarted.members()) == sorted(c.addrs("a", "b", "c"))  # its log predates d
    restarted.hint_peers(c.addrs("a", "b", "c", "d"))
    c.wait_applied(["c"], 20)
    wait_for(lambda: sorted(restarted.members()) == sorted(c.addrs("a", "b", "c", "d")), "c knows d")
    print(f"leader {c.leader().name}, term {term} -> {c.replicas['d'].g.status().term}")  # d, unchanged
    assert_caused_no_election(c, "c", before)
    assert c.replicas["c"].machine.commands() == c.replicas["d"].machine.commands()  # type: ignore[union-attr]


def test_a_joining_replica_does_not_campaign_until_a_leader_reaches_it(cluster: Cluster) -> None:
    """d is placed (the others hint it, so its messages get through) but not yet added: it must
    stay quiet however long that takes, or its higher terms would depose the leader again and
    again. Once added it follows the leader like any voter."""
    c = cluster
    for n in "abc":
        c.replicas[n].start(c.addrs("a", "b", "c"), c.replicas)
        c.replicas[n].g.hint_peers(c.addrs("a", "b", "c", "d"))
    c.submit(_commands("one", 5))
    leader = c.leader()
    term = leader.g.status().term
    before = rises(c)
    d = c.replicas["d"].start(c.addrs("a", "b", "c", "d"), c.replicas, joining=True)
    time.sleep(6 * SETTINGS.join_quiet_s)  # its deadline was pushed ahead several times
    print(f"the leader's term {term} -> {leader.g.status().term}")
    assert d.status().term == 0 and not d.is_leader()  # it never campaigned: quiet
    assert_caused_no_election(c, "d", before)
    c.change("add", "d")
    c.submit(_commands("two", 5))
    c.wait_applied(["d"], 10)
    print(f"leader {c.leader().name} (was {leader.name}), term {term} -> {c.leader().g.status().term}")
    assert_caused_no_election(c, "d", before)  # still none of d's making
