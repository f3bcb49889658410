"""The cap on live idempotent producer states (``expire_producers``' ``max_states``,
cluster/machines/producers.py): past it an append forgets the least recently used states, the
recent ones stay deduplicated, a lowered cap is reached by expiry steps, and a group never sent the
field applies appends as before; on the memory store and on RocksDB."""

from __future__ import annotations

import pytest
from test_producer_expiry import Harness

from raftmq.cluster import commands
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.base.limits import MAX_PRODUCER_STATES
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.machines.producers import expiry_due
from raftmq.cluster.replication.upgrade import CAPABILITIES, previous_release_refuses
from raftmq.storage import keys
from raftmq.storage.store import Store

DAY_MS = 24 * 3600 * 1000


def _capped(store: Store, cap: int) -> Harness:
    h = Harness(store)
    assert h.apply(expire_producers(1, DAY_MS, max_states=cap)) == {"expired": 0, "more": False}
    return h


def _states(h: Harness) -> list[str]:
    return sorted(keys.decode_producer_key(k)[2] for k, _ in h.store.scan(keys.PRODUCER, b"Q"))


def test_past_the_cap_the_least_recently_used_states_are_forgotten(store: Store) -> None:
    h = _capped(store, 5)
    for i in range(40):
        assert "duplicate" not in h.produce(f"p{i:02}", 0, now_ms=10 + i)
        assert len(h.index_keys()) == len(_states(h)) == min(i + 1, 5)
    assert _states(h) == [f"p{i}" for i in range(35, 40)]
    for i in range(35, 40):  # the most recent are still deduplicated
        assert h.produce(f"p{i}", 0, now_ms=60)["duplicate"] is True
    # A retry of a forgotten producer is a new producer's batch (stored again), as after expiry.
    assert "duplicate" not in h.produce("p00", 0, now_ms=70)
    assert "p35" not in _states(h) and len(_states(h)) == 5


def test_a_producer_using_its_state_again_forgets_nothing(store: Store) -> None:
    h = _capped(store, 3)
    for i in range(3):
        h.produce(f"p{i}", 0, now_ms=10 + i)
    for sequence in range(1, 20):
        h.produce("p0", sequence, now_ms=20 + sequence)  # its idle key moves: no new state
    assert _states(h) == ["p0", "p1", "p2"]
    h.produce("p3", 0, now_ms=50)
    assert _states(h) == ["p0", "p2", "p3"]  # p1 was the least recently used


def test_an_entry_at_the_same_group_time_never_forgets_a_state_it_uses(store: Store) -> None:
    """One producer appending again in the same group millisecond keeps its idle key where it was:
    the cap must not pick that key (found in review: ``a``'s state, just written, was forgotten,
    and its acknowledged batch's retry stored again, while the least recently used ``b`` stayed)."""
    h = _capped(store, 2)
    h.produce("a", 0, now_ms=10)
    h.produce("b", 0, now_ms=10)
    b = {"topic_id": 1, "queue": 0, "messages": [{"value": "v"}]}
    h.apply(
        commands.produce(
            10, [{**b, "producer_id": "a", "sequence": 1}, {**b, "producer_id": "c", "sequence": 0}]
        )
    )
    assert _states(h) == ["a", "c"]


def test_one_entry_of_several_new_producers_keeps_the_newest(store: Store) -> None:
    h = _capped(store, 4)
    for i in range(4):
        h.produce(f"old{i}", 0, now_ms=10 + i)
    b = {"topic_id": 1, "queue": 0, "messages": [{"value": "v"}]}
    batches = [{**b, "producer_id": f"new{i}", "sequence": 0} for i in range(3)]
    h.apply(commands.produce(20, batches))
    assert _states(h) == ["new0", "new1", "new2", "old3"]


def test_a_lowered_cap_is_reached_by_expiry_steps_and_0_lifts_it(store: Store) -> None:
    h = _capped(store, 100)
    for i in range(30):
        h.produce(f"p{i:02}", 0, now_ms=10 + i)
    assert h.apply(expire_producers(100, DAY_MS, max_items=10, max_states=12)) == {
        "expired": 10,
        "more": True,
    }
    assert h.apply(expire_producers(100, DAY_MS, max_items=10, max_states=12)) == {
        "expired": 8,
        "more": False,
    }
    assert _states(h) == [f"p{i}" for i in range(18, 30)]
    assert h.apply(expire_producers(100, DAY_MS, max_states=0)) == {"expired": 0, "more": False}
    assert h.store.get(keys.PRODUCER_CAP) is None
    for i in range(30, 40):
        h.produce(f"p{i}", 0, now_ms=100 + i)
    assert len(_states(h)) == 22


def test_without_the_field_appends_apply_as_before(store: Store) -> None:
    """A log of the release before (no ``max_states``) gives the bytes it gave: no cap."""
    h = Harness(store)
    for i in range(30):
        h.produce(f"p{i:02}", 0, now_ms=10 + i)
    assert h.apply(expire_producers(100, DAY_MS)) == {"expired": 0, "more": False}
    assert len(_states(h)) == len(h.index_keys()) == 30 and h.store.get(keys.PRODUCER_CAP) is None


def test_the_cap_survives_a_restart_counting_the_states_again(store: Store) -> None:
    h = _capped(store, 5)
    for i in range(8):
        h.produce(f"p{i}", 0, now_ms=10 + i)
    again = Harness.__new__(Harness)
    again.store, again.index = h.store, h.index
    again.machine = type(h.machine)(h.store, 1)  # a new cache: the count is taken from the store
    again.produce("q", 0, now_ms=30)
    assert _states(again) == ["p4", "p5", "p6", "p7", "q"]


def test_the_leader_proposes_until_the_group_holds_the_cap(store: Store) -> None:
    h = _capped(store, 5)
    assert not expiry_due(h.store, 100, DAY_MS, 5, 5)
    assert expiry_due(h.store, 100, DAY_MS, 4, 5)  # another cap
    assert expiry_due(h.store, 100, DAY_MS, 5, 6)  # above it
    assert not expiry_due(h.store, 100, DAY_MS, None, 6)  # a voter cannot apply the field yet


@pytest.mark.parametrize("bad", [-1, MAX_PRODUCER_STATES + 1, True, "5", None])
def test_a_bad_max_states_is_refused(bad: object) -> None:
    command = {"v": 1, "op": "expire_producers", "now_ms": 1, "idle_ms": 1, "max": 1, "max_states": bad}
    with pytest.raises(BadCommand):
        commands.validate(command)


def test_a_replica_of_the_release_before_refuses_the_field_so_it_is_gated() -> None:
    assert previous_release_refuses(expire_producers(1, DAY_MS, max_states=5))
    assert not previous_release_refuses(expire_producers(1, DAY_MS))
    assert "expire_producers.max_states" in CAPABILITIES
