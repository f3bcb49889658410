"""Which addresses count as loopback, and when ``raftmq serve`` refuses to start for an open API
(``cluster/cli/serve.py``; the real process is tested in tests/integration/test_open_api_refusal.py)."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq.cluster.cli.serve import loopback_host, open_api_refusal, write_dev_config
from raftmq.cluster.config.cluster_file import ConfigError, load_config, parse_config

SECRET = "0123456789abcdef0123"
TOKEN = {"name": "ops", "token": "ops-token-0123456789abcdef", "admin": ["*"]}


def config(http_host: str, security: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Any:
    node = {"id": "n1", "http": f"{http_host}:8081", "raft": "127.0.0.1:7100", "data_dir": "/d"}
    raw: dict[str, Any] = {"cluster": {"secret": SECRET}, "nodes": [node]}
    if security is not None:
        raw["security"] = security
    return parse_config(raw, env=env)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "[::1]", "::1"])
def test_loopback_addresses_and_localhost(host: str) -> None:
    assert loopback_host(host)
    assert open_api_refusal(config(host), "n1") is None


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "[::]", "10.0.0.1", "192.0.2.2", "fe80::1", "no-such-host.invalid"]
)
def test_any_other_address_or_unresolvable_name_is_not_loopback(host: str) -> None:
    assert not loopback_host(host)
    refusal = open_api_refusal(config(host), "n1")
    assert refusal is not None
    assert "not a loopback address" in refusal and "docs/security.md" in refusal
    assert "allow_unauthenticated = true" in refusal and "[security]" in refusal


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1"])
def test_tokens_or_allow_unauthenticated_lift_the_refusal(host: str) -> None:
    assert open_api_refusal(config(host, {"tokens": [TOKEN]}), "n1") is None
    allowed = config(host, {"allow_unauthenticated": True})
    assert allowed.security.allow_unauthenticated and not allowed.security.enabled
    assert open_api_refusal(allowed, "n1") is None


def test_the_environment_overrides_allow_unauthenticated() -> None:
    on = config("0.0.0.0", env={"RAFTMQ_SECURITY_ALLOW_UNAUTHENTICATED": "true"})
    assert on.security.allow_unauthenticated and open_api_refusal(on, "n1") is None
    off = config(
        "0.0.0.0", {"allow_unauthenticated": True}, env={"RAFTMQ_SECURITY_ALLOW_UNAUTHENTICATED": "0"}
    )
    assert not off.security.allow_unauthenticated and open_api_refusal(off, "n1") is not None


def test_allow_unauthenticated_is_off_by_default_and_must_be_a_boolean() -> None:
    assert not config("127.0.0.1").security.allow_unauthenticated
    with pytest.raises(ConfigError) as e:
        config("0.0.0.0", {"allow_unauthenticated": "yes"})
    assert e.value.problems == ["security.allow_unauthenticated must be true or false"]


def test_the_dev_cluster_stays_open_on_loopback(tmp_path: Any) -> None:
    dev = load_config(write_dev_config(str(tmp_path)), env={})
    assert not dev.security.enabled and not dev.security.allow_unauthenticated
    assert all(open_api_refusal(dev, n.id) is None for n in dev.nodes)
