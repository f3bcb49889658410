"""docker-compose.yml, end to end, on the image of the root Dockerfile (built on the local base).

The cluster comes up healthy; messages produced through the published ports are all there after a
node is killed with ``docker kill`` mid-stream; the killed node comes back from its volume and
catches up; a backup taken in a container and restored into every node's volume brings back exactly
the backed-up messages; ``down -v`` leaves no volume behind. Also: a missing secret or admin token
fails clearly, and the image refuses to serve its non-loopback address without API tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client import Admin, AsyncProducer

from .conftest import REPO

PROJECT = "raftmq-deploy-test"
CLUSTER_FILE = REPO / "deploy" / "compose" / "cluster.toml"
TOPIC = "deploy"
QUEUES = 6
ADMIN_TOKEN = os.urandom(24).hex()  # RAFTMQ_TOKEN_ADMIN: the compose cluster's admin token
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _compose_nodes() -> dict[str, str]:
    """Node id -> advertised HTTP address, from the cluster file the compose file mounts."""
    with open(CLUSTER_FILE, "rb") as f:
        return {n["id"]: n["http"] for n in tomllib.load(f)["nodes"]}


def _free_ports(count: int, start: int = 18081) -> list[int]:
    ports: list[int] = []
    port = start
    while len(ports) < count and port < 32000:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                ports.append(port)
            except OSError:
                pass
        port += 1
    assert len(ports) == count, "no free host ports below 32000"
    return ports


def _http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=timeout) as resp:
        return json.loads(resp.read())


class Compose:
    """docker-compose on the repository's compose file, in its own project, with its own env."""

    def __init__(self, command: list[str], env: dict[str, str], env_file: Path) -> None:
        self.command = [*command, "--project-name", PROJECT, "--env-file", str(env_file)]
        self.env = env
        self.env_file = env_file

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.command, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()


def _base_env() -> dict[str, str]:
    """This process's environment without raftmq settings (a developer's RAFTMQ_* stays out)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}


def _docker_nofile(image: str) -> int:
    """What the compose file may ask for: 65536, or less when dockerd's own hard limit is lower."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", "ulimit -Hn"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return 65536 if out == "unlimited" else min(65536, int(out))


@pytest.fixture
def empty_env_file(tmp_path: Path) -> Path:
    """An empty --env-file, so a developer's .env next to the compose file is not read."""
    path = tmp_path / "empty.env"
    path.write_text("")
    return path


