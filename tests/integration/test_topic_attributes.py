"""Topic attributes over the REST API: given at creation, merged by ``PATCH /v1/topics/{topic}``
(null removes one) through any node, and bad ones refused with nothing changed."""

from __future__ import annotations

from .conftest import assert_error
from .harness import Cluster


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
    for node in cluster.nodes:
        got = cluster.get("/v1/topics/with-attributes", node).json()
        assert got["attributes"] == {"owner": "ana", "team": "billing"}, node


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
