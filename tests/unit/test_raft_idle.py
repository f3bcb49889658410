"""An idle Raft group costs its heartbeats, nothing more (issue 25): the tick thread of a
:class:`RaftGroup` sleeps until its own next deadline (a leader's next heartbeat, a follower's
election deadline) instead of waking every ``tick_s``, and whatever needs it sooner wakes it (a
message, a proposal, a call queued for the tick thread). Real pysyncobj groups on localhost."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from raft_doubles import Machine, free_port, settled_leader, wait_for

from raftmq.cluster.replication.raft import Outcome, RaftGroup, RaftSettings
from raftmq.storage.memory import MemoryStore

SETTINGS = RaftSettings(
    password="x" * 16, election_min_s=0.4, election_max_s=0.8, heartbeat_s=0.05, tick_s=0.01
)
# A one-voter group whose leader sleeps 2 s between heartbeats when nothing happens (pysyncobj wants
# the election timeout above 3 heartbeats: it elects itself after 6 s).
LONE = dataclasses.replace(
    SETTINGS, election_min_s=6.1, election_max_s=6.2, heartbeat_s=2.0, max_tick_s=5.0, leader_fallback_s=7.0
)


class TickCounter:
    """Counts a group's ticks (a pysyncobj tick callback, on its tick thread)."""

    def __init__(self, group: RaftGroup) -> None:
        self.count = 0
        group._sync.addOnTickCallback(self._tick)

    def _tick(self) -> None:
        self.count += 1

    def over(self, seconds: float) -> int:
        before = self.count
        time.sleep(seconds)
        return self.count - before


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Callable[[int, RaftSettings], list[RaftGroup]]]:
    started: list[RaftGroup] = []

    def start(n: int, settings: RaftSettings) -> list[RaftGroup]:
        addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        for i, addr in enumerate(addrs):
            started.append(
                RaftGroup(
                    name="g",
                    node_id=f"n{i + 1}",
                    self_addr=addr,
                    peer_addrs=[a for a in addrs if a != addr] or [addr],
                    journal_store=MemoryStore(),
                    machine=Machine(),
                    snapshot_file=str(tmp_path / f"n{i + 1}" / "g.snapshot"),
                    settings=settings,
                )
            )
        settled_leader(started)
        return list(started)

    yield start
    for group in started:
        group.destroy()


def test_an_idle_group_ticks_for_its_heartbeats_only(
    groups: Callable[[int, RaftSettings], list[RaftGroup]],
) -> None:
    three = groups(3, SETTINGS)
    leader = next(g for g in three if g.is_leader())
    follower = next(g for g in three if not g.is_leader())
    counters = {id(g): TickCounter(g) for g in (leader, follower)}
    time.sleep(0.3)  # past the first heartbeats and answers
    seconds = 2.0
    heartbeats = seconds / SETTINGS.heartbeat_s  # 40
    # Every tick_s (10 ms) before: 200 ticks and more in 2 s, whatever the group did.
    follower_ticks = counters[id(follower)].over(seconds)
    # A follower: one tick per heartbeat it receives (and its answer), nothing in between.
    assert follower_ticks <= 1.5 * heartbeats, follower_ticks
    # A leader: its heartbeat's deadline and the two followers' answers.
    leader_ticks = counters[id(leader)].over(seconds)
    assert leader_ticks <= 3.5 * heartbeats, leader_ticks
    assert leader.is_leader() and follower.status().leader == leader.self_addr  # still one term


def test_a_proposal_and_a_call_for_the_tick_thread_wake_a_sleeping_group_at_once(
    groups: Callable[[int, RaftSettings], list[RaftGroup]],
) -> None:
    (group,) = groups(1, LONE)
    counter = TickCounter(group)
    assert counter.over(1.5) <= 3  # asleep between heartbeats
    done = threading.Event()
    outcomes: list[Outcome] = []

    def on_done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        done.set()

    # Proposed just after a tick, so without the wake-up it waits about a whole heartbeat (2 s);
    # 1.5 s is room for a loaded machine.
    ticks = counter.count
    wait_for(lambda: counter.count > ticks, "a heartbeat's tick", timeout=5)
    group.submit(b"command", on_done)
    assert done.wait(1.5), "the proposal waited for the next heartbeat"
    assert outcomes[0].error is None, outcomes
    hint = f"127.0.0.1:{free_port()}"
    ticks = counter.count
    wait_for(lambda: counter.count > ticks, "a heartbeat's tick", timeout=5)
    started = time.monotonic()
    group.hint_peers([hint])
    transport = group._sync._SyncObj__transport
    wait_for(lambda: any(str(n.id) == hint for n in transport._nodes), "the hint applied", timeout=1.5)
    assert time.monotonic() - started < 1.5
    # The same hints again (every node's reconciler repeats them each second) wait for the next
    # tick instead of waking the group.
    before = counter.count
    for _ in range(10):
        group.hint_peers([hint])
        time.sleep(0.02)
    assert counter.count - before <= 1


