"""The leader's look for retention work (``queue_group.retention_due``): it names exactly the queues
a ``retain`` would remove something from, and the first time an aging queue falls due, so a leader
proposes no ``retain`` while nothing is due and one as soon as something is."""

from __future__ import annotations

from typing import Any

from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine, retention_due
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch


def _machine() -> tuple[QueueGroupMachine, MemoryStore]:
    store = MemoryStore()
    return QueueGroupMachine(store, 1), store


def _produce(m: QueueGroupMachine, index: int, queue: int, now_ms: int, *values: str) -> None:
    batch = {"topic_id": 1, "queue": queue, "messages": [{"value": v} for v in values]}
    assert "results" in m.apply(index, commands.produce(now_ms, [batch]))


def _removes(store: MemoryStore, entry: dict[str, Any], now_ms: int) -> bool:
    """Whether a retain of ``entry`` at ``now_ms`` removes something (applied to a copy)."""
    copy = MemoryStore()
    batch = Batch()
    for k, v in store.scan(b""):
        batch.put(k, v)
    copy.write(batch)
    m = QueueGroupMachine(copy, 1)
    result = m.apply(m.applied_index + 1, commands.retain(now_ms, [entry]))
    return bool(result["removed"])


def test_retention_due_names_exactly_the_queues_a_retain_would_trim_and_when_the_next_falls_due() -> None:
    m, store = _machine()
    _produce(m, 1, 0, 1_000, "a", "b")  # aging: due after 1,000 + 5,000
    _produce(m, 2, 0, 3_000, "c")
    _produce(m, 3, 1, 2_000, "x" * 300)  # over its bytes bound at once
    _produce(m, 4, 1, 2_500, "y" * 300)
    entries = [
        {"topic_id": 1, "queue": 0, "max_age_ms": 5_000, "max_bytes": None},
        {"topic_id": 1, "queue": 1, "max_age_ms": None, "max_bytes": 400},
        {"topic_id": 1, "queue": 2, "max_age_ms": 1, "max_bytes": 1},  # never produced to
        {"topic_id": 1, "queue": 3, "max_age_ms": None, "max_bytes": None},
    ]
    due, next_ms = retention_due(store, entries, 4_000)
    assert due == [entries[1]] and next_ms == 6_001
    for now in (4_000, 6_000, 6_001, 7_999, 8_001):
        due, _ = retention_due(store, entries, now)
        assert [e in due for e in entries] == [_removes(store, e, now) for e in entries], now
    assert retention_due(store, entries, 6_000)[0] == [entries[1]]
    assert retention_due(store, entries, 6_001)[0] == [entries[0], entries[1]]


def test_an_empty_queue_is_never_due() -> None:
    m, store = _machine()
    _produce(m, 1, 0, 1_000, "a")
    entry = {"topic_id": 1, "queue": 0, "max_age_ms": 10, "max_bytes": None}
    assert m.apply(2, commands.retain(5_000, [entry]))["removed"]
    assert retention_due(store, [entry], 10**9) == ([], None)
