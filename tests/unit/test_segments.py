"""The pure part of segment sealing: the ``seal_segment`` command, its apply, prune, and the manifest."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.cluster import commands
from raftmq.cluster.commands.segments import seal_segment
from raftmq.cluster.machines import segments
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore


class Harness:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 1)
        self.index = 0

    def apply(self, command: bytes) -> dict[str, Any]:
        self.index += 1
        return self.machine.apply(self.index, command)

    def produce(self, topic_id: int, queue: int, n: int, now_ms: int = 1000) -> None:
        msgs = [{"value": f"m{i}"} for i in range(n)]
        r = self.apply(commands.produce(now_ms, [{"topic_id": topic_id, "queue": queue, "messages": msgs}]))
        assert "error" not in r["results"][0], r

    def seal(self, *segs: dict[str, Any], prune: list[tuple[int, int]] | None = None) -> dict[str, Any]:
        return self.apply(seal_segment(5000, list(segs), prune or []))

    def pairs(self) -> list[tuple[bytes, bytes]]:
        return list(self.store.scan(b""))


def seg(topic_id: int, queue: int, base: int, end: int, **over: Any) -> dict[str, Any]:
    entry = {
        "topic_id": topic_id,
        "queue": queue,
        "base": base,
        "end": end,
        "rows": end - base,
        "bytes": 10 * (end - base),
        "crc32c": 7,
        "parquet_crc32c": 8,
        "arrow": f"arrow/t.{topic_id}/{queue:05d}-{base:020d}-{end:020d}.n1.arrow",
        "parquet": f"parquet/t.{topic_id}/{queue:05d}-{base:020d}-{end:020d}.n1.parquet",
        "node": "n1",
        "first_ts_ms": 1000,
        "last_ts_ms": 1000,
    }
    entry.update(over)
    return entry


def spans(h: Harness, topic_id: int, queue: int) -> list[tuple[int, int]]:
    return [(s["base"], s["end"]) for s in segments.list_segments(h.store, topic_id, queue)]


def test_segments_must_tile_the_committed_range_in_order() -> None:
    h = Harness()
    h.produce(1, 0, 30)
    r = h.seal(seg(1, 0, 0, 10), seg(1, 0, 10, 25))
    assert [(s["base"], s["end"]) for s in r["sealed"]] == [(0, 10), (10, 25)] and not r["rejected"]
    bad = [
        seg(1, 0, 20, 30),  # overlaps
        seg(1, 0, 26, 30),  # gap
        seg(1, 0, 25, 31),  # beyond high_offset
        seg(1, 0, 25, 25),  # empty
        seg(1, 0, 25, 30, rows=4),  # wrong row count
        seg(2, 0, 0, 1),  # nothing produced to it
    ]
    for s in bad:
        r = h.seal(s)
        assert not r["sealed"] and len(r["rejected"]) == 1, (s, r)
    assert spans(h, 1, 0) == [(0, 10), (10, 25)]
    entry = segments.list_segments(h.store, 1, 0)[0]
    assert entry["arrow"].endswith(".arrow") and entry["index"] == 2 and entry["node"] == "n1"
    assert segments.manifest(h.store, 1, [0]) == {
        0: {"low_offset": 0, "high_offset": 30, "segments": segments.list_segments(h.store, 1, 0)}
    }


def test_retention_hides_then_prune_removes_segments_below_low_offset_and_sealing_continues_at_low() -> None:
    h = Harness()
    for t in (1000, 2000, 3000, 9000):
        h.produce(1, 0, 10, now_ms=t)  # batches [0,10) [10,20) [20,30) [30,40)
    h.seal(seg(1, 0, 0, 10), seg(1, 0, 10, 20))
    h.apply(commands.retain(10_000, [{"topic_id": 1, "queue": 0, "max_age_ms": 6500, "max_bytes": None}]))
    low = segments.manifest(h.store, 1, [0])[0]["low_offset"]
    assert low == 30  # the batches older than 3500 went
    assert segments.manifest(h.store, 1, [0])[0]["segments"] == []  # hidden in the same apply
    assert spans(h, 1, 0) == [(0, 10), (10, 20)]  # still recorded until pruned
    r = h.seal(seg(1, 0, 20, 40))  # must start at low_offset now
    assert r["rejected"] and not r["sealed"]
    assert [(p["base"], p["end"]) for p in r["pruned"]] == [(0, 10), (10, 20)]
    assert spans(h, 1, 0) == []
    r = h.seal(seg(1, 0, 30, 40))
    assert r["sealed"] and spans(h, 1, 0) == [(30, 40)]


def test_prune_removes_every_segment_of_a_dropped_topic_and_nothing_seals_there() -> None:
    h = Harness()
    h.produce(3, 0, 5)
    h.produce(3, 1, 5)
    h.seal(seg(3, 0, 0, 5), seg(3, 1, 0, 5))
    h.apply(commands.drop_topic(3))
    r = h.seal(seg(3, 0, 5, 6))
    assert r["rejected"][0]["reason"] == "topic 3 was dropped"
    assert {(p["queue"], p["base"]) for p in r["pruned"]} == {(0, 0), (1, 0)}
    assert not [k for k, _ in h.pairs() if k.startswith(segments.SEGMENT)]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.update(extra=1),
        lambda c: c["segments"][0].update(arrow="../escape.arrow"),
        lambda c: c["segments"][0].update(arrow="/abs/path.arrow"),
        lambda c: c["segments"][0].update(base=True),
        lambda c: c["segments"][0].update(node="bad node"),
        lambda c: c["segments"][0].update(crc32c=2**32),
        lambda c: c["segments"][0].pop("rows"),
        lambda c: c["prune"].append({"topic_id": 1}),
        lambda c: c.update(segments={}),
    ],
)
def test_malformed_seal_commands_are_errors_that_change_nothing(mutate: Any) -> None:
    h = Harness()
    h.produce(1, 0, 10)
    before = [(k, v) for k, v in h.pairs() if k != keys.APPLIED]
    command = orjson.loads(seal_segment(1, [seg(1, 0, 0, 10)], []))
    mutate(command)
    r = h.apply(orjson.dumps(command))
    assert r["error"]["code"] == "bad_request", r
    assert [(k, v) for k, v in h.pairs() if k != keys.APPLIED] == before


def test_seal_segment_keeps_its_op_position_and_decodes_to_the_same_command() -> None:
    assert commands.OPS.index("seal_segment") == 15  # ops are only ever added after it
    raw = seal_segment(5, [seg(1, 0, 0, 10)], [(1, 0)])
    cmd = commands.decode(raw)
    assert cmd["op"] == "seal_segment"
    assert orjson.loads(raw) == {**cmd, "v": 1}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("produce"), st.integers(0, 1), st.integers(1, 20)),
            st.tuples(st.just("seal"), st.integers(0, 1), st.integers(1, 25)),
            st.tuples(st.just("retain"), st.integers(0, 1), st.integers(0, 400)),
        ),
        max_size=30,
    )
)
def test_replicas_agree_and_segments_always_tile_without_gaps(ops: list[tuple[str, int, int]]) -> None:
    replicas = [Harness(), Harness()]
    for op, queue, n in ops:
        meta = keys.QueueMeta()
        for h in replicas:
            meta = segments.queues.queue_meta(h.store, 1, queue) or keys.QueueMeta()
            if op == "produce":
                h.produce(1, queue, n)
            elif op == "seal":
                base = segments.next_base(h.store, 1, queue, meta)
                end = min(meta.high_offset, base + n)
                h.seal(seg(1, queue, base, max(end, base + 1)))
            else:
                h.apply(
                    commands.retain(
                        10**9, [{"topic_id": 1, "queue": queue, "max_age_ms": None, "max_bytes": n}]
                    )
                )
        assert replicas[0].pairs() == replicas[1].pairs()
    for queue in (0, 1):
        m = segments.manifest(replicas[0].store, 1, [queue])[queue]
        listed = [(s["base"], s["end"]) for s in m["segments"]]
        for (_, e1), (b2, _) in itertools.pairwise(listed):
            assert e1 == b2
        assert all(e <= m["high_offset"] and e > m["low_offset"] for _, e in listed)
