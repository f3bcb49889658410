"""The secured cluster of the security tests (``test_security_*.py``): a 3-node cluster with HTTPS
under a test CA (n1 has a certificate of its own, the others share [tls]'s), five tokens (by SHA-256,
by value and from the environment), and n3's Raft ports bound to 0.0.0.0 on purpose (the others keep
the default: their Raft host). Each test module starts one (:func:`secure_cluster`, its ``secure``
fixture); every answer its tests see is kept in :data:`ANSWERS`, and when a module is done no secret
may be in its cluster's logs (:func:`assert_no_secret_in_logs`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.cluster.config.keys import derive_keys

from .harness import SECRET, Cluster
from .tls_certs import CertAuthority

ADMIN_TOKEN = "adm1n-token-Zq8YvX3k2P0aBcDeFgH"  # in the file only as its SHA-256
PRODUCER_TOKEN = "producer-token-7Hq2LmN9sT4vWxYz"  # in the file as itself
CONSUMER_TOKEN = "consumer-token-Rk5Jp8Qd3Ff6Gg1"  # from RAFTMQ_TOKEN_ORDERS_CONSUMER
AUDIT_TOKEN = "audit-admin-token-Ux7Vb2Nc4Mm9"
MONITOR_TOKEN = "monitor-token-Ee3Ww6Tt8Yy1Ii0"  # no permission on any topic
KEYS = derive_keys(SECRET)  # what the nodes use of the secret (cluster/config/keys.py)
SECRETS = (
    *(SECRET, KEYS.peer, KEYS.raft, KEYS.backup),
    *(ADMIN_TOKEN, PRODUCER_TOKEN, CONSUMER_TOKEN, AUDIT_TOKEN, MONITOR_TOKEN),
)

SECURITY_TOML = f"""
[security]
metrics_open = false

[[security.tokens]]
name = "admin"
sha256 = "{hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "orders-producer"
token = "{PRODUCER_TOKEN}"
produce = ["orders.*"]

[[security.tokens]]
name = "orders-consumer"
consume = ["orders.*"]

[[security.tokens]]
name = "audit-admin"
token = "{AUDIT_TOKEN}"
admin = ["audit.*"]

[[security.tokens]]
name = "monitor"
token = "{MONITOR_TOKEN}"
"""

ANSWERS: list[str] = []  # every response body and header seen, checked for secrets at the end


@dataclass
class Secure:
    c: Cluster
    ca: Path
    own_cert_cn: str

    def call(
        self, method: str, path: str, token: str | None = None, node: str | None = None, **kw: Any
    ) -> requests.Response:
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        r = self.c.session.request(method, self.c.url(node) + path, headers=headers, timeout=30, **kw)
        ANSWERS.append(r.text)
        ANSWERS.append(repr(dict(r.headers)))
        return r


def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """The body of a test module's ``secure`` fixture: the cluster, its topics made; at the end,
    every node still alive and no secret in any node's log."""
    tmp = tmp_path_factory.mktemp("secure")
    ca = CertAuthority(tmp)
    shared, own = ca.issue("cluster"), ca.issue("n1")
    tls = f'[tls]\ncert_file = "{shared.cert}"\nkey_file = "{shared.key}"\nca_file = "{ca.cert_path}"\n'

    def node_toml(node_id: str) -> str:
        if node_id == "n1":
            return f'tls_cert_file = "{own.cert}"\ntls_key_file = "{own.key}"'
        return 'raft_bind = "0.0.0.0"' if node_id == "n3" else ""

    with Cluster(tmp, nodes=3, extra_toml=tls + SECURITY_TOML, node_toml=node_toml, scheme="https") as c:
        c.session.verify = str(ca.cert_path)
        c.session.trust_env = False  # REQUESTS_CA_BUNDLE would replace verify
        c.start(env={"RAFTMQ_TOKEN_ORDERS_CONSUMER": CONSUMER_TOKEN})
        c.wait_ready()
        s = Secure(c, ca.cert_path, "n1")
        for name in ("orders.a", "orders.b", "audit.log", "other"):
            assert (
                s.call("POST", "/v1/topics", ADMIN_TOKEN, json={"name": name, "queues": 3}).status_code == 201
            )
        yield s
        for nid in c.nodes:
            assert c.alive(nid), f"{nid} died during the module:\n{c.log(nid)[-3000:]}"
        assert_no_secret_in_logs(c)
        assert_no_secret_in_answers()
        ANSWERS.clear()  # the next module's cluster starts a list of its own


def assert_no_secret_in_answers() -> None:
    """No secret in any answer the module's tests kept in :data:`ANSWERS` (bodies, headers, and
    what the CLI printed)."""
    for value in SECRETS:
        for answer in ANSWERS:
            assert value not in answer, "a secret is in an answer"


def assert_no_secret_in_logs(c: Cluster) -> dict[str, str]:
    """No secret (nor the admin token's digest, not secret but printed by nothing) in any node's
    log; returns the logs."""
    logs = {nid: c.log(nid) for nid in c.nodes}
    for value in SECRETS:
        for nid, text in logs.items():
            assert value not in text, f"a secret is in {nid}'s log"
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    assert all(digest not in text for text in logs.values())
    return logs


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
    )
