"""Small things users notice (issue 15, item 7 and item 1's list), against a real 3-node cluster:
JSON answers end with a newline, ``GET /`` redirects to the console, ``topic list`` piped shows
whole names, ``dlq list`` for a group without a subscription is an error, ``--from-beginning``,
plurals, and the quickstart's Python snippet runs twice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster
from .test_cli_produce_consume import create, raftmq, url_args

pytestmark = pytest.mark.timeout(240)

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("small")) as c:
        c.start()
        c.wait_ready()
        yield c


def test_json_answers_end_with_a_newline(cluster: Cluster) -> None:
    create(cluster, "nl")
    answers = [
        cluster.get("/v1/topics"),
        cluster.get("/v1/topics/nl"),
        cluster.get("/v1/cluster"),
        cluster.get("/openapi.json"),
        cluster.get("/v1/topics/no-such-topic"),  # an error body
        cluster.get("/v1/topics/nl/queues/0/messages", params={"offset": "x"}),  # 400
        cluster.post("/v1/topics/nl/messages", json={"messages": [{"value": "v"}]}),
        cluster.get("/v1/topics/nl/queues/0/messages", params={"offset": "0"}),  # written in parts
    ]
    for r in answers:
        assert r.headers["Content-Type"].startswith("application/json"), r.url
        assert r.content.endswith(b"}\n") and not r.content.endswith(b"\n\n"), (r.url, r.content[-40:])
        json.loads(r.content)
    assert [r.status_code for r in answers] == [200, 200, 200, 200, 404, 400, 200, 200]


def test_get_root_redirects_to_the_console(cluster: Cluster) -> None:
    r = cluster.get("/", allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"] == "/ui", (r.status_code, r.text)
    followed = cluster.get("/")
    assert followed.status_code == 200 and followed.headers["Content-Type"].startswith("text/html")


def test_topic_list_piped_shows_whole_names(cluster: Cluster) -> None:
    long = "orders.billing.invoices-" + "x" * 90
    create(cluster, long)
    listed = raftmq("topic", "list", *url_args(cluster), env={"COLUMNS": "80"})  # stdout is a pipe
    assert listed.returncode == 0, listed.stderr
    assert long in listed.stdout and "…" not in listed.stdout, listed.stdout


def test_dlq_list_without_a_subscription_is_an_error(cluster: Cluster) -> None:
    create(cluster, "dlq-none")
    none = raftmq("dlq", "list", "dlq-none", "--group", "nobody", *url_args(cluster))
    assert none.returncode == 1 and none.stdout == "", none
    assert none.stderr.startswith("error: group 'nobody' has no subscription to 'dlq-none'"), none.stderr

    produced = raftmq("produce", "dlq-none", "-q", *url_args(cluster), input="a\n")
    assert produced.returncode == 0, produced.stderr
    got = raftmq("receive", "dlq-none", "--group", "worker", "--max", "1", *url_args(cluster))
    assert got.returncode == 0 and "received 1 message " in got.stderr, got.stderr
    empty = raftmq("dlq", "list", "dlq-none", "--group", "worker", *url_args(cluster))
    assert empty.returncode == 0, empty.stderr
    assert empty.stderr == "dlq-none.worker.dlq: 0 dead letters not redriven\n", empty.stderr


def test_from_beginning_is_from_earliest(cluster: Cluster) -> None:
    create(cluster, "begin")
    produced = raftmq("produce", "begin", *url_args(cluster), input="one\ntwo\n")
    assert produced.returncode == 0 and "produced 2 messages " in produced.stderr, produced.stderr
    latest = raftmq(
        "consume", "begin", "--group", "late", "--from", "latest", "--timeout-ms", "1500", *url_args(cluster)
    )
    assert latest.returncode == 0 and latest.stdout == "", latest
    assert re.match(r"consumed 0 messages ", latest.stderr), latest.stderr
    first = raftmq(
        "consume", "begin", "--group", "early", "--from-beginning", "--max", "2", *url_args(cluster)
    )
    assert first.returncode == 0, first.stderr
    assert sorted(json.loads(line)["value"] for line in first.stdout.splitlines()) == ["one", "two"]


def test_the_quickstart_python_snippet_runs_twice(cluster: Cluster, tmp_path: Path) -> None:
    """docs/quickstart.md's snippet, with this cluster's addresses: the second run met TopicExists."""
    text = QUICKSTART.read_text()
    block = re.search(r"## The Python client in 10 lines\n\n```python\n(.*?)```", text, re.S)
    assert block, "the snippet moved"
    nodes = [n.url for n in cluster.nodes.values()]
    code = block.group(1).replace('["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"]', repr(nodes))
    assert repr(nodes) in code
    script = tmp_path / "snippet.py"
    script.write_text(code)
    for run in (1, 2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (run, done.stderr[-2000:])
        lines = done.stdout.splitlines()
        assert len(lines) == 10, (run, done.stdout)
        values = sorted(line.split(" ", 2)[2] for line in lines)
        assert values == sorted(f"hello {i}" for i in range(10)), (run, values)
