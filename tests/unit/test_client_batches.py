"""The consumer's binary fetch answer, without sockets: parsing the frames, skipping the records
below the offset asked for, making messages only as they are taken (and only those), their
fields as the JSON path makes them, TTL and retention expiry by the JSON fetch's rule, and the
consumer core's buffer of lazily decoded batches (taking, revoking)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from aiohttp import web
from fake_node import run as run_test
from fake_node import serve

from raftmq import batch as rb
from raftmq.client._batches import Batches, BatchRun, ack_expired, batch_runs, expired_offsets, parse_batches
from raftmq.client._consumer_config import ConsumerConfig
from raftmq.client._consumer_core import ConsumerCore
from raftmq.client._fetcher import Fetcher, QueueRun
from raftmq.client._metadata import ClusterMetadata
from raftmq.client._retry import Backoff
from raftmq.client._transport import Transport
from raftmq.client._types import Message
from raftmq.client._window import OffsetWindow
from raftmq.client.errors import UnexpectedResponse

APPEND_MS = 1_700_000_000_000


def stamped(values: list[str], base: int, append_ms: int = APPEND_MS, **kw: Any) -> bytes:
    b = rb.BatchBuilder()
    for v in values:
        b.append(v, **kw)
    return rb.stamp(b.finish(), base, append_ms, 7)


def parsed(
    batches: list[bytes], next_offset: int, now_ms: int = APPEND_MS + 10, max_age: int | None = None
) -> Batches:
    headers = {
        "X-Raftmq-Next-Offset": str(next_offset),
        "X-Raftmq-Low-Offset": "0",
        "X-Raftmq-High-Offset": str(next_offset + 5),
        "X-Raftmq-Now-Ms": str(now_ms),
    }
    if max_age is not None:
        headers["X-Raftmq-Max-Age-Ms"] = str(max_age)
    return parse_batches(rb.join_frames([(3, None, b) for b in batches]), headers)


def test_an_answer_parses_into_checked_views_and_its_positions() -> None:
    got = parsed([stamped(["a", "b"], 10), stamped(["c"], 12)], 13, max_age=60_000)
    assert [(v.base_offset, v.count) for v in got.views] == [(10, 2), (12, 1)]
    assert (got.next_offset, got.low_offset, got.high_offset, got.max_age_ms) == (13, 0, 18, 60_000)
    empty = parse_batches(
        b"", {"X-Raftmq-Next-Offset": "4", "X-Raftmq-High-Offset": "4", "X-Raftmq-Now-Ms": "1"}
    )
    assert empty.views == [] and empty.next_offset == 4 and empty.max_age_ms is None


def test_a_damaged_answer_or_a_missing_position_is_an_unexpected_response() -> None:
    body = bytearray(rb.join_frames([(0, None, stamped(["abc"], 0))]))
    body[-1] ^= 0xFF  # a value byte: the batch CRC no longer matches
    headers = {"X-Raftmq-Next-Offset": "1", "X-Raftmq-High-Offset": "1", "X-Raftmq-Now-Ms": "1"}
    with pytest.raises(UnexpectedResponse, match="damaged"):
        parse_batches(bytes(body), headers)
    with pytest.raises(UnexpectedResponse, match="X-Raftmq-Now-Ms"):
        parse_batches(b"", {"X-Raftmq-Next-Offset": "1", "X-Raftmq-High-Offset": "1"})


def test_records_below_the_offset_asked_for_are_skipped_and_the_window_covers_the_rest() -> None:
    window = OffsetWindow(15)
    got = parsed([stamped([f"m{i}" for i in range(10, 20)], 10), stamped(["m20", "m21"], 20)], 22)
    runs, first, end = batch_runs("t", 3, got, 15, window)
    assert (first, end) == (15, 22)
    assert [(r.offset, r.end) for r in runs] == [(15, 20), (20, 22)]
    window.add(first, end - first)
    messages = runs[0].take(100) + runs[1].take(100)
    assert [(m.offset, m.value) for m in messages] == [(i, f"m{i}") for i in range(15, 22)]
    # An answer wholly below the window (behind one that went further) gives nothing.
    assert batch_runs("t", 3, got, 22, window) == ([], 22, 22)


def test_messages_are_made_only_as_they_are_taken() -> None:
    view = parsed([stamped([f"v{i}" for i in range(10_000)], 0)], 10_000).views[0]
    run = BatchRun("t", 1, view, 0, None)
    first = run.take(3)
    assert [m.value for m in first] == ["v0", "v1", "v2"]
    assert len(run) == 9_997 and run.offset == 3  # nothing else was made
    assert [m.offset for m in run.take(2)] == [3, 4]
    rest = run.take(1 << 30)
    assert len(rest) == 9_995 and rest[-1].offset == 9_999 and len(run) == 0
    assert run.take(5) == []


def test_messages_carry_what_the_json_path_gives() -> None:
    b = rb.BatchBuilder()
    b.append("plain ascii")
    b.append("é ✓ text")
    b.append(b"\x00\xff bytes")
    b.append("keyed", key="k-1")
    b.append("with headers", key="", headers={"trace": "a1", "ü": "\n"})
    batch = rb.stamp(b.finish(), 40, APPEND_MS, 9)
    wire = [
        {"offset": 40, "value": "plain ascii", "key": None, "timestamp_ms": APPEND_MS, "headers": {}},
        {"offset": 41, "value": "é ✓ text", "key": None, "timestamp_ms": APPEND_MS},
        {"offset": 42, "value_b64": base64.b64encode(b"\x00\xff bytes").decode(), "timestamp_ms": APPEND_MS},
        {"offset": 43, "value": "keyed", "key": "k-1", "timestamp_ms": APPEND_MS},
        {
            "offset": 44,
            "value": "with headers",
            "key": "",
            "headers": {"trace": "a1", "ü": "\n"},
            "timestamp_ms": APPEND_MS,
        },
    ]
    want = [Message.from_wire("t", 2, m, None) for m in wire]
    for cut in (0, 1, 2, 3, 4):  # plain text slices and mixed ones alike
        run = BatchRun("t", 2, parsed([batch], 45).views[0], 40 + cut, None)
        got = run.take(100)
        assert [
            (m.topic, m.queue, m.offset, m.value, m.key, dict(m.headers), m.timestamp_ms) for m in got
        ] == [
            (m.topic, m.queue, m.offset, m.value, m.key, dict(m.headers), m.timestamp_ms) for m in want[cut:]
        ]
        assert all(type(m.value) is type(w.value) for m, w in zip(got, want[cut:], strict=True))
    only_text = BatchRun("t", 2, parsed([stamped(["é", "a", "ü✓"], 0)], 3).views[0], 0, None)
    assert [m.value for m in only_text.take(3)] == ["é", "a", "ü✓"]  # non-ASCII plain text


def test_expired_records_are_left_out_and_count_as_finished() -> None:
    b = rb.BatchBuilder()
    b.append("ttl gone", ttl_ms=5)
    b.append("kept")
    b.append("delayed, ttl not yet", delay_ms=100, ttl_ms=5)  # due at append + 100
    b.append("ttl gone 2", ttl_ms=50)
    b.append("ttl later", ttl_ms=1_000)
    batch = rb.stamp(b.finish(), 0, APPEND_MS, 3)
    got = parsed([batch], 5, now_ms=APPEND_MS + 60)
    assert expired_offsets(got.views[0], got.now_ms, None) == [0, 3]
    window = OffsetWindow(0)
    runs, first, end = batch_runs("t", 0, got, 0, window)
    window.add(first, end - first)
    ack_expired(runs, window)
    messages = runs[0].take(100)
    assert [m.value for m in messages] == ["kept", "delayed, ttl not yet", "ttl later"]
    for m in messages:
        window.ack(m.offset)
    assert window.low_edge == 5  # the expired offsets do not hold the commit back
    # Older than the topic's retention: the whole batch is expired (one append time per batch).
    assert expired_offsets(got.views[0], APPEND_MS + 60, 60) == range(0, 5)
    assert expired_offsets(got.views[0], APPEND_MS + 60, 61) == [0, 3]
    assert expired_offsets(parsed([stamped(["x"], 0)], 1).views[0], APPEND_MS + 10**9, None) == []


def test_the_core_buffer_takes_across_lazy_batches_and_a_revoke_drops_what_was_not_handed_out() -> None:
    async def main() -> None:
        core = ConsumerCore("127.0.0.1:1", ConsumerConfig(group="g", topics=("t",)))
        run = QueueRun("t", 0, 0, None, core.loop)
        run.task = asyncio.ensure_future(asyncio.sleep(3600))
        core.runs[("t", 0)] = run
        got = parsed([stamped([f"a{i}" for i in range(5)], 0), stamped([f"b{i}" for i in range(5)], 5)], 10)
        runs, first, end = batch_runs("t", 0, got, 0, run.window)
        run.window.add(first, end - first)
        core._deliver(runs)
        taken = core.take(7)
        assert [m.value for m in taken] == ["a0", "a1", "a2", "a3", "a4", "b0", "b1"]
        assert len(core.buffer) == 1 and core.buffer[0].offset == 7
        assert [m.value for m in await core.get_many(2, 0)] == ["b2", "b3"]
        for m in taken:
            m.ack()
        revoked = core._revoke([("t", 0)])
        assert revoked[0].stop_offset == 9 and not core.buffer  # b4 was never handed out
        await core.transport.close()

    asyncio.run(main())


JSON_ANSWER = {"messages": [{"offset": 0, "value": "j"}], "next_offset": 1, "low_offset": 0, "high_offset": 1}


def fetcher_for(address: str, wire: str = "binary") -> tuple[Fetcher, QueueRun, Transport]:
    config = ConsumerConfig(group="g", topics=("t",), wire=wire)  # type: ignore[arg-type]
    transport = Transport([address], request_timeout_ms=5_000)
    fetcher = Fetcher(
        config,
        transport,
        ClusterMetadata(),
        Backoff(),
        deliver=lambda _: None,
        fail=lambda _: None,
        refresh=lambda _: None,
    )
    return fetcher, QueueRun("t", 0, 0, None, asyncio.get_running_loop()), transport


def test_a_node_refusing_the_binary_answer_turns_the_consumer_to_json() -> None:
    accepts: list[str] = []

    async def old_node(request: web.Request) -> web.Response:
        accepts.append(request.headers.get("Accept", ""))
        if rb.BATCH_MEDIA_TYPE in request.headers.get("Accept", ""):
            return web.json_response({"error": {"code": "x", "message": "no"}}, status=415)
        return web.json_response(JSON_ANSWER)

    async def main() -> None:
        async with serve(web.get("/v1/topics/t/queues/0/messages", old_node)) as address:
            fetcher, run, transport = fetcher_for(address)
            assert await fetcher._fetch(run, 0, 0) == JSON_ANSWER
            assert not fetcher.binary  # and from now on it asks for JSON only
            assert await fetcher._fetch(run, 0, 0) == JSON_ANSWER
            await transport.close()
        assert [rb.BATCH_MEDIA_TYPE in a for a in accepts] == [True, False, False]

    run_test(main())


def test_a_node_answering_json_anyway_is_read_as_json_and_batches_as_batches() -> None:
    body = rb.join_frames([(0, None, stamped(["a", "b"], 0))])

    async def ignores_accept(request: web.Request) -> web.Response:
        return web.json_response(JSON_ANSWER)

    async def current(request: web.Request) -> web.Response:
        assert request.headers["Accept"] == rb.BATCH_MEDIA_TYPE
        assert request.query["offset"] == "0" and request.query["max"] == "32"
        headers = {"X-Raftmq-Next-Offset": "2", "X-Raftmq-High-Offset": "2", "X-Raftmq-Now-Ms": "5"}
        return web.Response(body=body, content_type=rb.BATCH_MEDIA_TYPE, headers=headers)

    async def main() -> None:
        async with serve(web.get("/v1/topics/t/queues/0/messages", ignores_accept)) as address:
            fetcher, run, transport = fetcher_for(address)
            assert await fetcher._fetch(run, 0, 0) == JSON_ANSWER
            await transport.close()
        async with serve(web.get("/v1/topics/t/queues/0/messages", current)) as address:
            fetcher, run, transport = fetcher_for(address)
            got = await fetcher._fetch(run, 0, 0)
            assert isinstance(got, Batches) and [v.count for v in got.views] == [2] and got.next_offset == 2
            assert fetcher.binary
            json_only, run, transport2 = fetcher_for(address, wire="json")
            assert not json_only.binary
            await transport.close()
            await transport2.close()

    run_test(main())
