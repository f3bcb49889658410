"""A refused request writes no Raft entry, on a real 3-node cluster with API tokens: a receive or an
offset commit under a new consumer group name past ``limits.max_groups_per_token`` is 409
``too_many_groups`` at the queue group's leader before anything is proposed. Before, the leader
proposed the ``subscribe`` and its apply refused it: a token with only a consume right, looping
receives under new names past its cap, wrote one entry per request to each queue group of the
topic (an fsync on every replica), without bound."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import assert_error
from .harness import Cluster, running, tokens_toml

pytestmark = pytest.mark.timeout(240)

ADMIN = "admin-token-Vb4Nq8Ls2Hd6Ke"
CONSUMER = "consumer-token-Rz7Pw3Jm5Ty1Fa"  # consume on capped
CONFIG = "[limits]\nmax_groups_per_topic = 8\nmax_groups_per_token = 2\n" + tokens_toml(
    [
        ("admin", ADMIN, '["*"]', '["*"]', '["*"]'),
        ("consumer", CONSUMER, "[]", "[]", '["capped"]'),
    ]
)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(tmp_path_factory.mktemp("refused"), extra_toml=CONFIG), ADMIN) as cluster:
        yield cluster


def _commit_indexes(c: Cluster) -> dict[str, int]:
    """Every group's commit index, as its leader reports it."""
    return {group: c.commit_index(group) for group in ("meta", *(str(g) for g in range(3)))}


def test_receives_and_commits_over_the_group_cap_propose_nothing(c: Cluster) -> None:
    c.create_topic("capped", queues=3)  # a queue in each queue group
    assert c.produce("capped", [{"value": "m", "queue": q} for q in range(3)]).status_code == 200
    nodes = list(c.nodes)
    for i in range(2):
        r = c.call_as(CONSUMER, "POST", f"/v1/topics/capped/subscriptions/g{i}/receive", json={})
        assert r.status_code == 200, r.text

    before = _commit_indexes(c)
    for i in range(10):
        path = f"/v1/topics/capped/subscriptions/over-{i}/receive"
        assert_error(c.call_as(CONSUMER, "POST", path, nodes[i % 3], json={}), 409, "too_many_groups")
        body = {"topic": "capped", "offsets": {"0": 1}}
        r = c.call_as(CONSUMER, "PUT", f"/v1/groups/over-c{i}/offsets", nodes[i % 3], json=body)
        assert_error(r, 409, "too_many_groups")
    after = _commit_indexes(c)
    # Queue groups: nothing at all (they were 20 refused requests x 3 queue groups of entries).
    assert {g: after[g] - before[g] for g in ("0", "1", "2")} == {"0": 0, "1": 0, "2": 0}
    # (The metadata group may commit a read barrier per new name: its dead-letter topic is looked
    # up at the metadata leader, with the barrier shared by the lookups waiting at once.)

    # The cap still lets a known group on.
    r = c.call_as(CONSUMER, "POST", "/v1/topics/capped/subscriptions/g0/receive", json={})
    assert r.status_code == 200, r.text


