"""What every part of the backlog benchmark shares: the message values, the sizes, and the
cluster's topics and queue groups as the nodes' API describes them."""

from __future__ import annotations

import random
import string
from typing import Any

from tests.integration.harness import Cluster, wait_until

POOL = 1024
GB = 1_000_000_000
# Per group and node: twice raft.compaction_max_bytes, as a leader defers (docs/operations.md).
JOURNAL_ALLOWANCE = 128 << 20


def value_pool(size: int) -> list[str]:
    """POOL random alphanumeric values of ``size`` bytes (neither zlib nor RocksDB shrinks them much)."""
    rng = random.Random(25)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=size)) for _ in range(POOL)]


def stored(cluster: Cluster, topic: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """(messages held, messages ever written): the sums of the queues' low and high offsets, as
    each queue group's leader has them once it serves reads (docs/api.md, "What the bounds and lag
    say"). A group without such a leader gives null bounds (never smaller ones): asked again."""

    def bounds() -> list[dict[str, Any]] | None:
        queues: list[dict[str, Any]] = cluster.get(f"/v1/topics/{topic}").json()["queues"]
        return None if any(q["high_offset"] is None for q in queues) else queues

    queues = wait_until(bounds, timeout_s, 0.5, f"every queue's bounds of {topic}")
    low = sum(int(q["low_offset"]) for q in queues)
    high = sum(int(q["high_offset"]) for q in queues)
    return high - low, high


def create_topic(cluster: Cluster, name: str, queues: int) -> None:
    r = cluster.post("/v1/topics", {"name": name, "queues": queues})
    if r.status_code != 201:
        raise RuntimeError(f"cannot create {name}: {r.status_code} {r.text}")


def commit_goals(cluster: Cluster, groups: list[str], exclude: str) -> dict[str, int]:
    """Each group's commit index at its leader now (a leader other than ``exclude``)."""
    goals = {}
    for g in groups:
        leader = cluster.wait_leader(g, exclude=exclude)
        goals[g] = int(cluster.status(leader)["groups"][g]["commit_index"])
    return goals


def caught_up(cluster: Cluster, nid: str, goals: dict[str, int]) -> bool:
    groups = cluster.status(nid)["groups"]
    return all(g in groups and int(groups[g]["applied_index"]) >= goal for g, goal in goals.items())


def groups_of(cluster: Cluster, nid: str) -> list[str]:
    return sorted(cluster.status(nid)["groups"])
