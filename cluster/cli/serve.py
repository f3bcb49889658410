"""``raftmq serve`` (one node) and ``raftmq dev`` (a local 3-node cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import click
import structlog

from raftmq.cluster.cli.dev_hints import ready_hints
from raftmq.cluster.config.cluster_file import ClusterConfig, ConfigError, load_config
from raftmq.cluster.replication.journal import JournalCorruptError
from raftmq.errors import RaftmqError
from raftmq.storage.store import StoreError

DEV_DIR = ".raftmq"


def configure_logging(json_logs: bool, level: str = "info") -> None:
    """structlog for raftmq, stdlib logging (pysyncobj, aiohttp) routed to the same stream."""
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _load(path: str) -> ClusterConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@click.command()
@click.option(
    "--config", "config_path", required=True, type=click.Path(dir_okay=False), help="The cluster file."
)
@click.option("--node", "node_id", required=True, help="This node's id in the cluster file.")
@click.option("--json-logs/--console-logs", default=False, help="Log as JSON lines (default: console).")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log records at this level and above.",
)
def serve(config_path: str, node_id: str, json_logs: bool, log_level: str) -> None:
    """Run one node of the cluster described by the cluster file."""
    config = _load(config_path)
    try:
        config.node(node_id)
    except KeyError:
        ids = ", ".join(n.id for n in config.nodes)
        raise click.ClickException(f"node {node_id!r} is not in {config_path} (nodes: {ids})") from None
    refusal = open_api_refusal(config, node_id)
    if refusal is not None:
        raise click.ClickException(refusal)
    # pysyncobj retries a busy Raft port forever without a word, so check every port before starting.
    busy = unavailable_addresses(listen_addresses(config, node_id))
    if busy:
        raise click.ClickException(_cannot_listen(f"node {node_id}", busy))
    configure_logging(json_logs, log_level)
    try:
        asyncio.run(_serve(config, node_id))
    except (CannotListen, CannotOpenStores) as e:
        raise click.ClickException(str(e)) from None
    except JournalCorruptError as e:  # refused: cutting the journal would drop acknowledged entries
        raise click.ClickException(
            f"node {node_id}: {e}\n  raftmq repair-journal --config {config_path} --node {node_id} "
            f"--group {e.group} --truncate-from {e.index} [--yes]"
        ) from None


class CannotListen(RaftmqError):
    """A node's address was taken between the check and the bind."""


class CannotOpenStores(RaftmqError):
    """A node's store (a group's journal or state) cannot be opened at start: a full disk, a store
    another process holds, a damaged file. The node stops what it started and exits with one line."""


def _cannot_open(node_id: str, e: StoreError) -> str:
    text = str(e)
    if "No space left on device" in text:
        hint = "The disk of its data directory is full: free space on it, then start the node again."
    elif "lock file" in text.lower():
        hint = "Is another raftmq process using this data directory?"
    else:
        hint = 'See docs/operations.md, "A node that cannot open its stores".'
    return f"node {node_id} cannot open its stores: {text}\n{hint}"


def open_api_refusal(config: ClusterConfig, node_id: str) -> str | None:
    """Why node ``node_id`` must not start, or None. Secure by default beyond one host: without
    API tokens anyone who reaches the HTTP port may read every message and change the cluster, so
    an HTTP address other than a loopback one needs tokens or ``allow_unauthenticated = true``."""
    http = config.node(node_id).http
    security = config.security
    if security.enabled or security.allow_unauthenticated or loopback_host(http.rsplit(":", 1)[0]):
        return None
    return (
        f"node {node_id} would serve the HTTP API on {http}, which is not a loopback address, "
        "without authentication: the cluster file lists no API tokens, so anyone who reaches that "
        "address could read and write every topic and change the cluster.\n"
        "Add tokens ([[security.tokens]] with an admin token, see docs/security.md), or, only on a "
        "network that no untrusted client can reach, set allow_unauthenticated = true in the cluster "
        "file's [security] section (or RAFTMQ_SECURITY_ALLOW_UNAUTHENTICATED=true)."
    )


