"""A segment download passed on by a node that did not write the segment (``ApiCore.forward_to``)
whose writer dies midway, on a real 3-node cluster without a shared segment store: the client
must never get what looks like the whole file.

A cluster of its own (the test kills a node), and a segment of about 36 MiB: between the writer
and the client, the kernel buffers of both connections and the part under way held 9 to 11 MiB
when the writer was killed (measured), and an 18 MiB segment left too thin a margin for a cut to
be sure to fall inside the body.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .big_segments import TOML, content_length, read_head, sealed_big_segment, stalled_downloads
from .harness import Cluster, running, wait_until

pytestmark = pytest.mark.timeout(180)

BIGGER = TOML.replace("max_messages = 20", "max_messages = 40")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running(Cluster(tmp_path, nodes=3, queue_groups=1, extra_toml=BIGGER)) as c:
        yield c


@pytest.fixture
def segment(cluster: Cluster) -> dict[str, Any]:
    """A sealed segment of about 36 MiB: its manifest entry, the node holding it and another."""
    entry = sealed_big_segment(cluster, batches=10)
    return {**entry, "other": next(n for n in cluster.nodes if n != entry["node"])}


def test_a_download_whose_writer_dies_midway_is_cut_short_never_complete_looking(
    cluster: Cluster, segment: dict[str, Any]
) -> None:
    """The node that wrote the segment killed (SIGKILL) while another node passes it on: its client
    has had the head (200, the whole file's ``Content-Length``) and a part of the body. What it
    gets then must not look like the whole file: the passing node drops its connection, the body
    ends short of its length. That node stays well and serves the next download whole."""
    writer, node = segment["node"], segment["other"]
    whole = cluster.get(segment["path"], node=writer).content
    # Kept alive: a node that ended the answer as if whole would keep the connection open for
    # the next request (and a client would read the next answer out of this one's rest).
    (s,) = stalled_downloads(cluster, node, segment["path"], 1, keep_alive=True)
    try:
        s.settimeout(30)
        head, body = read_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        length = content_length(head)
        assert length == len(whole)
        while len(body) < 1 << 20:  # under way: a part read, most of it still at the writer
            chunk = s.recv(1 << 16)
            if not chunk:  # closed before the kill: nothing to test (and no spin until the timeout)
                raise AssertionError(f"{node} closed the download after {len(body)} of {length} bytes")
            body += chunk
        cluster.kill(writer)
        try:  # to the connection's end: dropped by the node (a timeout here: left open)
            while chunk := s.recv(1 << 20):
                body += chunk
        except ConnectionResetError:
            pass  # cut: as good as a short body
        except TimeoutError as e:
            raise AssertionError(f"{node} left the connection open after {len(body)} bytes") from e
    finally:
        s.close()
    assert len(body) < length, f"the client got {len(body)} bytes of {length}: a complete-looking body"
    assert body == whole[: len(body)]  # what came was the file's
    assert cluster.alive(node), cluster.log(node)[-3000:]
    assert cluster.get("/v1/topics/big", node=node).status_code == 200
    cluster.start(writer)
    again = wait_until(
        lambda: (r := cluster.get(segment["path"], node=node)).status_code == 200 and r,
        timeout_s=60,
        what="a download through the same node once the writer is back",
    )
    assert again.content == whole
