"""The ``raftmq`` command line: run nodes and a local cluster, inspect and administer it."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
import structlog
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import cli_cluster as _cli_cluster
from .admin_http import DEFAULT_URL, AdminError, AdminHttp, ServerError
from .backup import backup_command, restore_command
from .config import ClusterConfig, ConfigError, load_config

__all__ = ["main"]

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


@click.group()
@click.version_option("0.1.0", prog_name="raftmq")
def main() -> None:
    """raftmq: a highly available message broker cluster."""


def _load(path: str) -> ClusterConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@main.command()
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
    # pysyncobj retries a busy Raft port forever without a word, so check every port before starting.
    busy = unavailable_addresses(listen_addresses(config, node_id))
    if busy:
        raise click.ClickException(_cannot_listen(f"node {node_id}", busy))
    configure_logging(json_logs, log_level)
    try:
        asyncio.run(_serve(config, node_id))
    except CannotListen as e:
        raise click.ClickException(str(e)) from None


class CannotListen(Exception):
    """A node's address was taken between the check and the bind."""


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
    if not config.security.enabled and not _loopback(node.me.http.rsplit(":", 1)[0]):
        log.warning("api_unauthenticated", node_id=node_id, hint="no [[security.tokens]] in the cluster file")
    try:
        await node.start()
    except RaftBindError as e:
        await node.stop()
        raise CannotListen(_cannot_listen(f"node {node_id}", [str(e)])) from None
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


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name
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


@main.command()
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


# -- admin commands: status and topics over the HTTP API ------------------------------------------

URL_HELP = (
    "A node's base URL; repeat to try several in order. "
    f"Default: $RAFTMQ_URL (comma- or space-separated) or {DEFAULT_URL}."
)


def resolve_urls(urls: tuple[str, ...], env: dict[str, str] | None = None) -> list[str]:
    """The --url values, else $RAFTMQ_URL, else the dev cluster's first node."""
    if urls:
        return list(urls)
    from_env = re.split(r"[,\s]+", (os.environ if env is None else env).get("RAFTMQ_URL", "").strip())
    return [u for u in from_env if u] or [DEFAULT_URL]


