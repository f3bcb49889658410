"""Shared by the ``raftmq`` commands (``cluster/cli/main.py``): the --url/--token/--ca-file options of the
admin and client commands, and small output helpers.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import IO, Any

import click
from rich.console import Console
from rich.text import Text

from raftmq.cluster.cli.admin_http import DEFAULT_URL, AdminError, AdminHttp, ServerError

URL_HELP = (
    "Nodes' base URLs, comma-separated or repeated, tried in order (as Kafka's --bootstrap-server). "
    "Default: $RAFTMQ_URL (comma- or space-separated), else every node of ./.raftmq/cluster.toml "
    f"on a loopback address (a raftmq dev folder), else {DEFAULT_URL}."
)
DEV_CLUSTER_FILE = os.path.join(".raftmq", "cluster.toml")  # written by `raftmq dev`
PROBE_S = 2.0  # how long the commands look for a node that accepts connections before failing


def _split(value: str) -> list[str]:
    return [u for u in re.split(r"[,\s]+", value.strip()) if u]


def dev_cluster_urls(path: str = DEV_CLUSTER_FILE) -> list[str]:
    """The HTTP URLs of the nodes of the cluster file ``path`` that listen on a loopback address
    (none if it is missing or bad). Only loopback ones: the commands send the API token to these
    URLs, and a file in the working folder (a cloned repository's, say) must not be able to send
    it to a host the user never named."""
    if not os.path.isfile(path):
        return []
    from raftmq.cluster.config.cluster_file import ConfigError, load_config

    try:
        nodes = load_config(path).nodes
    except (ConfigError, OSError, ValueError):
        return []
    return [n.http_url for n in nodes if _loopback_literal(n.http.rsplit(":", 1)[0])]


def _loopback_literal(host: str) -> bool:
    """``host`` is ``localhost`` or a loopback IP address, written out (no name is resolved)."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_urls(urls: tuple[str, ...], env: dict[str, str] | None = None) -> list[str]:
    """The --url values (each may be a comma list), else $RAFTMQ_URL, else every node of the dev
    cluster file in the working folder, else the dev cluster's first node."""
    given = [u for value in urls for u in _split(value)]
    if given:
        return given
    from_env = _split((os.environ if env is None else env).get("RAFTMQ_URL", ""))
    return from_env or dev_cluster_urls() or [DEFAULT_URL]


def _connect(url: str, timeout_s: float) -> str | None:
    """None if a TCP connection to ``url``'s host and port opens within ``timeout_s``, else why not."""
    import socket
    import urllib.parse

    from raftmq.cluster.cli.admin_http import normalize_url

    parts = urllib.parse.urlsplit(normalize_url(url))
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return None
    except (OSError, ValueError) as e:
        if isinstance(e, TimeoutError | socket.timeout):
            return "timed out"
        return (getattr(e, "strerror", None) or str(e) or type(e).__name__).lower()


def require_a_node(urls: list[str], timeout_s: float = PROBE_S) -> None:
    """Return once one of ``urls`` accepts a TCP connection (tried together); if none does within
    ``timeout_s``, fail with one line naming each URL and why (instead of retrying for 30 s)."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(len(urls), 16))
    try:
        futures = {pool.submit(_connect, u, timeout_s): u for u in urls}
        why: dict[str, str] = {}
        try:
            for done in concurrent.futures.as_completed(futures, timeout=timeout_s + 0.5):
                reason = done.result()
                if reason is None:
                    return
                why[futures[done]] = reason
        except concurrent.futures.TimeoutError:
            pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    from raftmq.cluster.cli.admin_http import normalize_url

    tried = ", ".join(f"{normalize_url(u)} ({why.get(u, 'timed out')})" for u in urls)
    click.echo(f"error: no raftmq node answered: {tried}", err=True)
    sys.exit(1)


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


def error_line(code: str, message: str) -> str:
    """The line a node's error becomes on stderr. ``unauthorized`` also says how this command sends
    a token: the node's message speaks HTTP ("send 'Authorization: Bearer <token>'"), and a newcomer
    who added tokens to the dev cluster's file was left to guess the option."""
    line = f"error {code}: {message}"
    if code == "unauthorized":
        line += " (give this command a token with --token or $RAFTMQ_TOKEN)"
    return line


def admin_command(f: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared --url, --token and --ca-file options and an :class:`AdminHttp` as
    first argument; an admin error becomes one line on stderr and exit status 1."""

    @functools.wraps(f)
    def run(*args: Any, urls: tuple[str, ...], **kwargs: Any) -> None:
        resolved = resolve_urls(urls)
        require_a_node(resolved)
        try:
            f(AdminHttp(resolved, **client_security()), *args, **kwargs)
        except ServerError as e:
            click.echo(error_line(e.code, e.message), err=True)
            sys.exit(1)
        except AdminError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return security_options(click.option("--url", "urls", multiple=True, metavar="URL", help=URL_HELP)(run))


def stdout_console() -> Console:
    """The console tables are printed to: the terminal's width on a terminal; piped or redirected,
    wide enough that no name is cut ("orders.billing…") or wrapped."""
    return Console() if sys.stdout.isatty() else Console(width=10_000)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _none(value: Any, style: str = "dim", text: str = "-") -> Text | str:
    return Text(text, style=style) if value is None else str(value)


def client_command(f: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared --url option (as :func:`admin_command` does) and the resolved
    URLs as first argument; a client error becomes one line on stderr and exit status 1."""
    from raftmq.client import RaftmqError

    @functools.wraps(f)
    def run(*args: Any, urls: tuple[str, ...], **kwargs: Any) -> None:
        resolved = resolve_urls(urls)
        require_a_node(resolved)
        try:
            f(resolved, *args, **kwargs)
        except RaftmqError as e:
            click.echo(error_line(e.code, e.message), err=True)
            sys.exit(1)

    return security_options(click.option("--url", "urls", multiple=True, metavar="URL", help=URL_HELP)(run))


def write_all(out: IO[bytes], data: bytes) -> None:
    """Write all of ``data``: a buffered write to a pipe that a signal interrupts (a Ctrl-C held
    until the batch is acked) returns having written only part, and the rest would be lost."""
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written:]
