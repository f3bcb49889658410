"""Prometheus metrics on a real cluster: Raft state, latencies, fsyncs, queue depth, consumer lag,
in-flight and dead-letter counts, checked against what the test did; and the Grafana dashboard only
uses series a real scrape has."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "raftmq-dashboard.json"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("metrics")
    with Cluster(tmp, nodes=3, extra_toml="[delivery]\ntick_ms = 100\n") as cluster:
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
    ]


def scrape(c: Cluster, node: str) -> list[tuple[str, dict[str, str], float]]:
    r = c.get("/metrics", node)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.text[:300]
    return samples(r.text)


def values(c: Cluster, name: str, **labels: str) -> list[float]:
    """Every sample of ``name`` with ``labels``, over all running nodes."""
    return [
        v
        for n in c.nodes
        if c.alive(n)
        for s, found, v in scrape(c, n)
        if s == name and all(found.get(k) == w for k, w in labels.items())
    ]


def one(c: Cluster, name: str, **labels: str) -> float:
    """The single sample of ``name`` with ``labels`` in the whole cluster (leader-reported series).

    Nodes are scraped one after another, so while a group's leadership moves (the leader balancer
    does that after start-up) a pass can see no leader or two: scrape again until it sees one."""
    got: list[float] = []

    def single() -> bool:
        got[:] = values(c, name, **labels)
        return len(got) == 1

    wait_until(single, 15, what=f"exactly one {name} {labels}")
    return got[0]


def sub(topic: str, group: str, action: str = "") -> str:
    return f"/v1/topics/{topic}/subscriptions/{group}" + (f"/{action}" if action else "")


def test_metrics_expose_raft_state_latencies_fsyncs_and_message_counts(c: Cluster) -> None:
    c.create_topic("metered", queues=1)
    leader = c.wait_leader("meta")
    r = c.produce("metered", [{"value": f"m{i}"} for i in range(25)], node="n1")
    assert r.status_code == 200
    assert c.get("/v1/topics/metered/queues/0/messages", "n1", params={"offset": 0}).status_code == 200
    for _ in range(2):  # counted apart from the 200s (the middleware keeps a series per status)
        assert c.produce("no-such-topic", [{"value": "x"}], node="n1").status_code == 404

    text = scrape(c, "n1")

    def get(name: str, **labels: str) -> float:
        (v,) = [v for s, f, v in text if s == name and all(f.get(k) == w for k, w in labels.items())]
        return v

    assert get("raftmq_produced_messages_total") >= 25
    # A fetch is served (and counted) by the leader of the queue's group, wherever it arrived.
    assert sum(values(c, "raftmq_fetched_messages_total")) >= 25
    route = "/v1/topics/{topic}/messages"
    assert get("raftmq_http_requests_total", route=route, status="200", method="POST") >= 1
    assert get("raftmq_http_requests_total", route=route, status="404", method="POST") == 2
    assert get("raftmq_http_request_seconds_count", route=route, method="POST") >= 1
    for group in ("meta", "0", "1", "2"):
        assert get("raftmq_raft_term", node_id="n1", group_id=group) >= 1
        assert get("raftmq_raft_commit_index", node_id="n1", group_id=group) >= 1
        assert get("raftmq_raft_has_quorum", node_id="n1", group_id=group) == 1
        # Each group had exactly as many leader changes as elections won, over its replicas.
        assert sum(values(c, "raftmq_raft_became_leader_total", group_id=group)) >= 1
        # Exported per group (get finds exactly one sample); a quiet cluster holds no follower back.
        assert get("raftmq_raft_pre_vote_unanswered_campaigns_total", node_id="n1", group_id=group) >= 0
        assert get("raftmq_raft_follower_backlog_holds_total", node_id="n1", group_id=group) == 0
        assert get("raftmq_raft_compaction_deferrals_total", node_id="n1", group_id=group) == 0
    # Every replica applied the topic's entries (metadata and its queue group) and timed them.
    queue_group = str(c.get("/v1/topics/metered").json()["queue_groups"][0])
    for n in c.nodes:
        for group in ("meta", queue_group):
            assert values(c, "raftmq_raft_apply_seconds_count", node_id=n, group_id=group)[0] >= 1
    # Exactly one replica of the metadata group says it leads, and it is the one the cluster names.
    leads = {n: values(c, "raftmq_raft_is_leader", group_id="meta", node_id=n) for n in c.nodes}
    assert [n for n, v in leads.items() if v == [1.0]] == [leader]
    # The metadata leader proposed create_topic: its commit latency was observed there.
    assert one(c, "raftmq_raft_commit_seconds_count", group_id="meta", node_id=leader) >= 1
    # Every node fsynced its journals (durability "fsync" is the default), and timed each fsync.
    for n in c.nodes:
        assert values(c, "raftmq_journal_fsync_seconds_count", group_id="meta", node_id=n)[0] >= 1
        assert values(c, "raftmq_journal_fsync_seconds_sum", group_id="meta", node_id=n)[0] > 0


def test_each_fetch_wire_counts_what_it_read_once_at_the_node_that_read_it(c: Cluster) -> None:
    """raftmq_fetched_messages_total, through the fetch core: the JSON, binary and Arrow answers
    each add the messages they read, at the queue group's leader only (the node that forwarded
    the request adds nothing)."""
    c.create_topic("counted", queues=1)
    assert c.produce("counted", [{"value": f"c{i}"} for i in range(10)], node="n1").status_code == 200
    leader = c.get("/v1/topics/counted").json()["queues"][0]["leader"]
    entry = next(n for n in c.nodes if n != leader)  # every fetch below is forwarded once

    def counted() -> dict[str, float]:
        return {
            n: sum(v for s, _, v in scrape(c, n) if s == "raftmq_fetched_messages_total") for n in c.nodes
        }

    path = "/v1/topics/counted/queues/0/messages"
    before = counted()
    r = c.get(path, entry, params={"offset": 2, "max": 4})
    assert r.status_code == 200 and len(r.json()["messages"]) == 4
    binary = c.get(
        path, entry, params={"offset": 0, "max": 3}, headers={"Accept": "application/vnd.raftmq.batch"}
    )
    # Whole batches: every record at or above the offset in the batches sent counts.
    assert binary.status_code == 200 and int(binary.headers["X-Raftmq-Next-Offset"]) >= 3
    arrow = c.get(
        path, entry, params={"offset": 5, "max": 2}, headers={"Accept": "application/vnd.apache.arrow.stream"}
    )
    assert arrow.status_code == 200 and arrow.headers["X-Raftmq-Next-Offset"] == "7"
    after = counted()
    assert after[entry] == before[entry]
    assert after[leader] - before[leader] == 4 + int(binary.headers["X-Raftmq-Next-Offset"]) + 2


def test_queue_depth_and_consumer_lag_follow_produce_and_commit(c: Cluster) -> None:
    c.create_topic("lagging", queues=2)
    assert c.produce("lagging", [{"value": f"a{i}", "queue": 0} for i in range(10)]).status_code == 200
    assert c.produce("lagging", [{"value": f"b{i}", "queue": 1} for i in range(4)]).status_code == 200
    r = c.session.put(
        c.url() + "/v1/groups/billing/offsets", json={"topic": "lagging", "offsets": {"0": 3, "1": 4}}
    )
    assert r.status_code == 200, r.text

    # Queue series are reported by the leader of the queue's group only: one sample per queue.
    assert one(c, "raftmq_queue_high_offset", topic="lagging", queue="0") == 10
    assert one(c, "raftmq_queue_messages", topic="lagging", queue="1") == 4
    assert one(c, "raftmq_queue_appended_messages_total", topic="lagging", queue="0") == 10
    assert one(c, "raftmq_queue_retained_bytes", topic="lagging", queue="0") > 0
    lag = {"topic": "lagging", "consumer_group": "billing"}
    assert one(c, "raftmq_consumer_committed_offset", queue="0", **lag) == 3
    assert one(c, "raftmq_consumer_lag_messages", queue="0", **lag) == 10 - 3
    assert one(c, "raftmq_consumer_lag_messages", queue="1", **lag) == 0

    # More messages: the lag grows by exactly that many; a commit to the end brings it to 0.
    assert c.produce("lagging", [{"value": f"c{i}", "queue": 1} for i in range(6)]).status_code == 200
    assert one(c, "raftmq_consumer_lag_messages", queue="1", **lag) == 6
    r = c.session.put(c.url() + "/v1/groups/billing/offsets", json={"topic": "lagging", "offsets": {"1": 10}})
    assert r.status_code == 200, r.text
    assert one(c, "raftmq_consumer_lag_messages", queue="1", **lag) == 0

    # The same figures through the API the console reads.
    groups = c.get("/v1/topics/lagging/groups").json()
    assert groups["unavailable_queues"] == []
    (billing,) = groups["groups"]
    assert (billing["group"], billing["lag"]) == ("billing", 7)
    assert [(q["queue"], q["committed_offset"], q["high_offset"], q["lag"]) for q in billing["queues"]] == [
        (0, 3, 10, 7),
        (1, 10, 10, 0),
    ]


def test_in_flight_and_dead_letter_counts_follow_receive_nack_and_redrive(c: Cluster) -> None:
    c.create_topic("jobs", queues=1)
    r = c.session.put(c.url() + sub("jobs", "workers"), json={"max_deliveries": 1})
    assert r.status_code == 200, r.text
    assert c.produce("jobs", [{"value": f"j{i}"} for i in range(5)]).status_code == 200
    r = c.post(sub("jobs", "workers", "receive"), {"max": 3, "wait_ms": 2000, "visibility_ms": 60000})
    assert r.status_code == 200, r.text
    received = r.json()["messages"]
    assert len(received) == 3
    labels = {"topic": "jobs", "queue": "0", "consumer_group": "workers"}
    assert one(c, "raftmq_subscription_in_flight_messages", **labels) == 3
    assert one(c, "raftmq_consumer_lag_messages", **labels) == 5  # nothing finished yet
    assert one(c, "raftmq_subscription_dead_letters", **labels) == 0

    # A poison message: nacked at its last delivery, it moves to the dead-letter queue.
    poison, *rest = received
    r = c.post(sub("jobs", "workers", "nack"), {"receipts": [poison["receipt"]]})
    assert r.json()["results"][0].get("dead_lettered") is True, r.text
    r = c.post(sub("jobs", "workers", "ack"), {"receipts": [m["receipt"] for m in rest]})
    assert all(x.get("ok") for x in r.json()["results"]), r.text
    assert one(c, "raftmq_subscription_in_flight_messages", **labels) == 0
    assert one(c, "raftmq_subscription_dead_letters", **labels) == 1
    assert one(c, "raftmq_consumer_lag_messages", **labels) == 2  # the 2 never received
    # The dead-letter topic is a topic too: its queue holds the message.
    assert one(c, "raftmq_queue_messages", topic="jobs.workers.dlq", queue="0") == 1

    r = c.post(sub("jobs", "workers", "dlq/redrive"), {})
    assert r.status_code == 200 and r.json()["redriven"] == 1, r.text
    assert one(c, "raftmq_subscription_dead_letters", **labels) == 0
    assert one(c, "raftmq_queue_high_offset", topic="jobs", queue="0") == 6  # redriven = appended

    (workers,) = c.get("/v1/topics/jobs/groups").json()["groups"]
    assert (workers["group"], workers["in_flight"], workers["dead_letters"], workers["lag"]) == (
        "workers",
        0,
        0,
        3,
    )


def test_waiting_receivers_are_counted_at_their_coordinator_until_served(c: Cluster) -> None:
    """Three long polls, one sent to each node, wait in one line at the coordinator (the leader of
    queue 0's group), which counts them all; a produce serves them and the count goes back to none."""
    c.create_topic("polled", queues=1)
    answers: list[requests.Response] = []

    def poll(node: str) -> None:
        answers.append(c.post(sub("polled", "pollers", "receive"), {"max": 1, "wait_ms": 14_000}, node=node))

    threads = [threading.Thread(target=poll, args=(n,)) for n in c.nodes]
    for t in threads:
        t.start()
    labels = {"topic": "polled", "consumer_group": "pollers"}
    wait_until(lambda: values(c, "raftmq_receivers_waiting", **labels) == [3], 15, what="3 receivers waiting")
    assert c.produce("polled", [{"value": f"p{i}"} for i in range(3)]).status_code == 200
    for t in threads:
        t.join(30)
    assert sorted(len(r.json()["messages"]) for r in answers) == [1, 1, 1], [r.text for r in answers]
    assert values(c, "raftmq_receivers_waiting", **labels) == []


def test_a_failover_counts_a_leader_change_and_moves_the_queue_series(c: Cluster) -> None:
    c.create_topic("moved", queues=1)
    assert c.produce("moved", [{"value": "x"}]).status_code == 200
    group = str(c.get("/v1/topics/moved").json()["queue_groups"][0])
    # Not during the leader balancer's handover (a few seconds after a start or restart): a
    # handover between reading the leader and the term kills a follower, and no election follows.
    c.wait_balanced()
    old = c.wait_leader(group)
    others = [n for n in c.nodes if n != old]
    became = {n: values(c, "raftmq_raft_became_leader_total", group_id=group, node_id=n)[0] for n in others}
    term = max(values(c, "raftmq_raft_term", group_id=group))
    c.kill(old)
    try:
        new = c.wait_leader(group, exclude=old)
        now = {n: values(c, "raftmq_raft_became_leader_total", group_id=group, node_id=n)[0] for n in others}
        new_term = max(values(c, "raftmq_raft_term", group_id=group))  # read after the wins
        assert values(c, "raftmq_raft_term", group_id=group, node_id=new)[0] > term
        # The new leader counted its win. A loaded machine may see more than one election (a
        # split vote, a leader that lost its quorum for a moment), but no term has two leaders:
        # the wins counted are at most the terms that passed.
        assert now[new] >= became[new] + 1, (became, now)
        assert 1 <= sum(now.values()) - sum(became.values()) <= new_term - term, (became, now, term, new_term)
        # The new leader reports the queue now, and only it.
        wait_until(
            lambda: values(c, "raftmq_queue_high_offset", topic="moved", queue="0") == [1],
            30,
            what="the queue reported by its new leader only",
        )
        assert values(c, "raftmq_raft_is_leader", group_id=group, node_id=new) == [1.0]
    finally:
        c.start(old)
        c.wait_ready([old], timeout_s=60)


def _expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item)


