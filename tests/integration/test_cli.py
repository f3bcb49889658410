"""The ``raftmq`` command line, run as a real process against real node processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, free_port_block, wait_until

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
DEV_HTTP_PORTS = (8081, 8082, 8083)
# `raftmq dev`: node i has Raft base port 7100 + 100 * i; the metadata group and 3 queue groups
# use base + 0..3.
DEV_RAFT_PORTS = tuple(7100 + 100 * i + k for i in (1, 2, 3) for k in range(4))


def raftmq(
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, "COLUMNS": "120", **(env or {})},
        cwd=cwd,
    )


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port_block(1)}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cli")) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        yield c


# -- status -------------------------------------------------------------------------------------


def status_when_led(*args: str) -> subprocess.CompletedProcess[str]:
    """``raftmq status`` once every group has one leader. Statuses are gathered node by node, so
    while a leadership moves (the balancer after start-up, an election on a busy machine) a view
    can show no leader, or the old one still starred next to the new one: it is asked again."""

    def led() -> subprocess.CompletedProcess[str] | None:
        r = raftmq("status", *args)
        assert r.returncode == 0, r.stderr
        if "--json" in args:
            done = all(
                g["leader"] and [x["node_id"] for x in g["replicas"] if x["is_leader"]] == [g["leader"]]
                for g in json.loads(r.stdout)["groups"]
            )
        else:
            rows = re.findall(r"^\s*(?:meta|\d+)\s+n([123])\s+\d+\s+(.*)$", r.stdout, re.M)
            done = "4/4 groups have a leader" in r.stdout and all(
                [i for i, star in enumerate(re.findall(r"(\*?)\d+/\d+", cells), 1) if star] == [int(leader)]
                for leader, cells in rows
            )
        return r if done else None

    result: subprocess.CompletedProcess[str] = wait_until(led, 30, interval_s=0.2, what="leaders")
    return result


def test_status_shows_three_nodes_and_four_groups_with_leaders(cluster: Cluster) -> None:
    r = status_when_led("--json", "--url", cluster.url("n1"))
    data = json.loads(r.stdout)
    assert [(n["id"], n["reachable"]) for n in data["nodes"]] == [(f"n{i}", True) for i in (1, 2, 3)]
    assert [g["group_id"] for g in data["groups"]] == ["meta", "0", "1", "2"]
    assert all(g["leader"] in ("n1", "n2", "n3") for g in data["groups"]), data["groups"]

    r = status_when_led("--url", cluster.url("n2"))
    for i in (1, 2, 3):
        assert re.search(rf"^\s*n{i}\s+127\.0\.0\.1:\d+\s+127\.0\.0\.1:\d+\s+yes\s*$", r.stdout, re.M), (
            r.stdout
        )
    for group in ("meta", "0", "1", "2"):
        row = re.search(rf"^\s*{group}\s+n([123])\s+\d+\s+(.*)$", r.stdout, re.M)
        assert row, r.stdout
        # One commit/applied cell per replica (in node order); the leader's is starred.
        stars = re.findall(r"(\*?)\d+/\d+", row.group(2))
        assert len(stars) == 3, row.group(0)
        assert [i for i, star in enumerate(stars, 1) if star] == [int(row.group(1))], row.group(0)
    assert "3/3 nodes reachable, 4/4 groups have a leader" in r.stdout


def test_status_tries_urls_in_order_until_one_answers(cluster: Cluster) -> None:
    r = raftmq("status", "--url", dead_url(), "--url", cluster.url("n3"))
    assert r.returncode == 0, r.stderr
    assert "as seen by n3" in r.stdout

    r = raftmq("status", env={"RAFTMQ_URL": f"{dead_url()},{cluster.url('n2')}"})
    assert r.returncode == 0, r.stderr
    assert "as seen by n2" in r.stdout


@pytest.mark.parametrize("command", [["status"], ["topic", "list"], ["topic", "create", "t"]])
def test_unreachable_url_fails_with_one_clear_line(command: list[str]) -> None:
    url = dead_url()
    r = raftmq(*command, "--url", url, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: no raftmq node answered: {url} (connection refused)"
    assert r.stdout == ""


# -- topics -------------------------------------------------------------------------------------


def test_topic_create_list_describe_delete_round_trip(cluster: Cluster) -> None:
    url = ["--url", cluster.url("n1")]
    r = raftmq("topic", "create", "orders", "--queues", "4", "--retention-ms", "60000", *url)
    assert r.returncode == 0, r.stderr
    assert "created topic 'orders' with 4 queues" in r.stdout

    r = raftmq("topic", "list", *url)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s*orders\s+4\s+60000\s+-\s+-\s*$", r.stdout, re.M), r.stdout

    produced = cluster.produce("orders", [{"value": "hello", "queue": 2}])
    assert produced.status_code == 200, produced.text
    r = raftmq("topic", "describe", "orders", "--url", cluster.url("n3"))
    assert r.returncode == 0, r.stderr
    assert "retention_ms 60000" in r.stdout
    rows = re.findall(r"^\s*(\d)\s+(\d)\s+(n[123])\s+(n\d,n\d,n\d)\s+(\d+)\s+(\d+)\s*$", r.stdout, re.M)
    assert [int(q) for q, *_ in rows] == [0, 1, 2, 3], r.stdout
    assert [(low, high) for *_, low, high in rows] == [("0", "0"), ("0", "0"), ("0", "1"), ("0", "0")]
    assert all(len(set(replicas.split(","))) == 3 for *_, replicas, _, _ in rows)

    r = raftmq("topic", "delete", "orders", *url, input="n\n")
    assert r.returncode == 1 and "Aborted" in r.stderr
    assert cluster.get("/v1/topics/orders").status_code == 200

    r = raftmq("topic", "delete", "orders", "--yes", *url)
    assert r.returncode == 0, r.stderr
    assert "deleted topic 'orders'" in r.stdout
    r = raftmq("topic", "describe", "orders", *url)
    assert r.returncode == 1
    assert r.stderr.startswith("error topic_not_found: ")
    r = raftmq("topic", "list", "--json", *url)
    assert "orders" not in [t["name"] for t in json.loads(r.stdout)["topics"]]


def test_duplicate_topic_fails_with_topic_exists(cluster: Cluster) -> None:
    url = ["--url", cluster.url("n2")]
    assert raftmq("topic", "create", "twice", "--queues", "1", *url).returncode == 0
    r = raftmq("topic", "create", "twice", *url)
    assert r.returncode == 1
    assert r.stderr.startswith("error topic_exists: "), r.stderr


def test_invalid_input_is_a_usage_or_server_error(cluster: Cluster) -> None:
    r = raftmq("topic", "create", "zero", "--queues", "0", "--url", cluster.url())
    assert r.returncode == 2 and "--queues" in r.stderr
    r = raftmq("topic", "create", "bad name!", "--url", cluster.url())
    assert r.returncode == 1 and r.stderr.startswith("error bad_request: "), r.stderr


def test_cancel_with_no_change_in_progress_is_a_conflict_and_says_so(cluster: Cluster) -> None:
    """Nothing to cancel is the cluster's state, not a malformed request: 409 with its own code
    (as ``change_in_progress`` is), in the API and in the CLI's one line."""
    before = cluster.get("/v1/cluster/placement").json()
    assert before["change"] is None
    r = cluster.session.delete(cluster.url("n2") + "/v1/cluster/change", timeout=30)
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert (error["code"], error["retriable"], error["definite"]) == ("no_change_in_progress", False, True)
    done = raftmq("cluster", "cancel", "--url", cluster.url("n3"))
    assert done.returncode == 1, done
    assert done.stderr == "error no_change_in_progress: no cluster change is in progress: nothing to cancel\n"
    assert cluster.get("/v1/cluster/placement").json() == before  # nothing changed


