"""Idle queues cost nothing (issue 25): the periodic work of a node follows what changed, not what
exists. The sealer looks only at queues that received messages (or age towards
``segments.max_age_ms``), and still seals what is due; the lag history samples every topic with a
consumer group, however many topics there are, with one read per queue group; a leader proposes
a ``retain`` only when a queue has something to remove, and retention still removes it in time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

IDLE_TOML = """
[raft]
retention_check_ms = 200
[segments]
max_messages = 20
max_age_ms = 1500
check_ms = 100
[limits]
lag_sample_ms = 200
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("idle")
    with Cluster(tmp, nodes=3, extra_toml=IDLE_TOML) as cluster:
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def seal_checks(c: Cluster) -> int:
    """Queues the sealers of every node looked at so far."""
    total = 0
    for nid in c.nodes:
        text = c.get("/metrics", nid).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "raftmq_segment_queue_checks_total":
                    total += int(s.value)
    return total


def stays(c: Cluster, seconds: float) -> tuple[int, int]:
    """The sealers' check count now and ``seconds`` later."""
    before = seal_checks(c)
    time.sleep(seconds)
    return before, seal_checks(c)


def sealed(c: Cluster, topic: str) -> dict[int, int]:
    r = c.get(f"/v1/topics/{topic}/segments")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return {q["queue"]: q["sealed_end"] for q in body["queues"]}


def test_an_idle_queue_is_not_looked_at_and_a_due_range_is_still_sealed(c: Cluster) -> None:
    for i in range(30):
        c.create_topic(f"idle-{i:02d}", queues=4)
    # 120 queues, 10 sealer rounds a second on each leader: none of them is looked at.
    before, after = stays(c, 1.5)
    assert after == before, f"{after - before} idle queues looked at"
    # A queue that grows is looked at: 20 messages seal at once, the 5 after them by age alone.
    r = c.produce("idle-07", [{"key": "k", "value": str(i)} for i in range(25)])
    assert r.status_code == 200, r.text
    queue = r.json()["results"][0]["queue"]
    wait_until(lambda: sealed(c, "idle-07")[queue] == 20, 30, what="the full range sealed")
    wait_until(lambda: sealed(c, "idle-07")[queue] == 25, 30, what="the aged range sealed")
    assert sealed(c, "idle-07") == {q: 25 if q == queue else 0 for q in range(4)}
    # Sealed to its end, the queue is idle again (after one more look: more could have been due).
    time.sleep(0.5)
    before, after = stays(c, 1.5)
    assert after == before, f"{after - before} idle queues looked at"


def test_the_lag_history_has_every_topic_with_a_group_however_many_topics(c: Cluster) -> None:
    # Sampled in name order, only the first 200 topics had a history before.
    for i in range(205):
        c.create_topic(f"lag-{i:03d}", queues=2)
    assert c.produce("lag-204", [{"value": str(i), "queue": 0} for i in range(3)]).status_code == 200
    r = c.session.put(
        c.url() + "/v1/groups/billing/offsets", json={"topic": "lag-204", "offsets": {"0": 0}}, timeout=10
    )
    assert r.status_code == 200, r.text

    def billing_lag(node: str) -> int | None:
        answer = c.get("/v1/topics/lag-204/groups/lag", node=node).json()
        found = [g["samples"] for g in answer["groups"] if g["group"] == "billing"]
        return found[0][-1][1] if found and found[0] else None

    lag = sum(
        g["lag"] for g in c.get("/v1/topics/lag-204/groups").json()["groups"] if g["group"] == "billing"
    )
    assert lag == 3
    for node in c.nodes:
        wait_until(lambda n=node: billing_lag(n) == 3, 30, what=f"{node}'s lag sample of lag-204")
    # A topic without a group has no series.
    assert c.get("/v1/topics/lag-203/groups/lag").json()["groups"] == []


def terms_and_applied(c: Cluster) -> dict[str, tuple[int, int]]:
    """Each queue group's term and applied index on every node."""
    return {
        f"{nid}/{g}": (s["term"], s["applied_index"])
        for nid in c.nodes
        for g, s in c.status(nid)["groups"].items()
        if g != "meta"
    }


def proposed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Entries each replica applied in between, less one per term: an election a loaded machine
    may hold meanwhile appends its leader's no-op, which no queue asked for."""
    return {k: (after[k][1] - before[k][1]) - (after[k][0] - before[k][0]) for k in before}


def test_idle_queues_with_retention_add_no_entries_and_an_aged_message_still_goes(c: Cluster) -> None:
    for i in range(30):
        c.create_topic(f"kept-{i:02d}", queues=4, retention_ms=1500, retention_bytes=10_000)
    assert c.produce("kept-03", [{"key": "k", "value": "old"}]).status_code == 200

    def low_high() -> list[tuple[int, int]]:
        return [(q["low_offset"], q["high_offset"]) for q in c.get("/v1/topics/kept-03").json()["queues"]]

    # Retention checks every 200 ms: the aged message goes, the queue keeps its high offset.
    wait_until(lambda: sorted(low_high())[-1] == (1, 1), 30, what="the aged message removed")
    time.sleep(0.5)  # the leaders look once more after their own retain
    before = terms_and_applied(c)
    time.sleep(1.5)
    after = terms_and_applied(c)
    extra = proposed(before, after)
    assert max(extra.values()) <= 0, f"entries proposed for idle queues: {extra}, {before} -> {after}"
    # Within its byte bound a queue keeps its messages; over it, the oldest go at the next tick.
    r = c.produce("kept-04", [{"key": "k", "value": "v" * 6_000}])
    queue = r.json()["results"][0]["queue"]
    assert c.produce("kept-04", [{"key": "k", "value": "w" * 6_000}]).status_code == 200
    wait_until(
        lambda: c.get("/v1/topics/kept-04").json()["queues"][queue]["low_offset"] == 1, 30, what="size"
    )


def test_idle_nodes_do_not_ask_each_other_for_the_placement_and_a_change_still_reaches_them(
    c: Cluster,
) -> None:
    # Every metadata replica hears from its leader: the reconcilers read their own replica
    # (they asked both peers every second before: 6 requests a second in this cluster).
    before = c.requests_served("/internal/placement")
    time.sleep(3.0)
    assert c.requests_served("/internal/placement") == before
    # A placement change still reaches the nodes: a queue group's leadership moved to another
    # replica stays there, so that replica's node knows it is now the preferred leader (with
    # the old placement its leader balancer would hand the leadership back within 3 s).
    group = "1"
    leader = c.leader(group)
    target = next(nid for nid in c.nodes if nid != leader)
    r = c.post(f"/v1/cluster/groups/{group}/leader", {"node": target})
    assert r.status_code == 202, r.text
    wait_until(lambda: c.leader(group) == target, timeout_s=30)
    time.sleep(5.0)
    # Waited for, not read once: a loaded machine may hold an election meanwhile, after which the
    # balancer hands the leadership back to the preferred replica. With the old placement the
    # balancer would have moved it back to the old leader and kept it there: this times out.
    wait_until(lambda: c.leader(group) == target, 30, what=f"{target} still leading group {group}")
