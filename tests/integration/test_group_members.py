"""GET /v1/topics/{topic}/groups/{group}/members on a real 3-node cluster: the members of a consumer
group (the Python client's clustering consumers) as the membership coordinator (the metadata
leader) sees them, asked of every node; a member that leaves disappears; the list is capped; bad
input is refused with stable codes; consumers without tokens keep their members through a
coordinator kill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftmq.client import Admin, Consumer

from .harness import Cluster, wait_until


def urls(c: Cluster) -> list[str]:
    return [n.url for n in c.nodes.values()]


def members(c: Cluster, topic: str, group: str, node: str | None = None) -> dict[str, Any]:
    r = c.get(f"/v1/topics/{topic}/groups/{group}/members", node=node)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def holding(answer: dict[str, Any]) -> dict[str, list[int]]:
    return {m["member_id"]: m["queues"] for m in answer["members"]}


def test_joined_consumers_appear_with_their_queues_and_a_member_that_leaves_disappears(
    cluster: Cluster,
) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topic("gm-orders", 4)
        admin.create_topic("gm-other", 2)
    assert members(cluster, "gm-orders", "ledger")["state"] == "empty"
    alpha = Consumer(
        urls(cluster), group="ledger", topics=["gm-orders", "gm-other"], member_id="alpha", wait_ms=200
    )
    beta = Consumer(urls(cluster), group="ledger", topics="gm-orders", member_id="beta", wait_ms=200)
    try:
        stable = wait_until(
            lambda: (a := members(cluster, "gm-orders", "ledger"))["state"] == "stable" and a,
            30,
            what="both members holding their queues",
        )
        assert holding(stable) == {"alpha": [0, 1], "beta": [2, 3]}  # average allocation by id
        assert stable["member_count"] == 2 and stable["truncated"] is False
        assert stable["unassigned_queues"] == []
        for m in stable["members"]:
            assert m["pending"] == [] and m["applied_generation"] == stable["generation"]
            assert 0 <= m["last_seen_ago_ms"] <= stable["session_timeout_ms"]
        # Every node answers the same (the others forward to the coordinator).
        for node in cluster.nodes:
            assert holding(members(cluster, "gm-orders", "ledger", node=node)) == {
                "alpha": [0, 1],
                "beta": [2, 3],
            }
        # On the other topic only alpha consumes; a member's other topics are not shown.
        other = members(cluster, "gm-other", "ledger")
        assert holding(other) == {"alpha": [0, 1]} and "gm-orders" not in str(other)
        beta.close()  # leaves the group
        after = wait_until(
            lambda: (a := members(cluster, "gm-orders", "ledger"))["state"] == "stable" and a,
            30,
            what="alpha holding every queue once beta left",
        )
        assert holding(after) == {"alpha": [0, 1, 2, 3]} and after["member_count"] == 1
        assert after["generation"] > stable["generation"]
    finally:
        beta.close()
        alpha.close()
    gone = members(cluster, "gm-orders", "ledger")
    assert gone["state"] == "empty" and gone["members"] == [] and gone["unassigned_queues"] == [0, 1, 2, 3]


def test_the_member_list_is_capped_and_says_how_many_there_are(cluster: Cluster) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topic("gm-many", 2)
    for i in range(105):
        r = cluster.post("/v1/groups/crowd/members", {"member_id": f"m{i:03}", "topics": ["gm-many"]})
        assert r.status_code == 200, r.text
    answer = members(cluster, "gm-many", "crowd")
    assert answer["member_count"] == 105 and answer["truncated"] is True
    assert [m["member_id"] for m in answer["members"]] == [f"m{i:03}" for i in range(100)]
    # Each member shows what its last heartbeat answer handed it: m000, alone at first, got both
    # queues and has not heartbeated since (so the group is rebalancing); m001 got queue 1 (m000
    # sends no generation, so no barrier holds it back); the others got none.
    assert answer["state"] == "rebalancing"
    assert [m["queues"] for m in answer["members"][:3]] == [[0, 1], [1], []]


def test_bad_input_is_refused_with_stable_codes_and_changes_nothing(cluster: Cluster) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topic("gm-bad", 1)
    r = cluster.post("/v1/groups/watched/members", {"member_id": "w", "topics": ["gm-bad"]})
    assert r.status_code == 200, r.text
    before = members(cluster, "gm-bad", "watched")
    cases = [
        ("/v1/topics/gm-bad/groups/watched/members?max=5", 400, "bad_request"),
        ("/v1/topics/gm-bad/groups/" + "g" * 256 + "/members", 400, "bad_request"),
        ("/v1/topics/no-such-topic/groups/watched/members", 404, "topic_not_found"),
    ]
    for path, status, code in cases:
        for node in cluster.nodes:
            r = cluster.get(path, node=node)
            assert r.status_code == status and r.json()["error"]["code"] == code, (path, node, r.text)
        # A client's body may not name the token a member acts for (only entry nodes send it).
        body = {"member_id": "w", "topics": ["gm-bad"], "token": "admin"}
        r = cluster.post("/v1/groups/watched/members", body, node=node)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (node, r.text)
    after = members(cluster, "gm-bad", "watched")
    assert holding(after) == holding(before) == {"w": [0]}
    assert after["generation"] == before["generation"]


def test_consumers_without_tokens_keep_their_members_through_a_coordinator_kill(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        with Admin(urls(c)) as admin:
            admin.create_topic("gm-kill", 4)
        consumers = [
            Consumer(urls(c), group="survivors", topics="gm-kill", member_id=f"s{i}", wait_ms=200)
            for i in range(2)
        ]
        got: set[str] = set()

        def drain(want: set[str]) -> bool:
            for consumer in consumers:
                for m in consumer.poll(timeout_ms=100):
                    got.add(str(m.value))
                    m.ack()
            return want <= got

        def produce(values: list[str], node: str) -> bool:
            r = c.post("/v1/topics/gm-kill/messages", {"messages": [{"value": v} for v in values]}, node)
            return bool(r.status_code == 200)

        try:
            coordinator = c.wait_leader("meta")
            survivor = next(n for n in c.nodes if n != coordinator)
            before = [f"b{i}" for i in range(40)]
            assert produce(before, survivor)
            wait_until(lambda: drain(set(before)), 60, what="the messages before the kill")
            c.kill(coordinator)
            after = [f"a{i}" for i in range(40)]
            wait_until(lambda: produce(after, survivor), 30, what="a produce after the kill")
            wait_until(lambda: drain(set(after)), 60, what="the messages after the kill")
            stable = wait_until(
                lambda: (
                    (a := members(c, "gm-kill", "survivors", survivor))["state"] == "stable"
                    and a["member_count"] == 2
                    and a
                ),
                60,
                what="both members at the new coordinator",
            )
            assert holding(stable) == {"s0": [0, 1], "s1": [2, 3]}
            assert [consumer.member_id for consumer in consumers] == ["s0", "s1"]
        finally:
            for consumer in consumers:
                consumer.close()
