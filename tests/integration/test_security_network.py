"""Security with real node processes, on the network: HTTPS for the API and between nodes (and the
TLS contexts a node builds), the Python client and the CLI over it with a token and a CA file, and
the Raft ports (encrypted with the secret, bound to the cluster network). One secured cluster serves
the module (``security_cluster.py``).
"""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.client import Admin, Forbidden, Producer, Unauthorized
from raftmq.cluster.config.cluster_file import parse_config
from raftmq.cluster.config.keys import derive_keys
from raftmq.cluster.config.tls import TlsError, client_context, server_context
from raftmq.cluster.replication.pso import RaftConnection
from raftmq.cluster.replication.wire import raft_key

from .harness import SECRET, wait_until
from .security_cluster import (
    ANSWERS,
    CONSUMER_TOKEN,
    MONITOR_TOKEN,
    PRODUCER_TOKEN,
    Secure,
    cli,
    secure_cluster,
)
from .tls_certs import CertAuthority


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    yield from secure_cluster(tmp_path_factory)


# -- TLS ----------------------------------------------------------------------------------------------


# The contexts a node builds (no cluster needed)
def _config(tls: dict[str, Any]) -> Any:
    nodes = [{"id": "n1", "http": "127.0.0.1:8001", "raft": "127.0.0.1:7001", "data_dir": "/d"}]
    return parse_config({"cluster": {"secret": SECRET}, "tls": tls, "nodes": nodes})


def test_plain_http_has_no_contexts() -> None:
    c = _config({})
    assert client_context(c) is None and server_context(c.nodes[0]) is None


def test_peers_are_verified_by_default_against_the_ca_file(tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path)
    issued = ca.issue("n1")
    c = _config({"cert_file": str(issued.cert), "key_file": str(issued.key), "ca_file": str(ca.cert_path)})
    client = client_context(c)
    assert client is not None
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert [x["subject"] for x in client.get_ca_certs()] == [((("commonName", "raftmq test CA"),),)]
    server = server_context(c.nodes[0])
    assert server is not None and server.minimum_version == ssl.TLSVersion.TLSv1_2


def test_verify_false_turns_peer_verification_off(tmp_path: Path) -> None:
    issued = CertAuthority(tmp_path).issue("n1")
    client = client_context(
        _config({"cert_file": str(issued.cert), "key_file": str(issued.key), "verify": False})
    )
    assert client is not None and client.verify_mode == ssl.CERT_NONE and not client.check_hostname


def test_unusable_files_are_reported_by_name(tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path)
    issued, other = ca.issue("n1"), ca.issue("other")
    mismatched = _config({"cert_file": str(issued.cert), "key_file": str(other.key)})
    with pytest.raises(TlsError, match=r"cannot load the TLS certificate .*n1\.pem"):
        server_context(mismatched.nodes[0])
    missing = _config({"cert_file": str(tmp_path / "nope.pem"), "key_file": str(issued.key)})
    with pytest.raises(TlsError, match=r"nope\.pem"):
        server_context(missing.nodes[0])
    bad_ca = _config({"cert_file": str(issued.cert), "key_file": str(issued.key), "ca_file": str(issued.key)})
    with pytest.raises(TlsError, match="cannot load the CA file"):
        client_context(bad_ca)


def test_the_api_is_https_only_and_verified_against_the_ca(secure: Secure) -> None:
    c = secure.c
    plain = c.nodes["n2"].url.replace("https://", "http://")
    with pytest.raises(requests.ConnectionError):
        requests.get(plain + "/healthz", timeout=5)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(c.url("n2") + "/healthz", timeout=5)  # the system's CAs do not know ours
    assert requests.get(c.url("n2") + "/healthz", timeout=5, verify=str(secure.ca)).status_code == 200


def test_n1_serves_its_own_certificate_and_the_others_the_shared_one(secure: Secure) -> None:
    context = ssl.create_default_context(cafile=str(secure.ca))
    names = {}
    for nid, n in secure.c.nodes.items():
        host, port = n.http.rsplit(":", 1)
        with (
            socket.create_connection((host, int(port)), 5) as raw,
            context.wrap_socket(raw, server_hostname=host) as s,
        ):
            cert: Any = s.getpeercert()
            names[nid] = dict(x[0] for x in cert["subject"])["commonName"]
    assert names == {"n1": "n1", "n2": "cluster", "n3": "cluster"}


def test_the_python_client_with_token_and_ca_file(secure: Secure) -> None:
    urls = [n.url for n in secure.c.nodes.values()]
    ca = str(secure.ca)
    with Admin(urls, token=PRODUCER_TOKEN, ca_file=ca) as admin:
        listed = {t.name for t in admin.list_topics()}
        assert {"orders.a", "orders.b"} <= listed and all(n.startswith("orders.") for n in listed)
    with Admin(urls, ca_file=ca) as anonymous, pytest.raises(Unauthorized):
        anonymous.list_topics()
    with Producer(urls, token=PRODUCER_TOKEN, ca_file=ca) as producer:
        assert producer.send("orders.a", "via-client").result(30).offset is not None
        with pytest.raises(Forbidden):
            producer.send("other", "not-allowed").result(30)


