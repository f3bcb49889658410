"""Placement and cluster changes in the metadata state machine (pure: MemoryStore, no sockets)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.placement import (
    OPS,
    Placement,
    overlay,
    pick_target,
    static_placement,
)
from raftmq.storage.memory import MemoryStore

SECRET = "0123456789abcdef0123"


def config(n: int = 3, join: int = 0, **cluster: Any) -> Any:
    nodes = [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8000 + i}",
            "raft": f"127.0.0.1:{7000 + 100 * i}",
            "data_dir": "/d",
            **({"join": True} if i > n else {}),
        }
        for i in range(1, n + join + 1)
    ]
    return parse_config({"cluster": {"secret": SECRET, **cluster}, "nodes": nodes})


class Meta:
    """A MetadataMachine fed commands at increasing indexes (the log), remembering the log."""

    def __init__(self) -> None:
        self.machine = MetadataMachine(MemoryStore())
        self.log: list[bytes] = []
        self.notified = 0
        self.machine.on_placement_changed = self._notify

    def _notify(self) -> None:
        self.notified += 1

    def __call__(self, op: str, **fields: Any) -> dict[str, Any]:
        command = orjson.dumps({"v": 1, "op": op, **fields})
        self.log.append(command)
        result: dict[str, Any] = self.machine.apply(len(self.log), command)
        return result

    @property
    def placement(self) -> Placement:
        p = self.machine.placement()
        assert p is not None
        return p

    def digest(self) -> list[tuple[bytes, bytes]]:
        return list(self.machine.store.scan(b""))


def error_code(result: dict[str, Any]) -> str:
    return str(result["error"]["code"])


@pytest.fixture
def meta() -> Meta:
    m = Meta()
    assert m("init_placement", placement=static_placement(config(3, join=1)).to_json())["created"]
    return m


def test_ops_are_only_appended_to() -> None:
    # The names are in the metadata group's log; this list may only grow at the end.
    assert OPS[:10] == (
        "init_placement",
        "begin_change",
        "change_phase",
        "place_replica",
        "unplace_replica",
        "prefer_leader",
        "add_node",
        "remove_node",
        "end_change",
        "cancel_change",
    )


def test_static_placement_leaves_join_nodes_out_and_matches_the_file() -> None:
    c = config(3, join=1, queue_groups=4)
    p = static_placement(c)
    assert [n.id for n in p.nodes] == ["n1", "n2", "n3"]
    assert p.groups == {
        "meta": ("n1", "n2", "n3"),
        "0": ("n1", "n2", "n3"),
        "1": ("n2", "n3", "n1"),
        "2": ("n3", "n1", "n2"),
        "3": ("n1", "n2", "n3"),
    }
    assert Placement.from_json(orjson.loads(orjson.dumps(p.to_json()))) == p


def test_init_placement_happens_once(meta: Meta) -> None:
    first = meta.placement
    other = static_placement(config(5)).to_json()
    result = meta("init_placement", placement=other)
    assert result["created"] is False and meta.placement == first


def test_a_second_change_is_refused_while_one_is_in_progress(meta: Meta) -> None:
    move = {"kind": "move", "group": "0", "source": "n1", "target": "n4"}
    assert meta("add_node", change_id=1, node={"id": "n4", "http": "h:1", "raft": "h:2"})["error"]
    begun = meta("begin_change", now_ms=5, change={"kind": "add_node", "node": _n4()})
    change_id = begun["change"]["id"]
    refused = meta("begin_change", now_ms=6, change=move)
    assert error_code(refused) == "change_in_progress"
    assert refused["error"]["change"]["id"] == change_id
    meta("add_node", change_id=change_id, node=_n4())
    meta("end_change", change_id=change_id, now_ms=7, outcome="done")
    assert meta.machine.change() is None
    assert meta("begin_change", now_ms=8, change=move)["change"]["id"] == change_id + 1


def _n4() -> dict[str, str]:
    return {"id": "n4", "http": "127.0.0.1:8004", "raft": "127.0.0.1:7400"}


def _begin(meta: Meta, **change: Any) -> int:
    result = meta("begin_change", now_ms=1, change=change)
    assert "change" in result, result
    return int(result["change"]["id"])


def test_a_move_places_the_target_beside_the_source_then_unplaces_the_source(meta: Meta) -> None:
    cid = _begin(meta, kind="add_node", node=_n4())
    meta("add_node", change_id=cid, node=_n4())
    meta("end_change", change_id=cid, now_ms=2, outcome="done")
    cid = _begin(meta, kind="move", group="1", source="n2", target="n4")
    version = meta.placement.version
    assert meta("place_replica", change_id=cid, group="1", node="n4", after="n2")["placement"]
    assert meta.placement.replicas("1") == ("n2", "n4", "n3", "n1")
    meta("place_replica", change_id=cid, group="1", node="n4", after="n2")  # idempotent
    assert meta.placement.version == version + 1
    meta("change_phase", change_id=cid, phase="remove")
    assert meta.machine.change().phase == "remove"  # type: ignore[union-attr]
    meta("unplace_replica", change_id=cid, group="1", node="n2")
    assert meta.placement.replicas("1") == ("n4", "n3", "n1")
    ended = meta("end_change", change_id=cid, now_ms=9, outcome="done")["ended"]
    assert (ended["kind"], ended["outcome"], ended["ended_ms"]) == ("move", "done", 9)
    assert [h["kind"] for h in meta.machine.change_history()] == ["add_node", "move"]


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "move", "group": "9", "source": "n1", "target": "n2"},
        {"kind": "move", "group": "0", "source": "n9", "target": "n2"},
        {"kind": "move", "group": "0", "source": "n1", "target": "n2"},  # n2 hosts group 0
        {"kind": "move", "group": "0", "source": "n1"},
        {"kind": "transfer_leader", "group": "0", "target": "n9"},
        {"kind": "add_node", "node": {"id": "n1", "http": "127.0.0.1:9", "raft": "127.0.0.1:10"}},
        {"kind": "add_node", "node": {"id": "n9", "http": "127.0.0.1:8001", "raft": "127.0.0.1:10"}},
        {"kind": "add_node", "node": {"id": "bad id", "http": "127.0.0.1:9", "raft": "127.0.0.1:10"}},
        {"kind": "add_node", "node": {"id": "n9", "http": "nohost", "raft": "127.0.0.1:10"}},
        # A superscript two is a digit to str.isdigit, not to int(): an error inside the apply before.
        {"kind": "add_node", "node": {"id": "n9", "http": "127.0.0.1:\u00b2", "raft": "127.0.0.1:10"}},
        {"kind": "remove_node", "node": "n1"},  # 3 nodes, 3 replicas: nowhere to move them
        {"kind": "remove_node", "node": "n9"},
        {"kind": "rename_node"},
        "move",
    ],
)
def test_invalid_changes_are_refused_and_change_nothing(meta: Meta, change: Any) -> None:
    before = meta.digest()
    result = meta("begin_change", now_ms=1, change=change)
    assert error_code(result) == "bad_request", result
    assert meta.machine.change() is None
    # Only the applied index moved.
    assert [kv for kv in meta.digest() if kv[0] != b"A"] == [kv for kv in before if kv[0] != b"A"]


def test_steps_of_another_change_are_refused(meta: Meta) -> None:
    cid = _begin(meta, kind="transfer_leader", group="0", target="n2")
    before = meta.placement
    for op, fields in [
        ("prefer_leader", {"group": "0", "node": "n2"}),
        ("end_change", {"now_ms": 1, "outcome": "done"}),
        ("change_phase", {"phase": "x"}),
    ]:
        assert error_code(meta(op, change_id=cid + 1, **fields)) == "bad_request"
    assert meta.placement == before and meta.machine.change() is not None
    meta("prefer_leader", change_id=cid, group="0", node="n2")
    assert meta.placement.replicas("0") == ("n2", "n1", "n3")


def test_a_node_hosting_replicas_is_never_removed_and_a_group_keeps_one_replica(meta: Meta) -> None:
    cid = _begin(meta, kind="add_node", node=_n4())
    meta("add_node", change_id=cid, node=_n4())
    meta("end_change", change_id=cid, now_ms=2, outcome="done")
    cid = _begin(meta, kind="remove_node", node="n1")
    assert error_code(meta("remove_node", change_id=cid, node="n1")) == "bad_request"
    for node in ("n1", "n2"):
        meta("unplace_replica", change_id=cid, group="0", node=node)
    assert error_code(meta("unplace_replica", change_id=cid, group="0", node="n3")) == "bad_request"
    assert meta.placement.replicas("0") == ("n3",)


def test_pick_target_takes_the_least_loaded_node_not_hosting_the_group(meta: Meta) -> None:
    cid = _begin(meta, kind="add_node", node=_n4())
    meta("add_node", change_id=cid, node=_n4())
    assert pick_target(meta.placement, "0", {"n1"}) == "n4"
    meta("place_replica", change_id=cid, group="1", node="n4")
    meta("place_replica", change_id=cid, group="2", node="n4")
    # n4 now hosts 2 replicas, the others 4 each: still the least loaded.
    assert pick_target(meta.placement, "0", {"n1"}) == "n4"
    assert pick_target(meta.placement, "1", {"n1"}) is None


def test_state_survives_reload_and_two_replicas_of_one_log_are_identical(meta: Meta) -> None:
    cid = _begin(meta, kind="add_node", node=_n4())
    meta("add_node", change_id=cid, node=_n4())
    meta("end_change", change_id=cid, now_ms=3, outcome="failed", error="boom")
    _begin(meta, kind="move", group="2", source="n3", target="n4")
    reloaded = MetadataMachine(meta.machine.store)
    assert reloaded.placement() == meta.placement
    assert reloaded.change() == meta.machine.change()
    assert reloaded.change_history() == meta.machine.change_history()
    replay = MetadataMachine(MemoryStore())
    for index, command in enumerate(meta.log, start=1):
        replay.apply(index, command)
    assert list(replay.store.scan(b"")) == meta.digest()
    assert meta.notified >= 4  # every applied placement change was announced


def test_overlay_gives_the_node_the_placement_view() -> None:
    file_config = config(3, queue_groups=3)
    p = Placement.from_json(
        {
            "version": 7,
            "nodes": [
                {"id": "n2", "http": "127.0.0.1:8002", "raft": "127.0.0.1:7200"},
                {"id": "n3", "http": "127.0.0.1:8003", "raft": "127.0.0.1:7300"},
                {"id": "n4", "http": "10.0.0.4:8004", "raft": "10.0.0.4:7400"},
            ],
            "groups": {"meta": ["n2", "n3", "n4"], "0": ["n4", "n2"], "1": ["n2", "n3"], "2": ["n3", "n4"]},
        }
    )
    view = overlay(file_config, p, "n2")
    assert [n.id for n in view.nodes] == ["n2", "n3", "n4"]
    assert view.node("n4").http_url == "http://10.0.0.4:8004"
    assert [n.id for n in view.group_replicas(0)] == ["n4", "n2"]
    assert [n.id for n in view.metadata_voters] == ["n2", "n3", "n4"]
    assert view.groups_on("n4") == [0, 2]
    removed = overlay(file_config, p, "n1")  # n1 was removed: it still knows itself
    assert removed.node("n1").data_dir == "/d" and removed.groups_on("n1") == []


def test_cancel_marks_the_change_and_steps_still_need_its_id(meta: Meta) -> None:
    cid = _begin(meta, kind="transfer_leader", group="0", target="n2")
    assert error_code(meta("cancel_change", change_id=cid + 1)) == "bad_request"
    assert meta.machine.change().cancel is False  # type: ignore[union-attr]
    assert meta("cancel_change", change_id=cid)["change"]["cancel"] is True
    assert meta.machine.change().cancel is True  # type: ignore[union-attr]
    ended = meta("end_change", change_id=cid, now_ms=4, outcome="failed", error="cancelled")["ended"]
    assert (ended["cancel"], ended["outcome"], ended["error"]) == (True, "failed", "cancelled")
    assert error_code(meta("cancel_change", change_id=cid)) == "bad_request"  # nothing in progress
