"""The node layer speaks no HTTP to clients: below ``cluster/api/`` no module imports
``aiohttp.web`` or names ``ApiError`` (node-layer failures are ``RaftmqError``s with their
catalogue code, which the API renders), and the writes at a group's leader are the node's own
(``LeaderRouter.actions``), not a callback the API sets after construction.

Parsed with :mod:`ast`, like ``test_layers.py``: an import inside a function counts too.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import CatalogError, RaftmqError
from raftmq.cluster.config.cluster_file import Limits, RaftTimingConfig
from raftmq.cluster.node.actions import LeaderActions
from raftmq.cluster.node.router import LeaderRouter
from raftmq.cluster.replication.contract import Outcome

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
BELOW_API = ["base", "config", "commands", "machines", "replication", "node"]


def _modules() -> list[Path]:
    return sorted(p for room in BELOW_API for p in (CLUSTER / room).rglob("*.py"))


def test_nothing_below_the_api_imports_aiohttp_web() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "aiohttp":
                found += [f"{path}:{node.lineno}" for a in node.names if a.name == "web"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp.web"):
                found.append(f"{path}:{node.lineno}")
            elif isinstance(node, ast.Import):
                found += [f"{path}:{node.lineno}" for a in node.names if a.name.startswith("aiohttp.web")]
    assert len(_modules()) > 40  # the rooms were found
    assert found == [], "aiohttp.web below cluster/api/:\n" + "\n".join(found)


def test_nothing_below_the_api_raises_http_errors() -> None:
    found = []
    for path in _modules():
        if path == CLUSTER / "base" / "errors.py":
            continue  # where the class is defined
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name) and node.id == "ApiError":
                found.append(f"{path}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom):
                found += [f"{path}:{node.lineno}" for a in node.names if a.name == "ApiError"]
    assert found == [], "ApiError below cluster/api/:\n" + "\n".join(found)


def test_the_writes_at_a_leader_are_the_routers_own_from_its_construction() -> None:
    source = (CLUSTER / "node" / "router.py").read_text()
    tree = ast.parse(source)
    init = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "LeaderRouter"
        for f in c.body
        if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef) and f.name == "__init__"
    )
    made = [
        n
        for n in ast.walk(init)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == LeaderActions.__name__
    ]
    assert made, "LeaderRouter.__init__ does not make its LeaderActions"
    # Nothing outside the node layer assigns to a router's attributes (the old local_action).
    assigned = []
    for path in sorted((CLUSTER / "api").rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Assign | ast.AnnAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    parent = t.value if isinstance(t, ast.Attribute) else None
                    if isinstance(parent, ast.Attribute) and parent.attr == "router":
                        assigned.append(f"{path}:{n.lineno}")
    assert assigned == [], "the API sets router attributes:\n" + "\n".join(assigned)
    assert not hasattr(LeaderRouter, "local_action")


def _leading_node(proposed: list[tuple[str, bytes]], result: dict[str, Any]) -> Any:
    """A node that leads queue group 0 and whose proposals end with ``result``."""

    async def propose(name: str, command: bytes) -> Outcome:
        proposed.append((name, command))
        return Outcome(result=result)

    return SimpleNamespace(
        config=SimpleNamespace(limits=Limits(), raft=RaftTimingConfig(), queue_groups=1),
        groups={"0": SimpleNamespace(raft=_leader(ready=lambda: True), committer=None)},
        me=SimpleNamespace(id="n1"),
        propose=propose,
        forget_peer_status=lambda: None,
    )


def _leader(ready: Any) -> Any:
    """A replica that leads, serving reads while ``ready()`` (``leader_reads.py``)."""
    return SimpleNamespace(is_leader=lambda: True, reads=SimpleNamespace(ready=ready))


def test_a_new_leader_runs_an_action_only_once_it_serves_reads() -> None:
    """A leader whose state may lack acknowledged writes (its term's first entry not applied yet)
    waits before it runs an action, whose checks read that state; past ``read_wait_s`` it refuses
    with a retriable ``unavailable`` and proposes nothing."""
    proposed: list[tuple[str, bytes]] = []
    ready = [False]
    node = _leading_node(proposed, {"ok": True})
    node.groups["0"].raft = _leader(ready=lambda: ready[0])
    router = LeaderRouter(node)
    router.leader_wait_s = 0.0  # no retry: one refusal is the answer
    router.actions.read_wait_s = 0.2

    async def ready_later() -> dict[str, Any]:
        call = asyncio.create_task(router.group_call(0, "barrier", {}))
        await asyncio.sleep(0.05)
        assert proposed == [] and not call.done()
        ready[0] = True
        return await call

    assert asyncio.run(ready_later()) == {"ok": True}
    assert proposed == [("0", commands.noop())]

    ready[0] = False
    with pytest.raises(RaftmqError) as refused:
        asyncio.run(router.group_call(0, "barrier", {}))
    assert refused.value.error is errors.UNAVAILABLE and refused.value.retriable
    assert proposed == [("0", commands.noop())]


def test_a_router_runs_a_write_it_leads_with_no_api_around_it() -> None:
    proposed: list[tuple[str, bytes]] = []
    router = LeaderRouter(_leading_node(proposed, {"ok": True}))
    assert asyncio.run(router.group_call(0, "barrier", {})) == {"ok": True}
    assert proposed == [("0", commands.noop())]
    # A commit: the command built at the leader, from the body a peer would send.
    body = {"group": "g", "topic_id": 3, "offsets": {"1": 7}}
    asyncio.run(router.group_call(0, "commit", body))
    assert proposed[-1] == ("0", commands.commit_offsets("g", 3, {1: 7}))


def test_a_refused_write_is_a_plain_error_with_its_catalogue_code() -> None:
    proposed: list[tuple[str, bytes]] = []
    refused = errors.error_body(errors.TOPIC_NOT_FOUND, "topic 3 was dropped")
    router = LeaderRouter(_leading_node(proposed, refused))
    with pytest.raises(RaftmqError) as info:
        asyncio.run(router.group_call(0, "drop", {"topic_id": 3}))
    assert type(info.value) is CatalogError and info.value.error is errors.TOPIC_NOT_FOUND
    with pytest.raises(RaftmqError) as info:
        asyncio.run(router.group_call(0, "no_such_action", {}))
    assert info.value.error is errors.NOT_FOUND


def test_a_topic_command_with_a_level_a_metadata_voter_lacks_is_refused_before_it_leaves_the_node() -> None:
    """The node that builds a topic command checks its op and field levels, not only the leader: a
    metadata leader of the release before would write ``tags`` or ``expect`` without knowing them,
    and its replicas would ignore what upgraded ones apply (the replicas diverge)."""
    asked: list[str] = []

    async def await_group_supports(name: str, capability: str) -> bool:
        asked.append(capability)
        return False  # a voter runs the release before

    async def wait_leader(*_: Any) -> Any:
        raise AssertionError("the command left the node")

    node = SimpleNamespace(
        config=SimpleNamespace(limits=Limits(), raft=RaftTimingConfig(), queue_groups=1),
        groups={"meta": SimpleNamespace(raft=SimpleNamespace(is_leader=lambda: False))},
        me=SimpleNamespace(id="n2"),
        await_group_supports=await_group_supports,
        forget_peer_status=lambda: None,
    )
    router = LeaderRouter(node)
    router.leader_wait_s = 0.3
    router.wait_leader = wait_leader  # type: ignore[method-assign]
    bodies = {
        "meta.create_topic.tags": {"op": "create_topic", "name": "q", "tags": {"team": "a"}},
        "meta.set_topic_tags": {"op": "set_topic_tags", "name": "q", "tags": {"team": "a"}},
        "meta.set_topic_retention": {"op": "set_topic_retention", "name": "q", "retention_bytes": 1024},
        "meta.set_topic_attributes.expect": {
            "op": "set_topic_attributes",
            "name": "q",
            "attributes": {"a": "2"},
            "expect": {"a": "1"},
        },
    }
    for level, body in bodies.items():
        asked.clear()
        with pytest.raises(RaftmqError) as refused:
            asyncio.run(router.group_call("meta", "topic_command", body))
        assert refused.value.error is errors.UPGRADE_IN_PROGRESS, (level, refused.value)
        assert level in asked


def test_a_read_at_the_leader_follows_a_leadership_that_moved_and_takes_no_followers_answer() -> None:
    """``LeaderRouter.read_at_leader``: a node that no longer leads answers ``not_leader`` (it
    does not serve reads), and the read goes to the leader known then; its answer is the one."""
    known = ["n2"]  # the leader this node knows of; forgetting the peers' statuses learns n3
    asked: list[str] = []

    async def peer_request(method: str, peer: Any, path: str, **_: Any) -> tuple[int, bytes, str]:
        asked.append(peer.id)
        if peer.id == "n2":
            return 421, orjson.dumps(errors.error_body(errors.NOT_LEADER, "n2 does not lead group 0")), ""
        return 200, orjson.dumps({"queues": {"0": [0, 30]}}), "application/json"

    node = SimpleNamespace(
        config=SimpleNamespace(limits=Limits(), raft=RaftTimingConfig(), queue_groups=1),
        groups={},
        me=SimpleNamespace(id="n1"),
        leader_of=lambda name: SimpleNamespace(id=known[0]),
        peer_request=peer_request,
        forget_peer_status=lambda: known.__setitem__(0, "n3"),
    )
    router = LeaderRouter(node)
    assert asyncio.run(router.reads_here("0")) is False  # no replica here: the leader answers
    answer = asyncio.run(router.read_at_leader("0", "/internal/groups/0/bounds?topic_id=1", 2.0))
    assert answer == {"queues": {"0": [0, 30]}} and asked == ["n2", "n3"]