def security_options(f: Callable[..., None]) -> Callable[..., None]:
    """--token and --ca-file (or $RAFTMQ_TOKEN, $RAFTMQ_CA_FILE), kept in the click context for
    :func:`client_security` (so commands keep their signatures)."""

    def keep(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        ctx.meta[f"raftmq.{param.name}"] = value

    f = click.option(
        "--ca-file",
        envvar="RAFTMQ_CA_FILE",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=keep,
        help="CA certificates (PEM) to verify https:// nodes with (default: $RAFTMQ_CA_FILE).",
    )(f)
    return click.option(
        "--token",
        envvar="RAFTMQ_TOKEN",
        expose_value=False,
        callback=keep,
        help="API token (sent as Authorization: Bearer). Default: $RAFTMQ_TOKEN.",
    )(f)


def client_security() -> dict[str, Any]:
    """``token`` and ``ca_file`` of the running command (keyword arguments of the clients)."""
    meta = click.get_current_context().meta
    return {"token": meta.get("raftmq.token"), "ca_file": meta.get("raftmq.ca_file")}


def admin_command(f: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared --url, --token and --ca-file options and an :class:`AdminHttp` as
    first argument; an admin error becomes one line on stderr and exit status 1."""

    @functools.wraps(f)
    def run(*args: Any, urls: tuple[str, ...], **kwargs: Any) -> None:
        try:
            f(AdminHttp(resolve_urls(urls), **client_security()), *args, **kwargs)
        except ServerError as e:
            click.echo(f"error {e.code}: {e.message}", err=True)
            sys.exit(1)
        except AdminError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return security_options(click.option("--url", "urls", multiple=True, metavar="URL", help=URL_HELP)(run))


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _none(value: Any, style: str = "dim", text: str = "-") -> Text | str:
    return Text(text, style=style) if value is None else str(value)


@main.command()
@json_option
@admin_command
def status(admin: AdminHttp, as_json: bool) -> None:
    """Show the nodes and every Raft group: leader, term, and commit/applied index per replica."""
    data = admin.get("/v1/cluster")
    if as_json:
        _print_json(data)
        return
    console = Console()
    console.print(f"[bold]nodes[/bold] (as seen by {data['node_id']})")
    nodes = Table(box=box.SIMPLE_HEAD)
    for column in ("node", "http", "raft", "reachable"):
        nodes.add_column(column)
    for n in data["nodes"]:
        reachable = Text("yes", style="green") if n["reachable"] else Text("no", style="bold red")
        nodes.add_row(n["id"], n["http"], n.get("raft", ""), reachable)
    console.print(nodes)
    console.print("[bold]groups[/bold]")
    console.print(_groups_table(data))
    console.print(
        "  cells: commit_index/applied_index, * leader, (-n) entries behind the leader", style="dim"
    )
    console.print(_status_summary(data))


def _groups_table(data: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    node_ids = [n["id"] for n in data["nodes"]]
    reachable = {n["id"] for n in data["nodes"] if n["reachable"]}
    for column in ("group", "leader", "term", *node_ids):
        table.add_column(column, justify="right" if column in node_ids or column == "term" else "left")
    for g in data["groups"]:
        replicas = {r["node_id"]: r for r in g["replicas"]}
        target = _leader_commit(g)
        cells: list[Text | str] = []
        for nid in node_ids:
            r = replicas.get(nid)
            if r is None:
                cells.append("" if nid in reachable else Text("?", style="red"))
                continue
            behind = target - r["applied_index"]
            mark = "*" if nid == g["leader"] else ""
            cell = Text(f"{mark}{r['commit_index']}/{r['applied_index']}")
            if behind > 0:
                cell.append(f" (-{behind})")
                cell.stylize("bold yellow")
            elif mark:
                cell.stylize("bold")
            cells.append(cell)
        leader = _none(g["leader"], "bold red", "none")
        table.add_row(g["group_id"], leader, str(g["term"]), *cells)
    return table


def _leader_commit(group: dict[str, Any]) -> int:
    """What a replica should have applied: the leader's commit index (the highest seen if none)."""
    for r in group["replicas"]:
        if r["node_id"] == group["leader"]:
            return int(r["commit_index"])
    return max((int(r["commit_index"]) for r in group["replicas"]), default=0)


def _status_summary(data: dict[str, Any]) -> Text:
    nodes, groups = data["nodes"], data["groups"]
    up = sum(1 for n in nodes if n["reachable"])
    led = sum(1 for g in groups if g["leader"])
    lagging = sum(1 for g in groups for r in g["replicas"] if r["applied_index"] < _leader_commit(g))
    ok = up == len(nodes) and led == len(groups)
    text = Text(
        f"{up}/{len(nodes)} nodes reachable, {led}/{len(groups)} groups have a leader, "
        f"{lagging} {'replica' if lagging == 1 else 'replicas'} behind its leader",
        style="green" if ok and not lagging else "yellow",
    )
    return text


@main.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("--queues", type=click.IntRange(min=1), default=8, show_default=True, help="Queue count.")
@click.option("--retention-ms", type=click.IntRange(min=1), help="Remove messages older than this.")
@click.option("--retention-bytes", type=click.IntRange(min=1), help="Keep at most this much per queue.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), help="Per-topic message size limit.")
@json_option
@admin_command
def topic_create(
    admin: AdminHttp,
    name: str,
    queues: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    max_message_bytes: int | None,
    as_json: bool,
) -> None:
    """Create topic NAME."""
    body: dict[str, Any] = {"name": name, "queues": queues}
    for key, value in (
        ("retention_ms", retention_ms),
        ("retention_bytes", retention_bytes),
        ("max_message_bytes", max_message_bytes),
    ):
        if value is not None:
            body[key] = value
    data = admin.post("/v1/topics", body)
    if as_json:
        _print_json(data)
        return
    Console().print(f"created topic {data['name']!r} with {len(data['queues'])} queues")
    _print_topic(data)


@topic.command("list")
@json_option
@admin_command
def topic_list(admin: AdminHttp, as_json: bool) -> None:
    """List the topics."""
    data = admin.get("/v1/topics")
    if as_json:
        _print_json(data)
        return
    console = Console()
    if not data["topics"]:
        console.print("no topics")
        return
    table = Table(
        "topic", "queues", "retention_ms", "retention_bytes", "max_message_bytes", box=box.SIMPLE_HEAD
    )
    for t in data["topics"]:
        table.add_row(
            t["name"],
            str(t["queues"]),
            _none(t.get("retention_ms")),
            _none(t.get("retention_bytes")),
            _none(t.get("max_message_bytes")),
        )
    console.print(table)


@topic.command("describe")
@click.argument("name")
@json_option
@admin_command
def topic_describe(admin: AdminHttp, name: str, as_json: bool) -> None:
    """Show topic NAME's settings and queues: queue group, leader, replicas, low/high offsets."""
    data = admin.get(f"/v1/topics/{AdminHttp.quote(name)}")
    if as_json:
        _print_json(data)
        return
    _print_topic(data)


def _print_topic(t: dict[str, Any]) -> None:
    settings = ", ".join(
        f"{k} {t.get(k) if t.get(k) is not None else '-'}"
        for k in ("retention_ms", "retention_bytes", "max_message_bytes")
    )
    table = Table(
        "queue",
        "group",
        "leader",
        "replicas",
        "low",
        "high",
        box=box.SIMPLE_HEAD,
    )
    console = Console()
    console.print(f"[bold]topic {t['name']}[/bold] (id {t['id']}, created {_time(t.get('created_ms'))})")
    console.print(f"  {settings}")
    for q in t["queues"]:
        table.add_row(
            str(q["queue"]),
            str(q["group_id"]),
            _none(q["leader"], "bold red", "none"),
            ",".join(q["replicas"]),
            _none(q["low_offset"], "red", "?"),
            _none(q["high_offset"], "red", "?"),
        )
    console.print(table)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@topic.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@admin_command
def topic_delete(admin: AdminHttp, name: str, yes: bool) -> None:
    """Delete topic NAME and all its messages."""
    if not yes:
        click.confirm(f"Delete topic {name!r} and all its messages?", abort=True)
    admin.delete(f"/v1/topics/{AdminHttp.quote(name)}")
    click.echo(f"deleted topic {name!r}")


# -- produce and consume: the Python client (raftmq.client) ---------------------------------------


def client_command(f: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared --url option (as :func:`admin_command` does) and the resolved
    URLs as first argument; a client error becomes one line on stderr and exit status 1."""
    from raftmq.client import RaftmqError

    @functools.wraps(f)
    def run(*args: Any, urls: tuple[str, ...], **kwargs: Any) -> None:
        try:
            f(resolve_urls(urls), *args, **kwargs)
        except RaftmqError as e:
            click.echo(f"error {e.code}: {e.message}", err=True)
            sys.exit(1)

    return security_options(click.option("--url", "urls", multiple=True, metavar="URL", help=URL_HELP)(run))


def _rate_line(what: str, count: int, size: int, seconds: float) -> str:
    seconds = max(seconds, 1e-9)
    return (
        f"{what} {count:,} messages ({size / 1e6:,.2f} MB) in {seconds:.2f} s: "
        f"{count / seconds:,.0f} messages/s, {size / 1e6 / seconds:,.2f} MB/s"
    )


def _parse_input_line(
    raw: bytes, fmt: str, key_field: str | None, number: int
) -> tuple[str | bytes, str | None]:
    """The (value, key) of one input line (its line break removed); ``number`` is its 1-based line
    number for errors. A line that is not UTF-8 is sent as a binary value (format ``lines``)."""
    body = raw.removesuffix(b"\n").removesuffix(b"\r")
    try:
        line = body.decode()
    except UnicodeDecodeError:
        if fmt == "lines":
            return body, None
        raise click.ClickException(f"line {number} is not UTF-8") from None
    if fmt == "lines":
        return line, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise click.ClickException(f"line {number} is not JSON: {e}") from None
    key: str | None = None
    if key_field is not None:
        if not isinstance(record, dict):
            raise click.ClickException(f"line {number} is not a JSON object (--key-field {key_field})")
        found = record.get(key_field)
        if found is not None:
            key = found if isinstance(found, str) else json.dumps(found, separators=(",", ":"))
    return line, key


@main.command()
@click.argument("topic")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Read the messages from this file (default: stdin).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lines", "jsonl"]),
    default="lines",
    show_default=True,
    help="lines: each line is a message. jsonl: each line is a JSON value, sent as it is (checked).",
)
@click.option("--key-field", help="jsonl: the field of each JSON object whose value is the message's key.")
@click.option("--linger-ms", type=click.IntRange(min=0), default=5, show_default=True, help="Batching delay.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@client_command
def produce(
    urls: list[str],
    topic: str,
    path: str | None,
    fmt: str,
    key_field: str | None,
    linger_ms: int,
    quiet: bool,
) -> None:
    """Produce each line of stdin or a file as one message to TOPIC.

    Idempotent (a retried batch is stored once), with a progress bar on stderr and the final rate
    on stdout. Exit status 1 if any message could not be stored.
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    from raftmq.client import Producer, RaftmqError, RecordMetadata

    if key_field is not None and fmt != "jsonl":
        raise click.UsageError("--key-field needs --format jsonl")
    stream = sys.stdin.buffer if path in (None, "-") else open(path, "rb")  # noqa: SIM115
    total = os.fstat(stream.fileno()).st_size if path not in (None, "-") else None
    stored = failed = 0
    stored_bytes = 0
    first_error: list[RaftmqError] = []

    def delivered(size: int) -> Callable[[RecordMetadata | None, RaftmqError | None], None]:
        def callback(meta: RecordMetadata | None, error: RaftmqError | None) -> None:
            nonlocal stored, failed, stored_bytes
            if error is None:
                stored += 1
                stored_bytes += size
            else:
                failed += 1
                if not first_error:
                    first_error.append(error)

        return callback

    columns = (
        [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn()]
        if total is not None
        else [SpinnerColumn(), TextColumn("{task.description}"), DownloadColumn()]
    )
    progress = Progress(
        *columns,
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
    )
    sent = read_bytes = 0
    interrupted = False
    started = time.monotonic()
    with stream, progress, Producer(urls, linger_ms=linger_ms, **client_security()) as producer:
        task = progress.add_task(f"producing to {topic}", total=total)
        try:
            for number, raw in enumerate(stream, 1):
                read_bytes += len(raw)
                value, key = _parse_input_line(raw, fmt, key_field, number)
                producer.send(topic, value, key=key, callback=delivered(len(raw)))
                sent += 1
                if sent % 256 == 0:
                    progress.update(
                        task, completed=read_bytes, description=f"{topic}: {stored:,}/{sent:,} stored"
                    )
        except KeyboardInterrupt:
            interrupted = True
        producer.flush()
        progress.update(task, completed=read_bytes, description=f"{topic}: {stored:,}/{sent:,} stored")
    elapsed = time.monotonic() - started
    click.echo(_rate_line("produced", stored, stored_bytes, elapsed))
    if failed:
        error = first_error[0]
        click.echo(
            f"{failed:,} messages were not stored; first error {error.code}: {error.message}", err=True
        )
        sys.exit(1)
    if interrupted:
        click.echo("interrupted: stopped reading the input", err=True)
        sys.exit(130)


def _message_json(m: Any) -> bytes:
    """One consumed message as a JSON line (binary values as ``value_b64``)."""
    import base64

    import orjson

    item: dict[str, Any] = {"offset": m.offset, "queue": m.queue, "key": m.key}
    if isinstance(m.value, bytes):
        item["value_b64"] = base64.b64encode(m.value).decode()
    else:
        item["value"] = m.value
    item["headers"] = dict(m.headers)
    item["timestamp_ms"] = m.timestamp_ms
    return orjson.dumps(item) + b"\n"


@main.command()
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group (its committed progress).")
@click.option(
    "--broadcast",
    is_flag=True,
    help="Read every queue with this consumer's own progress (committed as GROUP.MEMBER_ID) "
    "instead of sharing the queues with the group's other consumers.",
)
@click.option(
    "--member-id",
    help="This consumer's id in the group (broadcast: default the host name; clustering: random).",
)
@click.option(
    "--from",
    "reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where to start a queue the group has no committed offset for.",
)
@click.option("--max", "max_messages", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    help="Stop when no message arrived for this long (default: wait for more until Ctrl-C).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the JSON lines to this file (appended) instead of stdout.",
)
@client_command
def consume(
    urls: list[str],
    topic: str,
    group: str,
    broadcast: bool,
    member_id: str | None,
    reset: str,
    max_messages: int | None,
    timeout_ms: int | None,
    output: str | None,
) -> None:
    """Consume TOPIC as a member of GROUP, printing each message as a JSON line.

    Each line holds offset, queue, key, value (value_b64 for a binary value), headers and
    timestamp_ms. A message is acked once written; the group's offsets are committed every
    second and on exit (also after Ctrl-C), so the next run of the group continues after it.
    """
    from raftmq.client import Consumer

    if broadcast and member_id is None:
        member_id = socket.gethostname()
    out = sys.stdout.buffer if output in (None, "-") else open(output, "ab")  # noqa: SIM115
    consumer = Consumer(
        urls,
        **client_security(),
        group=group,
        topics=topic,
        mode="broadcast" if broadcast else "clustering",
        member_id=member_id,
        reset="earliest" if reset == "earliest" else "latest",
    )
    count = size = 0
    started = last_at = time.monotonic()
    interrupted = False
    try:
        while max_messages is None or count < max_messages:
            want = 10_000 if max_messages is None else min(10_000, max_messages - count)
            batch = consumer.poll(timeout_ms=timeout_ms, max_messages=want)
            if not batch:
                break
            lines = [_message_json(m) for m in batch]
            for line in lines:
                out.write(line)
            out.flush()
            for m in batch:
                m.ack()
            count += len(batch)
            size += sum(len(line) for line in lines)
            last_at = time.monotonic()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        try:
            consumer.close()  # commits what was written
        finally:
            if out is not sys.stdout.buffer:
                out.close()
    # The rate up to the last message (not the idle --timeout-ms wait after it).
    click.echo(_rate_line("consumed", count, size, last_at - started), err=True)
    if interrupted:
        sys.exit(130)


# -- receive/ack and dead letters (the work is in cli_delivery.py) -------------------------------


def _output(path: str | None) -> Any:
    return sys.stdout.buffer if path in (None, "-") else open(path, "ab")


@main.command()
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group (its subscription to TOPIC).")
@click.option("--max", "max_messages", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--visibility-ms",
    type=click.IntRange(min=1),
    help="How long each message stays in flight (default: the cluster's, 30 s).",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="Ack each message once written. --no-ack leaves it in flight: it comes back after its deadline.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for messages (until Ctrl-C or --max).")
@click.option(
    "--wait-ms",
    type=click.IntRange(min=0, max=15_000),
    default=1_000,
    show_default=True,
    help="How long one receive waits; without --follow, stop after a wait that brought nothing.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the JSON lines to this file (appended) instead of stdout.",
)
@client_command
def receive(
    urls: list[str],
    topic: str,
    group: str,
    max_messages: int | None,
    visibility_ms: int | None,
    ack: bool,
    follow: bool,
    wait_ms: int,
    output: str | None,
) -> None:
    """Receive messages of TOPIC for GROUP (receive/ack), printing each as a JSON line.

    Each line holds receipt, attempt, queue, offset, deadline_ms, key, value (value_b64 for a
    binary value), headers and timestamp_ms. Exit status 0 when done, 1 on an error, 130 after
    Ctrl-C (messages written but not acked yet come back after their deadline).
    """
    from .cli_delivery import ReceiveOptions
    from .cli_delivery import receive as run

    options = ReceiveOptions(topic, group, max_messages, visibility_ms, ack, follow, wait_ms)
    out = _output(output)
    try:
        done = run(urls, client_security(), options, out)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    click.echo(_rate_line("received", done.count, done.size, done.seconds), err=True)
    if done.stale:
        click.echo(f"{done.stale:,} acks came too late (the messages were redelivered)", err=True)


@main.group()
def dlq() -> None:
    """Dead letters of a consumer group: TOPIC.GROUP.dlq."""


@dlq.command("list")
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group whose dead letters to list.")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--queue", type=click.IntRange(min=0), help="Only this queue.")
@client_command
def dlq_list(urls: list[str], topic: str, group: str, max_messages: int, queue: int | None) -> None:
    """Print the dead letters of GROUP on TOPIC not yet redriven, one JSON line each (queue,
    offset, key, value, headers with their raftmq-dlq-* history, timestamp_ms); a summary per
    queue on stderr."""
    from .cli_delivery import dead_letter_line
    from .cli_delivery import dlq_list as run

    answer = run(urls, client_security(), topic, group, max_messages, queue)
    for m in answer["messages"]:
        sys.stdout.buffer.write(dead_letter_line(m))
    sys.stdout.buffer.flush()
    waiting = sum(q["high_offset"] - q["redrive_offset"] for q in answer["queues"])
    click.echo(f"{answer['dead_letter_topic']}: {waiting:,} dead letters not redriven", err=True)


@dlq.command("redrive")
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group whose dead letters to move back.")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(min=1, max=10_000),
    default=1_000,
    show_default=True,
    help="Per queue and request.",
)
@click.option("--queue", type=click.IntRange(min=0), help="Only this queue.")
@click.option("--all", "until_empty", is_flag=True, help="Repeat until no dead letter is left.")
@client_command
def dlq_redrive(
    urls: list[str], topic: str, group: str, max_messages: int, queue: int | None, until_empty: bool
) -> None:
    """Move dead letters of GROUP back to TOPIC as new messages for GROUP only (header
    raftmq-redrive-group). Prints each answer as a JSON line; the total on stderr."""
    from .cli_delivery import dlq_redrive as run

    answers = run(urls, client_security(), topic, group, max_messages, queue, until_empty)
    for answer in answers:
        click.echo(json.dumps(answer, separators=(",", ":")))
    total = sum(a["redriven"] for a in answers)
    more = " (more left: run again or use --all)" if answers[-1]["more"] else ""
    click.echo(f"redrove {total:,} dead letters to {topic}{more}", err=True)


main.add_command(backup_command)  # cluster/backup.py
main.add_command(restore_command)
_cli_cluster.register(main, admin_command, json_option)  # raftmq cluster ... (cluster/cli_cluster.py)

if __name__ == "__main__":
    main()
