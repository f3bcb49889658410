"""Pins of the pysyncobj 0.3.17 behaviour ``cluster/replication/raft.py`` relies on, and of the adapter's
seams.

Each test fails loudly if pysyncobj changes what a seam depends on. Most drive pysyncobj's real code
without sockets (a ``SyncObj`` with ``autoTick=False`` over a fake transport, its private handlers
called directly). ``RaftGroup``s running on localhost are tested in ``test_raft_group.py``. Hazard
numbers refer to docs/architecture.md, "pysyncobj 0.3.17: the facts raftmq relies on".
"""

from __future__ import annotations

import ast
import inspect
import os
import struct
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pysyncobj
import pysyncobj.syncobj as pso
import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.journal import Journal, MemoryJournal
from pysyncobj.serializer import SERIALIZER_STATE, Serializer
from pysyncobj.transport import TCPTransport, Transport
from pysyncobj.version import VERSION
from raft_doubles import Machine, fast_settings

from raftmq.cluster.replication import raft
from raftmq.cluster.replication.failures import FAILURES
from raftmq.cluster.replication.journal import DurableJournal, Entry
from raftmq.cluster.replication.pso import FlushingTransport, install_journal_seam
from raftmq.cluster.replication.raft import (
    PINNED_PYSYNCOBJ,
    RaftGroup,
    RaftSettings,
)
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, Store

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
    assert reasons - {FAIL_REASON.SUCCESS} == set(FAILURES)


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
