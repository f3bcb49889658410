"""The coordinator of cluster changes when there is nothing to coordinate (issue 25): it looks
once a second, not every 0.3 s, unless this node leads the metadata group and a change is in
progress or no placement is recorded yet. A real metadata machine under a stand-in node."""

from __future__ import annotations

from types import SimpleNamespace

from test_placement import Meta, config

from raftmq.cluster.machines.placement import static_placement
from raftmq.cluster.node.changes import IDLE_LOOP_S, LOOP_S, Coordinator


def coordinator(meta: Meta, leads: bool) -> Coordinator:
    local = SimpleNamespace(raft=SimpleNamespace(is_leader=lambda: leads))
    node = SimpleNamespace(groups={"meta": local}, metadata=meta.machine)
    return Coordinator(node, router=None)  # type: ignore[arg-type]


def test_the_coordinator_looks_often_only_while_it_has_a_change_to_drive() -> None:
    meta = Meta()
    assert coordinator(meta, leads=True).wait_s() == LOOP_S == 0.3  # the placement to record
    assert meta("init_placement", placement=static_placement(config(3)).to_json())["created"]
    assert coordinator(meta, leads=True).wait_s() == IDLE_LOOP_S == 1.0  # 0.3 before: idle
    add = {"kind": "add_node", "node": {"id": "n4", "http": "127.0.0.1:8004", "raft": "127.0.0.1:7400"}}
    assert "change" in meta("begin_change", now_ms=5, change=add)
    assert coordinator(meta, leads=True).wait_s() == LOOP_S
    assert coordinator(meta, leads=False).wait_s() == IDLE_LOOP_S  # a follower never acts
