"""The systemd guide's cluster file (docs/deploy.md) is one a node starts with: it lists an admin
token by SHA-256 (no secret in the file), and its nodes, on non-loopback addresses, would refuse to
start without it. Its shell lines generate the secret and the token."""

from __future__ import annotations

import hashlib
import re
import secrets
import tomllib
from typing import Any

from raftmq.cluster.cli.serve import open_api_refusal
from raftmq.cluster.config.cluster_file import parse_config

from .conftest import REPO

GUIDE = REPO / "docs" / "deploy.md"


def _section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"### {title}")
    end = text.index("\n### ", start + 1)
    return text[start:end]


def _cluster_file(sha256: str) -> dict[str, Any]:
    block = re.search(r"```toml\n(.*?)```", _section("3. The cluster file"), re.S)
    assert block is not None, "no cluster file in the guide"
    return tomllib.loads(block.group(1).replace("<the sha256 printed above>", sha256))


def test_the_guides_cluster_file_has_an_admin_token_by_digest_and_starts() -> None:
    token = secrets.token_hex(24)
    raw = _cluster_file(hashlib.sha256(token.encode()).hexdigest())
    config = parse_config(raw, env={"RAFTMQ_SECRET": secrets.token_hex(24)})
    (admin,) = config.security.tokens
    assert admin.cluster_admin and config.security.authenticate(token) is admin
    assert "secret" not in raw["cluster"]
    assert all(open_api_refusal(config, n.id) is None for n in config.nodes)
    # The same file without its token: every node would refuse to start.
    del raw["security"]
    open_config = parse_config(raw, env={"RAFTMQ_SECRET": secrets.token_hex(24)})
    assert all(open_api_refusal(open_config, n.id) is not None for n in open_config.nodes)


def test_the_guide_generates_the_secret_and_the_admin_token() -> None:
    steps = _section("2. The secret and the admin token")
    assert 'RAFTMQ_SECRET=$(openssl rand -hex 24)" > /etc/raftmq/raftmq.env' in steps
    assert "ADMIN_TOKEN=$(openssl rand -hex 24)" in steps
    assert 'printf %s "$ADMIN_TOKEN" | sha256sum' in steps