def listen_addresses(config: ClusterConfig, node_id: str) -> list[tuple[str, str]]:
    """(what, host:port) of every socket node ``node_id`` listens on: its HTTP address, the metadata
    group on its Raft port (when it is a voter) and queue group g on Raft port + 1 + g."""
    me = config.node(node_id)
    addrs = [("HTTP", me.http)]
    if any(v.id == node_id for v in config.metadata_voters):
        addrs.append(("Raft, metadata group", me.raft_bind_addr(0)))
    addrs += [(f"Raft, queue group {g}", me.raft_bind_addr(1 + g)) for g in config.groups_on(node_id)]
    return addrs


def unavailable_addresses(addrs: list[tuple[str, str]]) -> list[str]:
    """One line per address that cannot be bound now (in use, or not an address of this host)."""
    problems = []
    for what, addr in addrs:
        host, port = addr.rsplit(":", 1)
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_STREAM
            )[0]
            with socket.socket(family, kind, proto) as s:
                # As the real listeners do, so a port in TIME_WAIT does not count as busy.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(sockaddr)
        except OSError as e:
            problems.append(f"{addr} ({what}): {_os_reason(e)}")
    return problems


def _os_reason(e: OSError) -> str:
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror})"
    return os.strerror(e.errno).lower() if e.errno else str(e)


