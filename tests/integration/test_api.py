"""The public HTTP API v1 against real node processes: topics, produce, fetch, long polls,
consumer-group offsets, the cluster view, leader balancing and a leader crash under load."""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.cluster.api.app import key_queue

from .conftest import assert_error, describe, fetch, wait_applied_everywhere, wait_topic_gone
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

BINARY = bytes(range(256))


def sample_messages(tag: str, queue: int) -> list[dict[str, Any]]:
    """Messages of every shape: text, keyed, with headers, binary, unicode, empty."""
    return [
        {"value": f"{tag}-plain", "queue": queue},
        {"value": f"{tag}-keyed", "key": f"k-{tag}", "queue": queue},
        {"value": "héllo 世界 👋", "headers": {"h1": "v1", "ключ": "знач"}, "queue": queue},
        {"value_b64": base64.b64encode(BINARY).decode(), "key": "bin", "queue": queue},
        {"value": "", "headers": {}, "queue": queue},
    ]


def expected(sent: dict[str, Any]) -> dict[str, Any]:
    """What a fetch returns for a produced message (without offset and timestamp)."""
    out: dict[str, Any] = {"key": sent.get("key"), "headers": sent.get("headers") or {}}
    out["value_b64" if "value_b64" in sent else "value"] = sent.get("value_b64", sent.get("value"))
    return out


def content(fetched: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fetched.items() if k not in ("offset", "timestamp_ms")}


def fetch_range(c: Cluster, topic: str, queue: int, node: str, read_from: str) -> dict[int, dict[str, Any]]:
    return {m["offset"]: m for m in c.fetch_all(topic, queue, node=node, read_from=read_from)}


# -- topics -----------------------------------------------------------------------------------


def test_topic_lifecycle_create_list_describe_delete_and_recreate(cluster: Cluster) -> None:
    c = cluster
    created = c.create_topic("life", queues=4, node="n1")
    assert created["name"] == "life" and created["queues"] and len(created["queues"]) == 4
    for i, q in enumerate(created["queues"]):
        assert q["queue"] == i and q["group_id"] == created["queue_groups"][i]
        assert q["leader"] in c.nodes and sorted(q["replicas"]) == sorted(c.nodes)
        assert (q["low_offset"], q["high_offset"]) == (0, 0)

    assert_error(c.post("/v1/topics", {"name": "life"}, node="n2"), 409, "topic_exists")
    listed = c.get("/v1/topics", "n3").json()["topics"]
    assert [t["id"] for t in listed if t["name"] == "life"] == [created["id"]]
    for nid in c.nodes:
        d = describe(c, "life", nid)
        assert d["id"] == created["id"] and [q["queue"] for q in d["queues"]] == [0, 1, 2, 3]

    assert c.produce("life", [{"value": "old", "queue": 1}]).status_code == 200
    r = c.session.delete(c.url("n2") + "/v1/topics/life", timeout=30)
    assert r.status_code == 200 and r.json() == {"deleted": "life"}, r.text
    for nid in c.nodes:
        wait_topic_gone(c, "life", nid)
        assert_error(c.get("/v1/topics/life", nid), 404, "topic_not_found")
        assert_error(c.produce("life", [{"value": "x"}], node=nid), 404, "topic_not_found")
    assert "life" not in [t["name"] for t in c.get("/v1/topics").json()["topics"]]

    again = c.create_topic("life", queues=4, node="n3")
    assert again["id"] != created["id"]
    assert all((q["low_offset"], q["high_offset"]) == (0, 0) for q in again["queues"])
    r = c.produce("life", [{"value": "new", "queue": 1}], node="n1")
    assert r.json() == {"results": [{"queue": 1, "offset": 0}]}, r.text
    assert [m["value"] for m in c.fetch_all("life", 1)] == ["new"]


# -- produce and fetch ------------------------------------------------------------------------


