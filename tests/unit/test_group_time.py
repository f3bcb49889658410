"""The queue group's time: it never goes backwards, a forward jump of the leader's clock cannot age
messages early, and a ``retain`` removes a bounded number of batches. Every test runs on the
MemoryStore and on a RocksStore."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine, advance, group_time
from raftmq.storage.keys import GROUP_MAX_STEP_MS, GroupTime
from raftmq.storage.queues import queue_bounds, queue_meta, read_messages
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
JUMP_MS = 300_000  # max_jump_ms of the retains below
T0 = 1_800_000_000_000  # a wall-clock time in ms


class Group:
    """A machine that numbers entries itself."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.machine = QueueGroupMachine(store, 1)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(self, now_ms: int, queue: int = 0, **message: Any) -> dict[str, Any]:
        batch = {"topic_id": 1, "queue": queue, "messages": [{"value": "m", **message}]}
        result: dict[str, Any] = self.apply(commands.produce(now_ms, [batch]))["results"][0]
        return result

    def retain(self, now_ms: int, max_age_ms: int = HOUR_MS, **bounds: Any) -> dict[str, Any]:
        spec = [{"topic_id": 1, "queue": 0, "max_age_ms": max_age_ms, "max_bytes": None}]
        return self.apply(
            commands.retain(now_ms, spec, **{"max_jump_ms": JUMP_MS, "max_batches": 100, **bounds})
        )

    def low(self, queue: int = 0) -> int:
        return queue_bounds(self.store, 1, queue)[0]

    def receive(self, now_ms: int, max_age_ms: int | None = None, visibility_ms: int = 30_000) -> list[int]:
        command = commands.receive(now_ms, "g", 1, [0], 100, visibility_ms, max_age_ms=max_age_ms)
        result = self.apply(command)
        assert "messages" in result, result
        self.token = result["token"]
        return [m["offset"] for m in result["messages"]]

    def ack(self, now_ms: int, offsets: list[int]) -> list[Any]:
        result = self.apply(commands.ack(now_ms, "g", 1, [(0, o, self.token) for o in offsets]))
        return [r.get("ok") or r["error"]["code"] for r in result["results"]]


@pytest.fixture
def g(store: Store) -> Group:
    return Group(store)


# -- the group's time never goes backwards -------------------------------------------------------


def test_a_command_stamped_below_the_applied_time_is_applied_at_that_time(g: Group) -> None:
    g.produce(T0 + 10_000)
    # A new leader whose clock is 5 s behind: its messages are stamped at the group's time, and a
    # TTL counts from there, so nothing expires before what the group already applied.
    g.produce(T0 + 5_000, ttl_ms=1_000)
    messages = read_messages(g.store, 1, 0, 0, 10)
    assert [m.timestamp_ms for m in messages] == [T0 + 10_000, T0 + 10_000]
    assert messages[1].expires_at_ms == T0 + 11_000
    assert group_time(g.store).now_ms == T0 + 10_000
    g.produce(T0 + 12_000)  # a later stamp moves it on
    assert read_messages(g.store, 1, 0, 2, 1)[0].timestamp_ms == T0 + 12_000


def test_the_group_time_is_kept_across_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = RocksStore.open(path)
    Group(store).produce(T0 + 10_000)
    store.close()
    store = RocksStore.open(path)
    try:
        g = Group(store)
        g.index = g.machine.applied_index
        g.produce(T0)
        assert read_messages(store, 1, 0, 1, 1)[0].timestamp_ms == T0 + 10_000
    finally:
        store.close()


# -- a forward jump cannot age messages early ---------------------------------------------------


def test_retention_follows_the_stamps_when_time_advances_normally(g: Group) -> None:
    g.produce(T0)
    g.produce(T0 + 30 * 60_000)
    for now in range(T0 + 10_000, T0 + HOUR_MS, 60_000):
        assert g.retain(now) == {"removed": [], "more": False}
    assert g.low() == 0
    # A tick every 10 s (as retention_check_ms) once past an hour: the first batch is removed.
    result = g.retain(T0 + HOUR_MS + 10_000)
    assert result == {"removed": [{"topic_id": 1, "queue": 0, "low_offset": 1}], "more": False}