def test_lock_contention_and_stale_epochs_propose_nothing(c: Cluster) -> None:
    """A consumer polling for a queue lock another holds, an unlock, a fenced commit or a fenced
    ack with a stale epoch: each changes nothing and is answered by the queue group's leader from its state
    (before, each was an entry the apply refused or found nothing to do for). An epoch newer than
    the leader's lock is answered the same, but after a shared read barrier (a leader cut off from
    its group could miss the newer lock a new leader granted): an entry per round trip at most."""
    c.create_topic("locked", queues=1)
    assert c.produce("locked", [{"value": "m"}]).status_code == 200
    nodes = list(c.nodes)
    path = "/v1/topics/locked/queues/0/locks/ordered"
    r = c.post(path, {"consumer": "a", "lease_ms": 60000})
    assert r.status_code == 200, r.text
    old = r.json()["epoch"]
    r = c.session.delete(f"{c.url()}{path}", params={"consumer": "a", "epoch": old}, timeout=30)
    assert r.status_code == 200 and r.json()["released"] is True, r.text
    r = c.post(path, {"consumer": "a", "lease_ms": 60000})
    assert r.status_code == 200, r.text
    epoch = r.json()["epoch"]
    assert epoch > old, r.text
    topics = c.internal("GET", "/internal/topics", nodes[0]).json()["topics"]
    topic_id = next(t["id"] for t in topics if t["name"] == "locked")

    def contend(node: str, stale: int) -> None:
        assert_error(c.post(path, {"consumer": "b", "lease_ms": 60000}, node), 409, "lock_held")
        for consumer, e in (("b", epoch), ("a", stale)):
            query = {"consumer": consumer, "epoch": e}
            r = c.session.delete(f"{c.url(node)}{path}", params=query, timeout=30)
            assert r.status_code == 200 and r.json()["released"] is False, r.text
        body = {"topic": "locked", "offsets": {"0": 1}, "epoch": stale}
        r = c.session.put(f"{c.url(node)}/v1/groups/ordered/offsets", json=body, timeout=30)
        assert_error(r, 409, "stale_epoch")
        acks = {"receipts": [f"{topic_id}.0.0.1"], "epoch": stale}
        r = c.session.post(f"{c.url(node)}/v1/topics/locked/subscriptions/ordered/ack", json=acks, timeout=30)
        assert_error(r, 409, "stale_epoch")

    for node in nodes:  # each node records the group as used once (a subscribe entry), then not again
        contend(node, old)
    before = _commit_indexes(c)
    for i in range(10):
        contend(nodes[i % 3], old)
    after = _commit_indexes(c)
    assert {g: after[g] - before[g] for g in ("0", "1", "2")} == {"0": 0, "1": 0, "2": 0}
    # A newer epoch than the leader's: the same answers, each after a barrier (an unlock, a
    # commit and an ack per round, one at a time: three entries at most), no other entry.
    before = _commit_indexes(c)
    for i in range(5):
        contend(nodes[i % 3], epoch + 1)
    after = _commit_indexes(c)
    grown = sorted(after[g] - before[g] for g in ("0", "1", "2"))
    assert grown[:2] == [0, 0] and 0 < grown[2] <= 5 * 3, (before, after)  # the topic's one group

    # The holder still renews, commits under its epoch and releases.
    r = c.post(path, {"consumer": "a", "lease_ms": 60000})
    assert r.status_code == 200 and r.json()["epoch"] == epoch, r.text
    body = {"topic": "locked", "offsets": {"0": 1}, "epoch": epoch}
    assert c.session.put(f"{c.url()}/v1/groups/ordered/offsets", json=body, timeout=30).status_code == 200
    r = c.session.delete(f"{c.url()}{path}", params={"consumer": "a", "epoch": epoch}, timeout=30)
    assert r.status_code == 200 and r.json()["released"] is True, r.text
    r = c.session.delete(f"{c.url()}{path}", params={"consumer": "a", "epoch": epoch}, timeout=30)
    assert r.status_code == 200 and r.json()["released"] is True, r.text  # released already: as before


def test_a_redrive_with_nothing_to_redrive_proposes_nothing(c: Cluster) -> None:
    """Consumers that redrive their dead letters on a timer write nothing while there are none
    (before, each redrive was an entry in every queue group of the topic)."""
    c.create_topic("redriven", queues=3)
    r = c.session.put(f"{c.url()}/v1/topics/redriven/subscriptions/workers", json={"max_deliveries": 3})
    assert r.status_code == 200, r.text  # an admin's settings: the group's dead-letter topic is made
    path = "/v1/topics/redriven/subscriptions/workers/dlq/redrive"
    r = c.post(path, {})
    assert r.status_code == 200 and r.json()["dead_letter_topic"] == "redriven.workers.dlq", r.text
    before = _commit_indexes(c)
    for node in [*c.nodes] * 3:
        r = c.post(path, {}, node)
        assert r.status_code == 200, r.text
        assert r.json()["redriven"] == 0 and not r.json()["more"], r.text
        assert [q["queue"] for q in r.json()["queues"]] == [0, 1, 2], r.text
    after = _commit_indexes(c)
    assert {g: after[g] - before[g] for g in ("0", "1", "2")} == {"0": 0, "1": 0, "2": 0}