def test_produce_through_every_node_is_fetched_identically_everywhere(cluster: Cluster) -> None:
    c = cluster
    topic = c.create_topic("everywhere", queues=3)
    leaders = {q["queue"]: q["leader"] for q in topic["queues"]}
    sent: dict[tuple[int, int], dict[str, Any]] = {}
    through_follower = 0
    for nid in c.nodes:
        for q in range(3):
            msgs = sample_messages(f"{nid}-q{q}", q)
            r = c.produce("everywhere", msgs, node=nid)
            assert r.status_code == 200, r.text
            through_follower += nid != leaders[q]
            for m, res in zip(msgs, r.json()["results"], strict=True):
                assert res["queue"] == q
                sent[(q, res["offset"])] = m
    assert through_follower >= 6  # each group got requests through both of its followers

    for q in range(3):  # offsets are dense from 0 per queue
        assert sorted(o for qq, o in sent if qq == q) == list(range(15))
    wait_applied_everywhere(c, "everywhere")
    reads: list[dict[tuple[int, int], dict[str, Any]]] = []
    for nid in c.nodes:
        for read_from in ("leader", "local"):
            got = {
                (q, o): m
                for q in range(3)
                for o, m in fetch_range(c, "everywhere", q, nid, read_from).items()
            }
            assert set(got) == set(sent), (nid, read_from)
            for key, m in sent.items():
                assert content(got[key]) == expected(m), (nid, read_from, key)
            reads.append(got)
    assert all(r == reads[0] for r in reads)  # same timestamps too: one log, one truth


