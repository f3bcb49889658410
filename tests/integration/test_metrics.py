"""Prometheus metrics: request counters, Raft state per group, journal fsyncs, message counts."""

from __future__ import annotations

import re

from .harness import Cluster


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels}")


def test_metrics_expose_raft_state_fsyncs_and_message_counts(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("metered", queues=1)
    leader = c.wait_leader("meta")
    r = c.produce("metered", [{"value": f"m{i}"} for i in range(25)], node="n1")
    assert r.status_code == 200
    queue = r.json()["results"][0]["queue"]
    assert c.get("/v1/topics/metered/queues/0/messages", "n1", params={"offset": 0}).status_code == 200
    assert queue == 0

    text = c.get("/metrics", "n1").text
    assert sample(text, "raftmq_produced_messages_total") >= 25
    # A fetch is served (and counted) by the leader of the queue's group, wherever it arrived.
    fetched = sum(sample(c.get("/metrics", n).text, "raftmq_fetched_messages_total") for n in c.nodes)
    assert fetched >= 25
    assert sample(text, "raftmq_http_requests_total", route="/v1/topics/{topic}/messages", status="200") >= 1
    for group in ("meta", "0", "1", "2"):
        assert sample(text, "raftmq_raft_term", node_id="n1", group=group) >= 1
        assert sample(text, "raftmq_raft_commit_index", node_id="n1", group=group) >= 1
    # Exactly one replica of the metadata group says it leads, and it is the one the cluster names.
    leads = [sample(c.get("/metrics", n).text, "raftmq_raft_is_leader", group="meta") for n in c.nodes]
    assert leads.count(1.0) == 1 and leads[list(c.nodes).index(leader)] == 1.0
    # Every node fsynced its journals (durability "fsync" is the default).
    for n in c.nodes:
        assert sample(c.get("/metrics", n).text, "raftmq_journal_fsyncs_total", group="meta") >= 1
