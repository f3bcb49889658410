"""``Node.leader_of`` falls back to the leaders other nodes claimed in their last statuses, and only
while those statuses are recent (``PEER_STATUS_MAX_AGE_S``): an old claim is ignored, so a forward
asks the peers again instead of going to a node that may have lost the leadership long ago."""

from __future__ import annotations

import time
from typing import Any

from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.node.node import PEER_STATUS_MAX_AGE_S, Node


def node() -> Node:
    peers = [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8000 + i}",
            "raft": f"127.0.0.1:{7000 + 100 * i}",
            "data_dir": "/d",
        }
        for i in (1, 2, 3)
    ]
    return Node(parse_config({"cluster": {"secret": "0123456789abcdef0123"}, "nodes": peers}), "n1")


def status(node_id: str, term: int) -> dict[str, Any]:
    return {"node_id": node_id, "groups": {"7": {"is_leader": True, "term": term}}}


def test_a_fresh_peer_claim_names_the_leader_and_an_old_one_does_not() -> None:
    n = node()
    now = time.monotonic()
    n._peer_status = {"n2": status("n2", 3), "n3": status("n3", 4)}
    n._peer_status_at = {"n2": now, "n3": now}
    leader = n.leader_of("7")
    assert leader is not None and leader.id == "n3"  # the highest term
    n._peer_status_at = {"n2": now, "n3": now - PEER_STATUS_MAX_AGE_S - 1}
    leader = n.leader_of("7")
    assert leader is not None and leader.id == "n2"  # n3's claim is too old to count
    n._peer_status_at = {"n2": now - PEER_STATUS_MAX_AGE_S - 1, "n3": now - PEER_STATUS_MAX_AGE_S - 1}
    assert n.leader_of("7") is None
