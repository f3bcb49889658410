"""``raftmq serve`` (one node) and ``raftmq dev`` (a local 3-node cluster)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import click
import structlog

from .config import ClusterConfig, ConfigError, load_config
from .journal import JournalCorruptError

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
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
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
    except CannotListen as e:
        raise click.ClickException(str(e)) from None
    except JournalCorruptError as e:  # refused: cutting the journal would drop acknowledged entries
        raise click.ClickException(
            f"node {node_id}: {e}\n  raftmq repair-journal --config {config_path} --node {node_id} "
            f"--group {e.group} --truncate-from {e.index} [--yes]"
        ) from None


class CannotListen(Exception):
    """A node's address was taken between the check and the bind."""


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
    from aiohttp import web

    from .http_api import create_app
    from .node import Node
    from .raft import RaftBindError
    from .tls import TlsError, server_context

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
    runner = web.AppRunner(create_app(node), access_log=None, handle_signals=False)
    await runner.setup()
    host, port = node.me.http.rsplit(":", 1)
    site = web.TCPSite(runner, host, int(port), reuse_address=True, ssl_context=ssl_context)
    try:
        await site.start()
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


@click.command()
@click.option(
    "--dir", "directory", default=DEV_DIR, show_default=True, help="Where the cluster file and data go."
)
def dev(directory: str) -> None:
    """Run a 3-node cluster on 127.0.0.1 (data in ./.raftmq); Ctrl-C stops it."""
    path = write_dev_config(directory)
    config = _load(path)
    busy = [p for n in config.nodes for p in unavailable_addresses(listen_addresses(config, n.id))]
    if busy:
        raise click.ClickException(_cannot_listen("the dev cluster", busy))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for n in config.nodes:
        log_path = os.path.join(directory, f"{n.id}.log")
        log_file = open(log_path, "ab")  # noqa: SIM115 (owned by the child for its lifetime)
        procs[n.id] = subprocess.Popen(
            [sys.executable, "-m", "raftmq.cluster.cli", "serve", "--config", path, "--node", n.id],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    click.echo(f"raftmq dev cluster: cluster file {os.path.abspath(path)}")
    for n in config.nodes:
        log_path = os.path.join(directory, n.id + ".log")
        click.echo(f"  {n.id}  {n.http_url}   pid {procs[n.id].pid}   log {log_path}")
    click.echo('Try: curl -s -XPOST localhost:8081/v1/topics -d \'{"name":"orders"}\'')
    click.echo("Ctrl-C stops the cluster.")
    stopping = False

    def stop_all(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    reported: set[str] = set()
    while not stopping:
        for node_id, p in procs.items():
            if p.poll() is not None and node_id not in reported:
                reported.add(node_id)
                click.echo(
                    f"node {node_id} exited with code {p.returncode}; the others keep running. "
                    "Bring it back with:\n"
                    f"  raftmq serve --config {os.path.abspath(path)} --node {node_id}",
                    err=True,
                )
        if len(reported) == len(procs):
            raise click.ClickException(f"every node has exited; see the logs in {directory}")
        time.sleep(0.2)
    click.echo("stopping the cluster...")
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    click.echo("stopped.")
