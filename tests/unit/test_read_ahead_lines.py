"""A node's read-ahead for its own receive lines (``cluster/node/read_ahead.py`` and the lines of
``cluster/node/receive_coordinator.py``): when a delete may take messages along and from which
queues (in turn, and fair to the line's other queue groups), a receive of the same visibility taking
them with no take of its own, what no receive took released (and the line quieted only when no
receive took any), releases tried again, a graceful stop releasing what is held, and messages
nobody is left to take given back uncounted (tried again, and waited for by a graceful stop). The
queue groups' leaders are a stand-in router (the replicated ops are
``tests/unit/test_delivery_read_ahead.py``'s, the whole with real nodes
``tests/integration/test_sqs_read_ahead.py``'s)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import CatalogError
from raftmq.cluster.machines.metadata import Topic
from raftmq.cluster.node import read_ahead as ra
from raftmq.cluster.node.read_ahead import Plan
from raftmq.cluster.node.receive_coordinator import ReceiveCoordinator, Waiter, local_key

TOPIC = Topic(7, "t", 1, (1,), None, None, None, 0)
KEY = local_key(TOPIC.id, "sqs")
TAKEN = [{"receipt": f"7.0.{o}.9", "queue": 0, "offset": o, "attempt": 1} for o in range(3)]
# Two queue groups (1 and 2) of two queues each: queues 0 and 2 in group 1, 1 and 3 in group 2.
TWO_GROUPS = Topic(8, "u", 4, (1, 2, 1, 2), None, None, None, 0)
KEY2 = local_key(TWO_GROUPS.id, "sqs")


class Leaders:
    """The queue groups' leaders. ``backlog``: every receive hands out ``max`` new messages of
    the first queue it names (a queue never runs dry); else nothing. Each receive's first queue is
    recorded."""

    def __init__(self, backlog: bool = False) -> None:
        self.backlog = backlog
        self.asked: list[int] = []  # the first queue of each receive
        self.offsets: dict[int, int] = {}

    def leads(self, name: str) -> bool:
        return False

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        assert action == "receive"
        self.asked.append(body["queues"][0])
        return {"messages": self.take(body["queues"][0], body["max"]) if self.backlog else []}

    def take(self, queue: int, n: int) -> list[dict[str, Any]]:
        start = self.offsets.get(queue, 0)
        self.offsets[queue] = start + n
        return [{"receipt": f"8.{queue}.{o}.1", "queue": queue, "offset": o} for o in range(start, start + n)]


class Node:
    """The node: no replica of its own (every group may have something), every group's voters
    apply the newest ops."""

    groups: dict[str, Any] = {}

    def group_supports(self, name: str, capability: str) -> bool:
        return True


Settled = list[tuple[str, list[str]]]


def coordinator(
    leaders: Leaders | None = None, fail_first: int = 0, failure: Exception | None = None
) -> tuple[ReceiveCoordinator, Leaders, Settled]:
    """A coordinator whose settles are recorded; the first ``fail_first`` raise ``failure``
    (``not_leader`` unless given)."""
    settled: Settled = []

    async def settle(topic: Topic, group: str, op: str, receipts: list[str], fields: Any) -> list[Any]:
        settled.append((op, receipts))
        if len(settled) <= fail_first:
            raise failure or CatalogError(errors.NOT_LEADER, "the leader moved")
        return [{"receipt": r, "ok": True} for r in receipts]

    leaders = leaders or Leaders()
    return ReceiveCoordinator(Node(), leaders, settle), leaders, settled  # type: ignore[arg-type]


async def receive(
    c: ReceiveCoordinator, visibility_ms: int, wait_s: float = 0.0, topic: Topic = TOPIC, most: int = 10
) -> list[dict[str, Any]]:
    key = local_key(topic.id, "sqs")
    waiter = Waiter(
        most, visibility_ms, time.monotonic() + wait_s, asyncio.get_running_loop().create_future()
    )
    c.enqueue(key, waiter, lambda: c.target(topic, "sqs", None, None, None))
    return await asyncio.wait_for(waiter.future, 5)


def plan(c: ReceiveCoordinator, topic: Topic = TOPIC, candidates: list[int] | None = None) -> Plan | None:
    return c.read_ahead_wanted(local_key(topic.id, "sqs"), topic, [1] if candidates is None else candidates)


async def holding(c: ReceiveCoordinator, started: float | None = None) -> Plan:
    """A receive of 30 s on the line, then a delete's read-ahead of TAKEN put for its next receive
    (``started``: when the delete was sent; now if None). The read-ahead's plan."""
    await receive(c, 30_000)
    wanted = plan(c)
    assert wanted is not None
    c.put_ahead(KEY, TOPIC, "sqs", list(TAKEN), wanted, time.monotonic() if started is None else started)
    return wanted


