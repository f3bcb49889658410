"""The nodes pysyncobj keys its per-peer state by (``pso.RaftNode``): hashed and compared in C,
equal to pysyncobj's ``TCPNode`` of the same address, and never a change to what a membership
entry holds. The last test runs three real RaftGroups on 127.0.0.1."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso_syncobj
import pytest
from pysyncobj.node import TCPNode
from raft_doubles import fast_settings, start_three, submit_all, wait_for

from raftmq.cluster.replication.pso import RaftNode
from raftmq.cluster.replication.raft import Outcome, RaftGroup

ADDR = "127.0.0.1:4321"


def test_a_raft_node_hashes_and_compares_in_c_as_its_address() -> None:
    # The slots are str's own (no Python frame per hash or comparison): what makes it cheaper.
    assert RaftNode.__hash__ is str.__hash__ and RaftNode.__eq__ is str.__eq__
    node = RaftNode(ADDR)
    assert hash(node) == hash(ADDR) and node.id == ADDR and str(node) == ADDR
    assert (node.host, node.port, node.address) == ("127.0.0.1", 4321, ADDR)
    assert repr(node) == "RaftNode('127.0.0.1:4321')"


def test_a_raft_node_made_of_a_node_holds_a_plain_address() -> None:
    # The handshake pickles ``address`` and the peer looks it up among plain strings: a node there
    # (pickled as a TCPNode) would make every peer hang up on it.
    node = RaftNode(RaftNode(ADDR))
    assert type(node.address) is str and type(node.id) is str and node == RaftNode(ADDR)
    assert pickle.loads(pickle.dumps(node.address)) == ADDR


def test_a_raft_node_and_a_tcp_node_of_one_address_are_one_key() -> None:
    raft, tcp, other = RaftNode(ADDR), TCPNode(ADDR), TCPNode("127.0.0.1:4322")
    assert raft == tcp and tcp == raft and (raft != tcp) is False and (tcp != raft) is False
    assert hash(raft) == hash(tcp) and raft != other and other != raft
    assert {raft: 1}[tcp] == 1 and {tcp: 2}[raft] == 2
    assert {raft, tcp} == {tcp} and len({raft, tcp, other}) == 2


def test_a_pickled_raft_node_is_a_tcp_node_of_its_address() -> None:
    for dumps, loads in ((pso_pickle.dumps, pso_pickle.loads), (pickle.dumps, pickle.loads)):
        back = loads(dumps(RaftNode(ADDR)))
        assert type(back) is TCPNode and back == TCPNode(ADDR) and back.id == ADDR


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[list[RaftGroup]]:
    into: list[RaftGroup] = []
    try:
        yield start_three(tmp_path, fast_settings(), into)
    finally:
        for g in into:
            g.destroy()


def _change(leader: RaftGroup, action: str, addr: str) -> Outcome:
    done: list[Outcome] = []
    ready = threading.Event()
    leader.change_membership(action, addr, lambda o: (done.append(o), ready.set()))
    assert ready.wait(10.0), f"{action} {addr} unanswered"
    return done[0]


def test_a_group_keys_its_peers_by_raft_nodes_and_membership_entries_keep_their_bytes(
    groups: list[RaftGroup],
) -> None:
    leader = next(g for g in groups if g.is_leader())
    follower = next(g for g in groups if g is not leader)
    sync = leader._sync
    transport = sync._SyncObj__transport
    assert all(type(n) is RaftNode for n in sync.otherNodes | {sync.selfNode})
    assert all(type(n) is RaftNode for n in transport._connections)
    assert {type(n) for n in sync._SyncObj__raftNextIndex} == {RaftNode}

    for action, kind in (("remove", "rem"), ("add", "add")):
        assert _change(leader, action, follower.self_addr).error is None
        entry = next(e for e in reversed(leader._journal[:]) if e[0][:1] == b"\x02")
        # The bytes pysyncobj wrote before RaftNode: its own TCPNode, pickled.
        pickled = pso_pickle.dumps([kind, follower.self_addr, TCPNode(follower.self_addr)])
        assert entry[0] == bytes([pso_syncobj._COMMAND_TYPE.MEMBERSHIP]) + pickled

    # The voter the entry brought back is a RaftNode like the others, and replicates.
    assert all(type(n) is RaftNode for n in sync.otherNodes)
    assert [o.error for o in submit_all(leader, [b"after"])] == [None]
    wait_for(lambda: follower.status().applied_index >= leader.status().applied_index, "the re-added voter")
