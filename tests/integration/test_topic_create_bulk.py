"""Creating many topics in one request (issue 25): ``POST /v1/topics {"topics": [...]}`` makes them
in one metadata entry through any node, answers per topic (an existing name fails alone), refuses
more than ``limits.max_topics_per_request`` and a token without admin on any one name whole; the
CLI uses it in chunks, and creates one by one while a metadata voter cannot apply it yet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.client import Admin, TopicExists, TopicInfo

from .harness import Cluster
from .test_cli import raftmq

pytestmark = pytest.mark.timeout(180)

ADMIN = "bulk-admin-token-Qe4Rt7Yu1Io9"
TENANT = "bulk-tenant-token-Zx3Cv6Bn8Mq2"  # admin on tenant-* and shared.* (not on shared)
LIMIT = 5
CONFIG = (
    f"[limits]\nmax_topics_per_request = {LIMIT}\n"
    "[security]\n"
    f'[[security.tokens]]\nname = "admin"\ntoken = "{ADMIN}"\n'
    'admin = ["*"]\nproduce = ["*"]\nconsume = ["*"]\n'
    f'[[security.tokens]]\nname = "tenant"\ntoken = "{TENANT}"\n'
    'admin = ["tenant-*", "shared.*"]\nproduce = []\nconsume = []\n'
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("create-bulk"), extra_toml=CONFIG) as c:
        c.session.headers["Authorization"] = f"Bearer {ADMIN}"
        c.start()
        c.wait_ready()
        yield c
        for nid in c.nodes:
            assert c.alive(nid), f"{nid} died:\n{c.log(nid)[-3000:]}"


def names(c: Cluster) -> set[str]:
    return {t["name"] for t in c.get("/v1/topics").json()["topics"]}


def follower(c: Cluster) -> str:
    leader = c.wait_leader("meta")
    return next(n for n in c.nodes if n != leader)


def meta_entries(c: Cluster) -> int:
    """The metadata group's commit index at its leader."""
    return int(c.status(c.wait_leader("meta"))["groups"]["meta"]["commit_index"])


def bulk(c: Cluster, specs: list[Any], node: str | None = None, token: str = ADMIN) -> requests.Response:
    return c.post("/v1/topics", {"topics": specs}, node=node, headers={"Authorization": f"Bearer {token}"})


def test_many_topics_in_one_request_through_a_follower(cluster: Cluster) -> None:
    node = follower(cluster)
    before = meta_entries(cluster)
    specs = [
        {"name": "b-1", "queues": 2},
        {"name": "b-2", "queues": 3, "retention_ms": 60_000},
        {"name": "b-3", "queues": 1, "attributes": {"team": "payments"}},
    ]
    r = bulk(cluster, specs, node=node)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(x["name"], x["topic"]["name"], x["topic"]["queues"]) for x in results] == [
        ("b-1", "b-1", 2),
        ("b-2", "b-2", 3),
        ("b-3", "b-3", 1),
    ]
    assert meta_entries(cluster) - before <= 2  # the entry (and a leader's noop at most), not 3
    # The node that passed the request on reads its own write at once.
    described = cluster.get("/v1/topics/b-2", node=node).json()
    assert (len(described["queues"]), described["retention_ms"]) == (3, 60_000)
    assert cluster.get("/v1/topics/b-3", node=node).json()["attributes"] == {"team": "payments"}


def test_an_existing_name_fails_alone(cluster: Cluster) -> None:
    cluster.create_topic("e-taken", queues=1)
    r = bulk(cluster, [{"name": "e-1", "queues": 1}, {"name": "e-taken", "queues": 4}, {"name": "e-2"}])
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["name"] for x in results] == ["e-1", "e-taken", "e-2"]
    assert results[1]["error"]["code"] == "topic_exists" and "topic" not in results[1]
    assert "topic" in results[0] and results[2]["topic"]["queues"] == 8
    assert {"e-1", "e-2", "e-taken"} <= names(cluster)
    assert len(cluster.get("/v1/topics/e-taken").json()["queues"]) == 1  # unchanged


def last_topic_id(c: Cluster) -> int:
    return max((t["id"] for t in c.get("/v1/topics").json()["topics"]), default=0)


