"""The ``raftmq`` command line: run nodes and a local cluster, inspect and administer it."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

import click
import structlog

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
    configure_logging(json_logs, log_level)
    asyncio.run(_serve(config, node_id))


async def _serve(config: ClusterConfig, node_id: str) -> None:
    from aiohttp import web

    from .http_api import create_app
    from .node import Node

    log = structlog.get_logger("raftmq.serve")
    node = Node(config, node_id)
    await node.start()
    runner = web.AppRunner(create_app(node), access_log=None, handle_signals=False)
    await runner.setup()
    host, port = node.me.http.rsplit(":", 1)
    site = web.TCPSite(runner, host, int(port), reuse_address=True)
    await site.start()
    log.info("http_listening", node_id=node_id, url=node.me.http_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping", node_id=node_id)
    await runner.cleanup()
    await node.stop()


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
        click.echo(f"  {n.id}  {n.http_url}   log {os.path.join(directory, n.id + '.log')}")
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


if __name__ == "__main__":
    main()
