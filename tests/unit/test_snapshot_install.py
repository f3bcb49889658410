"""A snapshot install is all or nothing (issue 12, item 3), driven through pysyncobj's real code.

Each test builds a follower ``RaftGroup`` whose pysyncobj object ticks only when the test says so
(``autoTick=False``) over a transport that records what it sends, fills its journal with entries
that were never committed, and hands it an install-snapshot message as pysyncobj's leader sends it
(the manifest in one chunk, then an empty last chunk). pysyncobj swallows any exception from the
deserializer and answers success, so before the fix a failed checkpoint fetch or restore made the
follower raise its commit index over its own unchecked log and apply it.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pysyncobj.pickle as pso_pickle
import pytest
import raft_doubles
from pysyncobj import SyncObjConf
from pysyncobj.monotonic import monotonic
from pysyncobj.transport import Transport

from raftmq.cluster.replication import raft, snapshot_gate
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.cluster.replication.raft import RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import StoreError

SELF = "127.0.0.1:1"
LEADER = "127.0.0.1:2"
OTHER = "127.0.0.1:3"
NOOP = b"\x01"
UNCHECKED = 10  # entries 2..10 of term 1 in the follower's journal were never committed
SNAPSHOT_INDEX = 20  # the leader's snapshot covers entries up to 20 (term 2)
LEADER_COMMIT = 25


class RecordingTransport(Transport):  # type: ignore[misc]
    """Never connects (so the follower never campaigns); records what pysyncobj sends."""

    shared_bodies = None  # FlushingTransport's (shared_bodies.py): it seals nothing

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent: list[dict[str, Any]] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append(message)
        return True

    def destroy(self) -> None:
        pass


class Machine(raft_doubles.Machine):
    """Records applies; ``restore`` reads the index a fake checkpoint file names."""

    def __init__(self) -> None:
        super().__init__()
        self.restored: list[str] = []
        self.restore_error: Exception | None = None

    def restore(self, checkpoint_dir: str) -> None:
        if self.restore_error is not None:
            raise self.restore_error
        self.restored.append(checkpoint_dir)
        index = int((Path(checkpoint_dir) / "index").read_text())
        self.applied = [(index, b"restored")]


class Fetcher:
    """``fetch_checkpoint``: fails while ``failing``, blocks while ``gate`` is clear, else returns a
    fake checkpoint directory at ``index``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.failing = True
        self.index = SNAPSHOT_INDEX + 3
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def __call__(self, manifest: dict[str, Any]) -> tuple[str, int]:
        self.calls += 1
        self.gate.wait()
        if self.failing:
            raise RuntimeError("no replica could send a checkpoint")
        path = self.tmp / f"ckpt-{self.calls}"
        path.mkdir()
        (path / "index").write_text(str(self.index))
        return str(path), self.index


def _command(data: bytes) -> bytes:
    """A regular entry as pysyncobj writes one for ``apply_command(data)`` (method id 0: the only
    replicated method; the fixture checks it)."""
    return b"\x00" + bytes(pso_pickle.dumps((0, (data,))))


@pytest.fixture
def follower(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[], tuple[RaftGroup, Machine, Fetcher]]]:
    def conf_factory(**kwargs: Any) -> SyncObjConf:
        return SyncObjConf(autoTick=False, **kwargs)

    monkeypatch.setattr(raft, "SyncObjConf", conf_factory)
    monkeypatch.setattr(raft, "FlushingTransport", RecordingTransport)
    monkeypatch.setattr(snapshot_gate, "_CHECKPOINT_RETRY_S", 0.0)
    made: list[RaftGroup] = []

    def make() -> tuple[RaftGroup, Machine, Fetcher]:
        store = MemoryStore()
        journal = DurableJournal(store, fsync=False)
        journal.add(NOOP, 1, 1)  # what pysyncobj writes first into an empty journal
        for i in range(2, UNCHECKED + 1):
            journal.add(_command(f"unchecked-{i}".encode()), i, 1)
        journal.setRaftCommitIndex(1)
        journal.flush()
        machine = Machine()
        fetcher = Fetcher(tmp_path)
        group = RaftGroup(
            name="g",
            node_id="n1",
            self_addr=SELF,
            peer_addrs=[SELF, LEADER, OTHER],
            journal_store=store,
            machine=machine,
            snapshot_file=str(tmp_path / "snapshot" / "manifest.json"),
            settings=RaftSettings(password="x" * 16, fsync=False),
            fetch_checkpoint=fetcher,
        )
        made.append(group)
        assert group._sync._methodToID == {group._sync._getFuncName("apply_command"): 0}
        assert group._sync.raftCommitIndex == 1 and group._sync.raftLastApplied == 1
        return group, machine, fetcher

    yield make
    for group in made:
        group._sync.destroy()


