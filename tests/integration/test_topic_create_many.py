"""``raftmq topic create`` with many names (issue 25): every name is checked before anything is
created, the topics are created several at a time, and a failing one is reported while the others
are created."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster
from .test_cli import raftmq

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("create-many")) as c:
        c.start()
        c.wait_ready()
        yield c


def names(c: Cluster) -> set[str]:
    return {t["name"] for t in c.get("/v1/topics").json()["topics"]}


def test_many_topics_from_arguments_and_a_file(cluster: Cluster, tmp_path: Path) -> None:
    listed = tmp_path / "topics.txt"
    listed.write_text("# tenants\ntenant-a\n\n  tenant-b  \n")
    r = raftmq(
        "topic", "create", "orders", "billing", "--from-file", str(listed), "--queues", "2",
        "--retention-ms", "60000", "--url", cluster.url("n2"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "created 4 of 4 topics" in r.stdout
    wanted = {"orders", "billing", "tenant-a", "tenant-b"}
    assert wanted <= names(cluster)
    for name in wanted:
        topic = cluster.get(f"/v1/topics/{name}").json()
        assert (len(topic["queues"]), topic["retention_ms"]) == (2, 60000)
    # From stdin, with --json.
    r = raftmq("topic", "create", "--from-file", "-", "--json", "--url", cluster.url(), input="s1\ns2\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"created": ["s1", "s2"], "failed": []}


def test_a_bad_name_creates_nothing_and_an_existing_one_fails_alone(cluster: Cluster) -> None:
    before = names(cluster)
    for bad in (["good-1", "bad name!", "good-2"], ["dup", "good-3", "dup"]):
        r = raftmq("topic", "create", *bad, "--url", cluster.url())
        assert r.returncode == 2 and "nothing created" in r.stderr, r.stderr
    r = raftmq("topic", "create", "--url", cluster.url())
    assert r.returncode == 2 and "name at least one topic" in r.stderr
    assert names(cluster) == before
    assert raftmq("topic", "create", "taken", "--url", cluster.url()).returncode == 0
    r = raftmq("topic", "create", "new-1", "taken", "new-2", "--url", cluster.url())
    assert r.returncode == 1
    assert r.stderr.startswith("error topic_exists: taken: "), r.stderr
    assert "created 2 of 3 topics" in r.stdout
    assert {"new-1", "new-2", "taken"} <= names(cluster)
