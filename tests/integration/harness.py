"""A real raftmq cluster for tests: node processes on 127.0.0.1, killed and restarted for real."""

from __future__ import annotations

import fcntl
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from raftmq.cluster.config.keys import PEER_HEADER, derive_keys

SECRET = "integration-test-secret-0123456789"
PEER_KEY = derive_keys(SECRET).peer  # what the nodes send each other (cluster/config/keys.py)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORT_SLOT = 16  # ports per reserved block: a node takes its queue groups + 3
_PORT_LOCKS = Path("/tmp/raftmq-test-ports")  # one lock file per block, shared by every test run
# Clusters still referenced (a failed test's traceback holds its own): log_tails reads their logs.
_LIVE: weakref.WeakSet[Cluster] = weakref.WeakSet()
_held_ports: dict[int, int] = {}  # base port -> the fd holding its block's lock


def free_port_block(count: int) -> int:
    """A base port such that ``count`` (at most 16) consecutive ports are free, and reserved: no
    other call, in this process or another test run on the machine, gets them until
    :func:`release_port_block` (or the end of this process). A port only found free is not enough:
    a cluster's nodes, or two runs at once, could be handed the same port (a node's HTTP port was
    another's Raft port, which accepts a connection and never answers; a port of a killed node was
    taken before it restarted)."""
    if count > _PORT_SLOT:
        raise ValueError(f"at most {_PORT_SLOT} ports in a block, not {count}")
    _PORT_LOCKS.mkdir(exist_ok=True)
    for _ in range(200):
        # Below Linux's ephemeral range (32768+), where outgoing connections could take our ports.
        base = random.randrange(20000 // _PORT_SLOT, 32000 // _PORT_SLOT) * _PORT_SLOT
        fd = os.open(_PORT_LOCKS / f"{base}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if all(_port_free(base + i) for i in range(count)):
            _held_ports[base] = fd
            return base
        os.close(fd)
    raise RuntimeError("no free port block")


def release_port_block(base: int) -> None:
    """Give back the block :func:`free_port_block` reserved at ``base``."""
    fd = _held_ports.pop(base, None)
    if fd is not None:
        os.close(fd)


def blocked_writing_a_pipe(pid: int) -> bool:
    """Whether a thread of process ``pid`` sleeps in a write to a full pipe (its kernel wait
    channel). The bytes in the pipe do not say it: a writer can block with 63,354 of the pipe's
    65,536 bytes taken (a write that fits no page left)."""
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        try:
            if "pipe_write" in wchan.read_text():
                return True
        except OSError:  # a thread that ended
            continue
    return False


def ctrl_c_mid_write(args: list[str], env: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """Run the CLI with its stdout a pipe nobody reads until it is full, so the process is blocked
    in the middle of a write; then send it a Ctrl-C and read everything. Returns the exit status,
    stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:

        def blocked() -> bool:
            if proc.poll() is not None:  # not a "not yet": wait_until would ask again for 90 s
                raise RuntimeError(f"{args[0]} exited ({proc.returncode}): {proc.stderr.read().decode()}")
            return blocked_writing_a_pipe(proc.pid)

        wait_until(blocked, 90, what=f"{args[0]} blocked on a full pipe")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # reading the pipe lets it finish its write
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err.decode()


def wait_until(
    predicate: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``.

    A request error, a missing key or a failed assertion inside ``predicate`` (a 503 while a group
    elects its leader, say) counts as "not yet". The failure names what the last attempt saw: its
    error, or the falsy value it returned."""
    deadline = time.monotonic() + timeout_s
    last: str = "no attempt"
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
            last = f"the last attempt returned {value!r}"[:2000]
        except (requests.RequestException, KeyError, ValueError, AssertionError) as e:
            last = f"the last attempt raised {e!r}"[:2000]
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}; {last}")


@dataclass
class NodeProc:
    id: str
    http: str
    raft_base: int
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.http}"


def log_tails(lines_per_node: int = 20) -> str:
    """The last lines of every node log of the clusters still referenced, a run of lines with the
    same event collapsed into one: shown under a failed test (conftest.py), so that a failure in
    CI, whose temporary folders are gone afterwards, says what the nodes were doing."""
    out: list[str] = []
    for c in list(_LIVE):
        for node_id in c.nodes:
            tail: list[str] = []
            for line in c.log(node_id).splitlines():
                event = line[28:70].split()[:3]  # "[level", "]", event: a structlog line
                if tail and tail[-1][28:70].split()[:3] == event:
                    tail[-1] = line
                else:
                    tail.append(line)
            out.append(f"== {c.dir.name}/{node_id} (alive: {c.alive(node_id)})")
            out += [t[:300] for t in tail[-lines_per_node:]]
    return "\n".join(out)


class Cluster:
    """Nodes from one cluster file. Use as a context manager; ``stop`` kills what is left."""

    def __init__(
        self,
        tmp: Path,
        nodes: int = 3,
        queue_groups: int | None = None,
        replication: int | None = None,
        extra_toml: str = "",
        node_toml: Callable[[str], str] | None = None,
        scheme: str = "http",
    ) -> None:
        """``extra_toml`` goes after [cluster]; ``node_toml(node_id)`` into that node's [[nodes]]
        table; ``scheme`` is "https" when the cluster file sets up TLS."""
        self.dir = tmp
        self.data_dir = tmp / "data"
        groups = queue_groups if queue_groups is not None else nodes
        ports_per_node = groups + 2
        self.nodes: dict[str, NodeProc] = {}
        self._port_blocks: list[int] = []  # released by stop()
        for i in range(1, nodes + 1):
            base = free_port_block(ports_per_node + 1)
            self._port_blocks.append(base)
            self.nodes[f"n{i}"] = NodeProc(
                id=f"n{i}", http=f"127.0.0.1:{base}", raft_base=base + 1, scheme=scheme
            )
        lines = ["[cluster]", f'secret = "{SECRET}"']
        if queue_groups is not None:
            lines.append(f"queue_groups = {queue_groups}")
        if replication is not None:
            lines.append(f"replication = {replication}")
        lines.append(extra_toml)
        for n in self.nodes.values():
            lines += [
                "[[nodes]]",
                f'id = "{n.id}"',
                f'http = "{n.http}"',
                f'raft = "127.0.0.1:{n.raft_base}"',
                f'data_dir = "{self.data_dir}"',
                node_toml(n.id) if node_toml else "",
            ]
        self.config_path = tmp / "cluster.toml"
        self.config_path.write_text("\n".join(lines) + "\n")
        self.session = requests.Session()
        _LIVE.add(self)

    # -- process control ------------------------------------------------------------------------

    def start(self, node_id: str | None = None, env: dict[str, str] | None = None) -> None:
        for n in [self.nodes[node_id]] if node_id else self.nodes.values():
            assert n.proc is None or n.proc.poll() is not None, f"{n.id} is running"
            n.log_path = self.dir / f"{n.id}.log"
            full_env = {**os.environ, **(env or {})}
            with open(n.log_path, "ab") as log:
                n.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "raftmq.cluster.cli.main",
                        "serve",
                        "--config",
                        str(self.config_path),
                        "--node",
                        n.id,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                )

    def kill(self, node_id: str) -> None:
        """SIGKILL: no shutdown code runs (page cache survives, as after a process crash)."""
        n = self.nodes[node_id]
        assert n.proc is not None
        n.proc.send_signal(signal.SIGKILL)
        n.proc.wait(10)

    def terminate(self, node_id: str) -> int:
        n = self.nodes[node_id]
        assert n.proc is not None
        n.proc.send_signal(signal.SIGTERM)
        return n.proc.wait(20)

    def wipe(self, node_id: str) -> None:
        shutil.rmtree(self.data_dir / node_id, ignore_errors=True)

    def alive(self, node_id: str) -> bool:
        p = self.nodes[node_id].proc
        return p is not None and p.poll() is None

    def log(self, node_id: str) -> str:
        path = self.nodes[node_id].log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start_refused(self, node_id: str, timeout_s: float = 60) -> str:
        """Start ``node_id``, wait for it to exit with a failure status, and return its log."""
        self.start(node_id)
        proc = self.nodes[node_id].proc
        assert proc is not None
        wait_until(lambda: proc.poll() is not None, timeout_s, what=f"{node_id} refusing to start")
        assert proc.returncode != 0
        return self.log(node_id)

    def stop(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(10)
        self.session.close()
        for base in self._port_blocks:
            release_port_block(base)
        self._port_blocks = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- HTTP -----------------------------------------------------------------------------------

    def url(self, node_id: str | None = None) -> str:
        if node_id is None:
            node_id = next(n for n in self.nodes if self.alive(n))
        return self.nodes[node_id].url

    def get(self, path: str, node: str | None = None, **kw: Any) -> requests.Response:
        return self.session.get(self.url(node) + path, timeout=kw.pop("timeout", 30), **kw)

    def post(self, path: str, json: Any = None, node: str | None = None, **kw: Any) -> requests.Response:
        return self.session.post(self.url(node) + path, json=json, timeout=kw.pop("timeout", 30), **kw)

    def call_as(
        self, token: str, method: str, path: str, node: str | None = None, **kw: Any
    ) -> requests.Response:
        """A request made with API token ``token`` instead of the session's."""
        headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
        return self.session.request(method, self.url(node) + path, headers=headers, timeout=30, **kw)

    def internal(self, method: str, path: str, node: str, **kw: Any) -> requests.Response:
        headers = {PEER_HEADER: PEER_KEY, **kw.pop("headers", {})}
        return self.session.request(method, self.url(node) + path, headers=headers, timeout=30, **kw)

    def wait_ready(self, node_ids: list[str] | None = None, timeout_s: float = 30) -> None:
        for nid in node_ids or [n for n in self.nodes if self.alive(n)]:
            wait_until(functools.partial(self._answers_ready, nid), timeout_s, what=f"{nid} ready")

    def _answers_ready(self, node_id: str) -> bool:
        if not self.alive(node_id):  # fail at once, with why (wait_until retries request errors)
            raise RuntimeError(f"{node_id} exited:\n{self.log(node_id)[-3000:]}")
        return self.get("/readyz", node_id, timeout=2).status_code == 200

    def status(self, node_id: str) -> dict[str, Any]:
        r = self.internal("GET", "/internal/status", node_id)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def group_counter(self, node_id: str, counter: str, group: str) -> float:
        """``node_id``'s Raft counter ``counter`` (its ``_total`` sample) for queue group ``group``
        (exactly one sample: a counter not exported fails)."""
        r = self.get("/metrics", node_id)
        assert r.status_code == 200, r.text[:300]
        (value,) = [
            s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples
            if s.name == f"{counter}_total" and s.labels.get("group_id") == group
        ]
        return float(value)

    def metric_sum(self, node_id: str, sample: str) -> float:
        """The sum of ``node_id``'s samples named ``sample`` (0 when there is none)."""
        return sum(
            s.value
            for family in text_string_to_metric_families(self.get("/metrics", node_id).text)
            for s in family.samples
            if s.name == sample
        )

    def commit_index(self, group: str) -> int:
        """The commit index of ``group`` as its leader reports it (``raftmq_raft_commit_index``)."""
        text = self.get("/metrics", self.wait_leader(group)).text
        (value,) = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "raftmq_raft_commit_index" and s.labels.get("group_id") == group
        ]
        return int(value)

    def requests_served(self, route: str) -> int:
        """Requests for ``route`` (an HTTP route's pattern) the nodes answered so far, summed."""
        total = 0
        for nid in self.nodes:
            for family in text_string_to_metric_families(self.get("/metrics", nid).text):
                for s in family.samples:
                    if s.name == "raftmq_http_requests_total" and s.labels.get("route") == route:
                        total += int(s.value)
        return total

    def leader(self, group: str, among: list[str] | None = None) -> str | None:
        """The node that claims leadership of ``group`` with the highest term (None if none)."""
        best: tuple[int, str] | None = None
        for nid in among or [n for n in self.nodes if self.alive(n)]:
            try:
                g = self.status(nid)["groups"].get(group)
            except requests.RequestException:
                continue
            if g and g["is_leader"] and (best is None or g["term"] > best[0]):
                best = (g["term"], nid)
        return best[1] if best else None

    def wait_leader(self, group: str, timeout_s: float = 30, exclude: str | None = None) -> str:
        def found() -> str | None:
            leader = self.leader(group)
            return leader if leader and leader != exclude else None

        return str(wait_until(found, timeout_s, what=f"leader of group {group}"))

    def wait_balanced(self, timeout_s: float = 30) -> None:
        """Until each queue group is led by its preferred replica (the first of its replicas in
        the placement). The nodes' leader balancer hands leaderships over a few seconds after a
        start; a module fixture waits for this so that its tests do not start during a handover
        (a view with two leaders or none, a leader that moves under a request)."""

        def balanced() -> bool:
            r = self.get("/v1/cluster/placement", timeout=5)
            placed = r.json().get("placement") if r.status_code == 200 else None
            if not placed:
                return False
            return all(self.leader(g) == ids[0] for g, ids in placed["groups"].items() if g != "meta")

        wait_until(balanced, timeout_s, interval_s=0.2, what="each queue group led by its preferred replica")

    def digest(self, group: str, node_id: str) -> dict[str, Any]:
        r = self.internal("GET", f"/internal/groups/{group}/digest", node_id)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def wait_replicas_equal(
        self, group: str, node_ids: list[str] | None = None, timeout_s: float = 30
    ) -> dict[str, Any]:
        """Wait until every replica of ``group`` has the same state index and store digest."""
        ids = node_ids or [n for n in self.nodes if self.alive(n)]

        def equal() -> dict[str, Any] | None:
            digests = [self.digest(group, nid) for nid in ids]
            first = digests[0]
            same = all(
                (d["state_index"], d["sha256"]) == (first["state_index"], first["sha256"]) for d in digests
            )
            return first if same else None

        return dict(wait_until(equal, timeout_s, interval_s=0.2, what=f"replicas of {group} equal"))

    # -- data -----------------------------------------------------------------------------------

    def create_topic(
        self, name: str, queues: int = 4, node: str | None = None, **settings: Any
    ) -> dict[str, Any]:
        r = self.post("/v1/topics", {"name": name, "queues": queues, **settings}, node=node)
        assert r.status_code == 201, r.text
        result: dict[str, Any] = r.json()
        return result

    def produce(
        self, topic: str, messages: list[dict[str, Any]], node: str | None = None, **extra: Any
    ) -> requests.Response:
        return self.post(f"/v1/topics/{topic}/messages", {"messages": messages, **extra}, node=node)

    def fetch_all(
        self, topic: str, queue: int, node: str | None = None, read_from: str = "leader"
    ) -> list[dict[str, Any]]:
        """Every message of a queue from its low offset. A 503 (a group electing its leader after
        a kill, a leadership transfer) is asked again for up to 30 s."""
        out: list[dict[str, Any]] = []
        offset = 0
        unavailable_until = time.monotonic() + 30
        while True:
            r = self.get(
                f"/v1/topics/{topic}/queues/{queue}/messages",
                node,
                params={"offset": offset, "max": 1000, "read_from": read_from},
            )
            if r.status_code == 416:
                offset = r.json()["error"]["low_offset"]
                continue
            if r.status_code == 503 and time.monotonic() < unavailable_until:
                time.sleep(0.2)
                continue
            assert r.status_code == 200, f"fetch of {topic}/{queue} at {offset}: {r.status_code} {r.text}"
            body = r.json()
            out.extend(body["messages"])
            if not body["messages"] or body["next_offset"] >= body["high_offset"]:
                return out
            offset = body["next_offset"]


Token = tuple[str, str, str, str, str]
"""An API token of :func:`tokens_toml`: name, token, then the ``admin``, ``produce`` and
``consume`` topic patterns, each a TOML array (``'["*"]'``, ``"[]"``)."""


def tokens_toml(tokens: Iterable[Token]) -> str:
    """The cluster file's ``[security]`` table with these API tokens."""
    return "[security]\n" + "".join(
        f'[[security.tokens]]\nname = "{n}"\ntoken = "{t}"\nadmin = {a}\nproduce = {p}\nconsume = {c}\n'
        for n, t, a, p, c in tokens
    )


@contextmanager
def running(cluster: Cluster, token: str | None = None) -> Iterator[Cluster]:
    """``cluster`` started, ready and its leaders balanced, the harness's own calls made with API
    token ``token``; stopped on the way out, where every node must still be alive (a node that died
    under the tests fails them)."""
    with cluster:
        if token is not None:
            cluster.session.headers["Authorization"] = f"Bearer {token}"
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def answer_of(s: socket.socket, within_s: float) -> tuple[bytes, bool]:
    """What the node sends on ``s`` within ``within_s``, and whether it closed ``s`` by then."""
    s.settimeout(0.5)
    got, deadline = b"", time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False
