"""The sealer forgets nothing it took on for a round that could not look: queues that grew are
looked at again when no metadata voter answered, and a queue of a topic the metadata read does not
list yet (it lags a creation) is kept, not taken for a deleted topic's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raftmq.cluster.config.cluster_file import SegmentsConfig
from raftmq.cluster.node.sealer import Sealer
from raftmq.storage import keys
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch


def _node(tmp_path: Path, answers: list[Any] | None) -> Any:
    """A node leading queue group "1" without a metadata replica; its one metadata voter answers
    ``{"topics": answers}``, or fails when ``answers`` is None."""

    async def peer_get_json(voter: str, path: str, timeout_s: float) -> Any:
        if answers is None:
            raise ConnectionError(f"{voter} does not answer")
        return {"topics": answers}

    group = SimpleNamespace(
        raft=SimpleNamespace(is_leader=lambda: True),
        machine=SimpleNamespace(applied_index=5, store=MemoryStore()),
    )
    return SimpleNamespace(
        config=SimpleNamespace(
            segments=SegmentsConfig(store=str(tmp_path / "segments")), metadata_voters=["n1"]
        ),
        me=SimpleNamespace(id="n9"),
        data_dir=str(tmp_path),
        groups={"1": group},
        metadata=None,
        peer_get_json=peer_get_json,
    )


def _walked_sealer(node: Any) -> Sealer:
    sealer = Sealer(node)
    sealer._walked.add("1")  # the full look after becoming leader is done: only grown queues now
    sealer._pruned_at["1"] = node.groups["1"].machine.applied_index
    sealer.grown("1", [(7, 0), (7, 1)])
    return sealer


def test_queues_that_grew_are_looked_at_again_when_no_metadata_voter_answered(tmp_path: Path) -> None:
    node = _node(tmp_path, answers=None)
    sealer = _walked_sealer(node)
    assert asyncio.run(sealer.once()) == []
    assert sealer._grown["1"] == {(7, 0), (7, 1)}


def test_a_queue_of_a_topic_not_listed_yet_is_kept_and_a_dropped_ones_is_forgotten(tmp_path: Path) -> None:
    node = _node(tmp_path, answers=[])
    sealer = _walked_sealer(node)
    asyncio.run(sealer.once())
    assert sealer._grown["1"] == {(7, 0), (7, 1)}  # topic 7 is not listed yet, and not dropped
    batch = Batch()
    batch.put(keys.dropped_key(7), b"1")
    node.groups["1"].machine.store.write(batch)
    node.groups["1"].machine.applied_index = 6
    asyncio.run(sealer.once())
    assert not sealer._grown.get("1")  # dropped: nothing left to look at
