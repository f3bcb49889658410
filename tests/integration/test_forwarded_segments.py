"""A segment download asked of a node that does not hold the segment is passed through that node as
it comes (cluster/api/core.py, ``ApiCore.forward_to``), on a real 3-node cluster without a shared
segment store.

The forwarding node read the holder's whole answer (a segment: up to ``segments.max_bytes``,
64 MiB) into memory before answering, and held it for as long as its client took to read it: 6
downloads of an 18 MiB segment that read nothing for 4 s grew it by 259 MiB (9 MiB since). And the
answer passed on lost the holder's ``Content-Length`` (a ``HEAD``: 0, the holder sends it no body)
where the holder itself answers the file's size.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.node.node import FILE_PASS_CONNECTIONS
from raftmq.cluster.node.router import FILE_POOL_WAIT_S

from .big_segments import (
    TOML,
    resident_bytes,
    sealed_big_segment,
    stalled_downloads,
    wait_answered_ok,
    wait_resident_settled,
)
from .harness import Cluster, running, wait_until

pytestmark = pytest.mark.timeout(180)

READERS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with running(Cluster(tmp, nodes=3, queue_groups=1, extra_toml=TOML)) as c:
        yield c


@pytest.fixture(scope="module")
def segment(cluster: Cluster) -> dict[str, Any]:
    """A sealed segment of about 18 MiB: its manifest entry, the node holding it and another."""
    entry = sealed_big_segment(cluster)
    return {**entry, "other": next(n for n in cluster.nodes if n != entry["node"])}


def test_a_download_through_another_node_gets_the_same_bytes_and_head_the_real_length(
    cluster: Cluster, segment: dict[str, Any]
) -> None:
    direct = cluster.get(segment["path"], node=segment["node"])
    assert direct.status_code == 200, direct.text[:300]
    passed_on = cluster.get(segment["path"], node=segment["other"])
    assert passed_on.status_code == 200, passed_on.text[:300]
    assert passed_on.content == direct.content
    assert len(direct.content) > 16 * 1024 * 1024
    assert passed_on.headers["Content-Type"] == direct.headers["Content-Type"]
    assert passed_on.headers["X-Raftmq-Crc32c"] == direct.headers["X-Raftmq-Crc32c"]
    assert int(passed_on.headers["Content-Length"]) == len(direct.content)
    for node in (segment["node"], segment["other"]):
        head = cluster.session.head(cluster.url(node) + segment["path"], timeout=30)
        assert head.status_code == 200, (node, head.status_code)
        assert int(head.headers["Content-Length"]) == len(direct.content), (node, dict(head.headers))
        assert head.content == b""
    # An error of the holder comes back as it was (a segment it has no file of).
    missing = cluster.get(segment["path"] + "?format=parquet", node=segment["other"])
    assert missing.status_code == 404, missing.text[:300]
    assert missing.json()["error"]["code"] == "not_found"


def test_slow_downloads_through_another_node_hold_a_part_of_the_segment_there(
    cluster: Cluster, segment: dict[str, Any]
) -> None:
    size = len(cluster.get(segment["path"], node=segment["node"]).content)
    node = segment["other"]
    before = resident_bytes(cluster, node)
    sockets = stalled_downloads(cluster, node, segment["path"], READERS)
    try:
        wait_answered_ok(sockets)  # every download under way, none read yet
        grown = wait_resident_settled(cluster, node) - before  # what they hold once buffered
        assert cluster.get("/v1/topics/big", node=node).status_code == 200  # a normal client is served
        for s in sockets:  # each then reads its whole answer
            s.settimeout(30)
            got = b""
            while chunk := s.recv(1 << 20):
                got += chunk
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            assert len(body) == size, f"{len(body)} of {size} bytes"
    finally:
        for s in sockets:
            s.close()
    assert grown < 2 * size, f"{node} grew by {grown >> 20} MiB for {READERS} downloads of {size >> 20} MiB"


def test_stalled_downloads_through_a_node_take_only_its_file_pool_not_its_calls(
    cluster: Cluster, segment: dict[str, Any]
) -> None:
    """A download passed on holds a connection to the holder for as long as its client reads; they
    shared the node's pool of peer connections (100) with every forward and group call, so slow
    downloads could starve other clients' writes through that node, and a download past the pool
    waited for a connection without end. They have a pool of their own now: past it a download
    gets a retriable 503 after ``FILE_POOL_WAIT_S``, and the node's calls go on."""
    node = segment["other"]
    # Each holds one connection of the pool, reading nothing.
    sockets = stalled_downloads(cluster, node, segment["path"], FILE_PASS_CONNECTIONS)
    try:
        wait_answered_ok(sockets)  # every download under way: each holds its connection
        started = time.monotonic()
        over = cluster.get(segment["path"], node=node)
        assert over.status_code == 503, (over.status_code, over.text[:300])
        assert over.json()["error"]["code"] == "unavailable"
        assert time.monotonic() - started < FILE_POOL_WAIT_S + 5
        # A write through that node (forwarded to the group's leader when it is not the leader).
        r = cluster.produce("big", [{"value": "x"}], node=node)
        assert r.status_code == 200, r.text
    finally:
        for s in sockets:
            s.close()
    # Freed: the next download through it is served whole.
    again = wait_until(
        lambda: (r := cluster.get(segment["path"], node=node)).status_code == 200 and r,
        timeout_s=30,
        what="a download after the stalled ones",
    )
    assert len(again.content) > 16 * 1024 * 1024
