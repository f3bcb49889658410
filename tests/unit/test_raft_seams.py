"""Pins of the pysyncobj 0.3.17 behaviour ``cluster/replication/raft.py`` relies on, and of the adapter's
seams.

Each test fails loudly if pysyncobj changes what a seam depends on. Most drive pysyncobj's real code
without sockets (a ``SyncObj`` with ``autoTick=False`` over a fake transport, its private handlers
called directly); the last group runs single-node ``RaftGroup``s on localhost. Hazard numbers refer to
docs/architecture.md, "pysyncobj 0.3.17: the facts raftmq relies on".
"""

from __future__ import annotations

import ast
import inspect
import os
import socket
import struct
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pysyncobj
import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso
import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.journal import Journal, MemoryJournal
from pysyncobj.serializer import SERIALIZER_STATE, Serializer
from pysyncobj.transport import TCPTransport, Transport
from pysyncobj.version import VERSION

from raftmq.cluster.base.timing import LatencyHistogram
from raftmq.cluster.replication import raft
from raftmq.cluster.replication.journal import DurableJournal, Entry
from raftmq.cluster.replication.pso import FlushingTransport, install_journal_seam
from raftmq.cluster.replication.raft import (
    PINNED_PYSYNCOBJ,
    Outcome,
    RaftGroup,
    RaftSettings,
)
from raftmq.cluster.replication.snapshot_gate import entry_from_json
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, Store, StoreError

NOOP = b"\x01"  # pysyncobj _COMMAND_TYPE.NO_OP: applying it does nothing
SELF = "127.0.0.1:1"
PEERS = ["127.0.0.1:2", "127.0.0.1:3"]


def _src(func: Any) -> str:
    return textwrap.dedent(inspect.getsource(func))


# -- a socket-free SyncObj ---------------------------------------------------------------------------


