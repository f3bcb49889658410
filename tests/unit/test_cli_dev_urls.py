"""The commands' default addresses, and backup/restore's default cluster file, from a dev folder's
cluster file: loopback nodes only, so a file in the working folder cannot send the API token (or
the backup key) to a host the user never named."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.cluster.cli.admin_http import DEFAULT_URL
from raftmq.cluster.cli.common import dev_cluster_urls, resolve_urls

SECRET = "0123456789abcdef0123"


def cluster_file(tmp_path: Path, hosts: list[str]) -> str:
    lines = ["[cluster]", f'secret = "{SECRET}"']
    for i, host in enumerate(hosts, start=1):
        lines += [
            "[[nodes]]",
            f'id = "n{i}"',
            f'http = "{host}:{8080 + i}"',
            f'raft = "{host}:{7000 + 100 * i}"',
            f'data_dir = "{tmp_path}"',
        ]
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_nodes_of_a_dev_cluster_file_on_loopback_are_the_default(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, ["127.0.0.1", "localhost", "127.0.0.2"])
    assert dev_cluster_urls(path) == [
        "http://127.0.0.1:8081",
        "http://localhost:8082",
        "http://127.0.0.2:8083",
    ]


def test_nodes_of_a_cluster_file_elsewhere_are_never_asked(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, ["203.0.113.7", "127.0.0.1", "evil.example", "10.0.0.1"])
    assert dev_cluster_urls(path) == ["http://127.0.0.1:8082"]
    assert dev_cluster_urls(cluster_file(tmp_path, ["203.0.113.7", "198.51.100.1"])) == []


def test_given_addresses_win_and_a_non_loopback_file_falls_back_to_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_urls(("a:1,b:2",), env={}) == ["a:1", "b:2"]
    assert resolve_urls((), env={"RAFTMQ_URL": "c:3 d:4"}) == ["c:3", "d:4"]
    (tmp_path / ".raftmq").mkdir()
    (tmp_path / ".raftmq" / "cluster.toml").write_text(
        Path(cluster_file(tmp_path, ["203.0.113.7", "198.51.100.1"])).read_text()
    )
    monkeypatch.chdir(tmp_path)
    assert resolve_urls((), env={}) == [DEFAULT_URL]
