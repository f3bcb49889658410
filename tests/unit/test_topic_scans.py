"""A topic's queue bounds and a group's committed offsets read with one prefix scan each
(``storage/queues.topic_bounds``, ``committed_offsets``; the internal ``bounds`` and ``offsets``
routes a describe or a multi-group commit asks of a queue group's leader) are what a lookup per
queue gives, on a real RocksDB: other topics, other groups and groups whose names extend the
wanted one are left out."""

from __future__ import annotations

from pathlib import Path

from raftmq.storage.keys import QueueMeta, encode_u64, meta_key, offset_key
from raftmq.storage.queues import committed_offset, committed_offsets, queue_bounds, queue_meta, topic_bounds
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch


def test_one_scan_gives_what_a_lookup_per_queue_gives(tmp_path: Path) -> None:
    store = RocksStore.open(str(tmp_path / "state"))
    try:
        writes = Batch()
        for topic in (6, 7, 8):
            for q in (0, 1, 5, 4095, 4096, 70_000):
                if topic == 7 and q == 5:
                    continue  # a queue nothing was produced to has no meta
                writes.put(meta_key(topic, q), QueueMeta(q, 10 * q + topic).encode())
            for group, q, offset in (("g", 0, 3), ("g", 4096, 9), ("g2", 1, 4), ("", 5, 1), ("g", 9, 2)):
                writes.put(offset_key(topic, q, group), encode_u64(offset + topic))
        store.write(writes)
        for topic in (6, 7, 8):
            probed = {
                q: queue_bounds(store, topic, q)
                for q in range(70_001)
                if queue_meta(store, topic, q) is not None
            }
            assert topic_bounds(store, topic) == probed
            for group in ("g", "g2", "", "h"):
                by_lookup = {
                    q: o for q in range(70_001) if (o := committed_offset(store, group, topic, q)) is not None
                }
                assert committed_offsets(store, group, topic) == by_lookup, (topic, group)
        assert topic_bounds(store, 9) == {} and committed_offsets(store, "g", 9) == {}
    finally:
        store.close()
