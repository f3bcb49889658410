"""A node knows every peer's release before it needs to: on a real 3-node cluster with tokens, a
queue group's new leader, elected after the old one was killed, still lets a consume-only token
make a new consumer group (the write is gated on every voter applying it, and the dead voter's
release was learnt while it lived) instead of answering 503 ``upgrade_in_progress`` until the
dead node comes back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster, tokens_toml, wait_until

pytestmark = pytest.mark.timeout(180)

ADMIN_TOKEN = "admin-token-Rk4Lm8Np2Qs6Tv1Wx"
READER_TOKEN = "reader-token-Hb7Jc3Kd9Lf5Mg2Nh"  # consume on orders only: its new groups are gated
SECURITY_TOML = tokens_toml(
    [
        ("admin", ADMIN_TOKEN, ["*"], ["*"], ["*"]),
        ("reader", READER_TOKEN, [], [], ["orders"]),
    ]
)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("peer-releases"), extra_toml=SECURITY_TOML) as cluster:
        cluster.session.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()
        yield cluster


def test_a_new_leader_after_a_kill_still_makes_gated_writes(c: Cluster) -> None:
    r = c.post("/v1/topics", {"name": "orders", "queues": 3})
    assert r.status_code == 201, r.text
    topic = c.get("/v1/topics/orders").json()
    meta = c.wait_leader("meta")
    # A queue of the topic whose group a node other than the metadata leader leads: its new
    # leader after the kill has proposed nothing gated before.
    queue, group = next(
        (q, str(g)) for q, g in enumerate(topic["queue_groups"]) if c.wait_leader(str(g)) != meta
    )
    victim = c.wait_leader(group)
    # The premise: every node learnt every peer's release while all lived. Each node asks its peers
    # about a second apart from its start until each has answered once; a cluster now ready and
    # balanced in about two seconds could lose the victim before that (a view asks them at once).
    for node in c.nodes:
        view = c.get("/v1/cluster", node=node).json()
        assert all(n["reachable"] for n in view["nodes"]), view["nodes"]
    c.kill(victim)
    new_leader = c.wait_leader(group, exclude=victim)
    for node in c.nodes:  # every survivor's view of its peers now lacks the dead node
        if node != victim:
            assert c.get("/v1/cluster", node=node).status_code == 200

    # A leader still settling in may answer 503 for a moment; upgrade_in_progress would stay.
    wait_until(
        lambda: _commit_as_reader(c, new_leader, queue) == 200,
        15,
        what="the new consumer group's offsets at the new leader",
    )
    r = c.get("/v1/topics/orders/groups", node=new_leader)
    assert r.status_code == 200, r.text
    assert "fresh" in r.text, r.text


def _commit_as_reader(c: Cluster, node: str, queue: int) -> int:
    """A consume-only token's first commit of a new consumer group (a gated write) at ``node``."""
    r = c.session.put(
        c.url(node) + "/v1/groups/fresh/offsets",
        json={"topic": "orders", "offsets": {str(queue): 0}},
        headers={"Authorization": f"Bearer {READER_TOKEN}"},
        timeout=30,
    )
    assert r.status_code in (200, 503), r.text
    if r.status_code == 503:
        assert r.json()["error"]["code"] in ("upgrade_in_progress", "no_leader"), r.text
    return r.status_code


def test_a_peer_killed_as_soon_as_its_first_start_was_ready_was_heard_first(tmp_path: Path) -> None:
    """A new cluster whose third node starts late and dies as soon as it answers ``/readyz``: the
    two others had already learnt its release (they ask unheard peers every 0.1 s for their first
    30 s), so the gated write goes through without it. With a poll once a second, as before, they
    had not in most runs, and the write answered 503 ``upgrade_in_progress`` until it returned."""
    with Cluster(tmp_path, extra_toml=SECURITY_TOML) as c:
        c.session.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        c.start("n1")
        c.start("n2")
        c.wait_ready(["n1", "n2"])
        r = c.post("/v1/topics", {"name": "orders", "queues": 3}, node="n1")
        assert r.status_code == 201, r.text
        c.start("n3")
        wait_until(lambda: c.get("/healthz", node="n3", timeout=2).status_code == 200, 30, what="n3 up")
        time.sleep(0.5)  # the premise: a peer that answered for half a second was heard
        c.kill("n3")
        group = str(c.get("/v1/topics/orders", node="n1").json()["queue_groups"][0])
        leader = c.wait_leader(group, exclude="n3")
        # A leader still settling in may answer 503 for a moment; upgrade_in_progress would stay.
        wait_until(lambda: _commit_as_reader(c, leader, 0) == 200, 15, what="the gated write without n3")
