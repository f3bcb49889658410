"""The queue-group machine's cache of the keys every apply reads (cluster/machines/cache.py): with it,
without it and with a tiny one, the same store bytes and results; forgotten when a snapshot's
checkpoint replaces the store; nothing kept that a failed write did not write; expired producers
gone from it too; bounded."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_determinism import everything, seeded_log

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.machines.cache import _ABSENT, StateCache
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.keys import QueueMeta
from raftmq.storage.memory import MemoryStore
from raftmq.storage.queues import scan_prefix
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, Store, StoreError

T0 = 1_800_000_000_000


def append(now_ms: int, *batches: tuple[int, int, str | None, int, int]) -> bytes:
    """An ``append`` of ``(topic_id, queue, producer, sequence, records)`` batches."""
    items = []
    for topic_id, queue, producer, sequence, records in batches:
        b = rb.BatchBuilder(producer, sequence if producer else 0, base_timestamp_ms=now_ms)
        for r in range(records):
            b.append(f"value-{sequence}-{r}", key=f"k{r}", timestamp_ms=now_ms)
        items.append((topic_id, queue, b.finish()))
    return commands.append(now_ms, items)


def appends_log(rng: random.Random, length: int) -> list[bytes]:
    """Keyed appends of 40 producers over 6 queues of three topics, with their retries (duplicates,
    stale sequences), producer expiry (and its sweep), retention, a topic dropped late, clocks stepping
    back and jumping ahead, and garbage."""
    log: list[bytes] = []
    sequences: dict[tuple[str, int, int], int] = {}
    now_ms = T0
    for i in range(length):
        now_ms += rng.choice([0, 1, 7, 120, 2_000, -3_000, 400_000])
        weights = [80, 8, 5, 1 if i > length // 2 else 0, 6]  # topic 3 is used for a while first
        kind = rng.choices(["append", "expire", "retain", "drop", "garbage"], weights)[0]
        if kind == "append":
            batches = []
            for _ in range(rng.randint(1, 3)):
                topic_id, queue = rng.randint(1, 3), rng.randint(0, 5)
                producer = rng.choice([None, *(f"p{i}" for i in range(40))])
                ident = (producer or "", topic_id, queue)
                sequence = sequences.get(ident, 0) - rng.choice([0, 0, 0, 0, 1, 8])
                records = rng.randint(1, 3)
                sequences[ident] = max(sequence + records, sequences.get(ident, 0))
                batches.append((topic_id, queue, producer, max(sequence, 0), records))
            log.append(append(now_ms, *batches))
        elif kind == "expire":
            log.append(expire_producers(now_ms, rng.choice([1, 500, 5_000]), rng.randint(1, 30)))
        elif kind == "retain":
            queues = [{"topic_id": t, "queue": q, "max_bytes": 300} for t in (1, 2) for q in range(3)]
            log.append(commands.retain(now_ms, queues, max_batches=rng.randint(1, 5)))
        elif kind == "drop":
            log.append(commands.drop_topic(3))
        else:
            log.append(rng.randbytes(rng.randint(0, 12)))
    return log


def apply_log(store: Store, log: list[bytes], cache_entries: int | None) -> list[dict[str, Any]]:
    kwargs = {} if cache_entries is None else {"cache_entries": cache_entries}
    machine = QueueGroupMachine(store, 1, max_entry_messages=10, **kwargs)
    return [machine.apply(index, command) for index, command in enumerate(log, start=1)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("logs", ["appends", "every_op"])
def test_the_same_log_with_and_without_the_cache_gives_the_same_bytes_and_results(
    tmp_path: Path, seed: int, logs: str
) -> None:
    rng = random.Random(seed)
    log = appends_log(rng, 400) if logs == "appends" else seeded_log(rng, 300)
    plain = MemoryStore()
    expected = apply_log(plain, log, cache_entries=0)
    for cache_entries in (None, 5):  # the default, and one that forgets all the time
        rocks = RocksStore.open(str(tmp_path / f"cache-{cache_entries}"))
        try:
            assert apply_log(rocks, log, cache_entries) == expected
            assert everything(rocks) == everything(plain)
        finally:
            rocks.close()


def test_a_snapshot_restore_forgets_what_the_replaced_store_held(tmp_path: Path) -> None:
    """A follower that applied a few entries (their queue bounds, producer states and group time
    cached) restores a peer's checkpoint taken further on, as a snapshot install does, and then
    applies the next entries as that peer does."""
    log = appends_log(random.Random(11), 120)
    ahead_store = RocksStore.open(str(tmp_path / "ahead"))
    behind_store = RocksStore.open(str(tmp_path / "behind"))
    try:
        ahead = QueueGroupMachine(ahead_store, 1, max_entry_messages=10)
        behind = QueueGroupMachine(behind_store, 1, max_entry_messages=10)
        for index, command in enumerate(log[:80], start=1):
            ahead.apply(index, command)
            if index <= 10:
                behind.apply(index, command)
        ahead_store.checkpoint(str(tmp_path / "checkpoint"))
        behind.restore(str(tmp_path / "checkpoint"))
        assert behind.applied_index == 80
        for index, command in enumerate(log[80:], start=81):
            assert behind.apply(index, command) == ahead.apply(index, command)
        assert everything(behind_store) == everything(ahead_store)
    finally:
        ahead_store.close()
        behind_store.close()


class FailingWrites(MemoryStore):
    """The test double with a disk that refuses the next write (then works again)."""

    fail_next = False

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        if self.fail_next:
            self.fail_next = False
            raise StoreError("disk full")
        super().write(batch, sync=sync)


def test_a_failed_write_leaves_nothing_it_did_not_write_in_the_cache() -> None:
    store = FailingWrites()
    machine = QueueGroupMachine(store, 1)
    assert machine.apply(1, append(T0, (1, 0, "p", 0, 2)))["results"][0]["base_offset"] == 0
    store.fail_next = True
    with pytest.raises(StoreError):
        machine.apply(2, append(T0 + 1, (1, 0, "p", 2, 3)))
    # The same entry again (in the node the process stops, and the journal replays it): the queue
    # and the producer are as the store holds them, not as the failed entry would have left them.
    result = machine.apply(2, append(T0 + 1, (1, 0, "p", 2, 3)))
    assert result["results"] == [{"topic_id": 1, "queue": 0, "base_offset": 2, "count": 3}]
    assert QueueMeta.decode(store.get(keys.meta_key(1, 0)) or b"").high_offset == 5


def test_an_expired_producer_is_forgotten_by_the_cache_too(tmp_path: Path) -> None:
    """Once its state expired, a producer is new to the queue: a sequence below its old ones is
    stored, not refused as stale (a cached state would refuse it)."""
    store = RocksStore.open(str(tmp_path / "db"))
    try:
        machine = QueueGroupMachine(store, 1)
        assert machine.apply(1, expire_producers(T0, 1_000))["more"] is False  # the sweep is done
        assert "error" not in machine.apply(2, append(T0, (1, 0, "p", 5, 1)))["results"][0]
        assert machine.apply(3, expire_producers(T0 + 2_000, 1_000)) == {"expired": 1, "more": False}
        result = machine.apply(4, append(T0 + 2_001, (1, 0, "p", 0, 1)))
        assert result["results"] == [{"topic_id": 1, "queue": 0, "base_offset": 1, "count": 1}]
    finally:
        store.close()


def _put(store: Store, key: bytes, value: bytes) -> Batch:
    batch = Batch()
    batch.put(key, value)
    store.write(batch)
    return batch


def test_the_cache_keeps_at_most_its_size_the_least_recently_read_forgotten_first() -> None:
    store = MemoryStore()
    cache = StateCache(2)
    first, second, third = (keys.meta_key(1, q) for q in range(3))
    for key in (first, second, third):
        _put(store, key, QueueMeta(0, 1, 10).encode())
    for key in (first, second, first, third):  # second is the least recently read when third comes
        assert cache.read(store, key, QueueMeta.decode) == QueueMeta(0, 1, 10)
    assert len(cache) == 2
    for key in (first, second, third):  # behind the cache's back, so a kept key shows the old value
        _put(store, key, QueueMeta(0, 2, 20).encode())
    assert cache.read(store, first, QueueMeta.decode) == QueueMeta(0, 1, 10)
    assert cache.read(store, second, QueueMeta.decode) == QueueMeta(0, 2, 20)  # re-read


def test_a_written_batch_keeps_only_the_values_it_put_and_forgets_what_it_changed_otherwise() -> None:
    store = MemoryStore()
    cache = StateCache()
    meta, producer, other = keys.meta_key(1, 0), keys.producer_key(1, 0, "p"), keys.meta_key(2, 0)
    for key in (meta, producer, other):
        assert cache.read(store, key, bytes) is None  # absent, and kept as absent
    kept, unknown = QueueMeta(0, 3, 30), QueueMeta(0, 4, 40)
    batch = Batch()
    data = kept.encode()
    batch.put(meta, data)  # the very bytes of an encoded value: kept
    batch.put(other, unknown.encode())  # bytes from elsewhere: forgotten (read again)
    batch.delete(producer)  # a delete of a kept kind: forgotten
    batch.delete_range(*keys.queue_range(keys.RECORD, 1, 0))  # records only: nothing forgotten
    store.write(batch)
    cache.written(batch, {meta: (data, kept), other: (b"else", QueueMeta(0, 9, 9))})
    assert len(cache) == 1
    assert cache.read(store, meta, QueueMeta.decode) is kept
    assert cache.read(store, other, QueueMeta.decode) == unknown
    dropped = Batch()
    dropped.delete_range(*keys.topic_range(keys.META, 1))  # reaches a kept kind: all forgotten
    store.write(dropped)
    cache.written(dropped, {})
    assert len(cache) == 0


def test_a_read_of_a_kind_the_write_through_does_not_follow_is_refused() -> None:
    """A record key (say) would never be updated by :meth:`StateCache.written`: reading it through
    the cache is a programming error, not a stale answer."""
    with pytest.raises(AssertionError):
        StateCache().read(MemoryStore(), keys.record_key(1, 0, 0), bytes)


def test_a_group_time_stamped_0_is_kept_as_the_store_reads_it_back() -> None:
    """A command stamped 0 (a leader whose clock reads the epoch) leaves the group's time where it
    was, written with the stamp 0 that a read of the store turns into the time itself; the next
    command's jump is then judged from that. The cache kept the value as written (stamp 0), so the
    next stamp looked like a jump of 56 years and was clamped: different results and bytes from a
    replica reading its store (a restart, a snapshot install)."""
    log = [
        commands.retain(T0, [], max_batches=1),
        commands.retain(0, [], max_batches=1),
        commands.retain(T0 + 1_000, [], max_batches=1, max_jump_ms=300_000),
        append(T0 + 2_000, (1, 0, "p", 0, 2)),
    ]
    plain = MemoryStore()
    expected = apply_log(plain, log, cache_entries=0)
    cached = MemoryStore()
    assert apply_log(cached, log, cache_entries=None) == expected
    assert everything(cached) == everything(plain)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("logs", ["appends", "delivery"])
def test_every_value_kept_is_what_a_read_of_its_bytes_gives(seed: int, logs: str) -> None:
    """The write-through keeps, for each put, the value its bytes decode to: checked over a random
    log, for every kept key after every entry, against a read of the store."""
    store = MemoryStore()
    machine = QueueGroupMachine(store, 1, max_entry_messages=10)
    decoders: dict[bytes, Any] = {
        b"T": keys.GroupTime.decode,
        b"Q": QueueMeta.decode,
        b"P": keys.ProducerState.decode,
    }
    decoders.update({b"S": keys.decode_u64, b"O": keys.decode_u64, b"X": keys.LockState.decode})
    rng = random.Random(seed)
    log = appends_log(rng, 150) if logs == "appends" else seeded_log(rng, 300)
    for index, command in enumerate(log, start=1):
        machine.apply(index, command)
        for key, value in machine._cache._entries.items():
            data = store.get(key)
            if data is None:  # a deleted key is forgotten or kept as absent, never as its old value
                assert value is _ABSENT, (key, value)
                continue
            decode = decoders.get(key[:1])
            if decode is not None:
                assert decode(data) == value, (key, value)
        for prefix in machine._cache._no_retries:  # known empty: the store holds no retry there
            assert list(scan_prefix(store, prefix, limit=1)) == [], prefix


class CountedGets(MemoryStore):
    """A memory store that counts the reads of each key (the real store otherwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        self.gets[key] = self.gets.get(key, 0) + 1
        return super().get(key)


def test_a_receiver_s_entries_read_their_subscription_once_then_from_the_cache() -> None:
    """Every receive and settlement reads its group's subscription (issue 24: an ``ack_receive``
    per DeleteMessageBatch on every replica): kept as a read of its bytes gives it, the store read
    again only after a write changed it (before: once per entry)."""
    from raftmq.cluster.machines.delivery.state import decode_subscription

    store = CountedGets()
    machine = QueueGroupMachine(store, 1)
    log = [commands.subscribe("g", 1, "t", None, 2**32 - 1, [0], now_ms=T0), append(T0, (1, 0, None, 0, 8))]
    log += [commands.receive(T0 + 1, "g", 1, [0], 1, 30_000)]
    log += [commands.ack_receive(T0 + 2 + i, "g", 1, [(0, i, 3 + i)], [0], 1, 30_000) for i in range(6)]
    key = keys.subscription_key(1, "g")
    for index, command in enumerate(log, start=1):
        result = machine.apply(index, command)
        assert "error" not in result, result
        if key in machine._cache._entries:
            assert machine._cache._entries[key] == decode_subscription(MemoryStore.get(store, key) or b"")
    # The subscribe's own read, the receive's (into the cache), one after the receive wrote it
    # (its time in use moved): not one per entry.
    assert store.gets[key] == 3


class CountedRetryScans(MemoryStore):
    """A MemoryStore counting the scans of retry indexes (``Y`` keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.retry_scans = 0

    def scan(self, start: bytes, *args: Any, **kwargs: Any) -> Any:
        self.retry_scans += start.startswith(keys.RETRY)
        return super().scan(start, *args, **kwargs)


def test_an_empty_retry_index_is_scanned_once_until_a_retry_is_put() -> None:
    """Every receive looks for due retries first, and the index is empty unless something was
    nacked or released: a scan that found none is kept, until a put of a retry under that
    subscription queue (the nack below) makes the next receive scan again and find it."""
    store = CountedRetryScans()
    machine = QueueGroupMachine(store, 1)
    log = [commands.subscribe("g", 1, "t", None, 2**32 - 1, [0], now_ms=T0), append(T0, (1, 0, None, 0, 4))]
    for index, command in enumerate(log, start=1):
        assert "error" not in machine.apply(index, command)
    first = machine.apply(3, commands.receive(T0 + 1, "g", 1, [0], 2, 30_000))
    second = machine.apply(4, commands.receive(T0 + 2, "g", 1, [0], 1, 30_000))
    assert [m["offset"] for m in first["messages"] + second["messages"]] == [0, 1, 2]
    assert store.retry_scans == 1
    nacked = machine.apply(5, commands.nack(T0 + 3, "g", 1, [(0, 1, 3)], delay_ms=0))
    assert nacked["results"] == [{"ok": True}]
    again = machine.apply(6, commands.receive(T0 + 4, "g", 1, [0], 2, 30_000))
    assert [(m["offset"], m["attempt"]) for m in again["messages"]] == [(1, 2), (3, 1)]
    assert store.retry_scans == 2
    machine.apply(7, commands.receive(T0 + 5, "g", 1, [0], 1, 30_000))  # the retry taken: empty again
    machine.apply(8, commands.receive(T0 + 6, "g", 1, [0], 1, 30_000))
    assert store.retry_scans == 3


def test_the_cache_cuts_a_retry_key_to_its_subscription_queue_s_prefix() -> None:
    """A put of a retry forgets its queue's emptiness by the key's prefix: the cut must follow
    ``keys.retry_key``'s layout, whatever the group's name."""
    from raftmq.cluster.machines.cache import _RETRY_TAIL

    for group in ("", "g", "é" * 127):
        key = keys.retry_key(7, 3, group, 2**63, 99)
        assert key[:-_RETRY_TAIL] == keys.sub_key(keys.RETRY, 7, 3, group)


class CountedRetryPairs(MemoryStore):
    """A MemoryStore counting the pairs its scans of retry indexes (``Y`` keys) hand out."""

    def __init__(self) -> None:
        super().__init__()
        self.retry_pairs = 0

    def scan(self, start: bytes, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        for pair in super().scan(start, *args, **kwargs):
            self.retry_pairs += start.startswith(keys.RETRY)
            yield pair


def test_a_receive_reads_its_retry_index_up_to_the_first_retry_not_due() -> None:
    """A queue's retries waiting for their backoff (nacked with a delay) are not due yet: a receive
    stops at the first, as the scan did before the cache knew the empty indexes (it read up to
    ``max`` of them, up to 4,096, on every replica at every receive)."""
    store = CountedRetryPairs()
    machine = QueueGroupMachine(store, 1)
    log = [commands.subscribe("g", 1, "t", None, 2**32 - 1, [0], now_ms=T0), append(T0, (1, 0, None, 0, 50))]
    log += [commands.receive(T0 + 1, "g", 1, [0], 50, 30_000)]
    log += [commands.nack(T0 + 2, "g", 1, [(0, i, 3) for i in range(50)], delay_ms=3_600_000)]
    for index, command in enumerate(log, start=1):
        result = machine.apply(index, command)
        assert "error" not in result and all("error" not in r for r in result.get("results", [])), result
    store.retry_pairs = 0
    got = machine.apply(5, commands.receive(T0 + 3, "g", 1, [0], 100, 30_000))
    assert got["messages"] == []
    assert store.retry_pairs == 1


def test_a_receiver_s_cycle_reads_its_cursor_floor_and_lock_from_the_cache() -> None:
    """A receive reads its subscription queue's cursor, floor and lock, a settlement the first
    two (issue 24: every replica, every SQS call): kept as written, so after the first receive
    none is read from the store again (before: each at every entry)."""
    store = CountedGets()
    machine = QueueGroupMachine(store, 1)
    log = [commands.subscribe("g", 1, "t", None, 2**32 - 1, [0], now_ms=T0)]
    for cycle in range(5):
        now_ms = T0 + 10 * cycle
        log.append(append(now_ms, (1, 0, None, 0, 3)))
        log.append(commands.receive(now_ms + 1, "g", 1, [0], 3, 30_000))
        token = len(log)  # the receive's index
        log.append(commands.ack(now_ms + 2, "g", 1, [(0, 3 * cycle + i, token) for i in range(3)]))
    for index, command in enumerate(log, start=1):
        result = machine.apply(index, command)
        assert "error" not in result and all("error" not in r for r in result.get("results", [])), result
    cursor, floor = keys.sub_key(keys.SUB_CURSOR, 1, 0, "g"), keys.offset_key(1, 0, "g")
    assert keys.decode_u64(MemoryStore.get(store, cursor) or b"") == 15
    assert keys.decode_u64(MemoryStore.get(store, floor) or b"") == 15
    assert [store.gets.get(k, 0) for k in (cursor, floor, keys.lock_key(1, 0, "g"))] == [1, 1, 1]