async def settle_soon() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_line_reads_ahead_only_after_a_recent_receive_of_a_long_enough_visibility() -> None:
    async def main() -> None:
        c, _, _ = coordinator()
        assert plan(c) is None  # no receive waited in the line
        await receive(c, ra.READ_AHEAD_MIN_VISIBILITY_MS - 1)
        assert plan(c) is None  # too short a visibility timeout
        await receive(c, 30_000)
        assert plan(c, candidates=[]) is None  # no group of the receipts applies ack_receive
        wanted = plan(c)
        assert wanted is not None and (wanted.group, wanted.max, wanted.visibility_ms) == (1, 10, 30_000)
        assert wanted.taken_ms == 30_000 + ra.READ_AHEAD_HOLD_MS
        assert plan(c) is None  # one read-ahead a line at a time
        c.put_ahead(KEY, TOPIC, "sqs", [], wanted, time.monotonic())  # it found nothing
        assert plan(c) is not None

    asyncio.run(main())


def test_a_receive_of_the_same_visibility_takes_the_read_ahead_without_a_take() -> None:
    async def main() -> None:
        c, leaders, settled = coordinator()
        await holding(c)
        takes = len(leaders.asked)
        assert await receive(c, 60_000) == []  # another visibility: not for it
        got = await receive(c, 30_000, wait_s=1.0)
        assert got == TAKEN and len(leaders.asked) == takes + 1  # only the 60 s receive took
        await settle_soon()
        assert settled == []  # nothing left to give back
        counts = c.read_ahead.counts
        assert (counts.taken, counts.handed_out, counts.released) == (3, 3, 0)

    asyncio.run(main())


def test_a_read_ahead_no_receive_takes_in_time_is_released_and_the_line_goes_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ra, "READ_AHEAD_HOLD_MS", 0)

    async def main() -> None:
        c, _, settled = coordinator()
        await holding(c)
        await settle_soon()
        assert settled == [("release", [m["receipt"] for m in TAKEN])]
        assert c.read_ahead.counts.released == 3
        assert await receive(c, 30_000) == []  # given back, not handed out
        assert plan(c) is None  # quiet for READ_AHEAD_QUIET_S

    asyncio.run(main())


