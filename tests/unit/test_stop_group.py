"""Stopping a replica closes its stores off the event loop: a close waits for the threads still
in a store (cluster/node/node.py, Node.stop_group and Node.stop; storage/store_gate.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raftmq.cluster.node.node import Node
from raftmq.cluster.node.view import LocalGroup
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import StoreClosed


def _replica(tmp_path: Path) -> LocalGroup:
    return LocalGroup(
        name="3",
        raft=SimpleNamespace(destroy=lambda: None),  # type: ignore[arg-type]
        machine=None,  # type: ignore[arg-type]
        state_store=RocksStore.open(str(tmp_path / "state")),
        journal_store=RocksStore.open(str(tmp_path / "raft")),
    )


def test_stop_group_keeps_the_loop_running_while_a_store_waits_for_its_users(tmp_path: Path) -> None:
    local = _replica(tmp_path)
    node: Any = SimpleNamespace(
        groups={"3": local}, metadata=None, node_dir=str(tmp_path), me=SimpleNamespace(id="n1")
    )
    local.state_store._enter()  # a thread in the store (a compaction, a read): the close waits for it
    released_by: list[str] = []

    def leave(by: str) -> None:
        if not released_by:
            released_by.append(by)
            local.state_store._leave()

    # If the close blocked the loop, the loop could not release the store: the fallback would.
    fallback = threading.Timer(10.0, leave, ("fallback thread",))
    fallback.start()

    async def run() -> None:
        asyncio.get_running_loop().call_later(1.5, leave, "event loop")  # after stop_group's 1 s pause
        await Node.stop_group(node, "3", delete=False)

    try:
        asyncio.run(run())
    finally:
        fallback.cancel()
    assert released_by == ["event loop"]
    assert node.groups == {}
    for store in (local.state_store, local.journal_store):
        try:
            store.get(b"k")
        except StoreClosed:
            continue
        raise AssertionError("a store of the stopped replica is still open")