def _manifest() -> bytes:
    def entry(index: int) -> list[Any]:
        return [base64.b64encode(NOOP).decode(), index, 2]

    return orjson.dumps(
        {
            "format": 1,
            "group": "g",
            "node_id": "n2",
            "raft_addr": LEADER,
            "state_index": SNAPSHOT_INDEX,
            "last": entry(SNAPSHOT_INDEX),
            "prev": entry(SNAPSHOT_INDEX - 1),
            "cluster": [SELF, LEADER, OTHER],
        }
    )


def _send_snapshot(group: RaftGroup) -> None:
    """The two messages pysyncobj's leader sends for a small snapshot file (as the tick thread)."""
    sync = group._sync
    leader = next(n for n in sync._SyncObj__otherNodes if n.id == LEADER)
    for chunk in ((_manifest(), True, False), (b"", False, True)):
        message = {"type": "append_entries", "term": 2, "commit_index": LEADER_COMMIT, "serialized": chunk}
        sync._SyncObj__onMessageReceived(leader, message)


def _ticks(group: RaftGroup, n: int = 5) -> None:
    for _ in range(n):
        group._sync.doTick(0)


def _successes(group: RaftGroup) -> list[dict[str, Any]]:
    sent = group._sync._SyncObj__transport.sent
    return [m for m in sent if m.get("type") == "next_node_idx" and m.get("success")]


def _fetch_failed(group: RaftGroup, count: int) -> Callable[[], bool]:
    """``count`` fetches have failed and none runs."""

    def done() -> bool:
        with group.snapshot_gate.lock:
            return group.snapshot_gate.install_failures >= count and not group.snapshot_gate.fetching

    return done


def _wait(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _assert_untouched(group: RaftGroup, machine: Machine, tmp_path: Path) -> None:
    sync = group._sync
    assert machine.applied == [], "entries of the unchecked log were applied"
    assert sync.raftCommitIndex == 1, "the commit index rose over the unchecked log"
    assert sync.raftLastApplied == 1
    assert [e[1] for e in group._journal[:]] == list(range(1, UNCHECKED + 1))
    assert not (tmp_path / "snapshot" / "manifest.json").exists()
    assert _successes(group) == [], "the follower reported the snapshot as installed"


def test_failed_checkpoint_fetch_changes_nothing_and_reports_no_success(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]], tmp_path: Path
) -> None:
    group, machine, fetcher = follower()
    for _ in range(3):  # the leader sends the snapshot again and again; each fetch fails
        _send_snapshot(group)
        _ticks(group)
        _wait(_fetch_failed(group, fetcher.calls), "the fetch to fail")
        _ticks(group)
    _assert_untouched(group, machine, tmp_path)
    assert machine.restored == []
    assert group._sync._SyncObj__raftLeader is not None  # the message still counted as a heartbeat