def test_a_read_ahead_partly_taken_releases_the_rest_and_keeps_the_line_reading_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receive that asked fewer than were read ahead is still a receiver coming back: the rest is
    released, and the line goes on reading ahead (only a read-ahead no receive touched quiets it)."""

    async def main() -> None:
        c, _, settled = coordinator()
        await holding(c)
        assert await receive(c, 30_000, most=2) == TAKEN[:2]
        monkeypatch.setattr(ra, "READ_AHEAD_HOLD_MS", 0)
        await asyncio.sleep(ra.READ_AHEAD_HOLD_MS / 1000 + 1.1)  # the hold it was put with ends
        assert settled == [("release", [TAKEN[2]["receipt"]])]
        assert plan(c) is not None

    asyncio.run(main())


def test_a_release_that_fails_is_tried_again() -> None:
    async def main() -> None:
        c, _, settled = coordinator(fail_first=2)
        await holding(c, time.monotonic() - 2)  # its hold is over
        await asyncio.sleep(0.5)
        assert [op for op, _ in settled] == ["release"] * 3
        assert (c.read_ahead.counts.released, c.read_ahead.counts.unreleased) == (3, 0)

    asyncio.run(main())


def test_a_graceful_stop_releases_what_is_held_and_reads_nothing_ahead_after() -> None:
    async def main() -> None:
        c, _, settled = coordinator()
        wanted = await holding(c)
        await c.read_ahead.stop()
        assert settled == [("release", [m["receipt"] for m in TAKEN])]
        assert plan(c) is None
        # A delete that was under way when the stop began: what it took is given back at once.
        late = [{**m, "receipt": f"7.0.{m['offset'] + 10}.9"} for m in TAKEN]
        c.put_ahead(KEY, TOPIC, "sqs", late, wanted, time.monotonic())
        await c.read_ahead.stop()
        assert settled[-1] == ("release", [m["receipt"] for m in late])
        assert c.read_ahead.counts.released == 6

    asyncio.run(main())


def test_a_take_goes_on_in_turn_after_its_line_emptied() -> None:
    """One receiver at a time (its line empties between its receives): each take starts where
    the last one left off, not at the same queue group every time."""

    async def main() -> list[int]:
        c, leaders, _ = coordinator(Leaders(backlog=True))
        for _ in range(4):
            await receive(c, 30_000, topic=TWO_GROUPS)
        return leaders.asked

    asked = asyncio.run(main())
    groups = [TWO_GROUPS.queue_groups[q] for q in asked]
    assert groups in ([1, 2, 1, 2], [2, 1, 2, 1]), asked
    assert set(asked) == {0, 1, 2, 3}  # each group's queues in turn too


def test_read_ahead_from_one_queue_group_yields_to_another_with_messages() -> None:
    """Both queue groups have a backlog; a receiver receives and deletes in a loop, each delete
    taking the next messages along. The read-aheads come from the receipts' group, but at most
    READ_AHEAD_RUN in a row: then the next receive takes in turn, from the other group."""

    async def main() -> list[int]:
        c, leaders, _ = coordinator(Leaders(backlog=True))
        served: list[int] = []
        got = await receive(c, 30_000, topic=TWO_GROUPS)
        for _ in range(3 * (ra.READ_AHEAD_RUN + 1)):
            served.append(got[0]["queue"])
            g = TWO_GROUPS.queue_groups[got[0]["queue"]]
            wanted = plan(c, TWO_GROUPS, [g])
            if wanted is not None:  # the delete's entry takes the next ones along
                assert wanted.group == g and {TWO_GROUPS.queue_groups[q] for q in wanted.queues} == {g}
                taken = leaders.take(wanted.queues[0], wanted.max)
                c.put_ahead(KEY2, TWO_GROUPS, "sqs", taken, wanted, time.monotonic())
            got = await receive(c, 30_000, topic=TWO_GROUPS)
        return served

    served = asyncio.run(main())
    groups = [TWO_GROUPS.queue_groups[q] for q in served]
    runs = [len(list(run)) for _, run in __import__("itertools").groupby(groups)]
    assert set(groups) == {1, 2}, served
    assert max(runs) <= ra.READ_AHEAD_RUN + 1, runs
    assert set(served) == {0, 1, 2, 3}, served  # and each group's queues in turn


def test_messages_no_receiver_is_left_to_take_are_given_back_uncounted() -> None:
    """A take's messages whose receiver went away meanwhile: released (no consumer got them, so
    their receive count stays), not nacked (which counts the delivery)."""

    async def main() -> Settled:
        leaders = Slow()
        c, _, settled = coordinator(leaders)
        waiter = Waiter(2, 30_000, time.monotonic() + 5, asyncio.get_running_loop().create_future())
        c.enqueue(KEY, waiter, lambda: c.target(TOPIC, "sqs", None, None, None))
        await settle_soon()
        waiter.future.cancel()  # the client went away while its take was under way
        leaders.go.set()
        await asyncio.sleep(0.1)
        return settled

    settled = asyncio.run(main())
    assert [op for op, _ in settled] == ["release"], settled
    assert len(settled[0][1]) == 2


class Slow(Leaders):
    """Leaders whose receives answer once ``go`` is set."""

    def __init__(self) -> None:
        super().__init__(backlog=True)
        self.go = asyncio.Event()

    async def group_call(self, g: int, action: str, body: dict[str, Any]) -> dict[str, Any]:
        await self.go.wait()
        return await super().group_call(g, action, body)


async def abandoned_take(c: ReceiveCoordinator, leaders: Slow) -> None:
    """A receiver that goes away while its take is under way: the take's 2 messages find nobody."""
    waiter = Waiter(2, 30_000, time.monotonic() + 5, asyncio.get_running_loop().create_future())
    c.enqueue(KEY, waiter, lambda: c.target(TOPIC, "sqs", None, None, None))
    await settle_soon()
    waiter.future.cancel()
    leaders.go.set()
    await settle_soon()


