"""Security with real node processes, who may do what: API tokens and per-topic permissions
(401/403), the cluster secret on forwarded and internal requests, and no secret in any log, answer or
error message. One secured cluster serves the module (``security_cluster.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from .conftest import assert_error
from .harness import SECRET
from .security_cluster import (
    ADMIN_TOKEN,
    AUDIT_TOKEN,
    CONSUMER_TOKEN,
    MONITOR_TOKEN,
    PRODUCER_TOKEN,
    SECRETS,
    Secure,
    assert_no_secret_in_answers,
    cli,
    secure_cluster,
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    yield from secure_cluster(tmp_path_factory)


# -- authentication ---------------------------------------------------------------------------------


def test_health_readiness_spec_and_console_need_no_token(secure: Secure) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/ui/"):
        assert secure.call("GET", path).status_code == 200, path


def test_metrics_need_a_token_of_any_kind(secure: Secure) -> None:
    assert_error(secure.call("GET", "/metrics"), 401, "unauthorized")
    r = secure.call("GET", "/metrics", MONITOR_TOKEN)
    assert r.status_code == 200 and "raftmq_" in r.text


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic YWRtaW46YWRtaW4=",
        "bearer wrong-token-0123456789abcdef",
        f"Bearer {ADMIN_TOKEN}x",
        f"Bearer {ADMIN_TOKEN[:-1]}",
        f"Bearer {ADMIN_TOKEN} {ADMIN_TOKEN}",
        "Bearer " + "A" * 7000,  # a huge token, still below the HTTP parser's 8 KiB line limit
        "Bearer tökén-ünïcødé-0123456789".encode(),  # UTF-8 bytes on the wire
        b"Bearer \xff\xfe\xfd-not-utf8-0123456789",
        "Bearer a=b=c",
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/cluster"), ("POST", "/v1/topics/orders.a/messages"), ("GET", "/v1/topics")],
)
def test_missing_or_bad_credentials_are_401_unauthorized(
    secure: Secure, authorization: str | bytes | None, method: str, path: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    r = secure.call(method, path, node="n2", headers=headers, json={"messages": [{"value": "x"}]})
    assert_error(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"].startswith('Bearer realm="raftmq"')


def test_a_header_beyond_the_parser_limit_is_refused_and_the_node_lives_on(secure: Secure) -> None:
    try:
        r = secure.call("GET", "/v1/cluster", node="n2", headers={"Authorization": "Bearer " + "A" * 70_000})
    except requests.exceptions.ConnectionError:  # SSLError is one: closed while the header was sent
        pass  # refused before the client finished sending (1 run in 3 under load)
    else:
        assert 400 <= r.status_code < 500
    assert secure.call("GET", "/v1/cluster", MONITOR_TOKEN, node="n2").status_code == 200


def test_every_permission_on_its_own_topics(secure: Secure) -> None:
    """(token, method, path, body) -> status: produce, consume and admin each on their patterns."""
    msg = {"messages": [{"value": "v", "key": "k"}]}
    cases: list[tuple[str, str, str, Any, int]] = [
        # produce
        (PRODUCER_TOKEN, "POST", "/v1/topics/orders.a/messages", msg, 200),
        (PRODUCER_TOKEN, "POST", "/v1/topics/audit.log/messages", msg, 403),
        (CONSUMER_TOKEN, "POST", "/v1/topics/orders.a/messages", msg, 403),
        (ADMIN_TOKEN, "POST", "/v1/topics/other/messages", msg, 200),
        # consume: fetch, offsets, membership, receive/ack, dead letters
        (CONSUMER_TOKEN, "GET", "/v1/topics/orders.a/queues/0/messages?offset=0", None, 200),
        (PRODUCER_TOKEN, "GET", "/v1/topics/orders.a/queues/0/messages?offset=0", None, 403),
        (CONSUMER_TOKEN, "GET", "/v1/topics/other/queues/0/messages?offset=0", None, 403),
        (CONSUMER_TOKEN, "PUT", "/v1/groups/g1/offsets", {"topic": "orders.a", "offsets": {"0": 0}}, 200),
        (CONSUMER_TOKEN, "PUT", "/v1/groups/g1/offsets", {"topic": "other", "offsets": {"0": 0}}, 403),
        (PRODUCER_TOKEN, "PUT", "/v1/groups/g1/offsets", {"topic": "orders.a", "offsets": {"0": 0}}, 403),
        (CONSUMER_TOKEN, "GET", "/v1/groups/g1/offsets?topic=orders.a", None, 200),
        (CONSUMER_TOKEN, "GET", "/v1/groups/g1/offsets?topic=other", None, 403),
        (CONSUMER_TOKEN, "POST", "/v1/groups/g2/members", {"member_id": "m", "topics": ["orders.a"]}, 200),
        (
            CONSUMER_TOKEN,
            "POST",
            "/v1/groups/g2/members",
            {"member_id": "m", "topics": ["orders.a", "other"]},
            403,
        ),
        (CONSUMER_TOKEN, "DELETE", "/v1/groups/g2/members/m", None, 200),
        (PRODUCER_TOKEN, "DELETE", "/v1/groups/g2/members/m", None, 403),
        (CONSUMER_TOKEN, "POST", "/v1/topics/orders.b/subscriptions/s/receive", {"wait_ms": 0}, 200),
        (PRODUCER_TOKEN, "POST", "/v1/topics/orders.b/subscriptions/s/receive", {"wait_ms": 0}, 403),
        # (past the permission check, the handler refuses the made-up receipt)
        (CONSUMER_TOKEN, "POST", "/v1/topics/orders.b/subscriptions/s/ack", {"receipts": ["1.0.0.x"]}, 400),
        (AUDIT_TOKEN, "POST", "/v1/topics/audit.log/subscriptions/s/ack", {"receipts": ["1.0.0.x"]}, 403),
        (CONSUMER_TOKEN, "GET", "/v1/topics/orders.b/subscriptions/s/dlq", None, 200),
        (CONSUMER_TOKEN, "POST", "/v1/topics/orders.b/subscriptions/s/dlq/redrive", {}, 403),  # +produce
        (ADMIN_TOKEN, "POST", "/v1/topics/orders.b/subscriptions/s/dlq/redrive", {}, 200),
        (CONSUMER_TOKEN, "GET", "/v1/topics/orders.b/segments", None, 200),
        (PRODUCER_TOKEN, "GET", "/v1/topics/orders.b/segments", None, 403),
        # describe: any permission on the topic; the cluster view: any token
        (PRODUCER_TOKEN, "GET", "/v1/topics/orders.a", None, 200),
        (MONITOR_TOKEN, "GET", "/v1/topics/orders.a", None, 403),
        (MONITOR_TOKEN, "GET", "/v1/cluster", None, 200),
        # admin: create and delete topics on its patterns only
        (AUDIT_TOKEN, "POST", "/v1/topics", {"name": "audit.tmp", "queues": 1}, 201),
        (AUDIT_TOKEN, "DELETE", "/v1/topics/audit.tmp", None, 200),
        (AUDIT_TOKEN, "POST", "/v1/topics", {"name": "orders.new", "queues": 1}, 403),
        (PRODUCER_TOKEN, "POST", "/v1/topics", {"name": "orders.new", "queues": 1}, 403),
        (AUDIT_TOKEN, "DELETE", "/v1/topics/orders.a", None, 403),
        # a malformed body goes to the handler (400) only with the permission on some topic
        (AUDIT_TOKEN, "POST", "/v1/topics", {"queues": 1}, 400),
        (PRODUCER_TOKEN, "POST", "/v1/topics", {"queues": 1}, 403),
        (CONSUMER_TOKEN, "PUT", "/v1/groups/g1/offsets", [1, 2], 400),
    ]
    wrong = []
    for token, method, path, body, want in cases:
        for node in ("n1", "n2", "n3"):  # the entry node checks, wherever the leader is
            if node != "n1" and (want == 201 or (method == "DELETE" and want == 200)):
                continue  # not repeatable
            r = secure.call(method, path, token, node=node, json=body)
            if r.status_code != want:
                wrong.append(f"{node} {method} {path} -> {r.status_code} (wanted {want}): {r.text[:200]}")
            elif want == 403:
                assert_error(r, 403, "forbidden")
    assert not wrong, "\n".join(wrong)


def test_topic_list_shows_only_the_tokens_topics(secure: Secure) -> None:
    def names(token: str, node: str) -> set[str]:
        r = secure.call("GET", "/v1/topics", token, node=node)
        assert r.status_code == 200, r.text
        return {t["name"] for t in r.json()["topics"]}

    for node in secure.c.nodes:
        produced = names(PRODUCER_TOKEN, node)  # orders.* also matches dead-letter topics orders.b.s.dlq
        assert {"orders.a", "orders.b"} <= produced and all(n.startswith("orders.") for n in produced)
        assert names(AUDIT_TOKEN, node) == {"audit.log"}
        assert names(MONITOR_TOKEN, node) == set()
        assert {"orders.a", "orders.b", "audit.log", "other"} <= names(ADMIN_TOKEN, node)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/topics/orders.a/queues/0/messages"),  # the route itself (consume)
        ("HEAD", "/v1/topics/orders.a/queues/0/messages"),
        ("OPTIONS", "/v1/topics/orders.a/queues/0/messages"),
        ("GET", "/v1/topics/orders.a/queues/0/messages/"),  # trailing slash
        ("GET", "/V1/topics/orders.a/queues/0/messages"),  # case
        ("GET", "/v1/topics/orders.a%2Fqueues%2F0%2Fmessages"),  # encoded slashes
        ("GET", "/v1/topics/orders.a/subscriptions/%2E%2E/%2E%2E/queues/0/messages"),  # encoded dots
        ("GET", "/v1/topics/orders.a/./queues/0/messages"),
        ("GET", "//v1/topics/orders.a/queues/0/messages"),
        ("GET", "/internal/groups/0/records?topic_id=1&queue=0&offset=0"),  # peers only
    ],
)
def test_path_tricks_never_pass_the_permission_check(secure: Secure, method: str, path: str) -> None:
    """A producer-only token cannot read messages through another spelling of the route."""
    created = secure.call("POST", "/v1/topics", ADMIN_TOKEN, json={"name": "orders.tricks", "queues": 1})
    assert created.status_code in (201, 409), created.text
    body = {"messages": [{"value": "tricked", "queue": 0}]}
    assert secure.call("POST", "/v1/topics/orders.tricks/messages", PRODUCER_TOKEN, json=body).ok
    r = secure.call(method, path.replace("orders.a", "orders.tricks"), PRODUCER_TOKEN, node="n2")
    assert r.status_code in (401, 403, 404, 405), (r.status_code, r.text)
    assert "tricked" not in r.text


def test_the_push_stream_needs_consume(secure: Secure) -> None:
    context = ssl.create_default_context(cafile=str(secure.ca))

    async def handshake(token: str) -> int:
        url = secure.c.url("n2") + "/v1/topics/orders.a/subscriptions/push/stream"
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, ssl=context, headers={"Authorization": f"Bearer {token}"}):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status

    assert asyncio.run(handshake(CONSUMER_TOKEN)) == 101
    assert asyncio.run(handshake(PRODUCER_TOKEN)) == 403


def test_subscription_settings_need_admin_on_the_topic(secure: Secure) -> None:
    """A consume-only token may receive under any group but not set a group's settings (they
    outlive its consumers and create its dead-letter topic): 403, and nothing is created."""
    settings = {"max_deliveries": 3, "backoff_ms": [100]}
    path = "/v1/topics/orders.a/subscriptions/settings-check"
    for node in secure.c.nodes:
        assert_error(secure.call("PUT", path, CONSUMER_TOKEN, node=node, json=settings), 403, "forbidden")
        assert_error(secure.call("PUT", path, PRODUCER_TOKEN, node=node, json=settings), 403, "forbidden")
    # admin on other topics only is not enough either
    assert_error(secure.call("PUT", path, AUDIT_TOKEN, json=settings), 403, "forbidden")
    listed = secure.call("GET", "/v1/topics", ADMIN_TOKEN)
    assert "orders.a.settings-check.dlq" not in {t["name"] for t in listed.json()["topics"]}
    # admin on the topic (its own patterns or cluster-wide) sets them
    stored = secure.call("PUT", path, ADMIN_TOKEN, node="n2", json=settings)
    assert stored.status_code == 200, stored.text
    assert stored.json()["max_deliveries"] == 3
    own = secure.call("PUT", "/v1/topics/audit.log/subscriptions/settings-check", AUDIT_TOKEN, json=settings)
    assert own.status_code == 200, own.text
    # and consuming under the group stays a consume right
    received = secure.call("POST", path + "/receive", CONSUMER_TOKEN, json={"wait_ms": 0})
    assert received.status_code == 200, received.text


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/cluster/placement", None),
        ("POST", "/v1/cluster/nodes", {"id": "n9", "http": "127.0.0.1:1", "raft": "127.0.0.1:2"}),
        ("DELETE", "/v1/cluster/nodes/n3", None),
        ("POST", "/v1/cluster/groups/0/move", {"from": "n1", "to": "n2"}),
        ("POST", "/v1/cluster/groups/0/leader", {"node": "n2"}),
        ("POST", "/v1/cluster/rebalance", {}),
        ("DELETE", "/v1/cluster/change", None),
    ],
)
def test_cluster_changes_need_cluster_admin(secure: Secure, method: str, path: str, body: Any) -> None:
    """Admin on some topics, or every other right on every topic, changes nothing in the cluster."""
    for token in (AUDIT_TOKEN, CONSUMER_TOKEN, PRODUCER_TOKEN, MONITOR_TOKEN):
        assert_error(secure.call(method, path, token, node="n2", json=body), 403, "forbidden")
    assert secure.call("GET", "/v1/cluster/placement", ADMIN_TOKEN).status_code == 200


# -- forwarding and the cluster secret ----------------------------------------------------------------


def test_requests_forwarded_to_leaders_keep_working_from_every_node(secure: Secure) -> None:
    """Each node forwards to the leaders it does not host (over HTTPS, with the cluster secret)."""
    sent = []
    for i, node in enumerate(["n1", "n2", "n3"] * 3):
        r = secure.call(
            "POST",
            "/v1/topics/orders.b/messages",
            PRODUCER_TOKEN,
            node=node,
            json={"messages": [{"value": f"f{i}"}]},
        )
        assert r.status_code == 200, r.text
        sent.append(f"f{i}")
    got = []
    for q in range(3):
        for node in ("n1", "n2", "n3"):
            r = secure.call(
                "GET", f"/v1/topics/orders.b/queues/{q}/messages?offset=0&max=1000", CONSUMER_TOKEN, node=node
            )
            assert r.status_code == 200, r.text
            if node == "n1":
                got += [m["value"] for m in r.json()["messages"]]
    assert sorted(v for v in got if v.startswith("f")) == sorted(sent)


def test_the_internal_header_is_worthless_without_the_cluster_secret(secure: Secure) -> None:
    wrong = {"X-Raftmq-Secret": "integration-test-secret-012345678X"}
    for path in ("/v1/topics", "/v1/cluster", "/internal/status", "/internal/groups/meta/digest"):
        # a wrong secret is refused even with a valid admin token beside it: no fallback
        assert_error(secure.call("GET", path, ADMIN_TOKEN, headers=wrong), 401, "unauthorized")
        assert_error(secure.call("GET", path, headers={"X-Raftmq-Secret": "é"}), 401, "unauthorized")
    assert_error(secure.call("GET", "/internal/status", ADMIN_TOKEN), 401, "unauthorized")
    # claiming to be a forwarded request does not help either
    forwarded = {"X-Raftmq-Forwarded": "n1"}
    assert_error(secure.call("GET", "/v1/topics", headers=forwarded), 401, "unauthorized")
    # the peers' own header with the right secret passes (the harness's status calls use it)
    assert secure.c.status("n2")["node_id"] == "n2"


# -- no secret anywhere ---------------------------------------------------------------------------------


def test_bad_configs_never_echo_the_secret_or_a_token(tmp_path: Path) -> None:
    short_secret = "s3cr3t-xy-Kq9"  # too short
    bad_token = "tok en with spaces Vd8Lp2"
    config = tmp_path / "bad.toml"
    config.write_text(
        f'[cluster]\nsecret = "{short_secret}"\n'
        f'[[security.tokens]]\nname = "t"\ntoken = "{bad_token}"\nproduce = ["a/b"]\n'
        '[[nodes]]\nid = "n1"\nhttp = "127.0.0.1:1"\nraft = "127.0.0.1:2"\ndata_dir = "d"\n'
    )
    r = cli("serve", "--config", str(config), "--node", "n1")
    assert r.returncode != 0 and "cluster.secret must be" in r.stderr and "token 't'" in r.stderr
    env_secret = "env-s3cret-short"[:15]
    r2 = cli("serve", "--config", str(config), "--node", "n1", env={"RAFTMQ_SECRET": env_secret})
    assert r2.returncode != 0
    for out in (r.stdout + r.stderr, r2.stdout + r2.stderr):
        for value in (short_secret, bad_token, env_secret):
            assert value not in out


def test_no_secret_in_any_log_answer_or_metric(secure: Secure) -> None:
    c = secure.c
    # Exercise the paths that could leak, here too (the test may run alone): refusals of every
    # kind, forwarded writes, the cluster view, metrics.
    secure.call("GET", "/v1/topics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}x"})
    secure.call("GET", "/v1/topics", headers={"X-Raftmq-Secret": SECRET + "x"})
    secure.call("POST", "/v1/topics/audit.log/messages", PRODUCER_TOKEN, json={"messages": [{"value": "x"}]})
    for node in c.nodes:
        secure.call(
            "POST",
            "/v1/topics/orders.a/messages",
            PRODUCER_TOKEN,
            node=node,
            json={"messages": [{"value": "x"}]},
        )
        secure.call("GET", "/v1/cluster", MONITOR_TOKEN, node=node)
        secure.call("GET", "/metrics", MONITOR_TOKEN, node=node)
    logs = {nid: c.log(nid) for nid in c.nodes}
    assert all("request_refused" in text for text in logs.values())  # refusals are logged...
    for value in SECRETS:
        for nid, text in logs.items():
            assert value not in text, f"a secret is in {nid}'s log"
    assert_no_secret_in_answers()
    # The digests in the cluster file are not secret, but nothing prints them either.
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    assert all(digest not in text for text in logs.values())
