"""The ``[[nodes]]`` section of the cluster file (``cluster_file.py``): one node's settings and
their checks."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["NodeConfig", "parse_nodes"]

_NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass(frozen=True)
class NodeConfig:
    id: str
    http: str  # host:port of the HTTP API
    raft: str  # host:port; base of this node's Raft ports
    data_dir: str
    raft_bind: str = ""  # host the Raft ports listen on ("": the host of ``raft``)
    tls_cert_file: str = ""  # set (with tls_key_file): the HTTP API is served over HTTPS
    tls_key_file: str = ""
    join: bool = False  # not in the first placement: added to the running cluster later

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls_cert_file else 'http'}://{self.http}"

    def raft_addr(self, port_offset: int) -> str:
        host, port = self.raft.rsplit(":", 1)
        return f"{host}:{int(port) + port_offset}"

    def raft_bind_addr(self, port_offset: int) -> str:
        """Where the Raft port ``port_offset`` listens: never all interfaces unless configured."""
        host, port = self.raft.rsplit(":", 1)
        return f"{self.raft_bind or host}:{int(port) + port_offset}"

    def node_dir(self) -> str:
        return os.path.join(self.data_dir, self.id)


def parse_nodes(raw: Any, problems: list[str]) -> list[NodeConfig]:
    """The ``[[nodes]]`` entries of a cluster file; each problem found is added to ``problems``."""
    if not isinstance(raw, list) or not raw:
        problems.append("at least one [[nodes]] entry is required")
        return []
    nodes: list[NodeConfig] = []
    seen: dict[str, set[str]] = {"id": set(), "http": set(), "raft": set()}
    for i, entry in enumerate(raw):
        where = f"nodes[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} must be a table")
            continue
        unknown = set(entry) - {"id", "http", "raft", "data_dir", "join", *_NODE_OPTIONS}
        problems += [f"unknown key {where}.{k}" for k in sorted(unknown)]
        node_id, http, raft, data_dir = (entry.get(k) for k in ("id", "http", "raft", "data_dir"))
        if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
            problems.append(f"{where}.id must be 1-32 characters of A-Z a-z 0-9 _ -")
            continue
        where = f"node {node_id}"
        for key, value in (("http", http), ("raft", raft)):
            if not isinstance(value, str) or not _valid_addr(value):
                problems.append(f"{where}: {key} must be host:port with a port from 1 to 65535")
        if not isinstance(data_dir, str) or not data_dir:
            problems.append(f"{where}: data_dir must be a non-empty path")
        for key, value in (("id", node_id), ("http", http), ("raft", raft)):
            if isinstance(value, str):
                if value in seen[key]:
                    problems.append(f"{where}: duplicate {key} {value!r}")
                seen[key].add(value)
        join = entry.get("join", False)
        if not isinstance(join, bool):
            problems.append(f"{where}: join must be true or false")
        options = {k: entry[k] for k in _NODE_OPTIONS if k in entry}
        for key, value in options.items():
            if not isinstance(value, str) or (key == "raft_bind" and (not value or ":" in value)):
                problems.append(f"{where}: {key} must be a " + ("host" if key == "raft_bind" else "path"))
        if isinstance(http, str) and isinstance(raft, str) and isinstance(data_dir, str):
            node = NodeConfig(id=node_id, http=http, raft=raft, data_dir=data_dir, join=join is True)
            strings: dict[str, Any] = {k: v for k, v in options.items() if isinstance(v, str)}
            nodes.append(replace(node, **strings))
    return nodes


_NODE_OPTIONS = ("raft_bind", "tls_cert_file", "tls_key_file")


def _valid_addr(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)