def test_missing_secret_or_admin_token_fails_clearly(
    deploy_image: str, compose_bin: list[str], empty_env_file: Path, tmp_path: Path
) -> None:
    compose = Compose(compose_bin, _base_env() | {"RAFTMQ_IMAGE": deploy_image}, empty_env_file)
    done = compose.run("config", check=False)
    assert done.returncode != 0
    assert "RAFTMQ_SECRET is not set" in done.stderr
    secret = {"RAFTMQ_SECRET": os.urandom(16).hex()}
    compose = Compose(compose_bin, _base_env() | {"RAFTMQ_IMAGE": deploy_image} | secret, empty_env_file)
    done = compose.run("config", check=False)
    assert done.returncode != 0
    assert "RAFTMQ_TOKEN_ADMIN is not set" in done.stderr

    # The image itself, run without compose and without a secret, says what is missing.
    ran = subprocess.run(
        [
            "docker", "run", "--rm", "-e", "RAFTMQ_NODE=n1",
            "-v", f"{CLUSTER_FILE}:/etc/raftmq/cluster.toml:ro", deploy_image,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 64, ran.stderr
    assert "RAFTMQ_SECRET is not set" in ran.stderr

    # With the secret but without the admin token, the node names the missing variable.
    secret_arg = f"RAFTMQ_SECRET={secret['RAFTMQ_SECRET']}"
    ran = subprocess.run(
        [
            "docker", "run", "--rm", "-e", "RAFTMQ_NODE=n1", "-e", secret_arg,
            "-v", f"{CLUSTER_FILE}:/etc/raftmq/cluster.toml:ro", deploy_image,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    assert "RAFTMQ_TOKEN_ADMIN" in ran.stderr

    # A cluster file without tokens: a node on the container's (non-loopback) address refuses.
    open_file = tmp_path / "open.toml"
    open_file.write_text(CLUSTER_FILE.read_text().split("[[security.tokens]]")[0] + _nodes_toml())
    ran = subprocess.run(
        [
            "docker", "run", "--rm", "-e", "RAFTMQ_NODE=n1", "-e", secret_arg,
            "-v", f"{open_file}:/etc/raftmq/cluster.toml:ro", deploy_image,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    assert "not a loopback address" in ran.stderr and "allow_unauthenticated = true" in ran.stderr


def _nodes_toml() -> str:
    """The [[nodes]] tables of the compose cluster file, as they are written there."""
    text = CLUSTER_FILE.read_text()
    return text[text.index("[[nodes]]") :]


@pytest.fixture
def cluster(
    deploy_image: str, compose_bin: list[str], empty_env_file: Path
) -> Iterator[tuple[Compose, dict[str, int]]]:
    """The compose cluster up on free host ports; yields (compose, node id -> host port)."""
    nodes = sorted(_compose_nodes())
    ports = dict(zip(nodes, _free_ports(len(nodes)), strict=True))
    env = _base_env() | {
        "RAFTMQ_IMAGE": deploy_image,
        "RAFTMQ_SECRET": os.urandom(16).hex(),
        "RAFTMQ_TOKEN_ADMIN": ADMIN_TOKEN,
        "RAFTMQ_NOFILE": str(_docker_nofile(deploy_image)),
    }
    env |= {f"RAFTMQ_{n.upper()}_PORT": str(p) for n, p in ports.items()}
    compose = Compose(compose_bin, env, empty_env_file)
    compose.run("down", "-v", "--remove-orphans", check=False)  # leftovers of an interrupted run
    try:
        started = time.monotonic()
        compose.run("up", "-d", "--no-build")
        _wait_healthy(compose, nodes, timeout_s=90)
        print(f"cluster healthy {time.monotonic() - started:.1f} s after `up`")
        yield compose, ports
    finally:
        logs = compose.run("logs", "--no-color", "--tail", "30", check=False)
        print(logs.stdout[-20000:])
        compose.run("down", "-v", "--remove-orphans", check=False)
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"name={PROJECT}"], capture_output=True, text=True
    ).stdout.split()
    assert volumes == [], f"down -v left volumes behind: {volumes}"


def _wait_healthy(compose: Compose, services: list[str], timeout_s: float) -> None:
    """Until docker reports every service's container healthy (the image's HEALTHCHECK)."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for s in services:
            cid = compose.container(s)
            states[s] = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Status}}/{{.State.Health.Status}}", cid],
                capture_output=True,
                text=True,
            ).stdout.strip()
        if all(v == "running/healthy" for v in states.values()):
            return
        time.sleep(1)
    raise AssertionError(f"containers not healthy after {timeout_s} s: {states}")


def _wait_caught_up(url: str, timeout_s: float) -> dict[str, Any]:
    """Until every node is reachable and every replica has applied its leader's commit index."""
    deadline = time.monotonic() + timeout_s
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            data = _http_json(url + "/v1/cluster")
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
            continue
        behind = [
            (g["group_id"], r["node_id"])
            for g in data["groups"]
            for r in g["replicas"]
            if g["leader"] is None
            or r["applied_index"]
            < max(x["commit_index"] for x in g["replicas"] if x["node_id"] == g["leader"])
        ]
        if all(n["reachable"] for n in data["nodes"]) and not behind:
            return data
        time.sleep(0.5)
    raise AssertionError(f"cluster not caught up after {timeout_s} s: {data}")


def _read_all(url: str, read_from: str = "leader") -> list[str]:
    """Every message value of the topic, queue by queue, from offset 0 to the high offset."""
    values: list[str] = []
    for q in range(QUEUES):
        offset, high = 0, None
        while high is None or offset < high:
            answer = _http_json(
                f"{url}/v1/topics/{TOPIC}/queues/{q}/messages?offset={offset}&max=2000&read_from={read_from}"
            )
            values += [m["value"] for m in answer["messages"]]
            offset, high = answer["next_offset"], answer["high_offset"]
    return values


async def _produce_through_kill(
    urls: list[str], to_host: dict[str, str], victim_container: Callable[[], str]
) -> tuple[dict[str, Any], int]:
    """Produce for 2 s, ``docker kill`` the victim, produce 4 s more; every message's outcome
    (RecordMetadata or the exception), and how many were sent before the kill."""
    outcomes: dict[str, asyncio.Future[Any]] = {}
    async with AsyncProducer(
        urls,
        address_map=lambda u: to_host.get(u, u),
        linger_ms=2,
        delivery_timeout_ms=60_000,
        token=ADMIN_TOKEN,
    ) as p:
        loop = asyncio.get_running_loop()

        async def send_for(seconds: float) -> None:
            deadline = loop.time() + seconds
            while loop.time() < deadline:
                for _ in range(50):
                    i = len(outcomes)
                    outcomes[f"m{i}"] = await p.send(TOPIC, f"m{i}", key=f"k{i % 97}")
                await asyncio.sleep(0.02)

        await send_for(2.0)
        before_kill = len(outcomes)
        cid = await loop.run_in_executor(None, victim_container)
        kill = loop.run_in_executor(
            None, lambda: subprocess.run(["docker", "kill", cid], check=True, capture_output=True)
        )
        await send_for(4.0)  # through the election(s) that follow
        await kill
        results = await asyncio.wait_for(asyncio.gather(*outcomes.values(), return_exceptions=True), 90)
    return dict(zip(outcomes, results, strict=True)), before_kill


def test_compose_cluster_keeps_every_acknowledged_message_through_a_docker_kill(
    cluster: tuple[Compose, dict[str, int]],
) -> None:
    compose, ports = cluster
    advertised = _compose_nodes()
    to_host = {f"http://{advertised[n]}": f"http://127.0.0.1:{p}" for n, p in ports.items()}
    urls = list(to_host.values())

    with Admin(urls, request_timeout_ms=10_000, token=ADMIN_TOKEN) as admin:
        admin.create_topic(TOPIC, queues=QUEUES)
    status = _http_json(urls[0] + "/v1/cluster")
    victim = next(g["leader"] for g in status["groups"] if g["group_id"] == "meta")

    outcomes, before_kill = asyncio.run(
        _produce_through_kill(urls, to_host, lambda: compose.container(victim))
    )
    acked = {v for v, outcome in outcomes.items() if not isinstance(outcome, BaseException)}
    failed = {v: repr(e) for v, e in outcomes.items() if isinstance(e, BaseException)}
    print(f"killed {victim} after {before_kill} sends; acked {len(acked)} of {len(outcomes)}")
    print(f"failed: {len(failed)}, e.g. {list(failed.items())[:3]}")
    assert before_kill >= 100, "too few messages before the kill for the test to mean anything"
    assert len(acked) > before_kill, "nothing was acknowledged after the kill"

    survivor = next(to_host[f"http://{advertised[n]}"] for n in ports if n != victim)
    consumed = _read_all(survivor)
    missing = acked - set(consumed)
    assert not missing, f"{len(missing)} acknowledged messages missing, e.g. {sorted(missing)[:10]}"
    assert set(consumed) <= set(outcomes), "consumed a value that was never produced"

    # The killed node comes back from its volume and catches up; its own replica has every message.
    compose.run("start", victim)
    _wait_healthy(compose, [victim], timeout_s=60)
    victim_url = f"http://127.0.0.1:{ports[victim]}"
    _wait_caught_up(victim_url, timeout_s=60)
    assert sorted(_read_all(victim_url, read_from="local")) == sorted(consumed)

    # Backup and restore as docs/operations.md tells it for compose: `raftmq backup` in a running
    # container; stop; copy the file into each node's volume; `raftmq restore` in a one-off
    # container of each service; up. The message produced after the backup is gone.
    backup = compose.run("exec", "-T", "n1", "raftmq", "backup", "-o", "/var/lib/raftmq/backup.tar")
    assert "backup of 4 groups written" in backup.stdout, backup.stdout + backup.stderr
    _produce_one(victim_url, "after-backup")
    host_copy = Path(compose.env_file).parent / "backup.tar"
    subprocess.run(
        ["docker", "cp", f"{compose.container('n1')}:/var/lib/raftmq/backup.tar", str(host_copy)], check=True
    )
    compose.run("stop")
    for node in ports:
        subprocess.run(
            ["docker", "cp", str(host_copy), f"{compose.container(node)}:/var/lib/raftmq/backup.tar"],
            check=True,
        )
        restored = compose.run(
            "run",
            "--rm",
            "--no-deps",
            "-T",
            node,
            "raftmq",
            "restore",
            "--node",
            node,
            "--force",
            "/var/lib/raftmq/backup.tar",
        )
        assert f"node {node}: restored groups" in restored.stdout, restored.stdout + restored.stderr
    compose.run("up", "-d", "--no-build")
    _wait_healthy(compose, list(ports), timeout_s=90)
    _wait_caught_up(victim_url, timeout_s=60)
    assert sorted(_read_all(victim_url)) == sorted(consumed)


def _produce_one(url: str, value: str) -> None:
    request = urllib.request.Request(
        f"{url}/v1/topics/{TOPIC}/messages",
        data=json.dumps({"messages": [{"value": value}]}).encode(),
        headers={"Content-Type": "application/json", **AUTH},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
