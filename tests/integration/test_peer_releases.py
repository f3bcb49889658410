"""A node knows every peer's release before it needs to: on a real 3-node cluster with tokens, a
queue group's new leader, elected after the old one was killed, still lets a consume-only token
make a new consumer group (the write is gated on every voter applying it, and the dead voter's
release was learnt while it lived) instead of answering 503 ``upgrade_in_progress`` until the
dead node comes back."""

from __future__ import annotations

from collections.abc import Iterator

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

    def commit() -> int:
        r = c.session.put(
            c.url(new_leader) + "/v1/groups/fresh/offsets",
            json={"topic": "orders", "offsets": {str(queue): 0}},
            headers={"Authorization": f"Bearer {READER_TOKEN}"},
            timeout=30,
        )
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert r.json()["error"]["code"] in ("upgrade_in_progress", "no_leader"), r.text
        return r.status_code

    # A leader still settling in may answer 503 for a moment; upgrade_in_progress would stay.
    wait_until(lambda: commit() == 200, 15, what="the new consumer group's offsets at the new leader")
    r = c.get("/v1/topics/orders/groups", node=new_leader)
    assert r.status_code == 200, r.text
    assert "fresh" in r.text, r.text
