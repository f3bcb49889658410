"""What the report says of each power loss, from the nemesis operations of a history."""

from __future__ import annotations

from raftmq.chaos.powerloss_nemesis import power_loss_figures


def test_each_power_loss_lists_the_unsynced_bytes_each_node_dropped() -> None:
    dropped = {"unsynced_bytes": 700, "files_reverted": 3, "entries_removed": 1, "entries_restored": 0}
    n2 = {**dropped, "unsynced_bytes": 5}
    history = [
        {"process": "nemesis", "f": "start", "fault": "kill", "fault_id": 1, "value": {"nodes": ["n1"]}},
        {"process": 3, "f": "enqueue", "type": "invoke", "value": "1-1"},
        {"process": "nemesis", "f": "start", "fault": "power-loss-all", "fault_id": 2,
         "value": {"nodes": ["n1", "n2"], "dropped": {"n1": dropped, "n2": n2}}},
        {"process": "nemesis", "f": "stop", "fault": "power-loss-all", "fault_id": 2, "value": {}},
        {"process": "nemesis", "f": "start", "fault": "power-loss-leader", "fault_id": 3,
         "value": {"group": "1", "nodes": [], "note": "no leader to cut"}},
    ]  # fmt: skip
    assert power_loss_figures(history) == [
        {"fault": "power-loss-all", "fault_id": 2, "dropped_bytes": {"n1": 700, "n2": 5}},
        {"fault": "power-loss-leader", "fault_id": 3, "dropped_bytes": {}},
    ]
