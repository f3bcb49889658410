"""Topic attributes over the REST API: given at creation, merged by ``PATCH /v1/topics/{topic}``
(null removes one) through any node, and bad ones refused with nothing changed."""

from __future__ import annotations

from .conftest import assert_error
from .harness import Cluster, wait_until


def test_attributes_are_set_merged_and_removed_through_any_node(cluster: Cluster) -> None:
    created = cluster.create_topic("with-attributes", attributes={"team": "billing", "tier": "gold"})
    assert created["attributes"] == {"team": "billing", "tier": "gold"}
    r = cluster.session.patch(
        cluster.url("n2") + "/v1/topics/with-attributes",
        json={"attributes": {"tier": None, "owner": "ana"}},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["attributes"] == {"owner": "ana", "team": "billing"}
    assert cluster.get("/v1/topics/with-attributes", "n2").json()["attributes"] == {
        "owner": "ana",
        "team": "billing",
    }
    for node in cluster.nodes:  # the other replicas follow within a heartbeat
        wait_until(
            lambda node=node: (
                cluster.get("/v1/topics/with-attributes", node).json()["attributes"]
                == {"owner": "ana", "team": "billing"}
            ),
            10,
            what=f"the change on {node}",
        )


def test_bad_attributes_are_refused_and_change_nothing(cluster: Cluster) -> None:
    cluster.create_topic("attributes-kept", attributes={"a": "1"})
    for body in ({"attributes": {"bad name": "x"}}, {"attributes": {"a": 1}}, {"attributes": []}, {}):
        r = cluster.session.patch(cluster.url("n3") + "/v1/topics/attributes-kept", json=body, timeout=30)
        assert_error(r, 400, "bad_request")
    r = cluster.session.patch(
        cluster.url("n1") + "/v1/topics/nope", json={"attributes": {"a": "1"}}, timeout=30
    )
    assert_error(r, 404, "topic_not_found")
    assert cluster.get("/v1/topics/attributes-kept").json()["attributes"] == {"a": "1"}
    assert_error(
        cluster.post("/v1/topics", {"name": "attributes-bad", "attributes": {"a": None}}), 400, "bad_request"
    )
    assert cluster.get("/v1/topics/attributes-bad").status_code == 404


def test_a_node_reads_back_the_topic_changes_it_passed_on(cluster: Cluster) -> None:
    """A write to the metadata group made through a node that does not lead it returns once that
    node's own replica has applied it: a client that reads back through the same node sees its
    change at once, never the topic as it was (the SQS API's SetQueueAttributes then
    GetQueueAttributes rely on it)."""
    leader = cluster.wait_leader("meta")
    for node in (n for n in cluster.nodes if n != leader):
        url = cluster.url(node) + "/v1/topics/read-back"
        for i in range(15):
            r = cluster.session.post(cluster.url(node) + "/v1/topics", json={"name": "read-back"}, timeout=30)
            assert r.status_code == 201, r.text
            assert [t["name"] for t in cluster.get("/v1/topics", node).json()["topics"]].count(
                "read-back"
            ) == 1
            r = cluster.session.patch(url, json={"attributes": {"round": str(i)}}, timeout=30)
            assert r.status_code == 200, r.text
            assert cluster.get("/v1/topics/read-back", node).json()["attributes"] == {"round": str(i)}, (
                node,
                i,
            )
            assert cluster.session.delete(url, timeout=30).status_code == 200
            assert_error(cluster.get("/v1/topics/read-back", node), 404, "topic_not_found")