def test_the_grafana_dashboard_uses_only_series_a_real_scrape_has(c: Cluster) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    expressions = list(_expressions(dashboard))
    assert len(expressions) >= 10
    # Make every kind of series exist: a consumer group with receive/ack state on a fresh topic.
    c.create_topic("dashboarded", queues=1)
    assert c.produce("dashboarded", [{"value": "d"}]).status_code == 200
    assert c.post(sub("dashboarded", "viewers", "receive"), {"max": 1, "wait_ms": 2000}).status_code == 200
    names = {s for n in c.nodes for s, _, _ in scrape(c, n)}
    used = {m for e in expressions for m in re.findall(r"\b(raftmq_[a-z_]+)", e)}
    assert used, expressions
    assert used <= names, f"dashboard series missing from /metrics: {sorted(used - names)}"
    # Every label the dashboard filters or groups on exists on the series it is used with.
    for e in expressions:
        for metric, labels in re.findall(r"(raftmq_[a-z_]+)\{([^}]*)\}", e):
            keys = set(re.findall(r"(\w+)\s*[=!~]", labels))
            have = {k for n in c.nodes for s, f, _ in scrape(c, n) if s == metric for k in f}
            assert keys <= have, f"{metric}: labels {sorted(keys - have)} not exposed ({e})"