@pytest.mark.parametrize(
    "failure",
    [None, ValueError("HTTP 502 without an error body")],
    ids=["a refusal", "not a refusal"],  # a peer's answer the router cannot read raises ValueError
)
def test_messages_given_back_are_tried_again_when_the_give_back_fails(failure: Exception | None) -> None:
    async def main() -> Settled:
        leaders = Slow()
        c, _, settled = coordinator(leaders, fail_first=2, failure=failure)
        await abandoned_take(c, leaders)
        deadline = time.monotonic() + 10  # the tries' pauses: 0.05 s, 0.1 s (a busy machine: more)
        while len(settled) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # and no fourth try after the one that succeeded
        return settled

    settled = asyncio.run(main())
    assert [op for op, _ in settled] == ["release"] * 3
    assert settled[0][1] == settled[2][1] and len(settled[2][1]) == 2


def test_a_graceful_stop_waits_for_messages_being_given_back() -> None:
    async def main() -> list[str]:
        leaders = Slow()
        c, _, settled = coordinator(leaders, fail_first=1)  # the first try fails: the next is 50 ms on
        await abandoned_take(c, leaders)
        await c.read_ahead.stop()
        return [op for op, _ in settled]

    assert asyncio.run(main()) == ["release", "release"]


def test_a_graceful_stop_waits_for_give_backs_that_start_while_it_waits() -> None:
    """A take still under way when the stop begins finds its receivers gone and gives its
    messages back after the stop started waiting: the stop waits for that one too."""

    async def main() -> list[str]:
        # Each one's first try fails: the next is 50 ms on (r2's ends 10 ms after r1's).
        c, _, settled = coordinator(fail_first=2)
        c.read_ahead.give_back(TOPIC, "sqs", ["r1"])

        async def late_give_back() -> None:
            await asyncio.sleep(0.01)  # after the stop began waiting for r1's
            c.read_ahead.give_back(TOPIC, "sqs", ["r2"])

        late = asyncio.create_task(late_give_back())
        await c.read_ahead.stop()
        await late
        return [r for _, receipts in settled for r in receipts]

    assert sorted(asyncio.run(main())) == ["r1", "r1", "r2", "r2"]  # each tried twice


def test_a_graceful_stop_ends_releases_and_give_backs_still_trying_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release and a give-back that keep failing (their leader elects) would try again for
    RELEASE_TRY_S from their start: a stop waits STOP_RELEASE_S at most, then ends them. Nothing
    of them runs after it, and the read-ahead's messages are counted unreleased."""
    monkeypatch.setattr(ra, "STOP_RELEASE_S", 0.3)

    async def main() -> tuple[int, int, ra.ReadAheadCounts]:
        c, _, settled = coordinator(fail_first=1_000)
        c.read_ahead.give_back(TOPIC, "sqs", ["r1"])
        await holding(c, time.monotonic() - 2)  # its hold is over: released at once
        await c.read_ahead.stop()
        tries = len(settled)
        await asyncio.sleep(1.0)  # the retries' pauses by then: 0.05, 0.1, 0.2, 0.4, 0.5
        return tries, len(settled), c.read_ahead.counts

    tries, later, counts = asyncio.run(main())
    assert tries >= 4  # both tried, and again, while the stop waited
    assert later == tries
    assert (counts.released, counts.unreleased) == (0, len(TAKEN))


def test_a_graceful_stop_ends_a_give_back_whose_leader_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ra, "STOP_RELEASE_S", 0.2)
    ended: list[str] = []

    async def settle(topic: Topic, group: str, op: str, receipts: list[str], fields: Any) -> list[Any]:
        try:
            await asyncio.Event().wait()  # a hop to a leader that never answers
        except asyncio.CancelledError:
            ended.extend(receipts)
            raise
        return []

    async def main() -> None:
        c = ReceiveCoordinator(Node(), Leaders(), settle)  # type: ignore[arg-type]
        c.read_ahead.give_back(TOPIC, "sqs", ["r1"])
        await settle_soon()
        await asyncio.wait_for(c.read_ahead.stop(), 2)
        assert ended == ["r1"]  # ended by the stop, before it returned

    asyncio.run(main())
