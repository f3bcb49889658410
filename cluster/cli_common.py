"""Shared by the ``raftmq`` commands (``cluster/cli.py``): the --url/--token/--ca-file options of the
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
from rich.text import Text

from .admin_http import DEFAULT_URL, AdminError, AdminHttp, ServerError

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


def write_all(out: IO[bytes], data: bytes) -> None:
    """Write all of ``data``: a buffered write to a pipe that a signal interrupts (a Ctrl-C held
    until the batch is acked) returns having written only part, and the rest would be lost."""
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written:]