def _cannot_listen(who: str, problems: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"{who} cannot listen on:\n{lines}\nIs another raftmq node (or `raftmq dev`) running?"


async def _serve(config: ClusterConfig, node_id: str) -> None:
    from raftmq.cluster.api.app import create_app, create_runner
    from raftmq.cluster.api.connections import listen
    from raftmq.cluster.config.tls import TlsError, server_context
    from raftmq.cluster.node.node import Node
    from raftmq.cluster.replication.raft import RaftBindError

    log = structlog.get_logger("raftmq.serve")
    try:
        node, ssl_context = Node(config, node_id), server_context(config.node(node_id))
    except TlsError as e:
        raise CannotListen(str(e)) from None
    if not config.security.enabled and not loopback_host(node.me.http.rsplit(":", 1)[0]):
        # Only with allow_unauthenticated = true (serve refuses to start otherwise): say it loudly.
        log.warning(
            "api_unauthenticated",
            node_id=node_id,
            http=node.me.http,
            allow_unauthenticated=True,
            risk="no API tokens: anyone who reaches this address may read, write and administer everything",
            hint="add [[security.tokens]] (docs/security.md)",
        )
    try:
        await node.start()
    except RaftBindError as e:
        await node.stop()
        raise CannotListen(_cannot_listen(f"node {node_id}", [str(e)])) from None
    except JournalCorruptError:
        await node.stop()  # the groups started before it; serve() reports the error
        raise
    except StoreError as e:
        try:
            await node.stop()  # what started before it; on a full disk this may fail too
        except Exception as stop_error:
            log.warning("stop_after_failed_start_failed", node_id=node_id, error=str(stop_error))
        raise CannotOpenStores(_cannot_open(node_id, e)) from None
    runner = create_runner(create_app(node), node.config.limits)
    await runner.setup()
    host, port = node.me.http.rsplit(":", 1)
    try:
        http = await listen(runner, host, int(port), ssl_context)  # idle connections bounded
    except OSError as e:
        await runner.cleanup()
        await node.stop()
        raise CannotListen(
            _cannot_listen(f"node {node_id}", [f"{node.me.http} (HTTP): {_os_reason(e)}"])
        ) from None
    log.info("http_listening", node_id=node_id, url=node.me.http_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping", node_id=node_id)
    http.close()
    await runner.cleanup()
    await node.stop()


def loopback_host(host: str) -> bool:
    """True when ``host`` names loopback addresses only: 127.0.0.0/8, ::1, or a host name that
    resolves to nothing else (``localhost``). 0.0.0.0, ::, any other address and a name that does
    not resolve are not loopback."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)
    except (OSError, ValueError):
        return False


def write_dev_config(directory: str, nodes: int = 3, base_http: int = 8081, base_raft: int = 7100) -> str:
    """Write (once) the cluster file of the local development cluster; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "cluster.toml")
    if os.path.exists(path):
        return path
    lines = [
        "# The local development cluster written by `raftmq dev`.",
        "[cluster]",
        f'secret = "{secrets.token_hex(16)}"',
        'durability = "fsync"',
        "",
    ]
    for i in range(1, nodes + 1):
        lines += [
            "[[nodes]]",
            f'id = "n{i}"',
            f'http = "127.0.0.1:{base_http + i - 1}"',
            f'raft = "127.0.0.1:{base_raft + 100 * i}"',
            f'data_dir = "{os.path.abspath(directory)}"',
            "",
        ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


# `raftmq dev restart` asks the running `raftmq dev` through files in this folder of the dev
# directory: `pid` (the dev process), `<token>.restart` (a request: a node id) and `<token>.answer`
# (JSON: ok, message). The dev process starts the node itself, so it owns it and its Ctrl-C stops it.
DEV_CONTROL = "dev-control"
READY_WAIT_S = 60.0  # `dev restart` waits this long for the node's /readyz; `dev` then says it waits
SERVE = (sys.executable, "-m", "raftmq.cluster.cli.main", "serve")


def raftmq_command() -> str:
    """How to run this raftmq from the current folder, for hints that work as printed: ``raftmq``
    when that is the one on PATH, else the path of the script beside this Python (``.venv/bin/raftmq``
    for ./scripts/dev, which does not put the venv on PATH), else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "raftmq")
    if not os.path.exists(script):
        return f"{shlex.quote(sys.executable)} -m raftmq.cluster.cli.main"
    on_path = shutil.which("raftmq")
    if on_path is not None and os.path.samefile(on_path, script):
        return "raftmq"
    relative = os.path.relpath(script)
    return shlex.quote(script if relative.startswith("..") else relative)


def _answers_ready(http_url: str) -> bool:
    """True when the node at ``http_url`` answers ``GET /readyz`` with 200 (every group it hosts
    has a leader)."""
    try:
        with urllib.request.urlopen(http_url + "/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):  # not listening yet, not ready (503), a slow answer
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's (a reused pid)
        return False
    return True


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _stop_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGTERM when `raftmq dev` dies, even by ``kill -9``
    (Linux's PR_SET_PDEATHSIG), so no node outlives it; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # dev died before prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class DevCluster:
    """The node processes of `raftmq dev`: started, restarted on request, stopped together."""

    def __init__(self, directory: str, path: str, config: ClusterConfig) -> None:
        self.directory, self.path, self.config = directory, path, config
        self.control = os.path.join(directory, DEV_CONTROL)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exited: set[str] = set()  # reported as exited, not restarted since
        self.unready: set[str] = set()  # started, not yet answering /readyz
        self.command = raftmq_command()
        dir_option = "" if directory == DEV_DIR else f" --dir {shlex.quote(directory)}"
        self.restart_hint = f"{self.command} dev{dir_option} restart"
        self._preexec = _stop_with_parent()

    def log_path(self, node_id: str) -> str:
        return os.path.join(self.directory, f"{node_id}.log")

    def start(self, node_id: str) -> subprocess.Popen[bytes]:
        with open(self.log_path(node_id), "ab") as log_file:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [*SERVE, "--config", self.path, "--node", node_id],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=self._preexec,  # dev runs no threads
            )
        self.procs[node_id] = proc
        self.exited.discard(node_id)
        self.unready.add(node_id)
        return proc

    def open_control(self) -> None:
        os.makedirs(self.control, exist_ok=True)
        for name in os.listdir(self.control):  # left by a dev that was killed
            os.remove(os.path.join(self.control, name))
        _write_atomically(os.path.join(self.control, "pid"), str(os.getpid()))

    def close_control(self) -> None:
        shutil.rmtree(self.control, ignore_errors=True)

    def report_exits(self) -> None:
        for node_id, p in self.procs.items():
            if p.poll() is not None and node_id not in self.exited:
                self.exited.add(node_id)
                self.unready.discard(node_id)
                click.echo(
                    f"node {node_id} exited with code {p.returncode}; the others keep running. "
                    f"Bring it back with:\n  {self.restart_hint} {node_id}",
                    err=True,
                )

    def newly_ready(self) -> list[str]:
        """The started nodes that answer /readyz now and did not before."""
        ready = [n.id for n in self.config.nodes if n.id in self.unready and _answers_ready(n.http_url)]
        self.unready.difference_update(ready)
        return ready

    def serve_requests(self) -> None:
        """Answer the `raftmq dev restart` requests waiting in the control folder."""
        try:
            names = sorted(os.listdir(self.control))
        except FileNotFoundError:
            return
        for name in names:
            if not name.endswith(".restart"):
                continue
            request = os.path.join(self.control, name)
            with open(request) as f:
                node_id = f.read().strip()
            os.remove(request)
            ok, message = self.restart(node_id)
            click.echo(message, err=not ok)
            answer = os.path.join(self.control, name.removesuffix(".restart") + ".answer")
            _write_atomically(answer, json.dumps({"ok": ok, "message": message}))

    def restart(self, node_id: str) -> tuple[bool, str]:
        if node_id not in self.procs:
            return False, f"node {node_id!r} is not in {self.path} (nodes: {', '.join(self.procs)})"
        if self.procs[node_id].poll() is None:
            click.echo(f"stopping node {node_id} (pid {self.procs[node_id].pid}) to restart it...")
            self.stop([node_id])
            self.exited.add(node_id)  # stopped on purpose: not reported as exited
        busy = unavailable_addresses(listen_addresses(self.config, node_id))
        if busy:
            return False, _cannot_listen(f"node {node_id}", busy)
        proc = self.start(node_id)
        return True, f"node {node_id} restarted: pid {proc.pid}, log {self.log_path(node_id)}"

    def stop(self, node_ids: list[str], stop_now: Any = None) -> None:
        """SIGTERM to each running node, SIGKILL to those still running after 15 s (or at once
        when ``stop_now()`` becomes true: a second Ctrl-C)."""
        procs = [self.procs[n] for n in node_ids if self.procs[n].poll() is None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or (stop_now is not None and stop_now()):
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                return
            time.sleep(0.05)


@click.group(invoke_without_command=True)
@click.option(
    "--dir", "directory", default=DEV_DIR, show_default=True, help="Where the cluster file and data go."
)
@click.pass_context
def dev(ctx: click.Context, directory: str) -> None:
    """Run a 3-node cluster on 127.0.0.1 (data in ./.raftmq); Ctrl-C stops it.

    It says "ready" once every node answers. `raftmq dev restart NODE`, run in the same folder,
    restarts a node of it (one you killed, say); Ctrl-C stops that one too."""
    ctx.obj = directory
    if ctx.invoked_subcommand is None:
        _run_dev(directory)


def _run_dev(directory: str) -> None:
    path = os.path.abspath(write_dev_config(directory))
    config = _load(path)
    busy = [p for n in config.nodes for p in unavailable_addresses(listen_addresses(config, n.id))]
    if busy:  # the docs say 8081-8083; a newcomer whose ports are taken needs the way out
        hint = f"\nStop it, or edit the `http` and `raft` ports in {path} (`raftmq dev` keeps it)."
        ran = [n.id for n in config.nodes if os.path.isdir(os.path.join(os.path.dirname(path), n.id))]
        if ran:  # a node's addresses never change once it ran: its data must go with the old ports
            hint += f" Nodes {', '.join(ran)} ran on the old ports: delete their folders beside it first."
        raise click.ClickException(_cannot_listen("the dev cluster", busy) + hint)
    stops = 0

    def stop_all(*_: Any) -> None:
        nonlocal stops
        stops += 1

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_all)
    cluster = DevCluster(directory, path, config)
    cluster.open_control()
    try:
        for n in config.nodes:
            cluster.start(n.id)
        click.echo(f"raftmq dev cluster: cluster file {path}")
        for n in config.nodes:
            pid, log = cluster.procs[n.id].pid, cluster.log_path(n.id)
            click.echo(f"  {n.id}  {n.http_url}   pid {pid}   log {log}")
        click.echo("waiting for every node to answer /readyz...")
        _watch(cluster, lambda: stops > 0)
        click.echo("stopping the cluster...")
        cluster.stop(list(cluster.procs), stop_now=lambda: stops > 1)
    finally:
        cluster.close_control()
    click.echo("stopped.")


def _watch(cluster: DevCluster, stopping: Any) -> None:
    """Until ``stopping()``: say "ready" once every node answers, report exits, serve restarts."""
    config = cluster.config
    started, ready, warned = time.monotonic(), False, False
    while not stopping():
        cluster.report_exits()
        if len(cluster.exited) == len(cluster.procs):
            raise click.ClickException(f"every node has exited; see the logs in {cluster.directory}")
        for node_id in cluster.newly_ready():
            if ready:
                click.echo(f"node {node_id} is ready again")
        if not ready and not cluster.unready and not cluster.exited:
            ready = True
            urls = " ".join(n.http_url for n in config.nodes)
            click.echo(f"ready: HTTP API {urls}  console {config.nodes[0].http_url}/ui")
            status = f"{cluster.command} status"
            if cluster.directory != DEV_DIR:
                status += " --url " + ",".join(n.http for n in config.nodes)
            for line in ready_hints(config, cluster.path, status, cluster.restart_hint):
                click.echo(line)
            click.echo("Ctrl-C stops the cluster.")
        elif not ready and not warned and time.monotonic() - started > READY_WAIT_S:
            warned = True
            waiting = ", ".join(sorted(cluster.unready | cluster.exited))
            click.echo(f"still waiting for {waiting} to answer /readyz; see the logs in {cluster.directory}")
        cluster.serve_requests()
        time.sleep(0.2)


@dev.command("restart")
@click.argument("node_id", metavar="NODE")
@click.pass_obj
def dev_restart(directory: str, node_id: str) -> None:
    """Restart node NODE of the `raftmq dev` running in this folder, one you killed (or a running
    one: it is stopped first). That `raftmq dev` starts it, so its Ctrl-C stops it too. Waits until
    the node answers /readyz."""
    path = os.path.join(directory, "cluster.toml")
    if not os.path.exists(path):
        raise click.ClickException(f"no dev cluster here: {os.path.abspath(path)} does not exist")
    config = _load(path)
    try:
        node = config.node(node_id)
    except KeyError:
        ids = ", ".join(n.id for n in config.nodes)
        raise click.ClickException(f"node {node_id!r} is not in {path} (nodes: {ids})") from None
    control = os.path.join(directory, DEV_CONTROL)
    pid = _dev_pid(control)
    if pid is None:
        where = os.path.abspath(directory)
        raise click.ClickException(
            f"no `raftmq dev` is running for {where}; start it with: {raftmq_command()} dev"
        )
    token = secrets.token_hex(8)
    _write_atomically(os.path.join(control, token + ".restart"), node_id)
    answer_path = os.path.join(control, token + ".answer")
    deadline = time.monotonic() + 60  # dev may first stop a running node (up to 15 s)
    while not os.path.exists(answer_path):
        if not _alive(pid):
            raise click.ClickException(f"`raftmq dev` (pid {pid}) stopped before it answered")
        if time.monotonic() > deadline:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(control, token + ".restart"))
            raise click.ClickException(f"`raftmq dev` (pid {pid}) did not answer within 60 s")
        time.sleep(0.1)
    with open(answer_path) as f:
        answer = json.load(f)
    os.remove(answer_path)
    if not answer["ok"]:
        raise click.ClickException(answer["message"])
    click.echo(answer["message"])
    deadline = time.monotonic() + READY_WAIT_S
    while not _answers_ready(node.http_url):
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"node {node_id} started but does not answer {node.http_url}/readyz after "
                f"{READY_WAIT_S:.0f} s; see {os.path.join(directory, node_id + '.log')}"
            )
        time.sleep(0.2)
    click.echo(f"node {node_id} is ready: {node.http_url}")


def _dev_pid(control: str) -> int | None:
    """The pid of the `raftmq dev` that owns ``control``, or None when none runs."""
    try:
        with open(os.path.join(control, "pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None
