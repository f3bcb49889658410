"""A large JSON fetch in bounded steps: read a record batch at a time (``queues.message_steps``,
the same messages as one ``read_messages``), encoded in slices (``fetch_json.encode_fetch``) byte
for byte what encoding it whole gives, with the event loop given a turn between slices."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.api.common import message_item
from raftmq.cluster.api.handlers.fetch_json import ENCODE_SLICE_BYTES, encode_fetch
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.storage.queues import OffsetOutOfRange, message_steps, queue_bounds, read_messages
from raftmq.storage.records import Message
from raftmq.storage.store import Store

NOW_MS = 1_000_000


def message(offset: int, value: bytes, **fields: Any) -> Message:
    return Message(
        offset=offset,
        key=fields.get("key"),
        value=value,
        binary=fields.get("binary", False),
        headers=fields.get("headers"),
        timestamp_ms=fields.get("timestamp_ms", NOW_MS - 10),
        raft_index=7,
        expires_at_ms=fields.get("expires_at_ms"),
    )


def whole(messages: list[Message], max_age_ms: int | None, tail: dict[str, Any]) -> bytes:
    kept = [message_item({}, m) for m in messages if not m.expired(NOW_MS, max_age_ms)]
    return orjson.dumps({"messages": kept, **tail}, option=orjson.OPT_APPEND_NEWLINE)


MIXED = [
    message(0, b"plain"),
    message(1, 'ünïcödé " \\ \n'.encode(), key="k", headers={"a": "b", "é": "\u2028"}),
    message(2, bytes(range(256)), binary=True),
    message(3, b"expired by its ttl", expires_at_ms=NOW_MS),
    message(4, b"older than retention", timestamp_ms=NOW_MS - 5_000),
    message(5, b"x" * (ENCODE_SLICE_BYTES - 3)),  # ends a slice
    message(6, b"y" * (3 * ENCODE_SLICE_BYTES)),  # one message larger than a slice
    message(7, b"\x00\xff" * 1000, binary=True, key=""),
    message(8, b""),
]
TAIL = {"next_offset": 9, "low_offset": 0, "high_offset": 12}


@pytest.mark.parametrize(
    ("messages", "max_age_ms"),
    [([], None), (MIXED[:3], None), (MIXED, None), (MIXED, 1_000), ([MIXED[3]], None)],
    ids=["none", "small", "mixed", "mixed_with_retention", "all_expired"],
)
def test_the_sliced_answer_is_the_whole_encoding(messages: list[Message], max_age_ms: int | None) -> None:
    got = b"".join(asyncio.run(encode_fetch(messages, NOW_MS, max_age_ms, TAIL)))
    assert got == whole(messages, max_age_ms, TAIL)
    assert orjson.loads(got)["next_offset"] == 9


def test_many_small_messages_over_many_slices() -> None:
    messages = [message(i, b"v" * (i % 5000), key=str(i) if i % 3 else None) for i in range(2000)]
    assert b"".join(asyncio.run(encode_fetch(messages, NOW_MS, None, TAIL))) == whole(messages, None, TAIL)


def test_other_tasks_run_between_slices_of_a_large_answer() -> None:
    slices = 16
    messages = [message(i, b"z" * ENCODE_SLICE_BYTES) for i in range(slices)]
    turns: list[int] = []

    async def run() -> bytes:
        done = False

        async def other() -> None:
            while not done:
                turns.append(1)
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)  # the other task starts
        turns.clear()
        body = b"".join(await encode_fetch(messages, NOW_MS, None, TAIL))
        done = True
        await task
        return body

    body = asyncio.run(run())
    assert body == whole(messages, None, TAIL)
    # One turn of the other task per slice (a whole encoding would give it none).
    assert len(turns) >= slices - 1


# -- reading a fetch a record batch at a time ---------------------------------------------------


def test_message_steps_concatenated_are_read_messages(store: Store) -> None:
    machine = QueueGroupMachine(store, 1)
    sizes = [1, 3, 0, 700, 5000, 12, 90_000, 7]
    for index in range(1, 31):
        messages = [{"value": "x" * sizes[(index + j) % len(sizes)]} for j in range(index % 5 + 1)]
        machine.apply(index, commands.produce(1000, [{"topic_id": 1, "queue": 0, "messages": messages}]))
    high = queue_bounds(store, 1, 0)[1]
    for offset in (0, 1, 2, 17, high - 1, high):
        for max_messages in (0, 1, 2, 9, 10_000):
            for max_bytes in (None, 0, 1, 700, 6000, 100_000, 10**9):
                steps = list(message_steps(store, 1, 0, offset, max_messages, max_bytes))
                one = read_messages(store, 1, 0, offset, max_messages, max_bytes)
                assert [m for step in steps for m in step] == one, (offset, max_messages, max_bytes)
                assert all(steps), "no empty step"
    with pytest.raises(OffsetOutOfRange):
        next(message_steps(store, 1, 0, high + 1, 10, None))
