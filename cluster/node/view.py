"""What a node's helpers see of it: :class:`LocalGroup` (this node's replica of one Raft group) and
:class:`NodeView`, the part of :class:`~raftmq.cluster.node.node.Node` that its helpers use: the
reconciler (``reconcile.py``), the sealer (``sealer.py``), the tick loops (``ticks.py``) and the
checkpoints (``checkpoints.py``). They depend on this contract, not on
``node.py``, which creates them: imports in this room flow one way (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from raftmq.cluster.machines.delivery.ordered import OrderedLooks

if TYPE_CHECKING:
    import ssl

    from raftmq.cluster.config.cluster_file import ClusterConfig, NodeConfig
    from raftmq.cluster.config.keys import ClusterKeys
    from raftmq.cluster.machines.metadata import MetadataMachine
    from raftmq.cluster.machines.placement import Placement
    from raftmq.cluster.replication.group_commit import GroupCommitter
    from raftmq.cluster.replication.raft import Outcome, RaftGroup, StateMachine
    from raftmq.storage.rocks import RocksStore

__all__ = ["LocalGroup", "NodeView"]


@dataclass
class LocalGroup:
    """This node's replica of one Raft group."""

    name: str  # "meta" or the queue group id as a string
    raft: RaftGroup
    machine: StateMachine
    state_store: RocksStore
    journal_store: RocksStore
    committer: GroupCommitter | None = None
    # What the waiting ordered receivers' looks keep between looks while this replica leads
    # (delivery/ordered.py; not replicated).
    looks: OrderedLooks = field(default_factory=OrderedLooks)

    def close_stores(self) -> None:
        """Close the stores of this stopped replica. Blocking (each waits for the threads still
        in it, a compaction cancelled first): never on the event loop."""
        self.state_store.close()
        self.journal_store.close()


class NodeView(Protocol):
    """The node as its helpers see it (``Node`` is the implementation)."""

    file_config: ClusterConfig
    config: ClusterConfig
    me: NodeConfig
    node_dir: str
    groups: dict[str, LocalGroup]
    metadata: MetadataMachine | None
    placement: Placement | None
    change_in_progress: dict[str, Any] | None
    keys: ClusterKeys
    ssl_context: ssl.SSLContext | None

    def leader_of(self, name: str) -> NodeConfig | None: ...

    def group_supports(self, name: str, capability: str) -> bool: ...

    async def await_group_supports(self, name: str, capability: str) -> bool: ...

    def node_for_addr(self, raft_addr: str | None) -> NodeConfig | None: ...

    def replicas(self, name: str) -> tuple[NodeConfig, ...]: ...

    async def start_group(self, name: str, *, joining: bool) -> LocalGroup: ...

    async def stop_group(self, name: str, *, delete: bool) -> None: ...

    def hint_peers(self) -> None: ...

    def set_placement(self, placement: Placement) -> None: ...

    async def refresh_peer_status(self) -> dict[str, dict[str, Any]]: ...

    def heard_from(self) -> set[str]: ...

    async def peer_get_json(self, node: NodeConfig, path: str, timeout_s: float = 5.0) -> Any: ...

    async def propose(self, name: str, command: bytes, timeout_s: float | None = None) -> Outcome: ...