def test_bad_requests_are_refused_whole_and_change_nothing(cluster: Cluster) -> None:
    before, last_id = names(cluster), last_topic_id(cluster)
    over = [{"name": f"over-{i}", "queues": 1} for i in range(LIMIT + 1)]
    r = bulk(cluster, over, node=follower(cluster))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert r.json()["error"]["limit"] == LIMIT
    for specs, index in (
        ([{"name": "ok-1"}, {"name": "ok-2"}, {"name": "ok-1"}], 2),  # a name twice
        ([{"name": "ok-1"}, {"name": "bad name"}], 1),
        ([{"name": "ok-1"}, {"name": "ok-2", "queues": 0}], 1),
        ([{"name": "ok-1"}, {"name": "ok-2", "colour": "red"}], 1),
        ([{"name": "ok-1"}, "ok-2"], 1),
    ):
        r = bulk(cluster, specs)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (specs, r.text)
        assert r.json()["error"]["index"] == index, r.text
    for body in ({"topics": []}, {"topics": "ok-1"}, {"topics": [{"name": "ok-1"}], "name": "ok-2"}):
        r = cluster.post("/v1/topics", body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (body, r.text)
    assert names(cluster) == before
    # Topic ids are never reused: the next topic gets the next id, so none was made and deleted.
    assert cluster.create_topic("after-bad", queues=1)["id"] == last_id + 1


def test_a_token_without_admin_on_one_name_creates_nothing(cluster: Cluster) -> None:
    cluster.create_topic("shared", queues=1)
    before = names(cluster)
    for specs in (
        [{"name": "tenant-a"}, {"name": "other-b"}, {"name": "tenant-c"}],
        # shared.* allows the name, but it could be the dead-letter topic of shared (group g):
        # creating it needs admin on shared too.
        [{"name": "tenant-a"}, {"name": "shared.g.dlq"}],
    ):
        for node in cluster.nodes:
            r = bulk(cluster, specs, node=node, token=TENANT)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (specs, r.text)
    # Too many names: not looked up one by one, and no way around the limit.
    r = bulk(cluster, [{"name": f"tenant-{i}"} for i in range(LIMIT + 1)], token=TENANT)
    assert r.status_code == 413, r.text
    assert names(cluster) == before
    r = bulk(cluster, [{"name": "tenant-a"}, {"name": "shared.x"}], token=TENANT)
    assert r.status_code == 200 and all("topic" in x for x in r.json()["results"]), r.text


def test_the_client_creates_in_chunks_and_reports_per_topic(cluster: Cluster) -> None:
    cluster.create_topic("c-03", queues=1)
    wanted = [f"c-{i:02d}" for i in range(12)]
    with Admin([cluster.url(follower(cluster))], token=ADMIN) as admin:
        got = admin.create_topics(wanted, 2, retention_ms=1000)
    assert list(got) == wanted
    assert isinstance(got["c-03"], TopicExists)
    created = {n: t for n, t in got.items() if isinstance(t, TopicInfo)}
    assert len(created) == 11 and {(t.queues, t.retention_ms) for t in created.values()} == {(2, 1000)}
    assert set(wanted) <= names(cluster)


def test_the_cli_creates_in_bulk_with_progress(cluster: Cluster, tmp_path: Path) -> None:
    cluster.create_topic("cli-07", queues=1)
    listed = tmp_path / "topics.txt"
    listed.write_text("".join(f"cli-{i:02d}\n" for i in range(1, 13)))
    before = meta_entries(cluster)
    r = raftmq(
        "topic", "create", "cli-00", "--from-file", str(listed), "--queues", "2",
        "--url", cluster.url(follower(cluster)), "--token", ADMIN,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # cli-07 exists
    assert "created 12 of 13 topics" in r.stdout
    assert "error topic_exists: cli-07: " in r.stderr
    # The node's limit (5) answered the first request of 1,000, then chunks of 5, cli-07 in the second.
    progress = [line for line in r.stderr.splitlines() if line.endswith(" asked)")]
    assert progress == [
        "created 5 of 13 topics (5 asked)",
        "created 9 of 13 topics (10 asked)",
        "created 12 of 13 topics (13 asked)",
    ], r.stderr
    assert meta_entries(cluster) - before <= 6  # 3 chunks (and noops at most), not 13 entries
    assert {f"cli-{i:02d}" for i in range(13)} <= names(cluster)
    assert len(cluster.get("/v1/topics/cli-12").json()["queues"]) == 2


def test_the_cli_creates_one_by_one_while_a_metadata_voter_cannot_in_bulk(tmp_path: Path) -> None:
    faults = '[faults]\nprevious_release_node = "n2"\n'
    with Cluster(tmp_path, extra_toml=faults) as c:
        c.start()
        c.wait_ready()
        r = c.post("/v1/topics", {"topics": [{"name": "u-0"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "upgrade_in_progress", r.text
        r = raftmq("topic", "create", "u-1", "u-2", "u-3", "--url", c.url())
        assert r.returncode == 0, r.stderr
        assert "created 3 of 3 topics" in r.stdout
        assert {"u-1", "u-2", "u-3"} <= names(c) and "u-0" not in names(c)