# -- serve --------------------------------------------------------------------------------------


def test_serve_lists_every_problem_of_a_bad_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(
        '[[nodes]]\nid = "n1"\nhttp = "127.0.0.1:70000"\nraft = "127.0.0.1:7001"\ndata_dir = "d"\n'
    )
    r = raftmq("serve", "--config", str(path), "--node", "n1")
    assert r.returncode != 0
    assert "cluster.secret must be a string of at least 16 characters" in r.stderr
    assert "node n1: http must be host:port with a port from 1 to 65535" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_an_unknown_node_fails_clearly(cluster: Cluster) -> None:
    r = raftmq("serve", "--config", str(cluster.config_path), "--node", "n9")
    assert r.returncode != 0
    assert "node 'n9' is not in" in r.stderr and "(nodes: n1, n2, n3)" in r.stderr


def test_serve_reports_busy_http_and_raft_ports(tmp_path: Path) -> None:
    base = free_port_block(4)
    with socket.socket() as http, socket.socket() as raft:
        http.bind(("127.0.0.1", base))
        http.listen()
        raft.bind(("127.0.0.1", base + 2))  # the Raft port of queue group 0
        raft.listen()
        path = tmp_path / "cluster.toml"
        path.write_text(
            '[cluster]\nsecret = "0123456789abcdef0123"\n[[nodes]]\nid = "n1"\n'
            f'http = "127.0.0.1:{base}"\nraft = "127.0.0.1:{base + 1}"\ndata_dir = "{tmp_path}"\n'
        )
        r = raftmq("serve", "--config", str(path), "--node", "n1", timeout=20)
    assert r.returncode != 0
    assert f"127.0.0.1:{base} (HTTP): address already in use" in r.stderr
    assert f"127.0.0.1:{base + 2} (Raft, queue group 0): address already in use" in r.stderr
    assert f"127.0.0.1:{base + 1}" not in r.stderr  # the free metadata port is not blamed
    assert "Traceback" not in r.stderr