def test_each_replica_reports_its_stores_background_work_and_a_flush_shows(c: Cluster) -> None:
    """raftmq_rocksdb_*: per replica and store, RocksDB's own figures. 20 MiB into one queue group
    fills more than one 16 MiB memtable of its state store on every replica: a level-0 file each."""
    c.create_topic("flushed", queues=1)
    group = str(c.get("/v1/topics/flushed").json()["queue_groups"][0])
    value = "x" * 1000
    for _ in range(10):  # 2,000 messages of 1,000 bytes a request: 20 MB
        assert c.produce("flushed", [{"value": value}] * 2000).status_code == 200
    for n in c.nodes:
        for g in ("meta", "0", "1", "2"):
            for store in ("state", "raft"):
                for name in (
                    "raftmq_rocksdb_pending_compaction_bytes",
                    "raftmq_rocksdb_running_compactions",
                    "raftmq_rocksdb_running_flushes",
                    "raftmq_rocksdb_level0_files",
                    "raftmq_rocksdb_delayed_write_rate_bytes",
                    "raftmq_rocksdb_writes_stopped",
                    "raftmq_rocksdb_blob_file_bytes",
                    "raftmq_rocksdb_blob_garbage_bytes",
                ):
                    assert len(values(c, name, node_id=n, group_id=g, store=store)) == 1, (n, g, store, name)

    def flushed_everywhere() -> bool:
        return all(
            values(c, "raftmq_rocksdb_level0_files", node_id=n, group_id=group, store="state")[0] >= 1
            and values(c, "raftmq_rocksdb_running_flushes", node_id=n, group_id=group, store="state")[0] == 0
            for n in c.nodes
        )

    wait_until(flushed_everywhere, 30, what=f"a flushed memtable of group {group}'s state on every node")
