"""Pins of the pysyncobj 0.3.17 membership behaviour ``cluster/raft.py`` relies on (no sockets).

Each test names what raftmq does because of the pinned behaviour; if pysyncobj changes it, the test
fails and the adapter must be revisited (docs/architecture.md, "Placement and cluster changes").
"""

from __future__ import annotations

import inspect
import re
import textwrap
from typing import Any

import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso
from pysyncobj import SyncObj
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from raftmq.cluster.raft import _FlushingTransport, members_after, membership_change


def _src(func: Any) -> str:
    """The source of ``func`` with every run of whitespace made one space."""
    return " ".join(textwrap.dedent(inspect.getsource(func)).split())


def _entry(action: str, addr: str, index: int) -> tuple[bytes, int, int]:
    """A membership entry as pysyncobj writes it (``addNodeToCluster``/``removeNodeFromCluster``)."""
    return bytes([pso._COMMAND_TYPE.MEMBERSHIP]) + pso_pickle.dumps([action, addr, TCPNode(addr)]), index, 1


def test_membership_entries_are_a_type_byte_and_a_pickled_request() -> None:
    assert pso._COMMAND_TYPE.MEMBERSHIP == 2
    assert "pickle.dumps(['add', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP" in _src(
        SyncObj.addNodeToCluster
    )
    assert "pickle.dumps(['rem', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP" in _src(
        SyncObj.removeNodeFromCluster
    )
    assert membership_change(_entry("add", "h:1", 5)[0]) == ("add", "h:1")
    assert membership_change(_entry("rem", "h:2", 6)[0]) == ("rem", "h:2")
    assert membership_change(b"\x00" + pso_pickle.dumps((0, (b"x",)))) is None  # a regular entry
    assert membership_change(b"\x01") is None  # the leader's no-op


def test_voters_are_the_base_plus_the_changes_in_log_order() -> None:
    log = [_entry("add", "d:1", 10), _entry("rem", "a:1", 12), _entry("add", "a:1", 15)]
    base = ["a:1", "b:1", "c:1"]
    assert members_after(base, log, 0) == ["a:1", "b:1", "c:1", "d:1"]
    assert members_after(base, log, 0, upto_index=12) == ["b:1", "c:1", "d:1"]
    assert members_after(base, log, 10) == ["a:1", "b:1", "c:1"]  # the add at 10 is in the base


def test_the_guard_against_a_second_change_in_flight_is_dead_code() -> None:
    # Why RaftGroup.change_membership refuses while a membership entry is uncommitted.
    source = inspect.getsource(pso)
    assigned = re.findall(r"self\.__changeClusterIDx = (.+)", source)
    assert assigned and set(assigned) == {"None"}
    # What pysyncobj does check: the leader's no-op entry is applied (the thesis' bug fix).
    assert "if self.__raftLastApplied < self.__noopIDx:" in _src(SyncObj._SyncObj__changeCluster)


def test_changes_take_effect_when_appended_and_a_leader_cannot_remove_itself() -> None:
    check = _src(SyncObj._checkCommandsToApply)
    assert "self.__changeCluster(changeClusterRequest)" in check  # before the entry is appended
    do = _src(SyncObj._SyncObj__doChangeCluster)
    assert "if oldNode == self.__selfNode: return False" in do


def test_snapshots_carry_the_live_voters_and_loading_filters_self_only_as_a_node() -> None:
    # The serializer gets the live set (perhaps with an uncommitted change): the manifest records
    # the voters as of its last entry instead.
    assert "cluster = self.__otherNodes | {self.__selfNode}" in _src(SyncObj._SyncObj__tryLogCompaction)
    load = _src(SyncObj._SyncObj__loadDumpFile)
    assert "self.__updateClusterConfiguration([node for node in data[3] if node != self.__selfNode])" in load
    # A plain address never equals the self Node: the deserializer must leave itself out.
    assert TCPNode("h:1") != "h:1"
    assert "h:1" != TCPNode("h:1")  # noqa: SIM300 (the comparison pysyncobj makes, reflected)


def test_the_transport_hangs_up_on_unknown_addresses_and_hints_are_transport_nodes() -> None:
    incoming = _src(TCPTransport._onIncomingMessageReceived)
    assert "if node is None and message != 'readonly': conn.disconnect()" in incoming
    assert "self._nodes.add(node)" in _src(TCPTransport.addNode)
    assert "self._nodeAddrToNode[node.address] = node" in _src(TCPTransport.addNode)
    assert "self.__transport = transportClass(self, self.__selfNode, self.__otherNodes)" in _src(
        SyncObj.__init__
    )
    assert _FlushingTransport.addNode is not TCPTransport.addNode  # idempotent for a hinted peer
