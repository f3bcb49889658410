"""RaftGroup (``cluster/replication/raft.py``) over the real pysyncobj on localhost: entries are
durable before they apply, pysyncobj's failure reasons map to outcomes, compaction keeps every entry
across a restart or a crash between snapshot and compaction, and with three replicas only entries
durable on a majority commit while the leader sends before its fsync. Hazard numbers refer to
docs/architecture.md, "pysyncobj 0.3.17: the facts raftmq relies on" (the seams themselves:
``test_raft_seams.py``).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pysyncobj.pickle as pso_pickle
import pytest
from pysyncobj import FAIL_REASON
from pysyncobj.transport import TCPTransport
from raft_doubles import Machine, fast_settings, free_port, settled_leader, wait_for

from raftmq.cluster.base.timing import LatencyHistogram
from raftmq.cluster.replication import raft
from raftmq.cluster.replication.journal import Entry
from raftmq.cluster.replication.raft import (
    Outcome,
    RaftGroup,
    RaftSettings,
)
from raftmq.cluster.replication.snapshot_gate import entry_from_json
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, Store, StoreError

# -- 5. single-node RaftGroups -----------------------------------------------------------------------


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

    def start(
        stores: list[Store], machines: list[Machine], settings: RaftSettings | None = None
    ) -> list[RaftGroup]:
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
                    settings=settings or fast_settings(),
                )
            )
        settled_leader(groups)
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


@pytest.mark.parametrize("prompt", [True, False], ids=["prompt", "with-next-message"])
def test_a_leader_tells_the_commit_index_at_once_only_when_asked_and_followers_apply_all_either_way(
    three_groups: Callable[..., list[RaftGroup]], monkeypatch: pytest.MonkeyPatch, prompt: bool
) -> None:
    """pysyncobj follows every commit with an append_entries of its own carrying only the new
    commit index (to each follower, which answers it). With ``prompt_commit_notice=False`` the
    index goes with the next entries or the heartbeat: one entry at a time, the leader then sends
    no such message but its heartbeats, and the followers still apply every entry."""
    heartbeat_s = 0.3
    settings = dataclasses.replace(
        fast_settings(),
        heartbeat_s=heartbeat_s,
        election_min_s=1.0,
        election_max_s=1.5,
        prompt_commit_notice=prompt,
    )
    empty: list[float] = []  # when the leader sent an append_entries without entries
    original_send = TCPTransport.send

    def recording_send(self: Any, node: Any, message: Any) -> Any:
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "entries" in message
            and not message["entries"]
            and self._syncObj._isLeader()
        ):
            empty.append(time.monotonic())
        return original_send(self, node, message)

    monkeypatch.setattr(TCPTransport, "send", recording_send)
    machines = [Machine() for _ in range(3)]
    groups = three_groups([MemoryStore() for _ in range(3)], machines, settings)
    leader = next(g for g in groups if g.is_leader())
    commands = [f"command-{i}".encode() for i in range(30)]
    started = time.monotonic()
    outcomes = [_submit_all(leader, [c])[0] for c in commands]  # one entry in flight at a time
    elapsed = time.monotonic() - started
    assert all(o.error is None for o in outcomes), outcomes
    sent = sum(1 for t in empty if started <= t <= started + elapsed)
    last = outcomes[-1].result["index"]
    wait_for(lambda: all(m.applied_index >= last for m in machines), "every replica applied", timeout=7)
    heartbeats = 2 * (int(elapsed / heartbeat_s) + 2)  # to 2 followers, each period (+1 under way)
    if prompt:
        # A notice to each follower after each commit, but where the next entry went out before it
        # (the index then rides with the entry): 59 or 60 here. Counted until the followers
        # applied the last entry, as its notices may follow its outcome.
        notices = sum(1 for t in empty if t >= started)
        assert notices >= 1.8 * len(commands) > heartbeats, f"{notices} notices for {len(commands)} entries"
    else:  # heartbeats only
        assert sent <= heartbeats, f"{sent} empty append_entries in {elapsed:.2f} s"
    assert all(m.commands()[-len(commands) :] == commands for m in machines)
