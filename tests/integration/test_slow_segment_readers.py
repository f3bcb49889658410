"""A segment download to a client that does not read holds a part of the file, not all of it
(cluster/api/handlers/segments.py, ``send_file``).

A sealed segment (up to ``segments.max_bytes``, 64 MiB) was read whole into the node's memory and
handed to the transport: a dozen downloads that read nothing held a dozen segments for as long as
their clients liked (and, since the write deadline, for ``limits.http_write_timeout_ms``). Real
node, real sockets: the node's resident memory grows by a small part of what they asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .big_segments import (
    TOML,
    resident_bytes,
    sealed_big_segment,
    stalled_downloads,
    wait_answered_ok,
    wait_resident_settled,
)
from .harness import Cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=1, queue_groups=1, extra_toml=TOML) as c:
        c.start()
        c.wait_ready()
        yield c
        assert c.alive("n1"), c.log("n1")[-3000:]


def test_downloads_that_never_read_hold_a_part_of_their_segment_each(cluster: Cluster) -> None:
    path = sealed_big_segment(cluster)["path"]
    size = len(cluster.get(path).content)
    assert size > 16 * 1024 * 1024
    before = resident_bytes(cluster, "n1")
    sockets = stalled_downloads(cluster, "n1", path, 12)
    try:
        wait_answered_ok(sockets)  # every download under way, none read
        grown = wait_resident_settled(cluster, "n1") - before  # what they hold once buffered
        assert cluster.get("/v1/topics/big").status_code == 200  # a normal client is served
    finally:
        for s in sockets:
            s.close()
    assert grown < 3 * size, f"the node grew by {grown >> 20} MiB for 12 segments of {size >> 20} MiB"
