"""No request value, replicated path or archive member reaches a file outside where it belongs.

A live 3-node cluster with sealed segments: request paths with ``..`` (raw or ``%2e%2e``-encoded)
and a seal command naming ``../`` paths get a catalogued 4xx, change nothing and read nothing;
``raftmq restore`` refuses crafted backups (a checkpoint member with ``..``, a group named like a
path) before writing anything outside the node's directory.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.cli.backup import FORMAT, MANIFEST
from raftmq.cluster.config.cluster_file import load_config
from raftmq.cluster.machines.placement import static_placement

from .conftest import assert_error_shape
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

SECRET = "TOP-SECRET-OUTSIDE-THE-STORE"
TOML = """
[segments]
max_messages = 20
check_ms = 200
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("traversal")
    with Cluster(tmp, nodes=3, queue_groups=1, extra_toml=TOML) as cluster:
        cluster.start()
        cluster.wait_ready()
        (cluster.data_dir / "secret.txt").write_text(SECRET)
        for nid in cluster.nodes:
            (cluster.data_dir / nid / "secret.txt").write_text(SECRET)
        cluster.create_topic("trav", queues=1)
        assert cluster.produce("trav", [{"value": f"m{i}"} for i in range(40)]).status_code == 200
        wait_until(lambda: segments(cluster)["queues"][0]["sealed_end"] == 40, 60, what="segments sealed")
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), cluster.log(nid)[-3000:]


def segments(c: Cluster) -> dict[str, Any]:
    r = c.get("/v1/topics/trav/segments")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def raw_get(c: Cluster, node: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` exactly as written (no client-side normalisation of ``..``)."""
    host, port = c.nodes[node].http.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


TRAVERSING = [
    "/v1/topics/%2e%2e/segments",
    "/v1/topics/%2e%2e%2f%2e%2e%2fsecret.txt/segments",
    "/v1/topics/trav/segments/%2e%2e/0",
    "/v1/topics/trav/segments/0/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/v1/topics/trav/segments/0/0?format=..%2F..%2F..%2Fsecret.txt",
    "/v1/topics/trav/segments/0/0?format=../../../secret.txt",
    "/v1/topics/trav/segments/../../../../secret.txt",
    "/v1/topics/trav/segments/0/../../../../../secret.txt",
    "/v1/topics/%2E%2E/%2E%2E/%2E%2E/secret.txt",
    "/../../secret.txt",
    "/v1/topics/trav/queues/%2e%2e/messages?offset=0",
]


@pytest.mark.parametrize("path", TRAVERSING)
def test_request_paths_with_dotdot_get_a_4xx_and_read_nothing(c: Cluster, path: str) -> None:
    before = segments(c)
    for node in c.nodes:
        status, body = raw_get(c, node, path)
        assert 400 <= status < 500, (node, path, status, body[:300])
        assert SECRET.encode() not in body
        assert_error_shape(json.loads(body), status)
    assert segments(c) == before


def test_seal_command_naming_paths_outside_the_store_is_refused(c: Cluster) -> None:
    before = segments(c)
    entry = dict(before["queues"][0]["segments"][0])
    good = {
        "topic_id": before["topic_id"],
        "queue": 0,
        "base": 40,
        "end": 41,
        "rows": 1,
        "bytes": 1,
        "crc32c": 0,
        "parquet_crc32c": None,
        "node": entry["node"],
        "first_ts_ms": 1,
        "last_ts_ms": 1,
    }
    for arrow in ["../../../secret.txt", "/etc/passwd", "arrow/../../../secret.txt", "arrow/%2e%2e/x"]:
        command = {"v": 1, "op": "seal_segment", "now_ms": 1, "prune": []}
        command["segments"] = [{**good, "arrow": arrow, "parquet": None}]

        def propose(raw: bytes = json.dumps(command).encode()) -> dict[str, Any] | None:
            r = c.internal("POST", "/internal/groups/0/propose", c.wait_leader("0"), data=raw)
            if r.status_code == 421:  # the leadership moved after wait_leader looked
                return None
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body if body["error"] is None else None

        body = wait_until(propose, 30, what=f"seal with {arrow!r} applied")
        assert body["result"]["error"]["code"] == "bad_request", body
    assert segments(c) == before


# -- raftmq restore of crafted backups (no node runs; the cluster file is the module's) -----------


def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args], capture_output=True, text=True, timeout=180
    )


def _tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _backup(path: Path, placement: dict[str, Any], checkpoints: dict[str, bytes]) -> Path:
    manifest = {
        "format": FORMAT,
        "created_ms": 1,
        "queue_groups": 1,
        "placement": placement,
        "groups": {
            name: {"state_index": 5, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in checkpoints.items()
        },
    }
    members: list[tuple[str, bytes | None]] = [(f"groups/{n}.tar", d) for n, d in checkpoints.items()]
    members.append((MANIFEST, json.dumps(manifest).encode()))
    path.write_bytes(_tar_bytes(members))
    return path


def _restore(tmp_path: Path, placement_edit: Any, checkpoints: Any) -> subprocess.CompletedProcess[str]:
    """``raftmq restore`` of node n1 of a cluster file written (never started) under ``tmp_path``,
    from a backup whose placement matches that file, edited by ``placement_edit``."""
    (tmp_path / "cluster").mkdir()
    with Cluster(tmp_path / "cluster", nodes=3, queue_groups=1) as cluster:
        placement = static_placement(load_config(str(cluster.config_path))).to_json()
        placement_edit(placement)
        backup = _backup(tmp_path / "backup.tar", placement, checkpoints)
        return raftmq("restore", "--config", str(cluster.config_path), "--node", "n1", str(backup))


def _evil(tmp_path: Path) -> list[str]:
    return sorted(str(p) for p in tmp_path.rglob("*") if "evil" in p.name)


def test_restore_refuses_a_checkpoint_member_with_dotdot(tmp_path: Path) -> None:
    bad = _tar_bytes([("checkpoint", None), ("checkpoint/CURRENT", b"x"), ("../../../evil", b"evil")])
    done = _restore(tmp_path, lambda placement: None, {"0": bad, "meta": bad})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "unsafe entry" in done.stderr, done.stderr
    assert _evil(tmp_path) == []
    assert _evil(tmp_path.parent) == []


def test_restore_refuses_a_group_named_like_a_path(tmp_path: Path) -> None:
    evil = "../../evil-dir"

    def add_evil_group(placement: dict[str, Any]) -> None:
        placement["groups"][evil] = list(placement["groups"]["0"])

    good = _tar_bytes([("checkpoint", None), ("checkpoint/CURRENT", b"x"), ("meta.json", b"{}")])
    done = _restore(tmp_path, add_evil_group, {evil: good})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "groups this cluster does not have" in done.stderr, done.stderr
    assert _evil(tmp_path) == []
