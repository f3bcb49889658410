"""A segment download to a client that does not read holds a part of the file, not all of it
(cluster/api/handlers/segments.py, ``send_file``).

A sealed segment (up to ``segments.max_bytes``, 64 MiB) was read whole into the node's memory and
handed to the transport: a dozen downloads that read nothing held a dozen segments for as long as
their clients liked (and, since the write deadline, for ``limits.http_write_timeout_ms``). Real
node, real sockets: the node's resident memory grows by a small part of what they asked for.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(180)

VALUE = "s" * (900 * 1024)
TOML = """
[segments]
max_messages = 20
max_bytes = 67108864
check_ms = 200
parquet = false
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=1, queue_groups=1, extra_toml=TOML) as c:
        c.start()
        c.wait_ready()
        yield c
        assert c.alive("n1"), c.log("n1")[-3000:]


def resident_bytes(c: Cluster) -> int:
    proc = c.nodes["n1"].proc
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_downloads_that_never_read_hold_a_part_of_their_segment_each(cluster: Cluster) -> None:
    cluster.create_topic("big", queues=1)
    for _ in range(5):  # 20 messages of 900 KiB: one segment of about 18 MiB
        r = cluster.produce("big", [{"value": VALUE}] * 4)
        assert r.status_code == 200, r.text

    def sealed() -> list[dict[str, object]]:
        return list(cluster.get("/v1/topics/big/segments").json()["queues"][0]["segments"])

    wait_until(lambda: sealed(), timeout_s=30, what="the segment sealed")
    base = sealed()[0]["base"]
    size = len(cluster.get(f"/v1/topics/big/segments/0/{base}").content)
    assert size > 16 * 1024 * 1024
    host, port = cluster.nodes["n1"].http.rsplit(":", 1)
    before = resident_bytes(cluster)
    sockets = []
    try:
        for _ in range(12):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(f"GET /v1/topics/big/segments/0/{base} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            sockets.append(s)
        time.sleep(3)  # every download under way, none read
        grown = resident_bytes(cluster) - before
        assert cluster.get("/v1/topics/big").status_code == 200  # a normal client is served
    finally:
        for s in sockets:
            s.close()
    assert grown < 3 * size, f"the node grew by {grown >> 20} MiB for 12 segments of {size >> 20} MiB"