def test_a_leader_clock_days_ahead_removes_nothing_within_retention(g: Group) -> None:
    g.produce(T0)
    g.retain(T0 + 10_000)
    # A leader whose clock is 3 days ahead takes over and ticks every 10 s for 20 minutes; it
    # also appends, so the group's last stamp is days ahead too.
    skewed = T0 + 3 * DAY_MS
    g.produce(skewed + 20_000)
    # The produce's stamp is clamped already (the group's previous stamp is the retain's).
    assert group_time(g.store).now_ms == T0 + 10_000 + JUMP_MS
    first = g.retain(skewed + 20_000)
    assert first["removed"] == []
    for step in range(1, 120):
        assert g.retain(skewed + 20_000 + step * 10_000)["removed"] == []
    assert g.low() == 0
    # The true leader comes back 21 min after T0: the group's clock waits for its stamps (they
    # are lower), then follows them; the message goes once an hour has passed by them, less the
    # one clamped jump at most.
    for now in range(T0 + 21 * 60_000, T0 + HOUR_MS - JUMP_MS, 60_000):
        assert g.retain(now)["removed"] == [], now
    deadline = T0 + HOUR_MS + 60_000
    now = T0 + HOUR_MS - JUMP_MS
    while g.low() == 0 and now < deadline:
        g.retain(now)
        now += 10_000
    assert g.low() == 1


def test_flapping_between_a_skewed_and_a_true_leader_does_not_push_the_clock_ahead(g: Group) -> None:
    g.produce(T0)
    g.retain(T0)
    for minute in range(1, 40):
        true_now = T0 + minute * 60_000
        g.retain(true_now)
        g.retain(true_now + 3 * DAY_MS)  # the skewed node wins an election, ticks once, loses
        assert group_time(g.store).now_ms <= true_now + JUMP_MS
    assert g.low() == 0


def test_a_retain_without_max_jump_ms_trusts_its_stamp(g: Group) -> None:
    # Entries written before the bound existed apply as they did.
    g.produce(T0)
    spec = [{"topic_id": 1, "queue": 0, "max_age_ms": HOUR_MS, "max_bytes": None}]
    result = g.apply(commands.retain(T0 + 3 * DAY_MS, spec))
    assert result == {"removed": [{"topic_id": 1, "queue": 0, "low_offset": 1}]}


def test_retention_clamps_a_jump_with_no_earlier_retention_run(g: Group) -> None:
    # Issue 19: a young topic (1 h retention, three messages) never retained before; a node
    # restarted 48 h ahead leads, produces once and ticks retention 6 s later.
    for i in range(3):
        g.produce(T0 + i * 1_000)
    skewed = T0 + 10_000 + 2 * DAY_MS
    g.produce(skewed)
    assert g.retain(skewed + 6_000)["removed"] == []
    assert g.low() == 0
    # one step for the jump, then the 6 s of progress and a tenth of it (the time is behind)
    assert group_time(g.store).now_ms == T0 + 2_000 + JUMP_MS + 6_000 + 600


def test_a_receive_stamped_days_ahead_still_hands_out_what_retention_keeps(g: Group) -> None:
    # Issue 19: two messages in a topic with one day's retention; a receive stamped two days ahead
    # judged both older than the retention and finished them, and later receives found nothing.
    g.produce(T0)
    g.produce(T0 + 1_000)
    assert g.receive(T0 + 2 * DAY_MS, max_age_ms=DAY_MS) == [0, 1]
    assert group_time(g.store).now_ms == T0 + 1_000 + JUMP_MS
    assert g.ack(T0 + 5_000, [0, 1]) == [True, True]


def test_a_message_judged_expired_by_a_bad_stamp_is_delivered_once_the_clock_is_sane(g: Group) -> None:
    g.produce(T0, ttl_ms=HOUR_MS)
    g.produce(T0 + 2 * DAY_MS, queue=1)  # a leader two days ahead appends elsewhere
    assert g.receive(T0 + 60_000) == [0]  # the true leader is back a minute later


def test_a_delivery_tick_stamped_ahead_expires_no_deadline_early(g: Group) -> None:
    g.produce(T0)
    assert g.receive(T0 + 1_000, visibility_ms=HOUR_MS) == [0]
    result = g.apply(commands.deliver_tick(T0 + 2 * DAY_MS, 100))
    assert result["expired"] == 0, result
    assert g.ack(T0 + 2_000, [0]) == [True]  # the receipt is still valid


def test_a_ttl_of_a_message_appended_by_a_skewed_leader_counts_from_the_group_time(g: Group) -> None:
    g.produce(T0)
    g.produce(T0 + 2 * DAY_MS, ttl_ms=HOUR_MS)
    message = read_messages(g.store, 1, 0, 1, 1)[0]
    assert message.timestamp_ms == T0 + JUMP_MS
    assert message.expires_at_ms == T0 + JUMP_MS + HOUR_MS


