"""Secure by default beyond one host: the real ``raftmq serve`` on a non-loopback HTTP address.

Without API tokens it refuses to start, says why and how to fix it, and binds nothing; with
``allow_unauthenticated = true`` in the cluster file's ``[security]`` section (or its environment
override) it starts and logs ``api_unauthenticated`` as a warning. The non-loopback address is this
machine's own address on its default route (0.0.0.0 when it has none) and 0.0.0.0 itself, so the
tests run on any machine with a network stack.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import requests

from .harness import SECRET, free_port_block, wait_until


def own_address() -> str:
    """This machine's IPv4 address on its default route, or 0.0.0.0 without one. Connecting a
    UDP socket sends nothing: it only asks the kernel which source address the route uses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, never answered
            address = str(s.getsockname()[0])
        except OSError:
            return "0.0.0.0"
    return "0.0.0.0" if ipaddress.ip_address(address).is_loopback else address


def write_cluster_file(tmp: Path, http_host: str, security: str = "") -> tuple[Path, int]:
    """A one-node cluster file whose HTTP address is on ``http_host`` (its Raft ports stay on
    127.0.0.1); returns its path and the HTTP port."""
    base = free_port_block(4)
    path = tmp / "cluster.toml"
    path.write_text(
        f'[cluster]\nsecret = "{SECRET}"\n{security}\n'
        f'[[nodes]]\nid = "n1"\nhttp = "{http_host}:{base}"\nraft = "127.0.0.1:{base + 1}"\n'
        f'data_dir = "{tmp / "data"}"\n'
    )
    return path, base


def serve(path: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "raftmq.cluster.cli.main", "serve", "--config", str(path), "--node", "n1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean | (env or {}),
        )


def wait_serving(proc: subprocess.Popen[bytes], session: requests.Session, url: str, log: Path) -> None:
    """Until the node answers /readyz; fails at once if it exits."""

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"raftmq serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        return session.get(url + "/readyz", timeout=2).status_code == 200

    wait_until(ready, 60, what=f"n1 ready on {url} (log: {log})")


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, port), 2):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["0.0.0.0", own_address()])
def test_serve_on_a_non_loopback_address_without_tokens_refuses_to_start(tmp_path: Path, host: str) -> None:
    path, port = write_cluster_file(tmp_path, host)
    log = tmp_path / "n1.log"
    proc = serve(path, log)
    try:
        code = proc.wait(60)  # a node that starts would run until killed
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        pytest.fail(f"raftmq serve started on {host}:{port} without tokens:\n{log.read_text()[-3000:]}")
    out = log.read_text()
    assert code == 1, out
    assert f"{host}:{port}, which is not a loopback address" in out
    for fix in ("[[security.tokens]]", "docs/security.md", "allow_unauthenticated = true", "[security]"):
        assert fix in out, (fix, out)
    assert "api_unauthenticated" not in out and "http_listening" not in out  # it never got that far
    assert not _listening(host, port)
    assert not (tmp_path / "data" / "n1").exists(), "the refused node created its data directory"


@pytest.mark.parametrize("how", ["cluster file", "environment"])
def test_allow_unauthenticated_starts_and_logs_a_warning(tmp_path: Path, how: str) -> None:
    host = own_address()
    in_file = how == "cluster file"
    path, port = write_cluster_file(
        tmp_path, host, "[security]\nallow_unauthenticated = true" if in_file else ""
    )
    log = tmp_path / "n1.log"
    env = {} if in_file else {"RAFTMQ_SECURITY_ALLOW_UNAUTHENTICATED": "true"}
    proc = serve(path, log, env)
    session = requests.Session()
    session.trust_env = False  # no proxy between the test and the node
    try:
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
        wait_serving(proc, session, url, log)
        # Open as configured: a topic is created and described without any token.
        created = session.post(url + "/v1/topics", json={"name": "open", "queues": 1}, timeout=30)
        assert created.status_code == 201, created.text
        warnings = [
            line
            for line in log.read_text().splitlines()
            if "api_unauthenticated" in line and "[warning" in line and f"{host}:{port}" in line
        ]
        assert warnings, log.read_text()[-3000:]
        assert "allow_unauthenticated=True" in warnings[0]
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        session.close()


def test_tokens_on_a_non_loopback_address_start_without_the_warning(tmp_path: Path) -> None:
    host = own_address()
    token = "admin-token-for-the-open-api-test"
    tokens = f'[[security.tokens]]\nname = "admin"\ntoken = "{token}"\nadmin = ["*"]'
    path, port = write_cluster_file(tmp_path, host, tokens)
    log = tmp_path / "n1.log"
    proc = serve(path, log)
    session = requests.Session()
    session.trust_env = False
    try:
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
        wait_serving(proc, session, url, log)
        refused = session.get(url + "/v1/topics", timeout=30)
        assert refused.status_code == 401 and orjson.loads(refused.content)["error"]["code"] == "unauthorized"
        allowed = session.get(url + "/v1/topics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert allowed.status_code == 200, allowed.text
        assert "api_unauthenticated" not in log.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        session.close()
