"""A node starts each of its replicas with the early election ask (``campaign_first``, which makes
``PreVote.ask_first`` run) exactly where the placement puts that node first: ``Node._start_group``
as it is, with real ``RaftGroup`` replicas (pysyncobj, RocksDB) bound on 127.0.0.1.

No election is watched: one node's replicas start alone (no peer listens, so none connects and no
round is sent), with an election timeout of ten minutes, so nothing a tick does can end the ask
before it is read (``PreVote._first_until`` stays set until a leader is heard, a round ends or the
election deadline passes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raft_doubles import free_port

from raftmq.cluster.base.groups import META, port_offset
from raftmq.cluster.config.cluster_file import ClusterConfig, parse_config
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.queue_group import QueueGroupMachine
from raftmq.cluster.node.node import Node
from raftmq.storage.rocks import RocksStore

NODES = ("n1", "n2", "n3")
GROUPS = ("meta", "0", "1", "2")
# The cluster file's first placement (3 nodes, replication 3): the metadata group's voters are the
# nodes in order; queue group g's replicas start at node g + 1 and go round. The first is preferred.
FIRST = {"meta": "n1", "0": "n1", "1": "n2", "2": "n3"}


def _raft_base_port() -> int:
    """A port such that it and the next ones, one per group, are this test's alone (free_port)."""
    run: list[int] = []
    while len(run) < len(GROUPS):
        port = free_port()
        run = [*run, port] if run and port == run[-1] + 1 else [port]
    return run[0]


def _config(tmp_path: Path) -> ClusterConfig:
    nodes = [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{free_port()}",
            "raft": f"127.0.0.1:{_raft_base_port()}",
            "data_dir": str(tmp_path),
        }
        for i in (1, 2, 3)
    ]
    cluster = {"secret": "0123456789abcdef0123", "queue_groups": 3, "replication": 3}
    # Ten minutes: no election deadline passes while the test runs (it would end the early ask).
    raft = {"election_min_ms": 600_000, "election_max_ms": 600_001}
    return parse_config({"cluster": cluster, "nodes": nodes, "raft": raft})


def _asks_first(node: Node, name: str) -> bool:
    """Start ``node``'s replica of group ``name`` as ``Node.start_group`` does (a cluster's first
    start: not joining); whether it is set to ask first. The replica is stopped again."""
    store = RocksStore.open(node._group_dir(name, "state"))
    machine: Any = MetadataMachine(store) if name == META else QueueGroupMachine(store, int(name))
    seed = [n.raft_addr(port_offset(name)) for n in node.replicas(name)]
    local = node._start_group(name, seed, machine, store, False)
    try:
        assert sorted(local.raft.members()) == sorted(seed)  # three voters: not a lone one
        return local.raft.pre_vote._first_until is not None
    finally:
        local.raft.destroy()
        local.close_stores()


def test_each_replica_asks_first_exactly_where_the_placement_puts_its_node_first(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert {g: config.group_replicas(int(g))[0].id for g in GROUPS if g != META} == {
        g: FIRST[g] for g in GROUPS if g != META
    }
    asked = {(node_id, g): _asks_first(Node(config, node_id), g) for node_id in NODES for g in GROUPS}
    # Every (node, group) pair: always asking, never asking or the last replica asking all fail here.
    assert asked == {(node_id, g): FIRST[g] == node_id for node_id, g in asked}