def test_the_cli_with_token_and_ca_file(secure: Secure) -> None:
    url, ca = secure.c.url("n2"), str(secure.ca)
    ok = cli("status", "--json", "--url", url, "--token", MONITOR_TOKEN, "--ca-file", ca)
    assert ok.returncode == 0, ok.stderr
    assert '"node_id": "n2"' in ok.stdout
    by_env = cli("topic", "list", "--url", url, env={"RAFTMQ_TOKEN": PRODUCER_TOKEN, "RAFTMQ_CA_FILE": ca})
    assert by_env.returncode == 0 and "orders.a" in by_env.stdout and "audit.log" not in by_env.stdout
    missing = cli("status", "--url", url, "--ca-file", ca)
    assert missing.returncode == 1 and "error unauthorized" in missing.stderr
    # ... and says how to give this command a token (the node's message speaks of HTTP headers)
    assert "--token or $RAFTMQ_TOKEN" in missing.stderr, missing.stderr
    produce = subprocess.run(
        [
            sys.executable,
            "-m",
            "raftmq.cluster.cli.main",
            "produce",
            "other",
            "-q",
            "--url",
            url,
            "--token",
            CONSUMER_TOKEN,
            "--ca-file",
            ca,
        ],
        input="x\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produce.returncode == 1 and "forbidden" in produce.stderr
    ANSWERS.extend([ok.stdout, ok.stderr, by_env.stdout, missing.stderr, produce.stdout, produce.stderr])


# -- Raft ports -----------------------------------------------------------------------------------------


class _Mkdir:
    """Unpickling this creates a directory: what an attacker's pickle would run on the node."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def test_a_raw_pickle_sent_to_a_raft_port_does_nothing(secure: Secure, tmp_path: Path) -> None:
    control, marker = tmp_path / "control", tmp_path / "pwned"
    # The payload is live: unpickled (as pysyncobj would without a password) it runs its code.
    pickle.loads(zlib.decompress(zlib.compress(pickle.dumps(_Mkdir(control)))))
    assert control.is_dir()
    data = zlib.compress(pickle.dumps(_Mkdir(marker)))
    frames = [
        struct.pack("i", len(data)) + data,  # pysyncobj's framing, unencrypted
        pickle.dumps(_Mkdir(marker)),  # without framing
        struct.pack("i", 2**31 - 1) + b"x" * 1000,  # a frame that claims 2 GiB
        os.urandom(4096),
    ]
    c = secure.c
    n1 = c.nodes["n1"]
    for port in (n1.raft_base, n1.raft_base + 1, n1.raft_base + 2):  # metadata group, queue groups 0, 1
        for frame in frames:
            with socket.create_connection(("127.0.0.1", port), 5) as s:
                s.sendall(frame)
    wait_until(lambda: c.get("/readyz", "n1", timeout=2).status_code == 200, 15, what="n1 ready")
    assert not marker.exists()
    assert c.alive("n1")
    r = secure.call(
        "POST",
        "/v1/topics/orders.a/messages",
        PRODUCER_TOKEN,
        node="n1",
        json={"messages": [{"value": "after"}]},
    )
    assert r.status_code == 200, r.text


def test_a_node_with_the_wrong_raft_key_is_hung_up_on_and_injects_nothing(
    secure: Secure, tmp_path: Path
) -> None:
    """Frames as a node of another cluster (another secret, so another Raft key) would send them:
    pysyncobj's handshake (a random key), then a pickle that would create a directory. Every Raft
    port closes the connection without a word, and nothing runs."""
    marker = tmp_path / "pwned-by-wrong-key"
    sealer = RaftConnection(None)
    sealer.raft_key = raft_key(derive_keys("another cluster's secret").raft)
    c = secure.c
    n1 = c.nodes["n1"]
    for port in (n1.raft_base, n1.raft_base + 1, n1.raft_base + 2):  # metadata group, queue groups 0, 1
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.sendall(sealer.frame(os.urandom(32)) + sealer.frame(_Mkdir(marker)))
            try:
                answer = s.recv(65536)
            except ConnectionResetError:
                answer = b""
        assert answer == b"", port  # closed: no handshake answer to a wrong key
    wait_until(lambda: c.get("/readyz", "n1", timeout=2).status_code == 200, 15, what="n1 ready")
    assert not marker.exists()
    r = secure.call(
        "POST",
        "/v1/topics/orders.a/messages",
        PRODUCER_TOKEN,
        node="n1",
        json={"messages": [{"value": "after the wrong key"}]},
    )
    assert r.status_code == 200, r.text


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), 2):
            return True
    except OSError:
        return False


def test_raft_ports_listen_on_the_raft_host_unless_configured(secure: Secure) -> None:
    """127.0.0.2 is this host too (loopback /8) but not the Raft host: only n3, configured with
    raft_bind = "0.0.0.0", accepts there."""
    for nid in ("n1", "n2", "n3"):
        base = secure.c.nodes[nid].raft_base
        assert _accepts("127.0.0.1", base), nid
        assert _accepts("127.0.0.2", base) is (nid == "n3"), nid
