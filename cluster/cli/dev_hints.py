"""What ``raftmq dev`` suggests once its cluster is ready (``serve.py`` prints it): the README's and
quickstart's first ``curl``, ``raftmq status`` and the restart of a killed node.

A cluster file that lists API tokens (docs/security.md) makes every node refuse a request without
one, so the ``curl`` then sends ``Authorization: Bearer $RAFTMQ_TOKEN``, the variable raftmq's own
commands read, and a line says which token to put there and where it is: the environment variable
the dev cluster took it from, the file's ``token``, or the text hashed into its ``sha256``. The
hints never show a token itself: they are printed to a terminal, a scrollback or a CI log.
"""

from __future__ import annotations

from raftmq.cluster.config.cluster_file import ClusterConfig
from raftmq.cluster.config.tokens import ADMIN, TokenGrant, env_var

__all__ = ["TOPIC", "config_first_http", "ready_hints"]

TOPIC = "orders"  # the topic the README's first curl creates
_CREATE = f'-d \'{{"name": "{TOPIC}", "queues": 4}}\''
_BEARER = '-H "Authorization: Bearer $RAFTMQ_TOKEN"'


def config_first_http(config: ClusterConfig) -> str:
    """The first node's HTTP address as curl takes it (``localhost:8081`` for a loopback one)."""
    host, port = config.nodes[0].http.rsplit(":", 1)
    return f"localhost:{port}" if host == "127.0.0.1" else config.nodes[0].http


def ready_hints(config: ClusterConfig, path: str, status: str, restart_hint: str) -> list[str]:
    """The lines to print: where the token is when the cluster file ``path`` lists some, then
    ``Try:`` with the curl (the README's own line when there are no tokens), ``status`` and the
    restart. Only ``config`` is read, as loaded when the dev cluster started: the file edited to
    invalid TOML or removed while it runs must not stop it when it says "ready"."""
    first = config_first_http(config)
    tokens = config.security.tokens
    bearer = f" {_BEARER}" if tokens else ""
    return [
        *([_token_line(tokens, path)] if tokens else []),
        f"Try: curl -s -XPOST {first}/v1/topics{bearer} {_CREATE}",
        f"     {status}",
        f"     kill -9 a node's pid, then: {restart_hint} <node>",
    ]


def _token_line(tokens: tuple[TokenGrant, ...], path: str) -> str:
    """Which token the hints take (one that may create the topic when there is one) and where it
    is: the variable the nodes read it from, else the file's ``token``, else only its digest."""
    grant = next((g for g in tokens if g.allows(ADMIN, TOPIC)), tokens[0])
    line = f"API tokens are on: the curl and the status command below send $RAFTMQ_TOKEN ({grant.name!r}"
    if not grant.allows(ADMIN, TOPIC):
        line += f", though no token of the file has admin on {TOPIC}, which the curl needs"
    if grant.source == "env":
        var = env_var(grant.name)
        return line + f'): export RAFTMQ_TOKEN="${var}" (the dev cluster took it from ${var})'
    if grant.source == "token":
        return line + f"): export RAFTMQ_TOKEN=<its token = in {path}>"
    return line + f"): {path} keeps only its sha256; export RAFTMQ_TOKEN=<the token you hashed>"
