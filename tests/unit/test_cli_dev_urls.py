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


def test_the_file_commands_default_to_a_dev_folders_cluster_file_only_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`raftmq backup`/`restore`/`repair-journal` in a `raftmq dev` folder need no --config (a
    newcomer following operations.md got "Missing option '--config'"); a file naming any node off
    loopback is never the default: with $RAFTMQ_SECRET set, the backup key derived from it would go
    to the hosts of a file the user never named."""
    from click.testing import CliRunner

    from raftmq.cluster.cli.main import main as cli

    monkeypatch.delenv("RAFTMQ_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".raftmq").mkdir()
    dev_file = tmp_path / ".raftmq" / "cluster.toml"
    backup = tmp_path / "backup.tar"
    backup.write_bytes(b"")
    dev_file.write_text(Path(cluster_file(tmp_path, ["127.0.0.1", "127.0.0.1", "localhost"])).read_text())
    found = CliRunner().invoke(cli, ["restore", "--node", "n9", str(backup)])
    assert found.exit_code == 1 and "node 'n9' is not in .raftmq/cluster.toml" in found.output, found.output
    dev_file.write_text(Path(cluster_file(tmp_path, ["127.0.0.1", "203.0.113.7", "127.0.0.1"])).read_text())
    for args in (["backup", "-o", "out.tar"], ["restore", "--node", "n1", str(backup)]):
        refused = CliRunner().invoke(cli, args)
        assert refused.exit_code == 2 and "Missing option '--config'" in refused.output, refused.output
    assert not (tmp_path / "out.tar").exists()