def test_snapshot_installs_once_a_checkpoint_arrived(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]], tmp_path: Path
) -> None:
    group, machine, fetcher = follower()
    _send_snapshot(group)
    _wait(_fetch_failed(group, 1), "the first fetch to fail")
    _ticks(group)
    _assert_untouched(group, machine, tmp_path)
    fetcher.failing = False
    _send_snapshot(group)  # starts a fetch that succeeds; the snapshot is held until it is in
    _wait(lambda: group.snapshot_gate.staged is not None, "the checkpoint")
    _assert_untouched(group, machine, tmp_path)
    _send_snapshot(group)  # the leader's next try: restored, then installed
    _ticks(group)
    assert machine.applied == [(fetcher.index, b"restored")]  # nothing of the unchecked log
    assert group.snapshot_gate.installs == 1
    sync = group._sync
    assert sync.raftLastApplied == SNAPSHOT_INDEX
    assert [e[1] for e in group._journal[:]] == [SNAPSHOT_INDEX - 1, SNAPSHOT_INDEX]
    assert sync.raftCommitIndex == SNAPSHOT_INDEX
    assert [m["next_node_idx"] for m in _successes(group)] == [SNAPSHOT_INDEX + 1]
    assert (tmp_path / "snapshot" / "manifest.json").exists()


def test_checkpoint_behind_the_snapshot_is_not_restored(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]], tmp_path: Path
) -> None:
    group, machine, fetcher = follower()
    fetcher.failing = False
    fetcher.index = SNAPSHOT_INDEX - 5
    for _ in range(2):
        _send_snapshot(group)
        _wait(_fetch_failed(group, fetcher.calls), "the check to fail")
        _ticks(group)
    _assert_untouched(group, machine, tmp_path)
    assert machine.restored == []


def test_a_slow_fetch_does_not_block_the_tick_thread(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]], tmp_path: Path
) -> None:
    group, machine, fetcher = follower()
    fetcher.gate.clear()  # the fetch hangs until the test lets it go
    delivered = threading.Thread(target=_send_snapshot, args=(group,), daemon=True)
    delivered.start()
    delivered.join(30)
    try:
        assert not delivered.is_alive(), "the snapshot message waited for the checkpoint download"
        _wait(lambda: fetcher.calls == 1, "the fetch to start")
        # Heartbeats keep arriving and the ticks go on while the download hangs.
        group._sync._SyncObj__raftElectionDeadline = 0.0
        _send_snapshot(group)
        _ticks(group)
        assert group._sync._SyncObj__raftElectionDeadline > monotonic()  # pushed back by the leader
        _assert_untouched(group, machine, tmp_path)
    finally:
        fetcher.gate.set()


def test_storage_failure_during_restore_stops_the_process(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Exited(BaseException):
        pass

    def fake_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    group, machine, fetcher = follower()
    fetcher.failing = False
    machine.restore_error = StoreError("disk gone")
    _send_snapshot(group)
    _wait(lambda: group.snapshot_gate.staged is not None or fetcher.calls > 1, "the checkpoint")
    with pytest.raises(Exited) as info:
        _send_snapshot(group)
    assert info.value.args == (70,)
    assert machine.applied == [] and group._sync.raftCommitIndex == 1
    assert _successes(group) == []


def test_a_start_behind_its_own_snapshot_fetches_first_or_stops(
    follower: Callable[[], tuple[RaftGroup, Machine, Fetcher]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A replica whose state directory was lost starts behind its own manifest: pysyncobj loads the
    manifest on the first tick, and must not go on before the state covers it."""
    exits: list[int] = []  # os._exit, recorded (pysyncobj's bare except would swallow a raise)
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(snapshot_gate, "_BLOCKING_INSTALL_S", 0.0)
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "snapshot" / "manifest.json").write_bytes(_manifest())
    group, machine, fetcher = follower()  # fetches fail
    group._sync.doTick(0)
    assert exits == [70]
    assert machine.applied == [] and machine.restored == []
    exits.clear()

    monkeypatch.setattr(snapshot_gate, "_BLOCKING_INSTALL_S", 30.0)
    group, machine, fetcher = follower()
    fetcher.failing = False
    group._sync.doTick(0)
    assert exits == []
    assert machine.applied == [(fetcher.index, b"restored")]
    assert group._sync.raftLastApplied == SNAPSHOT_INDEX
