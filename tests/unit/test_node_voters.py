"""``Node._voters``, asked per proposal (``reads_binary``) and kept between asks: the answer follows
a new configuration and a change of the Raft members, and is the same object while neither
changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.node.node import Node


def nodes(count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8000 + i}",
            "raft": f"127.0.0.1:{7000 + 100 * i}",
            "data_dir": "/d",
        }
        for i in range(1, count + 1)
    ]


def config(replication: int) -> Any:
    cluster = {"secret": "0123456789abcdef0123", "queue_groups": 1, "replication": replication}
    return parse_config({"cluster": cluster, "nodes": nodes(4)})


def with_members(node: Node, *addrs: str) -> None:
    """The group's replica here, as far as _voters looks at it: the Raft members it uses."""
    node.groups = {"0": SimpleNamespace(raft=SimpleNamespace(members=lambda: addrs))}  # type: ignore[dict-item]


def test_the_voters_follow_the_members_and_the_configuration_and_are_kept_between_asks() -> None:
    n = Node(config(3), "n1")
    raft = {f"n{i}": n.config.node(f"n{i}").raft_addr(1) for i in range(1, 5)}
    with_members(n, raft["n1"], raft["n2"], raft["n3"])
    first = n._voters("0")
    assert first == {"n1", "n2", "n3"}
    assert n._voters("0") is first  # nothing changed: the answer kept
    with_members(n, raft["n1"], raft["n2"], raft["n3"], raft["n4"])  # a voter being added
    assert n._voters("0") == {"n1", "n2", "n3", "n4"}
    with_members(n, raft["n1"], raft["n2"])
    assert n._voters("0") == {"n1", "n2", "n3"}  # the configured replicas count too
    n._set_config(config(4))  # a new placement: four replicas
    assert n._voters("0") == {"n1", "n2", "n3", "n4"}
