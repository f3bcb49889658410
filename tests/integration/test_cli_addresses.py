"""Where the CLI looks for nodes (issue 15, as Kafka's --bootstrap-server): a comma list in --url,
every node of ./.raftmq/cluster.toml in a dev folder, failover between them, and a quick clear
error when none answers. Real CLI processes against a real 3-node cluster with a killed node."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster
from .test_cli_produce_consume import create, raftmq

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cli-addr")) as c:
        c.start()
        c.wait_ready()
        create(c, "addr")
        c.kill("n1")  # every test runs with the first node down
        yield c


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nobody listens


def test_a_comma_list_in_url_fails_over_past_a_dead_node(cluster: Cluster) -> None:
    urls = ",".join(n.url for n in cluster.nodes.values())  # n1 first, and it is down
    status = raftmq("status", "--url", urls, "--json")
    assert status.returncode == 0, status.stderr
    assert {n["id"] for n in json.loads(status.stdout)["nodes"]} >= {"n2", "n3"}
    produced = raftmq("produce", "addr", "--url", urls, input="a\nb\n")
    assert produced.returncode == 0 and "produced 2 messages" in produced.stderr, produced.stderr
    consumed = raftmq("consume", "addr", "--group", "comma", "--max", "2", "-q", "--url", urls)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(json.loads(line)["value"] for line in consumed.stdout.splitlines()) == ["a", "b"]


def test_in_a_dev_folder_every_node_of_its_cluster_file_is_tried(cluster: Cluster, tmp_path: Path) -> None:
    """Run where ``raftmq dev`` writes .raftmq/cluster.toml, without --url or $RAFTMQ_URL: with n1
    down, status and produce answer from the others (before: "no raftmq node answered: 8081")."""
    (tmp_path / ".raftmq").mkdir()
    shutil.copy(cluster.config_path, tmp_path / ".raftmq" / "cluster.toml")
    status = raftmq("status", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    produced = raftmq("produce", "addr", cwd=tmp_path, input="from the dev folder\n")
    assert produced.returncode == 0 and "produced 1 message " in produced.stderr, produced.stderr
    listed = raftmq("topic", "list", cwd=tmp_path)
    assert listed.returncode == 0 and "addr" in listed.stdout, listed


@pytest.mark.parametrize("command", [["status"], ["produce", "addr"], ["consume", "addr", "--group", "g"]])
def test_no_node_answering_is_a_clear_error_at_once(command: list[str], tmp_path: Path) -> None:
    """A wrong port: one line naming each address tried, exit status 1, in seconds (produce and
    consume retried for 30 s before; the deadline below is generous and still well under that)."""
    dead = [f"127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}"]
    done = raftmq(*command, "--url", ",".join(dead), input="x\n", timeout=20, cwd=tmp_path)
    assert done.returncode == 1, done
    assert done.stderr.startswith("error: no raftmq node answered: "), done.stderr
    assert all(d.split("//")[-1] in done.stderr for d in dead) and "connection refused" in done.stderr
    assert "Traceback" not in done.stderr
