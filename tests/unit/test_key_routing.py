"""Key routing: the broker's and the client's functions agree and spread keys evenly."""

from __future__ import annotations

from collections import Counter

from raftmq.client import key_queue as client_key_queue
from raftmq.cluster.api.app import key_queue


def test_client_and_broker_route_every_key_alike() -> None:
    keys = [f"user-{i}" for i in range(500)] + ["", "é", "🙂", "a" * 1000, "k0", "k9"]
    for queues in (1, 2, 3, 4, 8, 16, 1024):
        assert [key_queue(k, queues) for k in keys] == [client_key_queue(k, queues) for k in keys]


def test_similar_keys_spread_over_every_queue_of_a_power_of_two() -> None:
    # Plain CRC32C mod 4 put k0..k99 on 2 of 4 queues: its low bits are linear in the input.
    counts = Counter(key_queue(f"k{i}", 4) for i in range(100))
    assert sorted(counts) == [0, 1, 2, 3]
    many = Counter(key_queue(f"order-{i}", 8) for i in range(8000))
    assert all(800 <= n <= 1200 for n in many.values()), many
