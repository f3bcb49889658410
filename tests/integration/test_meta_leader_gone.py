"""A node that looks a topic up at a metadata leader that was just killed answers a retriable
503, never a 500 (the connection error escaped as ``internal``, seen in test_delivery_failover)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Cluster

pytestmark = pytest.mark.timeout(120)


def test_a_topic_lookup_at_a_killed_metadata_leader_is_unavailable_not_internal(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        leader = c.wait_leader("meta")
        others = [n for n in c.nodes if n != leader]
        for n in others:  # each knows the leader (so a lookup goes there)
            assert c.get("/v1/topics/not-here", n).status_code == 404
        c.kill(leader)
        statuses = []
        for n in others:
            r = c.get("/v1/topics/not-here", n)  # not in the local replica: asked at the leader
            statuses.append(r.status_code)
            assert r.status_code in (404, 503), r.text
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "unavailable" and r.json()["error"]["retriable"]
        assert 503 in statuses, statuses  # the dead leader was asked (else the test proves nothing)
