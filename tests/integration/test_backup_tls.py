"""``raftmq backup`` and ``raftmq restore`` on a cluster with HTTPS and API tokens, run as an operator
runs them: the CLI with the cluster file and nothing else. The backup authenticates with the cluster
secret and verifies every node's certificate against ``tls.ca_file``; a wrong secret, an untrusted
certificate and an unreadable CA file each end it at once with a one-line reason, not a traceback.
After a restore of every node into an empty data directory, every acknowledged message and the
committed offsets are back."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .harness import SECRET, Cluster
from .tls_certs import CertAuthority

ADMIN_TOKEN = "backup-admin-token-Qw3Er5Ty7Ui9Op"
PRODUCER_TOKEN = "backup-producer-token-As2Df4Gh6Jk8"
CONSUMER_TOKEN = "backup-consumer-token-Zx1Cv3Bn5Mm7"
TOPICS = {"orders": 3, "audit": 2}
SECURITY_TOML = f"""
[[security.tokens]]
name = "admin"
sha256 = "{hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}"
admin = ["*"]

[[security.tokens]]
name = "producer"
token = "{PRODUCER_TOKEN}"
produce = ["*"]

[[security.tokens]]
name = "consumer"
token = "{CONSUMER_TOKEN}"
consume = ["*"]
"""


def raftmq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator's shell runs it: no RAFTMQ_* variable but those given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAFTMQ_", "SSL_CERT", "REQUESTS_"))}
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean | env,
    )


def call(c: Cluster, method: str, path: str, token: str, **kw: Any) -> Any:
    r = c.session.request(
        method, c.url() + path, headers={"Authorization": f"Bearer {token}"}, timeout=30, **kw
    )
    assert r.status_code in (200, 201), r.text
    return r.json()


def state_of(c: Cluster) -> dict[str, Any]:
    """Every message of every queue and the committed offsets, read with the consumer's token."""
    state: dict[str, Any] = {}
    for topic, queues in TOPICS.items():
        for q in range(queues):
            path = f"/v1/topics/{topic}/queues/{q}/messages"
            body = call(c, "GET", path, CONSUMER_TOKEN, params={"offset": 0, "max": 10000})
            assert body["next_offset"] == body["high_offset"]
            state[f"{topic}/{q}"] = {m["offset"]: m["value"] for m in body["messages"]}
        offsets = call(c, "GET", "/v1/groups/billing/offsets", CONSUMER_TOKEN, params={"topic": topic})
        state[f"offsets/{topic}"] = offsets["offsets"]
    return state


def test_backup_and_restore_of_a_cluster_with_tls_and_tokens(tmp_path: Path) -> None:
    ca, stranger = CertAuthority(tmp_path), CertAuthority(tmp_path, "another CA")
    cert = ca.issue("cluster")
    tls = f'[tls]\ncert_file = "{cert.cert}"\nkey_file = "{cert.key}"\nca_file = "{ca.cert_path}"\n'
    with Cluster(tmp_path, nodes=3, extra_toml=tls + SECURITY_TOML, scheme="https") as c:
        c.session.verify = str(ca.cert_path)
        c.session.trust_env = False
        config = str(c.config_path)
        c.start()
        c.wait_ready()
        acked: dict[str, dict[int, str]] = {}
        for topic, queues in TOPICS.items():
            call(c, "POST", "/v1/topics", ADMIN_TOKEN, json={"name": topic, "queues": queues})
            for start in range(0, 300, 100):
                batch = [{"key": f"k{i % 7}", "value": f"{topic}-{i}"} for i in range(start, start + 100)]
                path = f"/v1/topics/{topic}/messages"
                body = call(c, "POST", path, PRODUCER_TOKEN, json={"messages": batch})
                for m, result in zip(batch, body["results"], strict=True):
                    acked.setdefault(f"{topic}/{result['queue']}", {})[result["offset"]] = m["value"]
            commit = {"topic": topic, "offsets": {str(q): 5 + q for q in range(queues)}}
            call(c, "PUT", "/v1/groups/billing/offsets", CONSUMER_TOKEN, json=commit)
        expected = state_of(c)
        for queue, messages in acked.items():
            assert expected[queue] == messages, queue  # what was read is exactly what was acknowledged
        assert expected["offsets/orders"] == {"0": 5, "1": 6, "2": 7}

        # Refused before any wait for leaders, each with its reason on one line.
        backup = tmp_path / "backup.tar"
        refusals = [
            # An admin token is no substitute: the backup calls the nodes as a peer.
            ({"RAFTMQ_SECRET": "not-the-cluster-secret-0123", "RAFTMQ_TOKEN": ADMIN_TOKEN}, "cluster secret"),
            ({"RAFTMQ_TLS_CA_FILE": str(stranger.cert_path)}, "certificate is not trusted"),
            ({"RAFTMQ_TLS_CA_FILE": str(tmp_path / "missing.pem")}, "cannot load the CA file"),
        ]
        for env, reason in refusals:
            started = time.monotonic()
            refused = raftmq("backup", "--config", config, "-o", str(backup), **env)
            assert refused.returncode == 1, refused
            assert reason in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
            assert time.monotonic() - started < 20, "a refusal must not wait for the leader timeout"
            assert not backup.exists()

        # The operator's backup: the cluster file (its secret and CA file), no API token; straight
        # to the nodes even with a proxy in the environment (which would see the secret).
        proxy = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": ""}
        done = raftmq("backup", "--config", config, "-o", str(backup), **proxy, no_proxy="")
        assert done.returncode == 0, done.stderr
        assert "backup of 4 groups written" in done.stdout
        content = backup.read_bytes()
        assert all(s.encode() not in content for s in (SECRET, ADMIN_TOKEN, PRODUCER_TOKEN, CONSUMER_TOKEN))

        for nid in c.nodes:
            assert c.terminate(nid) == 0
            c.wipe(nid)
            restored = raftmq("restore", "--config", config, "--node", nid, str(backup))
            assert restored.returncode == 0, restored.stderr
        c.start()
        c.wait_ready(timeout_s=60)
        assert state_of(c) == expected
