"""A node remembers its peers' releases across its own restart (``cluster/node/peer_releases.py``).

On a real 3-node cluster: one node is killed and stays down; the other two are killed and
started again, so neither has heard from the dead voter since it started. A consumer's commit
(``advance``) must still be applied forward only: an older commit that arrives late keeps the
newer offset. Before, a restarted leader took the dead voter for an older release, wrote the
commit as a plain set, and the late commit moved the committed offset back (the chaos soak's
``backwards`` commit)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("peer-releases-restart")) as cluster:
        cluster.start()
        cluster.wait_ready()
        yield cluster


def knows_peers(c: Cluster, node: str) -> bool:
    path = c.data_dir / node / "peers.json"
    peers = json.loads(path.read_text())["peers"] if path.exists() else {}
    others = set(c.nodes) - {node}
    return others <= set(peers) and all("commit_offsets.advance" in peers[p]["capabilities"] for p in others)


def test_a_restarted_leader_keeps_commits_forward_only_while_a_voter_stays_down(c: Cluster) -> None:
    c.create_topic("orders", queues=1)
    r = c.produce("orders", [{"value": f"m{i}"} for i in range(20)])
    assert r.status_code == 200, r.text
    for node in c.nodes:
        wait_until(lambda node=node: knows_peers(c, node), what=f"{node} saved its peers' releases")

    c.kill("n3")  # stays down to the end
    for node in ("n1", "n2"):
        c.kill(node)
    for node in ("n1", "n2"):
        c.start(node)
    c.wait_ready(["n1", "n2"], timeout_s=60)

    def commit(offset: int) -> dict[str, object]:
        r = c.session.put(
            c.url("n1") + "/v1/groups/workers/offsets",
            json={"topic": "orders", "offsets": {"0": offset}, "advance": True},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        answer: dict[str, object] = r.json()["offsets"]["0"]
        return answer

    assert wait_until(lambda: commit(10), timeout_s=60, what="a commit through the restarted nodes") == {
        "offset": 10,
        "applied": True,
    }
    assert commit(5) == {"offset": 10, "applied": False}  # a late, older commit is kept out
    r = c.get("/v1/groups/workers/offsets", node="n2", params={"topic": "orders"})
    assert r.status_code == 200, r.text
    assert r.json()["offsets"] == {"0": 10}