def test_keyed_messages_always_go_to_the_same_queue_and_explicit_queue_wins(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("keys", queues=5)
    seen: dict[str, set[int]] = {}
    for round_ in range(3):
        for nid in c.nodes:
            msgs = [{"value": f"{round_}", "key": f"user-{i}"} for i in range(20)]
            r = c.produce("keys", msgs, node=nid)
            assert r.status_code == 200, r.text
            for m, res in zip(msgs, r.json()["results"], strict=True):
                seen.setdefault(m["key"], set()).add(res["queue"])
    for key, queues in seen.items():
        assert queues == {key_queue(key, 5)}, key
    assert len({q for qs in seen.values() for q in qs}) > 1  # keys spread over queues

    r = c.produce("keys", [{"value": "pinned", "key": "user-0", "queue": (key_queue("user-0", 5) + 1) % 5}])
    assert r.json()["results"][0]["queue"] == (key_queue("user-0", 5) + 1) % 5
    # Offsets per queue are dense from 0.
    for q in range(5):
        offsets = [m["offset"] for m in c.fetch_all("keys", q)]
        assert offsets == list(range(len(offsets)))
    assert sum(len(c.fetch_all("keys", q)) for q in range(5)) == 3 * 3 * 20 + 1


def test_long_poll_returns_as_soon_as_a_message_is_committed(cluster: Cluster) -> None:
    c = cluster
    info = c.create_topic("poll", queues=1)
    leader = info["queues"][0]["leader"]
    follower = next(n for n in c.nodes if n != leader)  # the poll is forwarded to the leader
    result: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        r = requests.get(
            c.url(follower) + "/v1/topics/poll/queues/0/messages",
            params={"offset": 0, "wait_ms": 15_000},
            timeout=60,
        )
        result.update(response=r, returned=time.monotonic(), took=time.monotonic() - started)

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    assert t.is_alive(), "the fetch returned before anything was produced"
    r = c.produce("poll", [{"value": "wake up", "key": "k"}], node=leader)
    assert r.status_code == 200, r.text
    t.join(60)
    body = result["response"].json()
    assert [(m["offset"], m["value"], m["key"]) for m in body["messages"]] == [(0, "wake up", "k")]
    assert body["next_offset"] == 1 and body["high_offset"] == 1
    # Woken by the commit, not by the 15 s timeout (latency figures belong to the benchmarks; the
    # bound leaves a slow machine plenty).
    assert result["took"] < 10.0, result["took"]

    started = time.monotonic()
    r = fetch(c, "poll", 0, follower, offset=1, wait_ms=1000)
    took = time.monotonic() - started
    assert r.status_code == 200 and r.json()["messages"] == [] and r.json()["next_offset"] == 1
    assert 0.9 <= took < 10.0, took  # it waited (the lower bound); the upper one is generous


# -- consumer group offsets -------------------------------------------------------------------


def test_consumer_group_offsets_are_replicated_per_group_and_range_checked(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("offs", queues=3)  # three queues in three queue groups
    for q in range(3):
        assert c.produce("offs", [{"value": str(i), "queue": q} for i in range(5)]).status_code == 200

    def put(group: str, offsets: dict[str, int], node: str) -> requests.Response:
        return c.session.put(
            c.url(node) + f"/v1/groups/{group}/offsets",
            json={"topic": "offs", "offsets": offsets},
            timeout=30,
        )

    def get(group: str, node: str) -> dict[str, Any]:
        r = c.get(f"/v1/groups/{group}/offsets", node, params={"topic": "offs"})
        assert r.status_code == 200, r.text
        offsets: dict[str, Any] = r.json()["offsets"]
        return offsets

    assert put("g1", {"0": 2, "1": 5}, "n1").json() == {
        "ok": True,
        "offsets": {"0": {"offset": 2, "applied": True}, "1": {"offset": 5, "applied": True}},
    }
    assert put("g2", {"2": 1}, "n2").json() == {"ok": True, "offsets": {"2": {"offset": 1, "applied": True}}}
    for nid in c.nodes:  # linearizable: every node sees the commits at once
        assert get("g1", nid) == {"0": 2, "1": 5, "2": None}
        assert get("g2", nid) == {"0": None, "1": None, "2": 1}
        assert get("never", nid) == {"0": None, "1": None, "2": None}

    assert put("g1", {"0": 3}, "n3").status_code == 200  # moves only queue 0
    assert get("g1", "n1") == {"0": 3, "1": 5, "2": None}

    e = assert_error(put("g1", {"1": 6}, "n1"), 416, "offset_out_of_range")
    assert (e["low_offset"], e["high_offset"]) == (0, 5)
    # Several queue groups: one offset out of range refuses the whole request.
    e = assert_error(put("g1", {"0": 0, "2": 99}, "n2"), 416, "offset_out_of_range")
    assert (e["low_offset"], e["high_offset"]) == (0, 5)
    assert get("g1", "n3") == {"0": 3, "1": 5, "2": None}


def test_committed_offsets_are_listed_in_queue_order(cluster: Cluster) -> None:
    """The README's `GET /v1/groups/billing/offsets?topic=orders` answered
    {"2":null,"0":null,"3":1,"1":null} (queues by queue group): a reader's queues go 0, 1, 2, ..."""
    c = cluster
    c.create_topic("offs-order", queues=7)  # more queues than queue groups: each group holds several
    assert c.produce("offs-order", [{"value": "v", "queue": 5}]).status_code == 200
    r = c.session.put(c.url() + "/v1/groups/g/offsets", json={"topic": "offs-order", "offsets": {"5": 1}})
    assert r.status_code == 200, r.text
    for nid in c.nodes:
        r = c.get("/v1/groups/g/offsets", nid, params={"topic": "offs-order"})
        assert r.status_code == 200, r.text
        assert list(r.json()["offsets"].items()) == [(str(q), 1 if q == 5 else None) for q in range(7)]


# -- cluster view, health, metrics ------------------------------------------------------------


def settled_view(c: Cluster, nid: str) -> dict[str, Any] | None:
    """``GET /v1/cluster`` at ``nid`` once it shows every node reachable and one leader per group.

    Statuses are gathered node by node, so while a leadership moves (the leader balancer after
    start-up, an election on a busy machine) a view can show the old leader and the new one, or
    none: such a view is read again."""
    view: dict[str, Any] = c.get("/v1/cluster", nid).json()
    settled = all(n["reachable"] for n in view["nodes"]) and all(
        g["leader"] in c.nodes and [r["node_id"] for r in g["replicas"] if r["is_leader"]] == [g["leader"]]
        for g in view["groups"]
    )
    return view if settled else None


def test_cluster_view_health_and_metrics(cluster: Cluster) -> None:
    c = cluster
    for nid in c.nodes:
        assert c.get("/healthz", nid).json() == {"status": "ok", "node_id": nid}
        wait_until(lambda nid=nid: c.get("/readyz", nid).status_code == 200, 30, what=f"{nid} ready")
        view = wait_until(lambda nid=nid: settled_view(c, nid), 30, what=f"a settled view at {nid}")
        assert view["node_id"] == nid
        assert [n["id"] for n in view["nodes"]] == ["n1", "n2", "n3"]
        assert all(n["reachable"] for n in view["nodes"])
        assert [g["group_id"] for g in view["groups"]] == ["meta", "0", "1", "2"]
        for g in view["groups"]:
            assert g["leader"] in c.nodes and g["term"] >= 1, g
            assert sorted(r["node_id"] for r in g["replicas"]) == ["n1", "n2", "n3"]
            assert [r["node_id"] for r in g["replicas"] if r["is_leader"]] == [g["leader"]]
    metrics = c.get("/metrics").text
    assert "raftmq_http_requests" in metrics and 'route="/v1/cluster"' in metrics


# -- own clusters: five nodes, and a leader crash ---------------------------------------------


def test_leaders_spread_over_five_nodes(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=5, queue_groups=5) as c:
        c.start()
        c.wait_ready()

        def spread() -> Counter[str] | None:
            leaders = [c.leader(str(g)) for g in range(5)]
            if None in leaders:
                return None
            counts = Counter(str(n) for n in leaders)
            return counts if max(counts.values()) <= 2 else None

        # The nodes hand each group's leadership to its first replica every ~3 s.
        counts = wait_until(spread, 30, interval_s=0.5, what="leaders spread over the nodes")
        assert sum(counts.values()) == 5


class Producer(threading.Thread):
    """Produces requests of 20 messages through one node, retrying retriable errors with the same
    producer_id/sequence (so a retry is stored once); records every acknowledged message."""

    def __init__(self, url: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{url}/v1/topics/{topic}/messages"
        self.acked: dict[tuple[int, int], str] = {}
        self.retried: list[str] = []
        self.failure: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            seq = 0
            while not self.stop.is_set() and self.failure is None:
                values = [f"m-{seq}-{i}" for i in range(20)]
                body = {"messages": [{"value": v} for v in values], "producer_id": "p1", "sequence": seq}
                self._send(session, body, values)
                seq += 1

    def _send(self, session: requests.Session, body: dict[str, Any], values: list[str]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = session.post(self.url, json=body, timeout=30)
            except requests.RequestException as e:
                self.retried.append(repr(e))
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                for v, res in zip(values, r.json()["results"], strict=True):
                    self.acked[(res["queue"], res["offset"])] = v
                return
            if not r.json()["error"]["retriable"]:
                self.failure = r.text
                return
            self.retried.append(r.json()["error"]["code"])
            time.sleep(0.1)
        self.failure = f"no answer within 60 s for sequence {body['sequence']}"


def assert_acked_present(c: Cluster, topic: str, acked: dict[tuple[int, int], str], node: str) -> None:
    got = {(0, o): m["value"] for o, m in fetch_range(c, topic, 0, node, "local").items()}
    wrong = [k for k, v in acked.items() if got.get(k) != v]
    assert not wrong, f"{len(wrong)} acknowledged messages missing or different on {node}: {wrong[:5]}"


def test_kill_queue_group_leader_under_load_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        info = c.create_topic("crash", queues=1)
        group = str(info["queues"][0]["group_id"])
        victim = c.wait_leader(group)
        via = next(n for n in c.nodes if n != victim)
        producer = Producer(c.url(via), "crash")
        producer.start()
        try:
            wait_until(lambda: len(producer.acked) >= 400, 30, what="400 acknowledged messages")
            c.kill(victim)
            new_leader = c.wait_leader(group, exclude=victim, timeout_s=30)
            after = len(producer.acked)
            wait_until(lambda: len(producer.acked) >= after + 400, 60, what="400 more after the election")
        finally:
            producer.stop.set()
            producer.join(90)
        assert producer.failure is None, producer.failure
        acked = producer.acked
        assert sorted(o for _, o in acked) == list(range(len(acked)))  # no gap, no duplicate

        live = [n for n in c.nodes if n != victim]
        c.wait_replicas_equal(group, live)
        for nid in live:
            assert_acked_present(c, "crash", acked, nid)

        c.start(victim)
        c.wait_ready([victim], timeout_s=60)
        c.wait_replicas_equal(group, timeout_s=60)
        assert_acked_present(c, "crash", acked, victim)
        r = fetch(c, "crash", 0, victim, offset=0, max=5)
        assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == [
            acked[(0, o)] for o in range(5)
        ]
        assert new_leader != victim
