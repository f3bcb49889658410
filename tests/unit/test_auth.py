"""Tokens, permission matching, Bearer parsing, the route -> permission table and the security
settings of the cluster file (no sockets: the route table is checked against the real app's router)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from raftmq.cluster.api.auth import (
    CLUSTER_ADMIN,
    CREATE_SOURCE,
    LIST_TOPICS,
    METRICS,
    OPEN,
    PEER,
    ROUTES,
    TOKEN,
    route_rule,
)
from raftmq.cluster.config.cluster_file import ConfigError, parse_config
from raftmq.cluster.config.tokens import (
    ADMIN,
    CONSUME,
    PRODUCE,
    BadCredentials,
    SecurityConfig,
    TokenGrant,
    bearer_token,
    parse_security,
    token_digest,
)

SECRET = "0123456789abcdef0123"
TOKEN_A = "token-a-0123456789abcdef"


def grant(**perms: list[str]) -> TokenGrant:
    return TokenGrant(name="t", digest=token_digest("x" * 20), **{k: tuple(v) for k, v in perms.items()})


def nodes(n: int = 3, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": f"n{i}",
            "http": f"127.0.0.1:{8000 + i}",
            "raft": f"127.0.0.1:{7000 + 100 * i}",
            "data_dir": "/d",
        }
        | extra
        for i in range(1, n + 1)
    ]


# -- permission matching ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "topic", "allowed"),
    [
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders.eu.billing.dlq", True),  # * crosses dots: a DLQ of a topic matches too
        ("orders.*", "orders", False),
        ("orders.*", "Orders.eu", False),  # case-sensitive, as topic names are
        ("orders", "orders", True),
        ("orders", "orders2", False),
        ("*", "anything_at-all.9", True),
        ("o?ders", "orders", True),
        ("[ab]-*", "a-1", True),
        ("[ab]-*", "c-1", False),
        ("[!ab]-*", "c-1", True),
    ],
)
def test_patterns_are_case_sensitive_shell_globs(pattern: str, topic: str, allowed: bool) -> None:
    assert grant(produce=[pattern]).allows(PRODUCE, topic) is allowed


def test_each_permission_has_its_own_patterns() -> None:
    g = grant(produce=["orders.*"], consume=["audit"])
    assert g.allows(PRODUCE, "orders.x") and not g.allows(CONSUME, "orders.x")
    assert g.allows(CONSUME, "audit") and not g.allows(PRODUCE, "audit")
    assert not g.allows(ADMIN, "orders.x") and not g.allows(ADMIN, None)
    assert g.allows_any("audit") and g.allows_any("orders.1") and not g.allows_any("other")


def test_a_topic_that_cannot_be_read_needs_the_permission_on_some_topic() -> None:
    assert grant(consume=["a"]).allows(CONSUME, None)
    assert not grant(produce=["a"]).allows(CONSUME, None)


def test_only_admin_on_star_is_cluster_admin() -> None:
    assert grant(admin=["*"]).cluster_admin
    assert not grant(admin=["orders.*", "*x"]).cluster_admin
    assert not grant(produce=["*"], consume=["*"]).cluster_admin


# -- authentication ---------------------------------------------------------------------------------


def test_authenticate_finds_the_grant_by_digest_and_nothing_else() -> None:
    a = TokenGrant(name="a", digest=token_digest(TOKEN_A))
    b = TokenGrant(name="b", digest=token_digest("token-b-0123456789abcdef"))
    security = SecurityConfig(tokens=(a, b))
    assert security.enabled
    assert security.authenticate(TOKEN_A) is a
    assert security.authenticate("token-b-0123456789abcdef") is b
    assert security.authenticate(TOKEN_A + "x") is None
    assert security.authenticate("") is None
    assert not SecurityConfig().enabled


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.DEF-_~+/=", "abc.DEF-_~+/="),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
    ],
)
def test_bearer_token_accepts_rfc6750_credentials(header: str, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer two words",
        "Bearer tök€n",
        "Bearer \udcff\udcfe",  # undecodable bytes as aiohttp hands them over
        "Bearer abc\x00def",
        "Bearer a=b",  # = only at the end
        "Bearer " + "a" * 5000,
        "Token abc",
    ],
)
def test_bearer_token_refuses_everything_else_without_echoing_it(header: str | None) -> None:
    with pytest.raises(BadCredentials) as e:
        bearer_token(header)
    credential = (header or "").partition(" ")[2].strip()
    assert not credential or credential not in str(e.value)


def test_a_grant_repr_shows_no_digest() -> None:
    g = TokenGrant(name="svc", digest=token_digest(TOKEN_A), produce=("a",))
    assert token_digest(TOKEN_A).hex() not in repr(g) and "digest" not in repr(g)


# -- the [security] table ---------------------------------------------------------------------------


def test_tokens_by_hash_by_value_and_from_the_environment() -> None:
    problems: list[str] = []
    sha = hashlib.sha256(b"hashed-token-0123456789").hexdigest()
    security = parse_security(
        {
            "metrics_open": True,
            "tokens": [
                {"name": "hashed", "sha256": sha.upper(), "produce": ["a.*"]},
                {"name": "plain", "token": TOKEN_A, "consume": ["*"]},
                {"name": "from-env.x", "admin": ["*"]},
            ],
        },
        {"RAFTMQ_TOKEN_FROM_ENV_X": "env-token-0123456789abcdef"},
        problems,
    )
    assert problems == []
    assert security.metrics_open
    by_name = {g.name: g for g in security.tokens}
    assert security.authenticate("hashed-token-0123456789") is by_name["hashed"]
    assert security.authenticate(TOKEN_A) is by_name["plain"]
    assert security.authenticate("env-token-0123456789abcdef") is by_name["from-env.x"]
    assert by_name["hashed"].produce == ("a.*",) and by_name["hashed"].consume == ()


def test_the_environment_replaces_a_token_of_the_file() -> None:
    problems: list[str] = []
    security = parse_security(
        {"tokens": [{"name": "svc", "token": TOKEN_A}]},
        {"RAFTMQ_TOKEN_SVC": "other-token-0123456789"},
        problems,
    )
    assert problems == [] and security.authenticate(TOKEN_A) is None
    assert security.authenticate("other-token-0123456789") is not None


def test_a_token_reads_every_metric_only_with_metrics_true() -> None:
    problems: list[str] = []
    security = parse_security(
        {
            "tokens": [
                {"name": "scraper", "token": TOKEN_A, "metrics": True},
                {"name": "svc", "token": "svc-token-0123456789ab", "produce": ["orders"]},
                {"name": "bad", "token": "bad-token-0123456789ab", "metrics": "yes"},
            ]
        },
        {},
        problems,
    )
    assert problems == ["token 'bad': metrics must be true or false"]
    scraper, svc = security.tokens
    assert scraper.metrics and not scraper.allows_any("orders") and not svc.metrics


def test_no_tokens_means_authentication_off() -> None:
    problems: list[str] = []
    assert not parse_security(None, {}, problems).enabled
    assert not parse_security({"tokens": []}, {}, problems).enabled
    assert problems == []


def test_every_token_problem_is_listed_and_no_token_value_is_echoed() -> None:
    secret_short = "short-secret"
    secret_spaced = "has spaces in it 0123456789"
    raw = {
        "cluster": {"secret": "tooshort-secret"},
        "nodes": nodes(),
        "security": {
            "bogus": 1,
            "metrics_open": "yes",
            "tokens": [
                {"name": "short", "token": secret_short},
                {"name": "spaced", "token": secret_spaced},
                {"name": "both", "token": TOKEN_A, "sha256": "0" * 64},
                {"name": "neither"},
                {"name": "badhash", "sha256": "xyz"},
                {"name": "bad name!", "token": TOKEN_A},
                {"name": "pattern", "token": "pattern-token-0123456789", "produce": ["orders/*"]},
                {"name": "notlist", "token": "notlist-token-0123456789", "consume": "orders"},
                {"name": "dup", "token": "dup-token-0123456789ab"},
                {"name": "dup", "token": "dup-token-0123456789ab"},
                {"name": "extra", "token": "extra-token-0123456789", "write": ["x"]},
                "not a table",
            ],
        },
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    text = str(e.value)
    for needle in (
        "cluster.secret must be",
        "unknown key security.bogus",
        "security.metrics_open must be true or false",
        "token 'short': the token must be 16-4096 characters",
        "token 'spaced': the token may hold only",
        "token 'both': set exactly one of sha256 and token (or RAFTMQ_TOKEN_BOTH)",
        "token 'neither': set exactly one",
        "token 'badhash': sha256 must be 64 hex digits",
        "security.tokens[5].name must be",
        "token 'pattern': produce must be a list of topic name patterns",
        "token 'notlist': consume must be a list",
        "duplicate name 'dup'",
        "token 'dup' has the same value as an earlier token",
        "unknown key security.tokens[10].write",
        "security.tokens[11] must be a table",
    ):
        assert needle in text, (needle, text)
    for value in ("tooshort-secret", secret_short, secret_spaced, TOKEN_A, "dup-token-0123456789ab"):
        assert value not in text


def test_the_cluster_secret_is_not_in_the_config_repr() -> None:
    config = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes()})
    assert config.secret == SECRET and SECRET not in repr(config)


# -- TLS and the Raft bind address in the cluster file ----------------------------------------------


def test_tls_cluster_wide_with_a_per_node_override_makes_every_url_https() -> None:
    node_list = nodes()
    node_list[0] |= {"tls_cert_file": "/n1.pem", "tls_key_file": "/n1.key"}
    raw = {
        "cluster": {"secret": SECRET},
        "tls": {"cert_file": "/c.pem", "key_file": "/k.pem", "ca_file": "/ca.pem"},
        "nodes": node_list,
    }
    config = parse_config(raw)
    assert config.tls_enabled and config.tls.verify and config.tls.ca_file == "/ca.pem"
    assert [n.http_url for n in config.nodes] == [f"https://127.0.0.1:{8000 + i}" for i in (1, 2, 3)]
    assert (config.nodes[0].tls_cert_file, config.nodes[0].tls_key_file) == ("/n1.pem", "/n1.key")
    assert (config.nodes[1].tls_cert_file, config.nodes[1].tls_key_file) == ("/c.pem", "/k.pem")


def test_tls_settings_come_from_the_environment_too() -> None:
    env = {"RAFTMQ_TLS_CERT_FILE": "/c.pem", "RAFTMQ_TLS_KEY_FILE": "/k.pem", "RAFTMQ_TLS_VERIFY": "false"}
    config = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes()}, env=env)
    assert config.tls_enabled and not config.tls.verify


def test_without_tls_urls_stay_http() -> None:
    config = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes()})
    assert not config.tls_enabled and config.nodes[0].http_url == "http://127.0.0.1:8001"


def test_tls_on_some_nodes_only_or_a_cert_without_key_is_refused() -> None:
    node_list = nodes()
    node_list[0] |= {"tls_cert_file": "/n1.pem"}
    with pytest.raises(ConfigError) as e:
        parse_config({"cluster": {"secret": SECRET}, "nodes": node_list})
    assert "node n1: TLS needs both a certificate and a key file" in str(e.value)
    assert "TLS must be set for every node or for none" in str(e.value)


def test_raft_ports_bind_to_the_raft_host_unless_raft_bind_says_otherwise() -> None:
    node_list = nodes()
    node_list[1]["raft_bind"] = "0.0.0.0"
    raw = {"cluster": {"secret": SECRET}, "nodes": node_list}
    config = parse_config(raw)
    assert config.nodes[0].raft_bind_addr(0) == "127.0.0.1:7100"
    assert config.nodes[0].raft_bind_addr(3) == "127.0.0.1:7103"
    assert config.nodes[1].raft_bind_addr(2) == "0.0.0.0:7202"
    assert config.nodes[1].raft_addr(2) == "127.0.0.1:7202"  # what peers dial stays the same


@pytest.mark.parametrize("bad", ["", "10.0.0.1:7000", 7])
def test_raft_bind_must_be_a_host(bad: Any) -> None:
    with pytest.raises(ConfigError, match="raft_bind must be a host"):
        parse_config({"cluster": {"secret": SECRET}, "nodes": nodes(raft_bind=bad)})


# -- the route table ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "canonical", "path", "rule"),
    [
        ("GET", "/healthz", "/healthz", OPEN),
        ("HEAD", "/readyz", "/readyz", OPEN),
        ("GET", "/metrics", "/metrics", METRICS),
        ("GET", "/internal/status", "/internal/status", PEER),
        ("GET", None, "/internal/nope", PEER),
        ("GET", None, "/v1/nope", TOKEN),
        ("GET", "/v1/cluster", "/v1/cluster", TOKEN),
        ("GET", "/v1/topics", "/v1/topics", LIST_TOPICS),
        ("POST", "/v1/cluster/nodes", "/v1/cluster/nodes", CLUSTER_ADMIN),  # unknown: cluster admin
        ("GET", "/v1/brand/new", "/v1/brand/new", CLUSTER_ADMIN),
    ],
)
def test_route_rules(method: str, canonical: str | None, path: str, rule: Any) -> None:
    assert route_rule(method, canonical, path) is rule


@pytest.mark.parametrize(
    ("method", "canonical", "needs", "source"),
    [
        ("POST", "/v1/topics", (ADMIN,), CREATE_SOURCE),
        ("DELETE", "/v1/topics/{topic}", (ADMIN,), "path"),
        ("POST", "/v1/topics/{topic}/messages", (PRODUCE,), "path"),
        ("GET", "/v1/topics/{topic}/queues/{queue}/messages", (CONSUME,), "path"),
        ("PUT", "/v1/groups/{group}/offsets", (CONSUME,), "body:topic"),
        ("GET", "/v1/groups/{group}/offsets", (CONSUME,), "query:topic"),
        ("POST", "/v1/groups/{group}/members", (CONSUME,), "body:topics"),
        ("DELETE", "/v1/groups/{group}/members/{member_id}", (CONSUME,), "none"),
        ("POST", "/v1/topics/{topic}/subscriptions/{group}/receive", (CONSUME,), "path"),
        ("GET", "/v1/topics/{topic}/subscriptions/{group}/stream", (CONSUME,), "path"),
        ("PUT", "/v1/topics/{topic}/subscriptions/{group}", (ADMIN,), "path"),  # settings: admin
        ("GET", "/v1/topics/{topic}/subscriptions/{group}/dlq", (CONSUME,), "path"),
        ("POST", "/v1/topics/{topic}/subscriptions/{group}/dlq/redrive", (CONSUME, PRODUCE), "path"),
        ("POST", "/v1/topics/{topic}/queues/{queue}/locks/{group}", (CONSUME,), "path"),
        ("GET", "/v1/topics/{topic}/segments/{queue}/{base}", (CONSUME,), "path"),
    ],
)
def test_topic_routes_need_their_permission_on_their_topic(
    method: str, canonical: str, needs: tuple[str, ...], source: str
) -> None:
    rule = route_rule(method, canonical, canonical)
    assert (rule.kind, rule.needs, rule.source, rule.any_of) == ("topic", needs, source, False)


def test_describing_a_topic_needs_any_permission_on_it() -> None:
    rule = route_rule("GET", "/v1/topics/{topic}", "/v1/topics/x")
    assert rule.kind == "topic" and set(rule.needs) == {PRODUCE, CONSUME, ADMIN} and rule.any_of


def test_every_route_of_the_app_has_a_deliberate_rule() -> None:
    """A new route with a topic in its path must be put in the table (falling back to cluster
    admin would lock its users out); routes without a topic may fall back to cluster admin only
    under /v1/cluster/."""
    from raftmq.cluster.api.app import create_app
    from raftmq.cluster.node.node import Node

    config = parse_config({"cluster": {"secret": SECRET}, "nodes": nodes()})
    app = create_app(Node(config, "n1"))
    seen = 0
    for route in app.router.routes():
        canonical = route.resource.canonical if route.resource is not None else None
        assert canonical is not None
        rule = route_rule(route.method, canonical, canonical)
        seen += 1
        explicit = (route.method, canonical) in ROUTES or ("GET", canonical) in ROUTES
        if rule is CLUSTER_ADMIN and not explicit:  # the fallback: fine for cluster changes only
            assert canonical.startswith("/v1/cluster/"), f"{route.method} {canonical}: put it in auth.ROUTES"
        if "{topic}" in canonical and canonical.startswith("/v1/"):
            assert rule.kind == "topic", f"{route.method} {canonical}: {rule}"
    assert seen > 20
