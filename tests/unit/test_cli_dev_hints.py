"""What ``raftmq dev`` suggests once ready (``cluster/cli/dev_hints.py``): the README's curl as written
without tokens; with tokens the curl sends $RAFTMQ_TOKEN and a line says which token and where it
is, never the token itself. ``tests/integration/test_dev_tokens.py`` runs the hints as printed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from raftmq.cluster.cli.dev_hints import ready_hints
from raftmq.cluster.config.cluster_file import load_config

SECRET = "0123456789abcdef0123"
TOKEN = "a-token-of-the-dev-cluster-0123"
README_CURL = 'curl -s -XPOST localhost:8081/v1/topics -d \'{"name": "orders", "queues": 4}\''


def hints(tmp_path: Path, tokens: str = "", env: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[cluster]\nsecret = "{SECRET}"\n{tokens}\n[[nodes]]\nid = "n1"\nhttp = "127.0.0.1:8081"\n'
        f'raft = "127.0.0.1:7200"\ndata_dir = "{tmp_path}"\n'
    )
    config = load_config(str(path), env or {})
    return ready_hints(config, str(path), "raftmq status", "raftmq dev restart")


def entry(name: str, secret: str, admin: str = '["*"]') -> str:
    return f'[[security.tokens]]\nname = "{name}"\n{secret}\nadmin = {admin}\n'


def test_without_tokens_the_curl_is_the_readmes(tmp_path: Path) -> None:
    lines = hints(tmp_path)
    assert lines[0] == f"Try: {README_CURL}"
    assert not any("RAFTMQ_TOKEN" in line for line in lines)


def test_a_token_of_the_file_is_named_not_shown(tmp_path: Path) -> None:
    readonly = entry("reader", f'token = "{TOKEN}-r"', admin="[]")
    lines = hints(tmp_path, "[security]\n" + readonly + entry("ops", f'token = "{TOKEN}"'))
    assert lines[0] == (
        "API tokens are on: the curl and the status command below send $RAFTMQ_TOKEN ('ops'): "
        f"export RAFTMQ_TOKEN=<its token = in {tmp_path / 'cluster.toml'}>"
    )
    bearer = ' -H "Authorization: Bearer $RAFTMQ_TOKEN" -d'
    assert lines[1] == "Try: " + README_CURL.replace(" -d", bearer)
    assert not any(TOKEN in line for line in lines)


def test_a_token_from_the_environment_names_its_variable(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"unused-digest-of-the-file-0").hexdigest()
    env = {"RAFTMQ_TOKEN_DEV_OPS": TOKEN}
    lines = hints(tmp_path, "[security]\n" + entry("dev.ops", f'sha256 = "{digest}"'), env)
    assert lines[0].endswith(
        "('dev.ops'): export RAFTMQ_TOKEN=\"$RAFTMQ_TOKEN_DEV_OPS\" (the dev cluster took it from "
        "$RAFTMQ_TOKEN_DEV_OPS)"
    )
    assert not any(TOKEN in line for line in lines)


def test_a_digest_only_says_so_and_a_token_without_admin_on_orders_is_flagged(tmp_path: Path) -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines = hints(tmp_path, "[security]\n" + entry("reader", f'sha256 = "{digest}"', admin='["audit"]'))
    assert "('reader', though no token of the file has admin on orders, which the curl needs)" in lines[0]
    assert lines[0].endswith("keeps only its sha256; export RAFTMQ_TOKEN=<the token you hashed>")


@pytest.mark.parametrize("edit", ["invalid TOML", "removed"])
@pytest.mark.parametrize("secret", [f'token = "{TOKEN}"', f'sha256 = "{"ab" * 32}"'])
def test_the_file_edited_or_removed_after_the_start_does_not_stop_the_hints(
    tmp_path: Path, edit: str, secret: str
) -> None:
    """The hints are printed at "ready", seconds after the dev cluster loaded its file: they come
    from the config as loaded then (it read the file again, and an edit in between raised)."""
    path = tmp_path / "cluster.toml"
    hints(tmp_path, "[security]\n" + entry("ops", secret))
    config = load_config(str(path), {})
    if edit == "removed":
        path.unlink()
    else:
        path.write_text("[security\n")
    lines = ready_hints(config, str(path), "raftmq status", "raftmq dev restart")
    where = f"<its token = in {path}>" if secret.startswith("token") else "keeps only its sha256"
    assert where in lines[0] and lines[1].startswith("Try: curl")