# -- dev ----------------------------------------------------------------------------------------


def test_dev_on_busy_ports_says_how_to_use_others_and_honours_the_edited_file(tmp_path: Path) -> None:
    """A newcomer whose 8081 is taken was told only "Is another raftmq node running?": the answer
    now says that the ports are in the cluster file `dev` keeps, and `dev` uses that file's ports."""
    base = free_port_block(9)
    folder = tmp_path / ".raftmq"
    lines = ["[cluster]", 'secret = "0123456789abcdef0123"', "queue_groups = 1"]
    for i in range(3):
        http, raft = base + i, base + 3 + 2 * i  # raft: the metadata group's port, queue group 0's next
        lines += [f'[[nodes]]\nid = "n{i + 1}"\nhttp = "127.0.0.1:{http}"\nraft = "127.0.0.1:{raft}"']
        lines.append(f'data_dir = "{folder}"')
    folder.mkdir()
    cluster_file = folder / "cluster.toml"
    cluster_file.write_text("\n".join(lines) + "\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        r = subprocess.run(
            [sys.executable, "-m", "raftmq.cluster.cli.main", "dev"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode == 1, r.stderr
    assert f"127.0.0.1:{base + 1} (HTTP): address already in use" in r.stderr  # the edited file's port
    assert "8081" not in r.stderr.split("Is another")[0]
    assert f"edit the `http` and `raft` ports in {cluster_file}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_lines(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def _http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def answers(url: str) -> bool:
    try:
        return _http("GET", url)[0] == 200
    except OSError:  # not listening yet
        return False


def serve_processes_of(folder: Path) -> list[int]:
    """Pids of the ``raftmq serve`` processes that run a node of the dev cluster in ``folder``
    (their cluster file is ``folder/.raftmq/cluster.toml``, named absolutely or from ``folder``)."""
    cluster_file = str(folder / ".raftmq" / "cluster.toml")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        ours = cluster_file in argv or (cwd == str(folder) and ".raftmq/cluster.toml" in argv)
        if "serve" in argv and ours:
            found.append(int(entry))
    return found


@pytest.mark.timeout(300)
def test_dev_says_ready_restarts_a_killed_node_as_its_hint_says_and_stops_every_node(tmp_path: Path) -> None:
    """``raftmq dev`` as a user meets it, with raftmq not on PATH (./scripts/dev runs .venv/bin/raftmq
    without activating the venv): the "ready" line with the URLs comes once every node answers
    /readyz and before the "Try:" hints; with n1 killed, ``raftmq status`` in the dev folder answers
    from the others; the restart line it prints works as printed; SIGINT then stops every node,
    also the restarted one (before: it stayed running)."""
    busy = [p for p in DEV_HTTP_PORTS + DEV_RAFT_PORTS if not port_free(p)]
    if busy:
        pytest.skip(f"raftmq dev uses fixed ports and these are busy: {busy}")
    folder = tmp_path.resolve()
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not os.path.exists(Path(d) / "raftmq")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": os.pathsep.join(path)}
    env.pop("RAFTMQ_URL", None)
    dev = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "dev"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=read_lines, args=(dev.stdout, lines), daemon=True)
    reader.start()
    pids: dict[str, int] = {}
    try:
        wait_until(lambda: any(line.startswith("ready: ") for line in lines), 90, what="dev says ready")
        output = "".join(lines)
        cluster_file = folder / ".raftmq" / "cluster.toml"
        assert f"cluster file {cluster_file}" in output
        nodes = re.findall(r"^\s+(n\d)\s+(http://\S+)\s+pid (\d+)", output, re.M)
        assert [(n, u) for n, u, _ in nodes] == [(f"n{i}", f"http://127.0.0.1:808{i}") for i in (1, 2, 3)]
        pids = {n: int(pid) for n, _, pid in nodes}
        ready = next(i for i, line in enumerate(lines) if line.startswith("ready: "))
        assert lines[ready].split() == [
            "ready:",
            "HTTP",
            "API",
            *[f"http://127.0.0.1:808{i}" for i in (1, 2, 3)],
            "console",
            "http://127.0.0.1:8081/ui",
        ], lines[ready]
        assert not any(line.startswith("Try:") for line in lines[:ready]), output  # hints after "ready"
        wait_until(lambda: any(line.startswith("Try:") for line in lines[ready:]), 10, what="Try: hints")
        # The curl it suggests is the README's and quickstart's first, whose walk through goes on
        # from its 4 queues (it made an 8-queue orders, and the README's create then failed).
        tried = next(line for line in lines if line.startswith("Try:")).removeprefix("Try:").strip()
        for guide in ("README.md", "docs/quickstart.md"):
            assert tried in (REPO / guide).read_text().splitlines(), (tried, guide)
        with urllib.request.urlopen("http://127.0.0.1:8081/ui", timeout=10) as ui:
            assert ui.status == 200

        status, _ = _http("POST", "http://127.0.0.1:8081/v1/topics", {"name": "dev-orders", "queues": 1})
        assert status == 201
        status, body = _http(
            "POST", "http://127.0.0.1:8082/v1/topics/dev-orders/messages", {"messages": [{"value": "hi"}]}
        )
        assert (status, body) == (200, {"results": [{"queue": 0, "offset": 0}]})

        os.kill(pids["n1"], signal.SIGKILL)
        wait_until(lambda: "node n1 exited with code -9" in "".join(lines), 30, what="dev reports n1")
        assert dev.poll() is None
        for i in (2, 3):
            os.kill(pids[f"n{i}"], 0)  # still running
            assert answers(f"http://127.0.0.1:808{i}/healthz")

        # raftmq status in the dev folder, without --url: n1 is down, n2 and n3 answer.
        r = raftmq("status", cwd=folder)
        assert r.returncode == 0, r.stderr
        assert re.search(r"^\s*n1\s+127\.0\.0\.1:8081\s+127\.0\.0\.1:7200\s+no\s*$", r.stdout, re.M), r.stdout
        assert "2/3 nodes reachable" in r.stdout

        # The restart line, run exactly as printed, from the dev folder (raftmq is not on PATH).
        output = "".join(lines)
        hint = re.search(r"Bring it back with:\n\s+(.+)\n", output)
        assert hint, output
        r = raftmq("dev", "restart", "n9", cwd=folder)
        assert r.returncode == 1 and "node 'n9' is not in" in r.stderr, r
        restart = subprocess.run(
            shlex.split(hint.group(1)), cwd=folder, env=env, capture_output=True, text=True, timeout=120
        )
        assert restart.returncode == 0, (hint.group(1), restart.stdout, restart.stderr)
        restarted = wait_until(
            lambda: re.search(r"^node n1 restarted: pid (\d+)", "".join(lines), re.M), 30, what="n1 restarted"
        )
        pids["n1 again"] = int(restarted.group(1))
        assert pids["n1 again"] != pids["n1"]
        wait_until(lambda: answers("http://127.0.0.1:8081/readyz"), 60, what="n1 ready again")
        status, body = _http("GET", "http://127.0.0.1:8081/v1/topics/dev-orders/queues/0/messages?offset=0")
        assert status == 200 and [m["value"] for m in body["messages"]] == ["hi"], body
        assert sorted(serve_processes_of(folder)) == sorted([pids["n1 again"], pids["n2"], pids["n3"]])

        dev.send_signal(signal.SIGINT)
        assert dev.wait(40) == 0
        reader.join(5)
        assert "stopped." in "".join(lines)
        assert serve_processes_of(folder) == []  # the restarted n1 too
        r = raftmq("dev", "restart", "n1", cwd=folder)
        assert r.returncode == 1 and "no `raftmq dev` is running for" in r.stderr, r
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait(10)
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in serve_processes_of(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
