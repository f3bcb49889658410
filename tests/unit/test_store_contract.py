"""The Store contract, run against MemoryStore and RocksStore alike.

Every behaviour the state machines and the Raft journal rely on is stated once here; a difference
between the test double and RocksDB is a failure of one of them. The hypothesis test at the end
applies random op sequences to both stores and compares them.
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.storage.memory import MemoryStore
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    Batch,
    Store,
    StoreClosed,
    StoreError,
)

OpenCheckpoint = Callable[[str], Store]


def _be(n: int) -> bytes:
    return struct.pack(">Q", n)


def _put(store: Store, *pairs: tuple[bytes, bytes], sync: bool = False) -> None:
    batch = Batch()
    for key, value in pairs:
        batch.put(key, value)
    store.write(batch, sync=sync)


def _all(store: Store) -> list[tuple[bytes, bytes]]:
    return list(store.scan(b""))


def _keys(pairs: Iterator[tuple[bytes, bytes]]) -> list[bytes]:
    return [key for key, _ in pairs]


@pytest.fixture(params=["memory", "rocks"])
def kind(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture
def open_checkpoint(kind: str) -> Iterator[OpenCheckpoint]:
    opened: list[Store] = []

    def _open(path: str) -> Store:
        store: Store = MemoryStore.load(path) if kind == "memory" else RocksStore.open(path)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(kind: str, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if kind == "memory" else RocksStore.open(os.path.join(tmp_path, "db"))
    yield s
    s.close()


@pytest.fixture
def abc_store(store: Store) -> Store:
    _put(store, (b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", b"5"))
    return store


def test_implements_the_store_protocol(store: Store) -> None:
    assert isinstance(store, Store)


# -- single keys -------------------------------------------------------------------------------


def test_get_returns_none_for_a_missing_key(store: Store) -> None:
    assert store.get(b"nope") is None


def test_put_then_get_and_overwrite(store: Store) -> None:
    _put(store, (b"k", b"v1"))
    assert store.get(b"k") == b"v1"
    _put(store, (b"k", b"v2"))
    assert store.get(b"k") == b"v2"
    assert _all(store) == [(b"k", b"v2")]


def test_get_many_answers_each_key_in_order_none_where_missing(store: Store) -> None:
    _put(store, (b"a", b"1"), (b"c", b""), (b"\x00\xff", b"3"))
    wanted = [b"c", b"nope", b"a", b"\x00\xff", b"a", b""]
    assert store.get_many(wanted) == [b"", None, b"1", b"3", b"1", None]
    assert store.get_many([]) == []


def test_empty_value_is_stored_and_differs_from_missing(store: Store) -> None:
    _put(store, (b"k", b""))
    assert store.get(b"k") == b""
    assert _all(store) == [(b"k", b"")]


def test_empty_key_is_a_key(store: Store) -> None:
    _put(store, (b"", b"empty"), (b"\x00", b"zero"))
    assert store.get(b"") == b"empty"
    assert _all(store) == [(b"", b"empty"), (b"\x00", b"zero")]


def test_delete_removes_a_key_and_ignores_a_missing_one(store: Store) -> None:
    _put(store, (b"k", b"v"), (b"other", b"w"))
    batch = Batch()
    batch.delete(b"k")
    batch.delete(b"never-there")
    store.write(batch)
    assert store.get(b"k") is None
    assert _all(store) == [(b"other", b"w")]


# -- delete_range ------------------------------------------------------------------------------


def test_delete_range_includes_start_and_excludes_end(abc_store: Store) -> None:
    batch = Batch()
    batch.delete_range(b"b", b"d")
    abc_store.write(batch)
    assert _keys(abc_store.scan(b"")) == [b"a", b"d", b"e"]


def test_delete_range_bounds_need_not_be_keys(abc_store: Store) -> None:
    batch = Batch()
    batch.delete_range(b"a\x00", b"cc")
    abc_store.write(batch)
    assert _keys(abc_store.scan(b"")) == [b"a", b"d", b"e"]


@pytest.mark.parametrize(("start", "end"), [(b"c", b"c"), (b"d", b"b")])
def test_empty_or_reversed_delete_range_deletes_nothing_and_the_batch_still_applies(
    abc_store: Store, start: bytes, end: bytes
) -> None:
    batch = Batch()
    batch.put(b"f", b"6")
    batch.delete_range(start, end)
    batch.put(b"g", b"7")
    abc_store.write(batch)
    _put(abc_store, (b"h", b"8"))  # and the store still takes writes
    assert _keys(abc_store.scan(b"")) == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]


# -- scans -------------------------------------------------------------------------------------


def test_scan_returns_big_endian_integer_keys_in_numeric_order(store: Store) -> None:
    numbers = [0, 1, 255, 256, 65535, 65536, 2**32, 2**63, 2**64 - 1, *range(2, 200)]
    random.Random(7).shuffle(numbers)
    for n in numbers:
        _put(store, (_be(n), str(n).encode()))
    pairs = _all(store)
    assert [struct.unpack(">Q", k)[0] for k, _ in pairs] == sorted(numbers)
    assert all(v == str(struct.unpack(">Q", k)[0]).encode() for k, v in pairs)


def test_scan_end_is_exclusive_and_none_means_unbounded(abc_store: Store) -> None:
    assert _keys(abc_store.scan(b"b", b"d")) == [b"b", b"c"]
    assert _keys(abc_store.scan(b"b")) == [b"b", b"c", b"d", b"e"]
    assert _keys(abc_store.scan(b"bb", b"dd")) == [b"c", b"d"]


def test_scan_with_start_at_or_after_end_is_empty(abc_store: Store) -> None:
    assert list(abc_store.scan(b"c", b"c")) == []
    assert list(abc_store.scan(b"d", b"b")) == []
    assert list(abc_store.scan(b"d", b"b", reverse=True)) == []


def test_reverse_scan_descends_within_the_same_bounds(abc_store: Store) -> None:
    assert _keys(abc_store.scan(b"b", b"d", reverse=True)) == [b"c", b"b"]
    assert _keys(abc_store.scan(b"b", reverse=True)) == [b"e", b"d", b"c", b"b"]
    assert _keys(abc_store.scan(b"", reverse=True)) == [b"e", b"d", b"c", b"b", b"a"]
    assert _keys(abc_store.scan(b"bb", b"dd", reverse=True)) == [b"d", b"c"]
    assert abc_store.scan(b"a", b"b", reverse=True).__next__() == (b"a", b"1")


def test_limit_caps_forward_and_reverse_scans(abc_store: Store) -> None:
    assert _keys(abc_store.scan(b"b", limit=2)) == [b"b", b"c"]
    assert _keys(abc_store.scan(b"b", limit=2, reverse=True)) == [b"e", b"d"]
    assert _keys(abc_store.scan(b"a", b"c", limit=10)) == [b"a", b"b"]
    assert list(abc_store.scan(b"", limit=0)) == []


def test_negative_limit_is_rejected(abc_store: Store) -> None:
    with pytest.raises(ValueError):
        abc_store.scan(b"", limit=-1)


def test_scan_reads_the_snapshot_taken_when_it_was_called(abc_store: Store) -> None:
    pairs = abc_store.scan(b"")
    batch = Batch()
    batch.delete(b"a")
    batch.put(b"b", b"changed")
    batch.put(b"bb", b"new")
    abc_store.write(batch)
    assert list(pairs) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", b"5")]


def test_long_scans_are_complete_and_ordered(store: Store) -> None:
    batch = Batch()
    for n in range(1000):
        batch.put(_be(n), b"v" * (n % 7))
    store.write(batch)
    assert _keys(store.scan(b"")) == [_be(n) for n in range(1000)]
    assert _keys(store.scan(_be(10), _be(900), reverse=True)) == [_be(n) for n in range(899, 9, -1)]


# -- last_before -------------------------------------------------------------------------------


def test_last_before_finds_the_key_itself_or_the_greatest_below(abc_store: Store) -> None:
    assert abc_store.last_before(b"c", b"a") == (b"c", b"3")
    assert abc_store.last_before(b"cz", b"a") == (b"c", b"3")
    assert abc_store.last_before(b"zzz", b"") == (b"e", b"5")


def test_last_before_respects_the_floor(abc_store: Store) -> None:
    assert abc_store.last_before(b"cz", b"c") == (b"c", b"3")  # floor is inclusive
    assert abc_store.last_before(b"cz", b"ca") is None  # c lies below the floor
    assert abc_store.last_before(b"c", b"c") == (b"c", b"3")
    assert abc_store.last_before(b"b", b"c") is None  # floor above key
    assert abc_store.last_before(b"0", b"") is None  # nothing at or below key


def test_last_before_on_an_empty_store_is_none(store: Store) -> None:
    assert store.last_before(b"\xff", b"") is None


# -- batches -----------------------------------------------------------------------------------


def test_batch_ops_apply_in_order(abc_store: Store) -> None:
    batch = Batch()
    batch.put(b"bb", b"gone")  # put inside the range below: deleted by the later op
    batch.delete_range(b"b", b"d")
    batch.put(b"c", b"back")  # put after the delete_range: survives
    abc_store.write(batch)
    assert _all(abc_store) == [(b"a", b"1"), (b"c", b"back"), (b"d", b"4"), (b"e", b"5")]


def test_put_then_delete_of_one_key_in_a_batch_leaves_it_absent(store: Store) -> None:
    batch = Batch()
    batch.put(b"k", b"v")
    batch.delete(b"k")
    store.write(batch)
    assert store.get(b"k") is None


def test_a_batch_with_an_unknown_op_raises_and_writes_nothing(abc_store: Store) -> None:
    batch = Batch()
    batch.put(b"z", b"26")
    batch.delete_range(b"a", b"c")
    batch.ops.append((99, b"x", b"y"))
    with pytest.raises(ValueError):
        abc_store.write(batch)
    assert _keys(abc_store.scan(b"")) == [b"a", b"b", b"c", b"d", b"e"]


@pytest.mark.parametrize("sync", [False, True])
def test_empty_batch_changes_nothing(abc_store: Store, sync: bool) -> None:
    abc_store.write(Batch(), sync=sync)
    assert len(_all(abc_store)) == 5


def test_compact_range_changes_nothing_readable(abc_store: Store) -> None:
    before = _all(abc_store)
    batch = Batch()
    batch.delete_range(b"a", b"b")
    abc_store.write(batch)
    abc_store.compact_range(b"", b"\xff")
    assert _all(abc_store) == [pair for pair in before if not pair[0].startswith(b"a")]


def test_synced_writes_and_sync_succeed(store: Store) -> None:
    _put(store, (b"k", b"v"), sync=True)
    store.sync()
    assert store.get(b"k") == b"v"


# -- binary and large data ---------------------------------------------------------------------


def test_binary_keys_with_zero_and_ff_bytes_sort_as_unsigned_bytes(store: Store) -> None:
    keys = [b"\x00", b"\x00\x00", b"\x00\xff", b"\x01", b"\x7f", b"\x80", b"\xff", b"\xff\x00", b"\xff\xff"]
    shuffled = keys[:]
    random.Random(3).shuffle(shuffled)
    _put(store, *((k, k + b"v") for k in shuffled))
    assert _all(store) == [(k, k + b"v") for k in keys]
    assert _keys(store.scan(b"\x00", b"\xff")) == keys[:6]
    assert _keys(store.scan(b"\x00\x00", b"\xff\x00", reverse=True)) == keys[1:7][::-1]
    assert store.last_before(b"\xfe", b"\x00") == (b"\x80", b"\x80v")
    assert store.get(b"\x00\x00") == b"\x00\x00v"


def test_values_of_one_mebibyte_round_trip(store: Store) -> None:
    rng = random.Random(11)
    values = [rng.randbytes(1 << 20) for _ in range(3)]
    _put(store, *((_be(i), v) for i, v in enumerate(values)), sync=True)
    assert store.get(_be(1)) == values[1]
    assert [v for _, v in store.scan(b"")] == values
    assert [v for _, v in store.scan(b"", reverse=True)] == values[::-1]


# -- checkpoints -------------------------------------------------------------------------------


def test_checkpoint_is_an_equal_and_independent_copy(
    abc_store: Store, open_checkpoint: OpenCheckpoint, tmp_path: Path
) -> None:
    path = os.path.join(tmp_path, "snapshots", "ckpt-1")
    abc_store.checkpoint(path)
    _put(abc_store, (b"after", b"x"))
    copy = open_checkpoint(path)
    assert _all(copy) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", b"5")]
    _put(copy, (b"only-in-copy", b"y"))
    assert abc_store.get(b"only-in-copy") is None
    assert abc_store.get(b"after") == b"x"


def test_checkpoint_into_an_existing_path_fails(abc_store: Store, tmp_path: Path) -> None:
    path = os.path.join(tmp_path, "exists")
    os.makedirs(path)
    with pytest.raises(StoreError):
        abc_store.checkpoint(path)


# -- closing -----------------------------------------------------------------------------------


def test_a_closed_store_raises_store_closed_everywhere(abc_store: Store, tmp_path: Path) -> None:
    abc_store.close()
    abc_store.close()  # closing twice is harmless
    calls: list[Callable[[], object]] = [
        lambda: abc_store.get(b"a"),
        lambda: abc_store.get_many([b"a", b"b"]),
        lambda: list(abc_store.scan(b"")),
        lambda: list(abc_store.scan(b"", reverse=True, limit=1)),
        lambda: abc_store.last_before(b"z", b""),
        lambda: abc_store.write(Batch()),
        lambda: _put(abc_store, (b"k", b"v")),
        abc_store.sync,
        lambda: abc_store.checkpoint(os.path.join(tmp_path, "c")),
    ]
    for call in calls:
        with pytest.raises(StoreClosed):
            call()


# -- differential: MemoryStore and RocksStore agree on random histories -------------------------

_KEYS = st.one_of(
    st.sampled_from([b"", b"\x00", b"\x00\x00", b"\x01", b"a", b"ab", b"b", b"\xfe", b"\xff", b"\xff\xff"]),
    st.binary(max_size=3),
)
_OPS = st.one_of(
    st.tuples(st.just(OP_PUT), _KEYS, st.binary(max_size=16)),
    st.tuples(st.just(OP_DELETE), _KEYS, st.just(b"")),
    st.tuples(st.just(OP_DELETE_RANGE), _KEYS, _KEYS),
)
_SCANS = st.tuples(_KEYS, st.none() | _KEYS, st.booleans(), st.none() | st.integers(0, 5))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(_OPS, max_size=8), max_size=8),
    scans=st.lists(_SCANS, max_size=6),
    probes=st.lists(st.tuples(_KEYS, _KEYS), max_size=6),
)
def test_memory_and_rocks_stores_agree_on_random_histories(
    batches: list[list[tuple[int, bytes, bytes]]],
    scans: list[tuple[bytes, bytes | None, bool, int | None]],
    probes: list[tuple[bytes, bytes]],
) -> None:
    memory = MemoryStore()
    with tempfile.TemporaryDirectory() as tmp:
        rocks = RocksStore.open(os.path.join(tmp, "db"))
        try:
            for ops in batches:
                batch = Batch(list(ops))
                memory.write(batch)
                rocks.write(batch)
                assert _all(rocks) == _all(memory)
            for start, end, reverse, limit in scans:
                expected = list(memory.scan(start, end, reverse=reverse, limit=limit))
                assert list(rocks.scan(start, end, reverse=reverse, limit=limit)) == expected
            for key, floor in probes:
                assert rocks.last_before(key, floor) == memory.last_before(key, floor)
                assert rocks.get(key) == memory.get(key)
        finally:
            rocks.close()
