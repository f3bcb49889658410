"""The node layer speaks no HTTP to clients: below ``cluster/api/`` no module imports
``aiohttp.web`` or names ``ApiError`` (node-layer failures are ``RaftmqError``s with their
catalogue code, which the API renders), and the writes at a group's leader are the node's own
(``LeaderRouter.actions``), not a callback the API sets after construction.

Parsed with :mod:`ast`, like ``test_layers.py``: an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from raftmq.cluster.node.actions import LeaderActions
from raftmq.cluster.node.router import LeaderRouter

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