def test_the_group_time_reads_and_writes_the_layout_of_the_release_before() -> None:
    # That release wrote (last_ms, retain_stamp_ms, retain_clock_ms) and reads this one's bytes as
    # such: a checkpoint or a rolled-back replica of either release reads the other's.
    old = struct.pack(">QQQ", T0 + 5_000, T0 + 4_000, T0 + 3_000)
    assert GroupTime.decode(old) == GroupTime(T0 + 5_000, T0 + 4_000)
    assert GroupTime.decode(struct.pack(">QQQ", T0 + 5_000, 0, 0)) == GroupTime(T0 + 5_000, T0 + 5_000)
    assert GroupTime(T0 + 7_000, T0 + 6_000).encode() == struct.pack(
        ">QQQ", T0 + 7_000, T0 + 6_000, T0 + 7_000
    )
    after, jump = advance(GroupTime.decode(old), T0 + 2 * DAY_MS)
    assert (after.now_ms, jump) == (T0 + 4_000 + GROUP_MAX_STEP_MS, 2 * DAY_MS - 4_000)


def test_a_retain_applies_its_own_bound_to_itself(g: Group) -> None:
    g.produce(T0)
    g.apply(commands.retain(T0 + DAY_MS, [], max_jump_ms=30_000))
    assert group_time(g.store).now_ms == T0 + 30_000
    g.produce(T0 + 2 * DAY_MS)  # the group's bound for other commands
    assert group_time(g.store).now_ms == T0 + 30_000 + GROUP_MAX_STEP_MS


# -- bounded work per retain ------------------------------------------------------------------


def test_a_retain_removes_at_most_max_batches_and_the_next_one_goes_on(g: Group) -> None:
    for i in range(7):
        g.produce(T0 + i, queue=0)
        g.produce(T0 + i, queue=1)
    spec = [{"topic_id": 1, "queue": q, "max_age_ms": 1_000, "max_bytes": None} for q in (0, 1)]
    now = T0 + 10_000
    lows = []
    for _ in range(5):
        result = g.apply(commands.retain(now, spec, max_jump_ms=JUMP_MS, max_batches=3))
        lows.append((g.low(0), g.low(1), result["more"]))
    # 3 batches per command over both queues, in order, until all 14 are gone.
    assert lows == [(3, 0, True), (6, 0, True), (7, 2, True), (7, 5, True), (7, 7, False)]
    meta = queue_meta(g.store, 1, 1)
    assert meta is not None and meta.retained_bytes == 0


def test_a_bound_that_stops_exactly_at_the_last_due_batch_reports_no_more(g: Group) -> None:
    for i in range(3):
        g.produce(T0 + i)
    g.produce(T0 + 50_000)  # not due
    result = g.retain(T0 + 20_000, max_age_ms=10_000, max_batches=3)
    assert result == {"removed": [{"topic_id": 1, "queue": 0, "low_offset": 3}], "more": False}


@pytest.mark.parametrize(
    "bad",
    [{"max_batches": 0}, {"max_batches": True}, {"max_jump_ms": -1}, {"max_jump_ms": 2**41}],
    ids=["zero_batches", "bool_batches", "negative_jump", "jump_too_large"],
)
def test_a_retain_with_a_bad_bound_is_refused_and_changes_nothing(g: Group, bad: dict[str, Any]) -> None:
    g.produce(T0)
    before = [(k, v) for k, v in g.store.scan(b"") if k != b"A"]
    body = {"v": 1, "op": "retain", "now_ms": T0 + DAY_MS, "queues": [], **bad}
    result = g.apply(orjson.dumps(body))
    assert result["error"]["code"] == "bad_request"
    assert [(k, v) for k, v in g.store.scan(b"") if k != b"A"] == before


def test_a_group_that_had_no_leader_for_an_hour_catches_up_with_the_true_time() -> None:
    # A whole-cluster outage of an hour: the first stamp after it moves the time by the bound (the
    # group cannot tell an outage from a jumped clock), then the time gains a tenth of each step
    # until it meets the stamps again, instead of running an hour late for good.
    before, _ = advance(GroupTime(), T0)
    after, jump = advance(before, T0 + HOUR_MS)
    assert jump == HOUR_MS and after.now_ms < T0 + HOUR_MS
    behind = [T0 + HOUR_MS - after.now_ms]
    now = T0 + HOUR_MS
    for _ in range(12 * 3600):  # a stamp a second for 12 hours
        now += 1_000
        after, _ = advance(after, now)
        assert after.now_ms <= now
        behind.append(now - after.now_ms)
    assert behind[0] > 50 * 60_000
    assert behind[3600] < behind[0] - 5 * 60_000  # an hour later: six minutes made up
    assert behind[-1] == 0  # caught up well within 12 hours


def test_a_skewed_leader_pulls_the_group_time_ahead_by_at_most_a_tenth_of_its_reign(g: Group) -> None:
    g.produce(T0)
    now = T0
    for _ in range(3600):  # an hour of stamps from a leader three days ahead
        now += 1_000
        g.retain(now + 3 * DAY_MS, max_age_ms=2 * HOUR_MS)
    ahead = group_time(g.store).now_ms - now
    assert 0 < ahead <= JUMP_MS + HOUR_MS // 10
    assert g.low() == 0
