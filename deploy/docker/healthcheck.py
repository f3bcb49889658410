#!/usr/bin/env python3
"""The image's HEALTHCHECK: GET /healthz on this container's node, found in the cluster file.

The node listens on the ``http`` address its ``[[nodes]]`` entry names (``$RAFTMQ_NODE`` in
``$RAFTMQ_CONFIG``), which inside a container is usually the container's own address, not
127.0.0.1. Exit status 0: healthy; 1: not (the reason on stdout, which docker keeps in
``docker inspect``). Standard library only.
"""

from __future__ import annotations

import os
import sys
import tomllib
import urllib.request


def health_url(config_path: str, node_id: str) -> str:
    with open(config_path, "rb") as f:
        nodes = tomllib.load(f).get("nodes", [])
    for node in nodes:
        if node.get("id") == node_id:
            host, _, port = str(node["http"]).rpartition(":")
            if host in ("0.0.0.0", "", "[::]", "::"):
                host = "127.0.0.1"
            return f"http://{host}:{port}/healthz"
    raise LookupError(f"node {node_id!r} is not in {config_path}")


def main() -> int:
    try:
        url = health_url(
            os.environ.get("RAFTMQ_CONFIG", "/etc/raftmq/cluster.toml"), os.environ["RAFTMQ_NODE"]
        )
        with urllib.request.urlopen(url, timeout=2) as resp:
            print(f"{url}: {resp.status}")
            return 0 if resp.status == 200 else 1
    except Exception as e:  # any failure is "unhealthy", with the reason
        print(f"unhealthy: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
