"""The offset API's offsets of a consumer group no admin configured expire once unused for
``limits.offset_retention_ms`` (issue 19, "consume rights bounded"); a configured group's never do.

Pure: a queue-group machine over a MemoryStore, time from the commands; the leader's tick loop
with a stand-in node for the rolling-upgrade gate.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from test_delivery import Machine, T

from raftmq.cluster import commands
from raftmq.cluster.base.errors import BadCommand
from raftmq.cluster.machines.delivery import read_subscription
from raftmq.cluster.machines.delivery.expiry import next_expiry_ms
from raftmq.cluster.node.ticks import TickLoops
from raftmq.cluster.replication.upgrade import BEFORE_CAPABILITIES, CAPABILITIES
from raftmq.storage import keys
from raftmq.storage.queues import scan_prefix

IDLE, RETENTION = 1000, 5000


def sub(m: Machine, group: str, now: int, **kw: Any) -> None:
    result = m.apply(commands.subscribe(group, T, "orders", None, 16, [1], checked=True, now_ms=now, **kw))
    assert "subscription" in result, result


def expire(m: Machine, now: int, retention_ms: int | None = RETENTION) -> dict[str, Any]:
    return m.apply(commands.expire_subscriptions(now, IDLE, 100, offset_retention_ms=retention_ms))


def commit(m: Machine, group: str, offset: int) -> None:
    result = m.apply(commands.commit_offsets(group, T, {0: offset}))
    assert "error" not in result, result


def records(m: Machine) -> set[str]:
    return {k[6:].decode() for k, _ in scan_prefix(m.store, keys.SUBSCRIPTION)}


def offset_groups() -> Machine:
    """``committer``: an invented group of the offset API (its record made at 0); ``receiver``: an
    invented group that also received (in use until its deadline, 1000) and committed;
    ``admins``: a configured group that committed."""
    m = Machine()
    m.produce(0, "a", "b", "c")
    sub(m, "committer", 0, creator="t")
    commit(m, "committer", 2)
    sub(m, "receiver", 0, creator="t")
    assert len(m.receive(now=0, group="receiver")) == 3
    commit(m, "receiver", 1)
    sub(m, "admins", 0, configured=True)
    commit(m, "admins", 3)
    return m


def test_an_invented_groups_offsets_expire_after_retention_unused_and_a_configured_groups_stay() -> None:
    m = offset_groups()
    # After subscription_idle_ms the receive/ack state goes; the record stays, dormant, for the offsets.
    assert expire(m, 1999) == {"expired": 0, "more": False, "dormant": 1}  # committer (used at 0)
    assert expire(m, 2000) == {"expired": 0, "more": False, "dormant": 1}  # receiver (used until 1000)
    assert expire(m, 4000) == {"expired": 0, "more": False, "dormant": 0}  # a dormant one is not seen again
    assert not list(scan_prefix(m.store, keys.PENDING))  # the receiver's deliveries went
    assert (m.floor(group="committer"), m.floor(group="receiver"), m.floor(group="admins")) == (2, 1, 3)
    assert next_expiry_ms(m.store, IDLE, RETENTION) == 5000
    # After offset_retention_ms unused, the record goes with its offsets.
    assert expire(m, 5000) == {"expired": 1, "more": False, "dormant": 0}
    assert (m.floor(group="committer"), m.floor(group="receiver")) == (None, 1)
    assert next_expiry_ms(m.store, IDLE, RETENTION) == 6000
    assert expire(m, 6000) == {"expired": 1, "more": False, "dormant": 0}
    assert m.floor(group="receiver") is None
    # The configured group's offsets and record stay, however long unused.
    assert expire(m, 10**9) == {"expired": 0, "more": False, "dormant": 0}
    assert records(m) == {"admins"} and m.floor(group="admins") == 3
    assert next_expiry_ms(m.store, IDLE, RETENTION) is None


def test_a_use_wakes_a_dormant_group_and_its_offsets_count_from_then() -> None:
    m = offset_groups()
    expire(m, 2000)
    stored = read_subscription(m.store, T, "committer")
    assert stored is not None and stored.dormant
    sub(m, "committer", 3000, creator="t")  # a commit or a read of its offsets refreshes the record
    stored = read_subscription(m.store, T, "committer")
    assert stored is not None and not stored.dormant and stored.used_ms == 3000
    assert expire(m, 5000)["expired"] == 0
    assert m.floor(group="committer") == 2
    # Received again, a dormant receiver starts from its kept offset and is awake again.
    assert [d["offset"] for d in m.receive(now=5000, group="receiver")] == [1, 2]
    stored = read_subscription(m.store, T, "receiver")
    assert stored is not None and not stored.dormant and stored.used_ms == 6000  # its deadline
    assert expire(m, 8000) == {"expired": 1, "more": False, "dormant": 1}
    assert m.floor(group="committer") is None and m.floor(group="receiver") == 1


def test_without_offset_retention_the_command_applies_the_rule_before_it() -> None:
    # An entry written before the field (or by a leader whose voters lack it): the offset API's
    # offsets stay and the record goes, dormant or not, as the release before it applies it.
    m = offset_groups()
    expire(m, 2000)  # both invented groups dormant
    assert expire(m, 2500, retention_ms=None) == {"expired": 2, "more": False}
    assert records(m) == {"admins"}
    assert (m.floor(group="committer"), m.floor(group="receiver")) == (2, 1)
    assert next_expiry_ms(m.store, IDLE) is None


def test_replicas_applying_the_same_entries_agree_and_a_replayed_entry_is_skipped() -> None:
    log: list[bytes] = []
    a = Machine()
    real_apply = a.apply

    def recording(command: bytes) -> dict[str, Any]:
        log.append(command)
        return real_apply(command)

    a.apply = recording  # type: ignore[method-assign]
    a.produce(0, "a", "b", "c")
    sub(a, "committer", 0, creator="t")
    commit(a, "committer", 2)
    sub(a, "receiver", 0, creator="t")
    a.receive(now=0, group="receiver")
    for now in (1500, 2000, 5000, 6000):
        expire(a, now)
    b = Machine()
    for command in log:
        b.apply(command)
    assert a.pairs() == b.pairs() and records(b) == set()
    before = b.pairs()
    for index, command in enumerate(log, start=1):  # a journal replay after a restart
        assert b.machine.apply(index, command) == {"skipped": True}
    assert b.pairs() == before


def test_the_field_is_a_gated_level_and_refused_when_not_a_positive_duration() -> None:
    assert "expire_subscriptions.offsets" in CAPABILITIES
    assert "expire_subscriptions.offsets" not in BEFORE_CAPABILITIES
    decoded = commands.decode(commands.expire_subscriptions(1, 2, 3, offset_retention_ms=4))
    assert decoded["offset_retention_ms"] == 4  # type: ignore[typeddict-item]
    assert commands.decode(commands.expire_subscriptions(1, 2, 3))["offset_retention_ms"] is None  # type: ignore[typeddict-item]
    for bad in (0, -1, "7", 2**41):
        body = {"v": 1, "op": "expire_subscriptions", "now_ms": 1, "idle_ms": 2, "max": 3}
        with pytest.raises(BadCommand):
            commands.decode(orjson.dumps({**body, "offset_retention_ms": bad}))


class _Raft:
    def is_leader(self) -> bool:
        return True


def _leader(supported: set[str], proposed: list[bytes]) -> tuple[TickLoops, Any]:
    """A tick loop over a stand-in node that leads one queue group (``offset_groups``' store),
    whose voters all apply the capabilities in ``supported``."""
    m = offset_groups()

    async def propose(name: str, command: bytes) -> Any:
        proposed.append(command)
        return SimpleNamespace(error=None, result=m.apply(command))

    limits = SimpleNamespace(subscription_idle_ms=IDLE, offset_retention_ms=RETENTION)
    node = SimpleNamespace(
        config=SimpleNamespace(limits=limits),
        group_supports=lambda name, capability: capability in supported,
        propose=propose,
    )
    loops = TickLoops(node)  # type: ignore[arg-type]
    loops._expiry_open_s["0"] = -1e9  # past the grace after the upgrade
    return loops, SimpleNamespace(raft=_Raft(), machine=m.machine)


def test_the_leader_writes_offset_retention_only_once_every_voter_applies_it() -> None:
    # The tick is stamped with this machine's clock: the groups' times (0 to 1000) are long past.
    # A voter of the release before: the command is written without the field (offsets stay).
    proposed: list[bytes] = []
    loops, local = _leader({"expire_subscriptions"}, proposed)
    asyncio.run(loops._expire_subscriptions("0", local))
    assert proposed and all(b"offset_retention_ms" not in c for c in proposed)
    assert local.machine.store.get(keys.offset_key(T, 0, "committer")) is not None
    # Every voter upgraded: the field is written, and the invented groups' offsets go.
    proposed.clear()
    loops, local = _leader({"expire_subscriptions", "expire_subscriptions.offsets"}, proposed)
    asyncio.run(loops._expire_subscriptions("0", local))
    assert proposed and all(orjson.loads(c)["offset_retention_ms"] == RETENTION for c in proposed)
    assert local.machine.store.get(keys.offset_key(T, 0, "committer")) is None
    assert local.machine.store.get(keys.offset_key(T, 0, "admins")) is not None
