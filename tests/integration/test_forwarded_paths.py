"""A request passed on to another node is the request its entry node routed, on a real 3-node
cluster (docs/security.md, "Forwarding"): a path segment a client names ``.`` or ``..``
(``%2E%2E``: a consumer group or member id may be any UTF-8) reaches the same route at the leader.
Before, the forwarding node's HTTP client removed such segments, as a URL's dot segments are:
a join under the group ``..`` through a node that does not lead the metadata group was passed on
as ``POST /v1/members`` (404 there, 200 through the leader), with the peer key, which the leader
serves without checking a token: a route shape where the shortened path names another route would
have been served unchecked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Cluster, running

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(tmp_path_factory.mktemp("forwarded-paths"))) as cluster:
        yield cluster


def test_dot_segments_reach_the_same_route_through_every_node(c: Cluster) -> None:
    c.create_topic("dots", queues=2)
    for node in c.nodes:
        for group, member in (("%2E%2E", "m-up"), ("%2E", "m-here")):
            path = f"/v1/groups/{group}/members"
            r = c.session.post(c.url(node) + path, json={"member_id": member, "topics": ["dots"]}, timeout=10)
            assert r.status_code == 200, (node, group, r.text)
            assert r.json()["group"] == group.replace("%2E", ".") and r.json()["member_id"] == member
            r = c.session.delete(c.url(node) + f"{path}/{member}", timeout=10)
            assert r.status_code == 200 and r.json()["left"] is True, (node, group, r.text)
        r = c.session.post(
            c.url(node) + "/v1/groups/g/members", json={"member_id": "..", "topics": ["dots"]}, timeout=10
        )
        assert r.status_code == 200, (node, r.text)
        r = c.session.delete(c.url(node) + "/v1/groups/g/members/%2E%2E", timeout=10)
        assert r.status_code == 200 and r.json()["left"] is True, (node, r.text)