def test_a_follower_cut_off_from_every_peer_no_longer_hears_a_leader(
    groups: Callable[[int, RaftSettings], list[RaftGroup]],
) -> None:
    # What a node's reconciler trusts instead of asking its peers for the placement every second.
    three = groups(3, SETTINGS)
    wait_for(lambda: all(g.status().hears_leader for g in three), "every replica hearing the leader")
    follower = next(g for g in three if not g.is_leader())
    for group in three:
        if group is not follower:
            group.destroy()
    # Connected to no peer, it does not campaign, and pysyncobj still names the old leader.
    wait_for(lambda: not follower.status().hears_leader, "the follower cut off", timeout=3.0)
    assert follower.status().leader is not None


def test_a_lone_voters_entry_commits_at_its_next_tick_not_a_tick_period_later(
    groups: Callable[[int, RaftSettings], list[RaftGroup]],
) -> None:
    # A one-voter group (replication 1) waits for no acknowledgement: nothing but its own next tick
    # commits an entry. With entries awaiting a commit it used to sleep `tick_s` (50 ms by default:
    # every produce to a one-node cluster took 53 ms); here `tick_s` is 1.5 s, so a wait for it
    # shows plainly.
    (group,) = groups(1, dataclasses.replace(LONE, tick_s=1.5))
    for i in range(3):
        outcomes: queue.Queue[Outcome] = queue.Queue()
        group.submit(b"command %d" % i, outcomes.put)
        try:
            outcome = outcomes.get(timeout=0.75)
        except queue.Empty:
            pytest.fail(f"entry {i} waited for the tick period")
        assert outcome.error is None, outcome


def test_a_tick_that_fails_before_its_end_leaves_no_entry_to_commit_unflushed(
    groups: Callable[[int, RaftSettings], list[RaftGroup]],
) -> None:
    # A tick's end flushes the journal (a tick callback); a tick that failed before it (here a
    # callback ahead of it, in the tick that added the entry) left the entry unflushed, and a lone
    # voter's next tick counted it as committed at once: applied, and answered, before it was on disk.
    (group,) = groups(1, SETTINGS)
    journal = group._journal
    fail_next = threading.Event()

    def fail_the_tick_that_added_it() -> None:
        if fail_next.is_set() and journal._dirty:  # before _after_tick's flush: this tick added it
            fail_next.clear()
            raise RuntimeError("a tick that fails before its end (the test's)")

    group._sync._SyncObj__onTickCallbacks.insert(0, fail_the_tick_that_added_it)
    for i in range(5):
        # Answered on the tick thread as the entry is applied: whether the journal was dirty then.
        answers: queue.Queue[tuple[Outcome, bool]] = queue.Queue()
        fail_next.set()
        group.submit(b"entry %d" % i, lambda outcome, q=answers: q.put((outcome, journal._dirty)))
        outcome, dirty = answers.get(timeout=5)
        assert outcome.error is None, outcome
        assert not fail_next.is_set(), "no tick failed"
        assert not dirty, f"entry {i} applied before it was flushed"


def test_a_lone_voter_leads_at_its_first_tick_after_a_start_and_a_restart(tmp_path: Path) -> None:
    # A one-voter group campaigned only once its election timeout had passed (0.8-1.6 s by default,
    # 6.1 s here): after every start of a one-node cluster, writes waited that long for a leader.
    addr, store = f"127.0.0.1:{free_port()}", MemoryStore()
    for start in ("start", "restart"):
        began = time.monotonic()
        group = RaftGroup(
            name="g",
            node_id="n1",
            self_addr=addr,
            peer_addrs=[addr],
            journal_store=store,
            machine=Machine(),
            snapshot_file=str(tmp_path / "g.snapshot"),
            settings=LONE,
        )
        try:
            leads = f"the lone voter leads after its {start}"
            wait_for(lambda g=group: g.status().is_leader, leads, timeout=2.0)
            assert time.monotonic() - began < LONE.election_min_s / 3
            outcomes: queue.Queue[Outcome] = queue.Queue()
            group.submit(b"after the " + start.encode(), outcomes.put)
            assert outcomes.get(timeout=2.0).error is None
        finally:
            group.destroy()
    assert len(group._journal) > 2  # the restart read the first start's journal
