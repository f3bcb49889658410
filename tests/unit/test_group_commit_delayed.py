"""Group commit and delayed messages (cluster/replication/group_commit.py): requests proposed in
one entry must not make two delayed messages share a key in the queue group's machine.

The JSON produce command keys a delayed message by its position in its own batch (a replica of
every version applies it so), so a JSON request holding a delayed message is proposed alone;
binary requests merge, and the append keys by the position in the whole command. The entries are
applied by the real state machine on a MemoryStore, in order, as a Raft group would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.replication.contract import Outcome
from raftmq.cluster.replication.group_commit import GroupCommitter
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.records import decode_batch


class AppliedInOrder:
    """Stands in for a RaftGroup: each submitted entry is applied by a real machine, once the
    test lets the entries go (``release``), so concurrent requests can pile up first."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.machine = QueueGroupMachine(self.store, 1)
        self.entries: list[bytes] = []
        self.waiting: list[tuple[bytes, Callable[[Outcome], None]]] = []

    def submit(self, command: bytes, on_done: Callable[[Outcome], None]) -> None:
        self.waiting.append((command, on_done))

    def release(self) -> None:
        waiting, self.waiting = self.waiting, []
        for command, on_done in waiting:
            self.entries.append(command)
            on_done(Outcome(result=self.machine.apply(len(self.entries), command)))

    def delayed_values(self) -> list[bytes]:
        held = [v for k, v in self.store.scan(keys.DELAYED) if k.startswith(keys.DELAYED)]
        return sorted(decode_batch(v).messages[0].value for v in held)


async def run(requests: list[tuple[str, Any]]) -> AppliedInOrder:
    group = AppliedInOrder()
    loop = asyncio.get_running_loop()
    committer = GroupCommitter(
        group,  # type: ignore[arg-type]
        loop,
        now_ms=lambda: 10_000,
        max_entry_bytes=1 << 20,
        max_inflight=1,
    )
    first = asyncio.ensure_future(
        committer.produce([{"topic_id": 1, "queue": 0, "messages": [{"value": "x"}]}], 10)
    )
    await asyncio.sleep(0)  # in flight: the next requests wait and may be merged
    calls = [
        committer.produce(body, 100) if kind == "json" else committer.append(body, 100)
        for kind, body in requests
    ]
    pending = [asyncio.ensure_future(c) for c in calls]
    for _ in range(10):
        await asyncio.sleep(0)
        group.release()
    await asyncio.gather(first, *pending)
    return group


def json_delayed(value: str) -> list[dict[str, Any]]:
    return [{"topic_id": 1, "queue": 0, "messages": [{"value": value, "deliver_at_ms": 15_000}]}]


def binary_delayed(value: str) -> list[tuple[int, int, bytes]]:
    b = rb.BatchBuilder(base_timestamp_ms=1)
    b.append(value, delay_ms=5_000)
    return [(1, 0, b.finish())]


def test_json_requests_with_equal_due_times_both_keep_their_delayed_message() -> None:
    group = asyncio.run(run([("json", json_delayed("first")), ("json", json_delayed("second"))]))
    assert group.delayed_values() == [b"first", b"second"]


def test_binary_requests_with_equal_delays_merge_and_both_keep_their_delayed_message() -> None:
    group = asyncio.run(run([("binary", binary_delayed("first")), ("binary", binary_delayed("second"))]))
    assert group.delayed_values() == [b"first", b"second"]
    assert len(group.entries) == 2  # the first request's entry, then the two merged into one
    assert commands.decode(group.entries[1])["op"] == "append"
