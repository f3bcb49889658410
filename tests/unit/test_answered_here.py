"""What a queue group's leader answers without proposing (``DeliveryActions``' ``answered_here``)
is what the apply answers for the same state, and the apply writes nothing for it: a refusal
or no-op answered at the leader changes no behaviour, it only costs no Raft entry."""

from __future__ import annotations

from typing import Any

from test_delivery import DLQ, G, Machine, T, codes

from raftmq.cluster import commands
from raftmq.cluster.base.errors import CatalogError
from raftmq.cluster.node.delivery_actions import answered_here, stale_results


def _here(m: Machine, command: bytes) -> dict[str, Any] | None:
    """The leader's answer (an error as its body), or None: proposed."""
    try:
        return answered_here(m.store, commands.decode(command))
    except CatalogError as e:
        return e.body()


def _same_as_the_apply(m: Machine, command: bytes) -> None:
    here = _here(m, command)
    assert here is not None, "answered at the leader"
    before = m.pairs()
    applied = m.apply(command)
    assert m.pairs() == before  # the apply wrote nothing either
    if "error" in here:
        assert {k: applied["error"][k] for k in here["error"]} == here["error"], (here, applied)
    else:
        assert applied == here


def test_each_answer_at_the_leader_is_the_applys() -> None:
    m = Machine()
    m.subscribe()
    m.produce(0, "a", "b")
    assert m.apply(commands.lock(0, G, T, 0, "a", 100))["epoch"] == 1
    _same_as_the_apply(m, commands.lock(50, G, T, 0, "b", 100))  # lock_held
    _same_as_the_apply(m, commands.unlock(G, T, 0, "b", 1))  # not the holder
    _same_as_the_apply(m, commands.unlock(G, T, 0, "a", 2))  # not the epoch
    _same_as_the_apply(m, commands.commit_fenced(G, T, {0: 1}, 2))  # stale_epoch
    _same_as_the_apply(m, commands.ack(60, G, T, [(0, 0, 1)], epoch=2))
    _same_as_the_apply(m, commands.nack(60, G, T, [(0, 0, 1)], epoch=2))
    _same_as_the_apply(m, commands.ack(60, G, T, [(0, 0, 1), (0, 7, 2)], epoch=1))  # none in flight
    _same_as_the_apply(m, commands.extend(60, G, T, [(0, 1, 1)], 100, epoch=1))
    assert m.apply(commands.unlock(G, T, 0, "a", 1)) == {"released": True}
    _same_as_the_apply(m, commands.unlock(G, T, 0, "a", 1))  # released already
    # Proposed: what changes something.
    assert _here(m, commands.lock(70, G, T, 0, "b", 100)) is None  # the lock is free
    assert _here(m, commands.commit_fenced(G, T, {0: 1}, 1)) is None
    assert _here(m, commands.redrive(80, G, T, DLQ, [0], 10)) is None  # no redrive offset yet
    assert m.apply(commands.redrive(80, G, T, DLQ, [0, 1], 10))["queues"][0]["count"] == 0
    _same_as_the_apply(m, commands.redrive(90, G, T, DLQ, [0, 1], 10))  # nothing to redrive


def test_a_redrive_with_dead_letters_is_proposed() -> None:
    m = Machine()
    m.subscribe(max_deliveries=1)
    m.produce(0, "poison")
    got = m.receive(now=0)
    m.op("nack", 10, got)  # its last delivery: to the dead-letter topic
    assert _here(m, commands.redrive(20, G, T, DLQ, [0], 10)) is None
    assert m.apply(commands.redrive(20, G, T, DLQ, [0], 10))["queues"][0]["count"] == 1
    _same_as_the_apply(m, commands.redrive(30, G, T, DLQ, [0], 10))


def test_a_settlement_of_a_dropped_topic_is_proposed_for_the_apply_to_refuse() -> None:
    """The apply refuses an ack, nack or extend of a dropped topic first (``topic_not_found``);
    the drop deleted its locks, so the fence alone said ``stale_epoch`` (review of the leader's
    answers: it answered that here)."""
    m = Machine()
    m.subscribe()
    m.produce(0, "a")
    assert m.apply(commands.lock(0, G, T, 0, "a", 100))["epoch"] == 1
    m.apply(commands.drop_topic(T))
    for command in (
        commands.ack(60, G, T, [(0, 0, 1)], epoch=1),
        commands.nack(60, G, T, [(0, 0, 1)], epoch=1),
        commands.extend(60, G, T, [(0, 0, 1)], 100, epoch=1),
    ):
        assert _here(m, command) is None
        assert m.apply(command)["error"]["code"] == "topic_not_found"


def test_a_settlement_of_receipts_none_in_flight_is_answered_as_the_apply_answers_it() -> None:
    """Spent and made-up receipts: the leader's answer is the apply's, which writes nothing; it
    stands at once for tokens the replica applied, not for a token above (a newer leader's)."""
    m = Machine()
    m.subscribe()
    m.produce(0, "a", "b")
    got = m.receive(now=0)
    assert codes(m.op("ack", 10, got[:1])) == ["ok"]
    token = got[0]["token"]
    for op, kw in (
        ("ack", {}),
        ("nack", {"delay_ms": 0}),
        ("extend", {"visibility_ms": 10}),
        ("release", {}),
    ):
        receipts = [(0, 0, token), (0, 1, token - 1), (0, 9, token), (0, 1, 1)]
        here, stands = stale_results(m.store, m.index, T, G, [list(r) for r in receipts])
        assert stands and here is not None
        before = m.pairs()
        applied = m.apply(getattr(commands, op)(20, G, T, receipts, **kw))["results"]
        assert m.pairs() == before and codes(applied) == codes(here) == ["stale_receipt"] * 4
        assert [r["error"] for r in applied] == [r["error"] for r in here]
    assert stale_results(m.store, m.index, T, G, [[0, 1, m.index + 1]]) == ([here[1]], False)
    assert stale_results(m.store, m.index, T, G, [[0, 1, 1], [0, 1, token]]) == (None, False)  # in flight
