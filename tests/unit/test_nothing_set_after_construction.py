"""Nothing is filled in after construction (issue 20): building the API on a node sets or replaces
no attribute of the node (the node owns what it calls: the parked dead-letter reports are its
queue, which the API takes from), and ``ApiCore`` declares no attribute its constructor does not
set. The reports' queue is bounded."""

from __future__ import annotations

import asyncio

from raftmq.cluster.api.app import API_KEY, create_app
from raftmq.cluster.api.core import ApiCore
from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.node.changes import Coordinator
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.parked import ParkedReports

NODES = [
    {"id": f"n{i}", "http": f"127.0.0.1:{8000 + i}", "raft": f"127.0.0.1:{7000 + 100 * i}", "data_dir": "/d"}
    for i in (1, 2, 3)
]


def node() -> Node:
    return Node(parse_config({"cluster": {"secret": "0123456789abcdef0123"}, "nodes": NODES}), "n1")


def test_building_the_api_sets_nothing_on_the_node() -> None:
    n = node()
    before = dict(vars(n))
    create_app(n)
    after = vars(n)
    assert set(after) == set(before)
    changed = sorted(k for k in before if after[k] is not before[k])
    assert changed == [], changed


def test_api_core_declares_only_what_its_constructor_sets() -> None:
    n = node()
    core = ApiCore(n)
    declared = set(ApiCore.__annotations__)
    assert declared <= set(vars(core)), declared - set(vars(core))
    api = create_app(n)[API_KEY]
    # The Api made by create_app has what a bare ApiCore has, and nothing was added to it later.
    assert set(vars(core)) <= set(vars(api))


def test_parked_reports_are_taken_oldest_first_and_bounded() -> None:
    async def run() -> tuple[list[object], int]:
        reports = ParkedReports(limit=2)
        for i in range(3):
            reports.put(((i, "orders", "billing"),))
        return [await reports.get(), await reports.get()], reports.dropped

    got, dropped = asyncio.run(run())
    assert got == [((0, "orders", "billing"),), ((1, "orders", "billing"),)]
    assert dropped == 1  # the third found the queue full (it is asked again at the next failure)


def test_the_cluster_handlers_have_their_change_coordinator_from_construction() -> None:
    """The cluster routes' handler object has its change coordinator once built (the app's
    startup only runs it): no attribute of it is filled in later."""
    app = create_app(node())
    handlers = {
        getattr(route.handler, "__self__", None)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical == "/v1/cluster/rebalance"
    }
    (cluster,) = handlers
    assert isinstance(cluster.coordinator, Coordinator)