class FakeTransport(Transport):  # type: ignore[misc]
    """Never connects; records what pysyncobj sends."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent: list[tuple[Any, dict[str, Any]]] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append((node, message))
        return True

    def destroy(self) -> None:
        pass


@pytest.fixture
def make_sync() -> Iterator[Callable[..., SyncObj]]:
    made: list[SyncObj] = []

    def make(journal: Any = None, others: list[str] = PEERS, **conf: Any) -> SyncObj:
        install_journal_seam()
        obj = SyncObj(
            SELF,
            others,
            conf=SyncObjConf(autoTick=False, journalFile=journal, **conf),
            transportClass=FakeTransport,
        )
        made.append(obj)
        return obj

    yield make
    for obj in made:
        obj.destroy()


def _node(obj: SyncObj, addr: str) -> Any:
    return next(n for n in obj._SyncObj__otherNodes if n.id == addr)


def _append_entries(obj: SyncObj, leader: str, **message: Any) -> None:
    obj._SyncObj__onMessageReceived(_node(obj, leader), {"type": "append_entries", **message})


def _journal_of(obj: SyncObj) -> Any:
    return obj._SyncObj__raftLog


# -- 1. version -----------------------------------------------------------------------------------------


def test_pysyncobj_version_is_pinned() -> None:
    assert VERSION == "0.3.17"
    assert PINNED_PYSYNCOBJ == VERSION
    assert pysyncobj.syncobj.VERSION == VERSION


# -- 2. the journal seam ----------------------------------------------------------------------------


def test_journal_seam_passes_durable_journal_through_and_is_idempotent() -> None:
    install_journal_seam()
    installed = pso.createJournal
    install_journal_seam()
    assert pso.createJournal is installed  # not wrapped twice
    assert getattr(installed, "raftmq_seam", False)
    journal = DurableJournal(MemoryStore())
    assert pso.createJournal(journal) is journal
    assert isinstance(pso.createJournal(None), MemoryJournal)
    assert isinstance(pso.createJournal(), MemoryJournal)


def test_syncobj_looks_up_create_journal_in_its_module_at_construction() -> None:
    assert "createJournal(self.__conf.journalFile)" in _src(SyncObj.__init__)
    assert SyncObj.__init__.__globals__ is pso.__dict__  # so patching pso.createJournal reaches it


def test_syncobj_uses_the_durable_journal_object(make_sync: Callable[..., SyncObj]) -> None:
    journal = DurableJournal(MemoryStore())
    obj = make_sync(journal)
    assert _journal_of(obj) is journal
    assert journal[:] == [(NOOP, 1, 0)]  # pysyncobj seeds an empty journal with a no-op


def test_durable_journal_implements_pysyncobj_journal_interface() -> None:
    names = [n for n, v in vars(Journal).items() if callable(v) and n not in ("__init__",)]
    assert {"add", "deleteEntriesFrom", "deleteEntriesTo", "__getitem__", "__len__"} <= set(names)
    for name in names:
        assert callable(getattr(DurableJournal, name, None)), name
    # every journal method SyncObj calls
    called: set[str] = set()
    for attr in ast.walk(ast.parse(_src(SyncObj))):
        if (
            isinstance(attr, ast.Attribute)
            and isinstance(attr.value, ast.Attribute)
            and attr.value.attr == "__raftLog"
        ):
            called.add(attr.attr)
    assert called, "SyncObj no longer uses self.__raftLog?"
    for name in called:
        assert callable(getattr(DurableJournal, name, None)), name


# -- 3. private names and signatures the adapter touches --------------------------------------------


def test_private_names_exist(make_sync: Callable[..., SyncObj]) -> None:
    assert "self.__raftElectionDeadline = " in _src(SyncObj.__init__)
    obj = make_sync()
    assert isinstance(obj._SyncObj__raftElectionDeadline, float)
    for name in (
        "_isLeader",
        "_getLeader",
        "transferLeadership",
        "forceLogCompaction",
        "addOnTickCallback",
        "destroy_synchronous",
    ):
        assert callable(getattr(SyncObj, name, None)), name
    for name in ("raftLastApplied", "raftCommitIndex", "raftCurrentTerm", "hasQuorum"):
        assert isinstance(inspect.getattr_static(SyncObj, name), property), name
    assert obj.raftLastApplied == 1 and obj.raftCommitIndex == 1 and obj.raftCurrentTerm == 0
    assert obj._isLeader() is False and obj._getLeader() is None
    assert "node" in inspect.signature(SyncObj.transferLeadership).parameters


def test_transport_signatures() -> None:
    assert list(inspect.signature(TCPTransport.send).parameters) == ["self", "node", "message"]
    assert list(inspect.signature(TCPTransport.__init__).parameters) == [
        "self",
        "syncObj",
        "selfNode",
        "otherNodes",
    ]
    assert "self._syncObj = syncObj" in _src(TCPTransport.__init__)
    params = inspect.signature(SyncObj.__init__).parameters
    assert {"selfNode", "otherNodes", "conf", "transportClass"} <= set(params)


def test_flushing_transport_flushes_before_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[Any] = []
    monkeypatch.setattr(TCPTransport, "send", lambda self, node, message: events.append(("send", message)))
    transport = FlushingTransport.__new__(FlushingTransport)
    transport._syncObj = SimpleNamespace(raftmq_journal=SimpleNamespace(flush=lambda: events.append("flush")))
    for kind in ("next_node_idx", "response_vote", "request_vote", "apply_command"):
        events.clear()
        transport.send("node", {"type": kind})
        assert events == ["flush", ("send", {"type": kind})], kind


def test_a_leaders_entries_leave_before_its_flush_and_acks_are_read_after_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The leader's fsync overlaps replication: its append_entries go unflushed (the tick's end
    # flushes), and a follower's acknowledgement, which may complete a quorum counting the leader,
    # is handed to pysyncobj only after a flush.
    events: list[Any] = []
    monkeypatch.setattr(TCPTransport, "send", lambda self, node, message: events.append(("send", message)))
    monkeypatch.setattr(
        TCPTransport, "_onMessageReceived", lambda self, node, message: events.append(("handled", message))
    )
    transport = FlushingTransport.__new__(FlushingTransport)
    journal = SimpleNamespace(flush=lambda: events.append("flush"))
    transport._syncObj = SimpleNamespace(raftmq_journal=journal, otherNodes={"node"})
    entries = {"type": "append_entries", "entries": [(b"x", 7, 1)]}
    transport.send("node", entries)
    assert events == [("send", entries)]
    events.clear()
    ack = {"type": "next_node_idx", "next_node_idx": 8, "success": True, "reset": False}
    transport._onMessageReceived("node", ack)
    assert events == ["flush", ("handled", ack)]


class _Stop(Exception):
    pass


def _capture_group_kwargs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: RaftSettings
) -> tuple[dict[str, Any], dict[str, Any]]:
    conf_kwargs: dict[str, Any] = {}
    sync_kwargs: dict[str, Any] = {}

    def conf_factory(**kwargs: Any) -> SyncObjConf:
        conf_kwargs.update(kwargs)
        return SyncObjConf(**kwargs)

    class StopSync:
        def __init__(self, group: Any, journal: Any, **kwargs: Any) -> None:
            sync_kwargs.update(kwargs)
            raise _Stop

    monkeypatch.setattr(raft, "SyncObjConf", conf_factory)
    monkeypatch.setattr(raft, "_GroupSyncObj", StopSync)
    with pytest.raises(_Stop):
        RaftGroup(
            name="g",
            node_id="n1",
            self_addr=SELF,
            peer_addrs=[SELF, *PEERS],
            journal_store=MemoryStore(),
            machine=Machine(),
            snapshot_file=str(tmp_path / "snap" / "g.snapshot"),
            settings=settings,
        )
    return conf_kwargs, sync_kwargs


@pytest.mark.parametrize("settings", [RaftSettings(password="x" * 16), None], ids=["defaults", "fast"])
def test_syncobjconf_accepts_every_kwarg_raftgroup_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: RaftSettings | None
) -> None:
    conf_kwargs, sync_kwargs = _capture_group_kwargs(monkeypatch, tmp_path, settings or fast_settings())
    assert conf_kwargs["journalFile"] is not None and conf_kwargs["fullDumpFile"]  # hazard 3
    defaults = SyncObjConf()
    for key in conf_kwargs:
        # SyncObjConf reads kwargs with .get(): a misspelt name would be silently ignored
        assert hasattr(defaults, key), f"SyncObjConf has no option {key!r}"
    conf = SyncObjConf(**conf_kwargs)
    conf.validate()
    for key, value in conf_kwargs.items():
        assert getattr(conf, key) is value, key
    assert set(sync_kwargs) == {"selfNode", "otherNodes", "conf", "transportClass"}
    assert sync_kwargs["otherNodes"] == PEERS  # self filtered out
    assert sync_kwargs["transportClass"] is FlushingTransport


# -- 4. source and behaviour pins for the hazards ---------------------------------------------------


def test_apply_runs_before_last_applied_increments() -> None:
    # hazard 6: inside a replicated method the entry index is raftLastApplied + 1
    src = _src(SyncObj._SyncObj__applyLogEntries)
    assert src.index("self.__doApplyCommand(entry[0])") < src.index("self.__raftLastApplied += 1")
    assert "self.__getEntries(self.__raftLastApplied + 1, count)" in src
    assert "return self.__raftLastApplied" in _src(inspect.getattr_static(SyncObj, "raftLastApplied").fget)
    assert "self.raftLastApplied + 1" in _src(raft._GroupSyncObj.apply_command)


def test_load_dump_file_compares_first_two_entries_and_clears_otherwise() -> None:
    src = _src(SyncObj._SyncObj__loadDumpFile)
    for needle in (
        "self.__raftLog[0] != data[2]",
        "self.__raftLog[1] != data[1]",
        "self.__raftLog.clear()",
        "self.__raftLog.add(*data[2])",
        "self.__raftLog.add(*data[1])",
        "self.__raftLastApplied = data[1][1]",
    ):
        assert needle in src, needle
    # the deserializer's (last, prev, cluster) lands in data[1], data[2], data[3]
    assert "return (None,) + self.__deserializer(self.__fileName)" in _src(Serializer.deserialize)


def _dump_env(tmp_path: Path, *, align: bool) -> tuple[DurableJournal, dict[str, Any], list[Entry]]:
    journal = DurableJournal(MemoryStore())
    items = [(NOOP, i, 1) for i in range(1, 21)]
    for item in items:
        journal.add(*item)
    prev, last = items[9], items[10]
    dump = tmp_path / "dump"
    dump.write_bytes(b"manifest")

    def deserializer(path: str) -> tuple[Entry, Entry, list[str]]:
        assert path == str(dump)
        if align:
            journal.align_to_snapshot(prev, last)
        return last, prev, [SELF, *PEERS]

    conf = {"fullDumpFile": str(dump), "serializer": lambda *a: None, "deserializer": deserializer}
    return journal, conf, items


def test_unaligned_journal_is_cleared_by_load_dump_file(
    make_sync: Callable[..., SyncObj], tmp_path: Path
) -> None:
    # hazard 2 still exists in pysyncobj: a journal not compacted to the snapshot loses its tail
    journal, conf, items = _dump_env(tmp_path, align=False)
    obj = make_sync(journal, **conf)
    obj.doTick(0)
    assert journal[:] == [items[9], items[10]]
    assert obj.raftLastApplied == 11


def test_aligned_journal_is_kept_by_load_dump_file(make_sync: Callable[..., SyncObj], tmp_path: Path) -> None:
    journal, conf, items = _dump_env(tmp_path, align=True)
    obj = make_sync(journal, **conf)
    obj.doTick(0)
    assert journal[:] == items[9:]
    assert obj.raftLastApplied == 11


def test_follower_truncation_is_unconditional_in_source() -> None:
    tree = ast.parse(_src(SyncObj._SyncObj__onMessageReceived))
    found = False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "len(prevEntries) > 1":
            direct = [ast.unparse(s) for s in node.body if isinstance(s, ast.Expr)]
            assert "self.__deleteEntriesFrom(prevLogIdx + 1)" in direct  # not behind a term check
            found = True
    assert found


class RecordingJournal(DurableJournal):
    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.deletes_from: list[int] = []

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self.deletes_from.append(entryFrom)
        super().deleteEntriesFrom(entryFrom)


def _pipeline_then_resend(obj: SyncObj) -> None:
    entries = [(NOOP, 2, 2), (NOOP, 3, 2), (NOOP, 4, 2)]
    _append_entries(obj, PEERS[0], term=2, commit_index=1, prevLogIdx=1, prevLogTerm=0, entries=entries)
    assert len(_journal_of(obj)) == 4
    # the leader moved this follower's next index back: it re-sends entry 2 after prevLogIdx 1
    _append_entries(obj, PEERS[0], term=2, commit_index=1, prevLogIdx=1, prevLogTerm=0, entries=entries[:1])


def test_pysyncobj_truncates_matching_entries(make_sync: Callable[..., SyncObj]) -> None:
    # hazard 5 still exists with pysyncobj's own journal
    obj = make_sync(None)
    _pipeline_then_resend(obj)
    assert _journal_of(obj)[:] == [(NOOP, 1, 0), (NOOP, 2, 2)]


def test_durable_journal_makes_matching_truncation_a_noop(make_sync: Callable[..., SyncObj]) -> None:
    journal = RecordingJournal(MemoryStore())
    obj = make_sync(journal)
    _pipeline_then_resend(obj)
    assert journal.deletes_from == [1]  # pysyncobj did ask to truncate from entry 2 ...
    assert journal.getCurrentTerm() == 2  # ... after making the leader's term current
    assert journal[:] == [(NOOP, 1, 0), (NOOP, 2, 2), (NOOP, 3, 2), (NOOP, 4, 2)]  # ... and nothing went
    node, reply = obj._SyncObj__transport.sent[-1]
    assert node.id == PEERS[0]
    assert reply == {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True}


def test_follower_acks_go_through_the_transport() -> None:
    # FlushingTransport.send is what makes an entry durable before it is acknowledged
    assert "self.__transport.send(node," in _src(SyncObj._SyncObj__sendNextNodeIdx)
    assert "self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)" in _src(
        SyncObj._SyncObj__onMessageReceived
    )


def test_tick_callbacks_run_after_entries_are_added_and_before_the_next_commit() -> None:
    # hazard 1 on the leader: it counts itself (count = 1) in the next tick's commit loop, so the
    # flush in RaftGroup._after_tick must run after this tick added entries.
    src = _src(SyncObj._onTick)
    commit_loop = src.index("while commitIdx < self.__getCurrentLogIndex():")
    assert src.index("count = 1", commit_loop) < src.index("self.__raftMatchIndex[node] >= commitIdx")
    assert src.index("self._checkCommandsToApply()") < src.index("for callback in self.__onTickCallbacks:")
    assert src.index("self.__tryLogCompaction()") < src.index("for callback in self.__onTickCallbacks:")
    assert src.index("self.__raftLog.onOneSecondTimer()") < commit_loop
    assert "self.__raftLog._destroy()" in _src(SyncObj._doDestroy)


def test_compaction_serializes_last_then_prev_and_compacts_to_prev() -> None:
    src = _src(SyncObj._SyncObj__tryLogCompaction)
    assert "lastAppliedEntries = self.__getEntries(self.__raftLastApplied - 1, 2)" in src
    assert (
        "self.__serializer.serialize((data, lastAppliedEntries[1], lastAppliedEntries[0], cluster), "
        "lastAppliedEntries[0][1])" in src
    )
    assert src.index("serializeState == SERIALIZER_STATE.SUCCESS") < src.index(
        "self.__deleteEntriesTo(serializeID)"
    )


def test_serializer_does_not_fork_with_a_custom_serializer(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    dump = str(tmp_path / "dump")

    def serializer(path: str, data: Any) -> None:
        calls.append((path, data, os.getpid(), threading.get_ident()))
        with open(path, "wb") as f:
            f.write(b"manifest")

    last, prev = (NOOP, 11, 1), (NOOP, 10, 1)
    s = Serializer(dump, 1000, True, serializer, lambda path: (last, prev, ["c"]), None)
    assert s._Serializer__useFork is False
    s.serialize((None, last, prev, {"c"}), prev[1])
    assert calls == [(dump + ".tmp", (last, prev, {"c"}), os.getpid(), threading.get_ident())]
    assert os.path.isfile(dump) and not os.path.exists(dump + ".tmp")  # renamed into place
    assert s.checkSerializing() == (SERIALIZER_STATE.SUCCESS, prev[1])
    assert s.deserialize() == (None, last, prev, ["c"])
    assert "serializer is None" in _src(Serializer.__init__)


def test_every_failure_reason_is_mapped() -> None:
    reasons = {v for k, v in vars(FAIL_REASON).items() if k.isupper() and isinstance(v, int)}
    assert reasons - {FAIL_REASON.SUCCESS} == set(raft._FAILURES)


def test_leader_with_a_repaired_journal_does_not_apply_unreplicated_entries(
    make_sync: Callable[..., SyncObj],
) -> None:
    # pysyncobj trusts the persisted commit index on start and its leader path never clamps it to
    # the log: a hint past a cut tail would make entries appended there count as committed at once.
    store = MemoryStore()
    journal = DurableJournal(store)
    for i in range(1, 9):
        journal.add(NOOP, i, 1)
    journal.setCurrentTerm(1, None)
    journal.setRaftCommitIndex(8)
    journal._destroy()
    batch = Batch()
    for index in (6, 7, 8):  # a torn tail: 6, 7, 8 are cut on load
        key = b"E" + struct.pack(">Q", index)
        value = store.get(key)
        assert value is not None
        batch.put(key, value[:-1] + bytes([value[-1] ^ 0x02]))
    store.write(batch)

    journal = DurableJournal(store)
    assert len(journal) == 5
    obj = make_sync(journal)
    obj._SyncObj__onBecomeLeader()  # no follower is connected: nothing can commit past 5
    assert journal[-1][1] == 6
    obj.doTick(0)
    assert obj._isLeader()
    assert obj.raftCommitIndex <= 5
    assert obj.raftLastApplied <= 5


# -- 5. single-node RaftGroups -----------------------------------------------------------------------


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

    def restore(self, checkpoint_dir: str) -> None:
        raise NotImplementedError


class SyncTrackingStore:
    """A Store wrapper that knows which journal entries a sync has made durable."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self._lock = threading.Lock()
        self._written: set[int] = set()
        self.synced: set[int] = set()

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def scan(self, start: bytes, end: bytes | None = None, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(start, end, **kwargs)

    def last_before(self, key: bytes, floor: bytes) -> tuple[bytes, bytes] | None:
        return self.inner.last_before(key, floor)

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        self.inner.write(batch, sync=sync)
        with self._lock:
            for op, key, _ in batch.ops:
                if op == 0 and key[:1] == b"E":
                    self._written.add(struct.unpack(">Q", key[1:])[0])
            if sync:
                self.synced |= self._written

    def sync(self) -> None:
        self.inner.sync()
        with self._lock:
            self.synced |= self._written

    def checkpoint(self, path: str) -> None:
        self.inner.checkpoint(path)

    def close(self) -> None:
        self.inner.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def fast_settings() -> RaftSettings:
    return RaftSettings(
        password="x" * 16,
        election_min_s=0.15,
        election_max_s=0.3,
        heartbeat_s=0.02,
        tick_s=0.01,
    )


@pytest.fixture
def start_group(tmp_path: Path) -> Iterator[Callable[..., RaftGroup]]:
    groups: list[RaftGroup] = []
    addrs: dict[int, str] = {}  # a restarted group keeps its address: its log names its voters

    def start(journal_store: Store, machine: Machine) -> RaftGroup:
        addr = addrs.setdefault(id(journal_store), f"127.0.0.1:{free_port()}")
        group = RaftGroup(
            name="g",
            node_id="n1",
            self_addr=addr,
            peer_addrs=[addr],
            journal_store=journal_store,
            machine=machine,
            snapshot_file=str(tmp_path / "snapshots" / "g.snapshot"),
            settings=fast_settings(),
        )
        groups.append(group)
        wait_for(group.is_leader, "leadership")
        return group

    yield start
    for group in groups:
        group.destroy()


class Results:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()

    def __call__(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def wait(self, count: int) -> list[Outcome]:
        wait_for(lambda: len(self.outcomes) >= count, f"{count} outcomes")
        return list(self.outcomes)


def _submitted_data(entry: Entry) -> bytes | None:
    """The bytes a regular entry carries (pysyncobj pickles (method id, args))."""
    command = entry[0]
    if command[:1] != b"\x00":
        return None
    payload = pso_pickle.loads(command[1:])
    assert isinstance(payload, tuple) and len(payload) == 2
    (data,) = payload[1]
    assert isinstance(data, bytes)
    return data


def _submit_all(group: RaftGroup, commands: list[bytes]) -> list[Outcome]:
    results = Results()
    for command in commands:
        group.submit(command, results)
    return results.wait(len(commands))


def test_apply_gets_the_entry_index_and_entries_are_synced_first(
    start_group: Callable[..., RaftGroup],
) -> None:
    journal_store = SyncTrackingStore()
    unsynced: list[int] = []

    def check(index: int) -> None:
        if index not in journal_store.synced:
            unsynced.append(index)

    machine = Machine(check)
    group = start_group(journal_store, machine)
    commands = [f"command-{i}".encode() for i in range(5)]
    outcomes = _submit_all(group, commands)
    assert all(o.error is None and o.definite for o in outcomes)
    assert [c for _, c in machine.applied] == commands
    journal = group._journal
    first = journal[0][1]
    for (index, command), outcome in zip(machine.applied, outcomes, strict=True):
        assert outcome.result == {"index": index}
        entry = journal[index - first]
        assert entry[1] == index
        assert _submitted_data(entry) == command
    assert unsynced == []  # hazard 1: a (single-node) leader applied only synced entries
    status = group.status()
    assert status.is_leader and status.state_index == machine.applied_index
    assert status.applied_index >= machine.applied_index


def test_storage_failure_in_apply_exits_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    class Exited(BaseException):
        pass

    def fake_exit(code: int) -> None:
        raise Exited(code)

    class Broken(Machine):
        def apply(self, index: int, command: bytes) -> Any:
            raise StoreError("disk gone")

    monkeypatch.setattr(raft.os, "_exit", fake_exit)
    group = RaftGroup.__new__(RaftGroup)
    group.name = "g"
    group._machine = Broken()
    group.apply_latency = LatencyHistogram()
    with pytest.raises(Exited) as info:
        group._apply(7, b"x")
    assert info.value.args == (70,)
    group._machine = Machine()
    assert group._apply(7, b"x") == {"index": 7}


def _group_with_fake_sync(error: int, result: Any = None) -> tuple[RaftGroup, list[bytes]]:
    submitted: list[bytes] = []

    def apply_command(command: bytes, callback: Callable[[Any, int], None]) -> None:
        submitted.append(command)
        callback(result, error)

    group = RaftGroup.__new__(RaftGroup)
    group.name = "g"
    group._settings = RaftSettings(password="x" * 16, max_entry_bytes=100)
    group._sync = SimpleNamespace(apply_command=apply_command)
    group.commit_latency = LatencyHistogram()
    return group, submitted


@pytest.mark.parametrize(
    ("reason", "code", "definite"),
    [
        (FAIL_REASON.LEADER_CHANGED, "unknown_outcome", False),
        (FAIL_REASON.UNKNOWN_OUTCOME, "unknown_outcome", False),
        (FAIL_REASON.QUEUE_FULL, "unavailable", True),
        (FAIL_REASON.NOT_LEADER, "not_leader", True),
        (FAIL_REASON.MISSING_LEADER, "unavailable", True),
        (FAIL_REASON.DISCARDED, "not_leader", True),
        (FAIL_REASON.REQUEST_DENIED, "unavailable", True),
        (999, "unknown_outcome", False),
    ],
)
def test_failure_reasons_map_to_outcomes(reason: int, code: str, definite: bool) -> None:
    group, _ = _group_with_fake_sync(reason)
    results = Results()
    group.submit(b"cmd", results)
    assert results.outcomes == [Outcome(error=code, definite=definite)]


def test_success_and_oversize_and_raising_callbacks() -> None:
    group, submitted = _group_with_fake_sync(FAIL_REASON.SUCCESS, {"ok": 1})
    results = Results()
    group.submit(b"cmd", results)
    assert results.outcomes == [Outcome(result={"ok": 1})]
    group.submit(b"x" * 101, results)
    assert results.outcomes[-1] == Outcome(error="request_too_large", definite=True)
    assert submitted == [b"cmd"]

    def raising(outcome: Outcome) -> None:
        raise RuntimeError("callback bug")

    group.submit(b"cmd", raising)  # must not propagate into pysyncobj (it would apply twice)


def _manifest(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        data: dict[str, Any] = orjson.loads(f.read())
    return data


def _wait_caught_up(group: RaftGroup) -> None:
    """Until the (single-node) group applied everything in its journal, its own no-op included."""
    wait_for(lambda: group.status().applied_index >= group._journal[-1][1], "applied to the journal end")


def test_force_compaction_writes_a_manifest_and_restart_keeps_every_entry(
    start_group: Callable[..., RaftGroup], tmp_path: Path
) -> None:
    journal_store = MemoryStore()
    machine = Machine()
    group = start_group(journal_store, machine)
    _submit_all(group, [f"c{i}".encode() for i in range(6)])
    journal = group._journal
    assert journal[0][1] == 1
    group.force_compaction()
    snapshot = str(tmp_path / "snapshots" / "g.snapshot")
    wait_for(lambda: os.path.isfile(snapshot) and journal[0][1] > 1, "snapshot and compaction")
    manifest = _manifest(snapshot)
    prev = entry_from_json(manifest["prev"])
    last = entry_from_json(manifest["last"])
    assert manifest["format"] == 1 and manifest["group"] == "g"
    assert last[1] == prev[1] + 1
    assert manifest["state_index"] <= last[1]
    assert journal[0] == prev and journal[1] == last  # compacted to the snapshot point
    _submit_all(group, [f"d{i}".encode() for i in range(3)])  # entries after the snapshot
    applied_before = list(machine.applied)
    group.destroy()
    kept = list(journal[:])
    assert kept[-1][1] >= applied_before[-1][0] > last[1]

    group2 = start_group(journal_store, machine)
    # The restarted leader appends its own no-op after what was kept (the journal's end may still
    # be kept[-1] for a moment: waiting for that alone raced the no-op).
    wait_for(lambda: group2.status().applied_index > kept[-1][1], "the restarted leader's no-op applied")
    assert list(group2._journal[: len(kept)]) == kept  # nothing lost
    assert machine.applied == applied_before  # replay skipped what was applied
    outcomes = _submit_all(group2, [b"after-restart"])
    assert outcomes[0].result == {"index": machine.applied_index}
    assert machine.applied_index > kept[-1][1]


def test_crash_between_snapshot_and_compaction_keeps_every_entry(
    start_group: Callable[..., RaftGroup], tmp_path: Path
) -> None:
    # hazard 2 end to end: the snapshot is renamed into place but the journal is never compacted
    journal_store = MemoryStore()
    machine = Machine()
    group = start_group(journal_store, machine)
    _submit_all(group, [f"c{i}".encode() for i in range(6)])
    journal = group._journal
    journal.deleteEntriesTo = lambda entryTo: None  # type: ignore[method-assign]  # "crashed" here
    group.force_compaction()
    snapshot = str(tmp_path / "snapshots" / "g.snapshot")
    wait_for(lambda: os.path.isfile(snapshot), "snapshot")
    _submit_all(group, [f"d{i}".encode() for i in range(3)])  # entries after the snapshot
    group.destroy()
    before = list(journal[:])
    assert before[0][1] == 1
    manifest = _manifest(snapshot)
    prev = entry_from_json(manifest["prev"])
    last = entry_from_json(manifest["last"])
    assert before[-1][1] > last[1]

    group2 = start_group(journal_store, machine)
    _wait_caught_up(group2)
    after = list(group2._journal[:])
    assert after[0] == prev
    assert after[: len(before) - (prev[1] - 1)] == before[prev[1] - 1 :]  # everything after prev kept


# -- 6. three RaftGroups on localhost: the leader's fsync overlaps replication ---------------------


@pytest.fixture
def three_groups(tmp_path: Path) -> Iterator[Callable[..., list[RaftGroup]]]:
    groups: list[RaftGroup] = []

    def start(stores: list[Store], machines: list[Machine]) -> list[RaftGroup]:
        addrs = [f"127.0.0.1:{free_port()}" for _ in stores]
        for i, (store, machine) in enumerate(zip(stores, machines, strict=True)):
            groups.append(
                RaftGroup(
                    name="g",
                    node_id=f"n{i + 1}",
                    self_addr=addrs[i],
                    peer_addrs=[a for a in addrs if a != addrs[i]],
                    journal_store=store,
                    machine=machine,
                    snapshot_file=str(tmp_path / f"n{i + 1}" / "g.snapshot"),
                    settings=fast_settings(),
                )
            )
        wait_for(lambda: any(g.is_leader() for g in groups), "a leader")
        return list(groups)

    yield start
    for group in groups:
        group.destroy()


def test_three_replicas_commit_only_entries_durable_on_a_majority_and_the_leader_sends_before_its_fsync(
    three_groups: Callable[..., list[RaftGroup]], monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = [SyncTrackingStore() for _ in range(3)]
    store_of: dict[int, SyncTrackingStore] = {}
    not_durable: list[tuple[int, int]] = []  # (index, replicas holding it synced) at an apply
    sent_unsynced: list[int] = []  # entries a leader sent before its own journal had synced them
    lock = threading.Lock()

    def check(index: int) -> None:
        synced = sum(1 for st in stores if index in st.synced)
        if synced < 2:
            not_durable.append((index, synced))

    original_send = TCPTransport.send

    def recording_send(self: Any, node: Any, message: Any) -> Any:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            own = store_of.get(id(self._syncObj.raftmq_journal))
            with lock:
                for entry in message.get("entries", ()):
                    if own is not None and entry[1] not in own.synced:
                        sent_unsynced.append(entry[1])
        return original_send(self, node, message)

    monkeypatch.setattr(TCPTransport, "send", recording_send)
    machines = [Machine(check) for _ in range(3)]
    groups = three_groups(stores, machines)
    for group, store in zip(groups, stores, strict=True):
        store_of[id(group._journal)] = store
    leader = next(g for g in groups if g.is_leader())
    outcomes = _submit_all(leader, [f"command-{i}".encode() for i in range(40)])
    assert all(o.error is None for o in outcomes), outcomes
    wait_for(lambda: all(m.applied_index >= outcomes[-1].result["index"] for m in machines), "every replica")
    # safety: every replica applied an entry only once a majority held it synced
    assert not_durable == []
    # latency: the leader sent entries before its own fsync of them (it overlapped)
    assert sent_unsynced, "the leader synced every entry before sending it"
